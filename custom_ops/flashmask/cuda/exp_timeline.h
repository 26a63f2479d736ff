// Diagnostics, compiled only under -DFLASHMASK_EXP_TIMELINE (the harness's
// --timeline; NOTES.md, "Where a masked step's time goes"): the main backward
// kernels and the FA2-class forward record, per CTA, its SM, globaltimer at entry, clock64 at entry, at
// its first step, after its loop and at exit, its steps, head and key block,
// into the buffer the harness sets here. Nothing of it exists otherwise.
#pragma once

#ifdef FLASHMASK_EXP_TIMELINE
namespace flashmask {
namespace cuda {

// 8 words a CTA, indexed by the CTA's linear block index; null: no recording.
inline unsigned long long* g_exp_timeline = nullptr;
// The same for the FA2-class forward (its first step: its first live block's
// first barrier passed, Q and K landed; its steps: live key blocks).
inline unsigned long long* g_exp_timeline_fwd = nullptr;

#if defined(__CUDACC__)
// Trivially constructible, so that a kernel at its register limit can keep it in
// shared memory, written by one thread (the FA2-class forward).
struct ExpTimeline {
  unsigned long long global_entry, entry, first_step, loop_end;
  __device__ __forceinline__ void start() {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(global_entry));
    entry = clock64();
    first_step = loop_end = 0;
  }
  __device__ __forceinline__ void record(unsigned long long* timeline, int steps, int head, int n_block) const {
    if (timeline == nullptr) return;
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    const unsigned long long cta =
        (unsigned long long)blockIdx.z * gridDim.x * gridDim.y + blockIdx.y * gridDim.x + blockIdx.x;
    unsigned long long* r = timeline + cta * 8;
    r[0] = smid, r[1] = global_entry, r[2] = entry, r[3] = first_step, r[4] = loop_end, r[5] = clock64();
    r[6] = (unsigned long long)steps, r[7] = (unsigned long long)head << 32 | unsigned(n_block);
  }
};
#endif

}  // namespace cuda
}  // namespace flashmask
#endif
