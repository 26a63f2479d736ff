// Paddle-free device check of the CUDA kernels: random inputs, the CPU kernel
// (fp32, on the same bf16-rounded inputs) as the reference for out, LSE and
// dq/dk/dv, for both kernel families (head dims 192/128: the Hopper ones
// only; 256 on both, --check-fa2 for the FA2-class ones);
// then timings of a few large cases.
// --check-fa2 / --time-fa2 / --mma-peak: the FA2-class kernels alone (their
// rework, NOTES.md issue 15; build_variant.sh builds one binary per version
// and ../fa2_steps.sh times them against each other and torch's FA2).
// Built on a CPU machine (benchmarks/device/harness/build.sh) and run on the
// device without the Paddle GPU runtime: a quick first look at a new kernel.
// The Paddle-level GPU tests (tests/test_gpu.py) remain the full check.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "../../../custom_ops/flashmask/flashmask_api.h"
#include "../../../custom_ops/flashmask/cuda/sm90/flashmask_sm90_api.h"
#include "../../../custom_ops/flashmask/cuda/env_settings.h"
#include "../../../custom_ops/flashmask/cuda/kernel_traits.h"
#include "../../../custom_ops/flashmask/cuda/workspace.h"
#include "../../../custom_ops/flashmask/mask_bounds.h"

// The backward's stages around the main kernel (cuda/mask_prep.cu), timed
// on their own.
namespace flashmask::cuda {
void bwd_prepare(const BwdParams& p, cudaStream_t stream);
void bwd_finish(const BwdParams& p, cudaStream_t stream);
}  // namespace flashmask::cuda

using flashmask::BwdParams;
using flashmask::DType;
using flashmask::FwdParams;
using flashmask::GpuKernel;

#define CHECK(x)                                                                         \
  do {                                                                                   \
    cudaError_t e = (x);                                                                 \
    if (e != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(2);                                                                      \
    }                                                                                    \
  } while (0)

// The stream every op call runs on: a created (blocking) stream, as Paddle's
// are, since the sm90 backward's finish is a programmatic dependent launch.
cudaStream_t g_stream = nullptr;

struct Case {
  std::string name;
  int b, sq, sk, h, hk, d;
  bool causal;
  int cols;  // 0: none
  // Fills [b, hm=1, sk, cols].
  std::vector<int32_t> (*make)(const Case&);
  int dv = 0;  // value head dim; 0: d
  int value_dim() const { return dv > 0 ? dv : d; }
};

// The opt-in split FA2-class backward (PADDLE_FLASHMASK_FA2_BWD=split) takes head
// dims up to kSplitBwdMaxHeadDim; the op throws past that, so the FA2-class modes skip them.
using flashmask::cuda::kSplitBwdMaxHeadDim;
bool split_bwd_requested() { return !flashmask::cuda::use_staged_bwd(); }
// Head dims the FA2-class modes skip under the split backward: past kSplitBwdMaxHeadDim, and
// those run on a wider head dim's tiles (80), which it has no kernel for either.
bool split_bwd_skips(int d) {
  return (d > kSplitBwdMaxHeadDim || flashmask::cuda::tile_head_dim(d) != d) && split_bwd_requested();
}

// The value head dim the Hopper kernels pair with head dim d (timings).
int paired_value_dim(int d) { return d == 192 ? 128 : d; }

std::vector<int32_t> doc_mask(const Case& c) {  // causal document: LTS = end of the doc
  std::vector<int32_t> m(size_t(c.b) * c.sk);
  for (int b = 0; b < c.b; ++b) {
    const int doc = 97 + 31 * b;
    for (int j = 0; j < c.sk; ++j) m[size_t(b) * c.sk + j] = std::min(c.sq, (j / doc + 1) * doc);
  }
  return m;
}
std::vector<int32_t> window_mask(const Case& c) {  // causal C=2: sliding window of 128
  std::vector<int32_t> m(size_t(c.b) * c.sk * 2);
  for (int b = 0; b < c.b; ++b)
    for (int j = 0; j < c.sk; ++j) {
      m[(size_t(b) * c.sk + j) * 2] = std::min(c.sq, j + 128);
      m[(size_t(b) * c.sk + j) * 2 + 1] = c.sq;
    }
  return m;
}
std::vector<int32_t> bidir_window_mask(const Case& c) {  // non-causal C=2: rows [j - 60, j + 100) see key j
  std::vector<int32_t> m(size_t(c.b) * c.sk * 2);
  for (int b = 0; b < c.b; ++b)
    for (int j = 0; j < c.sk; ++j) {
      m[(size_t(b) * c.sk + j) * 2] = std::min(c.sq, j + 100);
      m[(size_t(b) * c.sk + j) * 2 + 1] = std::max(0, j - 60);
    }
  return m;
}
std::vector<int32_t> random4_mask(const Case& c) {  // C=4 random bands, rows 10..20 fully masked
  std::mt19937 rng(7);
  std::vector<int32_t> m(size_t(c.b) * c.sk * 4);
  for (size_t j = 0; j < size_t(c.b) * c.sk; ++j) {
    int a = rng() % (c.sq + 1), e = rng() % (c.sq + 1);
    if (a > e) std::swap(a, e);
    m[j * 4 + 0] = a, m[j * 4 + 1] = e;
    m[j * 4 + 2] = std::min(10, c.sq), m[j * 4 + 3] = std::min(21, c.sq);
  }
  return m;
}

float bf16_round(float x) { return __bfloat162float(__float2bfloat16(x)); }

struct Buffers {
  std::vector<float> host;  // bf16-rounded values, fp32
  __nv_bfloat16* dev = nullptr;
};

Buffers random_buffer(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist;
  Buffers b;
  b.host.resize(n);
  std::vector<__nv_bfloat16> tmp(n);
  for (size_t i = 0; i < n; ++i) {
    tmp[i] = __float2bfloat16(dist(rng));
    b.host[i] = __bfloat162float(tmp[i]);
  }
  CHECK(cudaMalloc(&b.dev, n * 2));
  CHECK(cudaMemcpy(b.dev, tmp.data(), n * 2, cudaMemcpyHostToDevice));
  return b;
}

// Timing inputs: standard normal bf16 drawn on the device (a hash of the
// element's index, Box-Muller), so that 128K-token cases cost no host time.
__global__ void fill_normal_kernel(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9E3779B9u ^ uint32_t(i >> 32) * 0x85EBCA6Bu ^ seed;
    h ^= h >> 16, h *= 0x7FEB352Du, h ^= h >> 15, h *= 0x846CA68Bu, h ^= h >> 16;
    const uint32_t h2 = h * 0x2C1B3C6Du + 0x297A2D39u;
    const float u1 = (float(h >> 8) + 1.f) * (1.f / 16777217.f), u2 = float(h2 >> 8) * (1.f / 16777216.f);
    x[i] = __float2bfloat16(sqrtf(-2.f * logf(u1)) * cospif(2.f * u2));
  }
}
Buffers device_random_buffer(size_t n, std::mt19937& rng) {
  Buffers b;
  CHECK(cudaMalloc(&b.dev, n * 2));
  fill_normal_kernel<<<1024, 256>>>(b.dev, n, uint32_t(rng()));
  CHECK(cudaGetLastError());
  return b;
}

std::vector<float> download(const __nv_bfloat16* dev, size_t n) {
  std::vector<__nv_bfloat16> tmp(n);
  CHECK(cudaMemcpy(tmp.data(), dev, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = __bfloat162float(tmp[i]);
  return out;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(ref[i]) && a[i] == ref[i]) continue;
    const double d = double(a[i]) - ref[i];
    num += d * d;
    den += double(ref[i]) * ref[i];
    if (std::isnan(a[i])) return 1e9;
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

void fill_params(FwdParams& p, const Case& c) {
  const int dv = c.value_dim();
  p.batch = c.b, p.seqlen_q = c.sq, p.seqlen_k = c.sk, p.num_heads = c.h, p.num_heads_k = c.hk;
  p.head_dim = c.d, p.head_dim_v = dv;
  p.q_row_stride = int64_t(c.h) * c.d, p.q_head_stride = c.d, p.q_batch_stride = int64_t(c.sq) * c.h * c.d;
  p.o_row_stride = int64_t(c.h) * dv, p.o_head_stride = dv, p.o_batch_stride = int64_t(c.sq) * c.h * dv;
  p.k_row_stride = int64_t(c.hk) * c.d, p.k_head_stride = c.d, p.k_batch_stride = int64_t(c.sk) * c.hk * c.d;
  p.v_row_stride = int64_t(c.hk) * dv, p.v_head_stride = dv, p.v_batch_stride = int64_t(c.sk) * c.hk * dv;
  p.softmax_scale = 1.f / std::sqrt(float(c.d));
  p.mask.causal = c.causal;
}

// dO like out, each gradient like its input.
void set_bwd_strides(BwdParams& p) {
  p.do_row_stride = p.o_row_stride, p.do_head_stride = p.o_head_stride, p.do_batch_stride = p.o_batch_stride;
  p.dq_row_stride = p.q_row_stride, p.dq_head_stride = p.q_head_stride, p.dq_batch_stride = p.q_batch_stride;
  p.dk_row_stride = p.k_row_stride, p.dk_head_stride = p.k_head_stride, p.dk_batch_stride = p.k_batch_stride;
  p.dv_row_stride = p.v_row_stride, p.dv_head_stride = p.v_head_stride, p.dv_batch_stride = p.v_batch_stride;
}

// One case: GPU (given family, determinism) vs CPU fp32 reference.
// head_group, max_steps: the sm90 backward's grouping asked of plan_bwd_cuda.
bool check_case(const Case& c, GpuKernel kernel, bool deterministic, int head_group, int max_steps,
                std::mt19937& rng) {
  // q/dq, k/dk, v/dv, out/dout elements.
  const size_t nq = size_t(c.b) * c.sq * c.h * c.d, nk = size_t(c.b) * c.sk * c.hk * c.d;
  const size_t nv = size_t(c.b) * c.sk * c.hk * c.value_dim(), no = size_t(c.b) * c.sq * c.h * c.value_dim();
  Buffers q = random_buffer(nq, rng), k = random_buffer(nk, rng), v = random_buffer(nv, rng);
  Buffers dout = random_buffer(no, rng);
  std::vector<int32_t> mask = c.make ? c.make(c) : std::vector<int32_t>();
  int32_t* dmask = nullptr;
  FwdParams p;
  fill_params(p, c);
  if (!mask.empty()) {
    CHECK(cudaMalloc(&dmask, mask.size() * 4));
    CHECK(cudaMemcpy(dmask, mask.data(), mask.size() * 4, cudaMemcpyHostToDevice));
    p.mask.num_cols = c.cols, p.mask.num_heads = 1, p.mask.col_stride = c.cols;
    p.mask.head_stride = int64_t(c.sk) * c.cols, p.mask.batch_stride = int64_t(c.sk) * c.cols;
  }
  // CPU reference.
  FwdParams cp = p;
  cp.dtype = DType::kFloat32;
  std::vector<float> ref_o(no), ref_lse(size_t(c.b) * c.h * c.sq);
  cp.q = q.host.data(), cp.k = k.host.data(), cp.v = v.host.data(), cp.out = ref_o.data();
  cp.softmax_lse = ref_lse.data();
  cp.mask.startend_row_indices = mask.empty() ? nullptr : mask.data();
  flashmask::run_fwd_cpu(cp);
  std::vector<float> ref_o_rounded(ref_o);
  for (auto& x : ref_o_rounded) x = bf16_round(x);
  BwdParams cb;
  static_cast<FwdParams&>(cb) = cp;
  set_bwd_strides(cb);
  std::vector<float> ref_dq(nq), ref_dk(nk), ref_dv(nv);
  cb.out = ref_o_rounded.data(), cb.dout = dout.host.data();
  cb.dq = ref_dq.data(), cb.dk = ref_dk.data(), cb.dv = ref_dv.data();
  flashmask::run_bwd_cpu(cb);

  // GPU.
  p.dtype = DType::kBFloat16;
  p.gpu_kernel = kernel;
  p.q = q.dev, p.k = k.dev, p.v = v.dev;
  p.mask.startend_row_indices = dmask;
  __nv_bfloat16 *o_dev, *dq_dev, *dk_dev, *dv_dev;
  float *lse_dev, *dq_acc, *dk_acc = nullptr, *dv_acc = nullptr, *delta;
  int32_t* bounds = nullptr;
  CHECK(cudaMalloc(&o_dev, no * 2));
  CHECK(cudaMemset(o_dev, 0xff, no * 2));  // poison: NaN unless written
  CHECK(cudaMalloc(&lse_dev, ref_lse.size() * 4));
  const int64_t nb = flashmask::block_bounds_elems(p);
  if (nb) CHECK(cudaMalloc(&bounds, nb * 4));
  p.out = o_dev, p.softmax_lse = lse_dev, p.block_bounds = bounds;
  flashmask::run_fwd_cuda(p, g_stream);
  CHECK(cudaDeviceSynchronize());
  std::vector<float> o = download(o_dev, no), lse(ref_lse.size());
  CHECK(cudaMemcpy(lse.data(), lse_dev, lse.size() * 4, cudaMemcpyDeviceToHost));

  BwdParams b;
  static_cast<FwdParams&>(b) = p;
  set_bwd_strides(b);
  b.deterministic = deterministic;
  b.dout = dout.dev;  // the plan looks at its alignment
  flashmask::plan_bwd_cuda(b, head_group, max_steps);
  const size_t nk_acc = size_t(c.b) * c.sk * b.accum_heads_k * c.d;
  const size_t nv_acc = nk_acc / c.d * c.value_dim();
  CHECK(cudaMalloc(&dq_dev, nq * 2));
  CHECK(cudaMalloc(&dk_dev, nk * 2));
  CHECK(cudaMalloc(&dv_dev, nv * 2));
  CHECK(cudaMalloc(&dq_acc, flashmask::bwd_dq_accum_elems(b) * 4));
  if (!b.dkv_direct) {  // the fp32 slots; none where the kernel stores dK/dV itself (the op alike)
    CHECK(cudaMalloc(&dk_acc, nk_acc * 4));
    CHECK(cudaMalloc(&dv_acc, nv_acc * 4));
  }
  // Poison the fp32 accumulators (NaN unless written): the op allocates them
  // uninitialised, so whatever the backward adds into it must zero itself.
  CHECK(cudaMemset(dq_acc, 0xff, flashmask::bwd_dq_accum_elems(b) * 4));
  if (dk_acc) CHECK(cudaMemset(dk_acc, 0xff, nk_acc * 4));
  if (dv_acc) CHECK(cudaMemset(dv_acc, 0xff, nv_acc * 4));
  CHECK(cudaMalloc(&delta, ref_lse.size() * 4));
  float* row_stats = nullptr;
  if (const int64_t n = flashmask::bwd_row_stats_elems(b)) CHECK(cudaMalloc(&row_stats, n * 4));
  void *dk_heads = nullptr, *dv_heads = nullptr;  // 16-bit, dkv_direct with GQA
  if (const int64_t n = flashmask::bwd_dkv_heads_elems(b, false)) CHECK(cudaMalloc(&dk_heads, n * 2));
  if (const int64_t n = flashmask::bwd_dkv_heads_elems(b, true)) CHECK(cudaMalloc(&dv_heads, n * 2));
  b.out = o_dev, b.dout = dout.dev, b.dq = dq_dev, b.dk = dk_dev, b.dv = dv_dev;
  b.dq_accum = dq_acc, b.dk_accum = dk_acc, b.dv_accum = dv_acc, b.softmax_d = delta;
  b.row_stats = row_stats, b.dk_heads = dk_heads, b.dv_heads = dv_heads;
  flashmask::run_bwd_cuda(b, g_stream);
  CHECK(cudaDeviceSynchronize());
  std::vector<float> dq = download(dq_dev, nq), dk = download(dk_dev, nk), dv = download(dv_dev, nv);
  bool same = true;
  if (deterministic) {  // a second run must be bit-identical
    flashmask::run_bwd_cuda(b, g_stream);
    CHECK(cudaDeviceSynchronize());
    same = download(dq_dev, nq) == dq && download(dk_dev, nk) == dk && download(dv_dev, nv) == dv;
  }
  const double eo = rel_err(o, ref_o), el = rel_err(lse, ref_lse), edq = rel_err(dq, ref_dq),
               edk = rel_err(dk, ref_dk), edv = rel_err(dv, ref_dv);
  const bool ok = eo < 1e-2 && el < 1e-3 && edq < 2e-2 && edk < 2e-2 && edv < 2e-2 && same;
  std::printf("%-4s %-5s hg%d/%-3d %-16s B%d Sq%-5d Sk%-5d H%d:%d D%-3d/%-3d out %.1e lse %.1e dq %.1e dk %.1e dv %.1e%s %s\n",
              kernel == GpuKernel::kSm90 ? "sm90" : "fa2", deterministic ? "det" : "", b.bwd_head_group,
              b.bwd_group_max_steps, c.name.c_str(), c.b, c.sq, c.sk, c.h, c.hk, c.d, c.value_dim(), eo, el, edq, edk, edv,
              deterministic ? (same ? " bit-identical" : " NOT-IDENTICAL") : "", ok ? "ok" : "FAIL");
  for (void* ptr : {(void*)q.dev, (void*)k.dev, (void*)v.dev, (void*)dout.dev, (void*)o_dev, (void*)lse_dev,
                    (void*)dq_dev, (void*)dk_dev, (void*)dv_dev, (void*)dq_acc, (void*)dk_acc, (void*)dv_acc,
                    (void*)delta, (void*)bounds, (void*)dmask, (void*)row_stats, dk_heads, dv_heads})
    if (ptr) CHECK(cudaFree(ptr));
  return ok;
}

// Unmasked (query, key) pairs of a causal or column-bounds mask, for TFLOP/s
// on the unmasked area (the benchmark convention).
double unmasked_area(int s, bool causal, int cols, const std::vector<int32_t>& mask) {
  auto overlap = [](int a0, int a1, int b0, int b1) { return std::max(0, std::min(a1, b1) - std::max(a0, b0)); };
  double area = 0;
  for (int j = 0; j < s; ++j) {
    const int r0 = causal ? j : 0, r1 = s;
    if (cols == 0) {
      area += r1 - r0;
      continue;
    }
    const flashmask::ColumnBounds b = flashmask::load_column_bounds(mask.data() + size_t(j) * cols, cols, causal, s);
    // rows of [r0, r1) outside both masked intervals (inclusion-exclusion).
    area += (r1 - r0) - overlap(r0, r1, b.lts, b.lte) - overlap(r0, r1, b.uts, b.ute) +
            overlap(std::max(r0, b.lts), std::min(r1, b.lte), b.uts, b.ute);
  }
  return area;
}

// Set by --timeline in a FLASHMASK_EXP_TIMELINE build of the op (flashmask_launch.cuh);
// absent (null address) otherwise.
namespace flashmask {
namespace cuda {
extern unsigned long long* g_exp_timeline __attribute__((weak));
extern unsigned long long* g_exp_timeline_fwd __attribute__((weak));  // the FA2-class forward's
}  // namespace cuda
}  // namespace flashmask

// Timing masks at length s (B=1, Hm=1): random documents, sliding window 1024.
std::vector<int32_t> timing_docs(int s, std::mt19937& rng) {  // causal document, C=1
  std::vector<int32_t> m(s);
  std::uniform_int_distribution<int> len(256, std::max(257, s / 3));
  for (int start = 0; start < s;) {
    const int end = std::min(s, start + len(rng));
    for (int j = start; j < end; ++j) m[j] = end;
    start = end;
  }
  return m;
}
// Prefix-LM documents (not causal, C = 2: LTS = the document's end, UTE = its start for
// prefix columns and j after them): timing_docs's lengths, each with a prefix of a random
// share of it, as the benchmark's prefix_lm_document.
std::vector<int32_t> timing_prefix_lm_docs(int s, std::mt19937& rng) {
  const std::vector<int32_t> doc_end = timing_docs(s, rng);
  std::vector<int32_t> m(size_t(s) * 2);
  for (int start = 0; start < s;) {
    const int end = doc_end[start];
    const int prefix_end = start + std::uniform_int_distribution<int>(0, end - start)(rng);
    for (int j = start; j < end; ++j) {
      m[size_t(j) * 2] = end;
      m[size_t(j) * 2 + 1] = j < prefix_end ? start : j;
    }
    start = end;
  }
  return m;
}
std::vector<int32_t> timing_short_docs(int s, std::mt19937& rng) {  // documents of 128-512 tokens
  std::vector<int32_t> m(s);
  std::uniform_int_distribution<int> len(128, 512);
  for (int start = 0; start < s;) {
    const int end = std::min(s, start + len(rng));
    for (int j = start; j < end; ++j) m[j] = end;
    start = end;
  }
  return m;
}
std::vector<int32_t> timing_window(int s, int width = 1024) {  // causal, C=1: rows j .. j + width see key j
  std::vector<int32_t> m(s);
  for (int j = 0; j < s; ++j) m[j] = std::min(s, j + width + 1);
  return m;
}
std::vector<int32_t> fixed_docs(int s, int len) {  // causal documents of `len` tokens each
  std::vector<int32_t> m(s);
  for (int j = 0; j < s; ++j) m[j] = std::min(s, (j / len + 1) * len);
  return m;
}

// Timing runs' backward grouping (time_case): HARNESS_BWD_HEAD_GROUP and
// HARNESS_BWD_GROUP_MAX_STEPS, where set, replace the plan's defaults, so
// that one binary times several settings (fa2_steps.sh variant `env` files).
int harness_env_int(const char* name, int unset) {
  const char* env = std::getenv(name);
  return env != nullptr && *env != '\0' ? std::atoi(env) : unset;
}

// Timing modes' kv heads of their 32 query heads: FLASHMASK_HARNESS_HEADS_K
// (8 unset; 32: MHA), or 0 after saying why where it does not divide 32.
int timing_kv_heads(const std::string& mode) {
  const int hk = harness_env_int("FLASHMASK_HARNESS_HEADS_K", 8);
  if (hk >= 1 && 32 % hk == 0) return hk;
  std::printf("%s: FLASHMASK_HARNESS_HEADS_K must divide 32, got %d\n", mode.c_str(), hk);
  return 0;
}

// --time-fwd: time_case times the forward alone (the backward's columns print 0).
bool g_forward_only = false;

// The sm90 backward's CTA order (sm90/bwd_cta_order.cuh) as the last
// backward left it in the workspace, checked on the host: per (batch, GQA
// group) stretch the working slots first, sorted (short calls) by the class
// of their capped work, heaviest first, ties in the group's grid order (its
// heads in fitted_head_of's row order, key blocks fastest), then the idle
// ones; the chains (slots past bwd_chain_threshold's steps) of every stretch
// in front of all stretches, in stretch order. An unsorted order without
// chains is the grid's own.
// Returns the number of places that fail (a bad order would leave key blocks
// out or run them twice; time_case exits on any).
int check_cta_order(const BwdParams& b) {
  const int32_t* order_dev = flashmask::cuda::bwd_cta_order(b);
  const bool sorted = flashmask::sm90::bwd_cta_ordered(b), chains = flashmask::sm90::bwd_chains_first(b);
  if (order_dev == nullptr || !(sorted || chains)) return 0;
  const int hg = b.bwd_head_group, groups = b.num_heads / hg;
  const int key_block = flashmask::cuda::dkv_block(b.head_dim);
  const int blocks = (b.seqlen_k + key_block - 1) / key_block;
  const int64_t slots = int64_t(b.batch) * b.num_heads * blocks, items = int64_t(b.batch) * groups * blocks;
  std::vector<int32_t> order(slots), counts(items), live(items);
  CHECK(cudaMemcpy(order.data(), order_dev, slots * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(counts.data(), flashmask::cuda::fitted_head_counts(b), items * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(live.data(), flashmask::cuda::bwd_live_block_counts(b), items * 4, cudaMemcpyDeviceToHost));
  const int cap = sorted ? flashmask::sm90::bwd_cta_order_cap(b) : 0;
  const int classes = flashmask::sm90::bwd_cta_order_classes();
  int64_t threshold = INT64_MAX;
  if (chains) {
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    int64_t total = 0;
    for (int64_t at = 0; at < items; ++at) total += int64_t(hg) * live[at];
    threshold = flashmask::sm90::bwd_chain_threshold(total, sms);
  }
  auto head_of_row = [&](int y) {  // fitted_head_of
    const int g = y % groups, rank = y / groups;
    int j = rank;
    if ((hg & (hg - 1)) == 0) {
      j = 0;
      for (int bit = 1, r = rank; bit < hg; bit <<= 1, r >>= 1) j = j * 2 + (r & 1);
    }
    return g * hg + j;
  };
  std::vector<int32_t> front, rest;  // the chains, then the stretches short of them
  for (int batch = 0; batch < b.batch; ++batch) {
    for (int g = 0; g < groups; ++g) {
      // The stretch: the group's slots in grid order, stably sorted.
      std::vector<std::pair<int, int32_t>> expect;  // (key: chain, -capped work, idle last; slot)
      for (int rank = 0; rank < hg; ++rank) {
        const int head = head_of_row(rank * groups + g);
        for (int n = 0; n < blocks; ++n) {
          const int64_t at = (int64_t(batch) * groups + g) * blocks + n;
          const int heads = counts[at];
          const bool idle = head % heads != 0;
          const bool chain = !idle && int64_t(heads) * live[at] > threshold;
          const int64_t steps = std::min(heads * live[at], cap);
          const int key = idle ? 1 : chain ? -(1 << 20) : -int(steps * classes / (cap + 1));
          expect.push_back({key, int32_t((int64_t(batch) * b.num_heads + head) * blocks + n)});
        }
      }
      std::stable_sort(expect.begin(), expect.end(), [](auto& x, auto& y) { return x.first < y.first; });
      for (auto& e : expect) (e.first == -(1 << 20) ? front : rest).push_back(e.second);
    }
  }
  std::vector<int32_t> expected;
  if (!sorted && front.empty()) {  // the grid's own order: key blocks fastest, rows, batch
    for (int64_t i = 0; i < slots; ++i) {
      const int n = int(i % blocks), row = int(i / blocks % b.num_heads), batch = int(i / blocks / b.num_heads);
      expected.push_back(int32_t((int64_t(batch) * b.num_heads + head_of_row(row)) * blocks + n));
    }
  } else {
    expected = front;
    expected.insert(expected.end(), rest.begin(), rest.end());
  }
  int failed = 0;
  for (int64_t i = 0; i < slots; ++i) {
    if (order[i] != expected[i]) {
      if (failed < 3) std::printf("cta order: place %lld: slot %d, expected %d\n", (long long)i, order[i],
                                  expected[i]);
      ++failed;
    }
  }
  if (chains) std::printf("cta order: %zu chain slots (threshold %lld steps)%s\n", front.size(), (long long)threshold,
                          failed ? "" : ", order as expected");
  return failed;
}

// Median of 6 timings (ms) of fwd and bwd, B=1, causal, optional C=1 mask.
void time_case(const char* name, int s, int h, int hk, int d, GpuKernel kernel, std::mt19937& rng,
               const std::vector<int32_t>& mask = {}, bool deterministic = false, int head_group = 0,
               int max_steps = -1, bool causal = true, int cols = 1) {
  const int dv = paired_value_dim(d);
  Case c{name, 1, s, s, h, hk, d, causal, 0, nullptr, dv};
  const size_t nq = size_t(s) * h * d, nk = size_t(s) * hk * d, nv = size_t(s) * hk * dv, no = size_t(s) * h * dv;
  Buffers q = device_random_buffer(nq, rng), k = device_random_buffer(nk, rng), v = device_random_buffer(nv, rng),
          dout = device_random_buffer(no, rng);
  FwdParams p;
  fill_params(p, c);
  p.dtype = DType::kBFloat16, p.gpu_kernel = kernel;
  p.q = q.dev, p.k = k.dev, p.v = v.dev;
  int32_t *dmask = nullptr, *bounds = nullptr;
  if (!mask.empty()) {
    CHECK(cudaMalloc(&dmask, mask.size() * 4));
    CHECK(cudaMemcpy(dmask, mask.data(), mask.size() * 4, cudaMemcpyHostToDevice));
    p.mask.startend_row_indices = dmask;
    p.mask.num_cols = cols, p.mask.num_heads = 1, p.mask.col_stride = cols;
    p.mask.head_stride = p.mask.batch_stride = int64_t(s) * cols;
  }
  CHECK(cudaMalloc(&bounds, flashmask::block_bounds_elems(p) * 4));
  p.block_bounds = bounds;
  __nv_bfloat16 *o, *dq, *dk, *dv_grad;
  float *lse, *dqa, *dka, *dva, *delta;
  CHECK(cudaMalloc(&o, no * 2));
  CHECK(cudaMalloc(&lse, size_t(h) * s * 4));
  CHECK(cudaMalloc(&dq, nq * 2));
  CHECK(cudaMalloc(&dk, nk * 2));
  CHECK(cudaMalloc(&dv_grad, nv * 2));
  p.out = o, p.softmax_lse = lse;
  BwdParams b;
  static_cast<FwdParams&>(b) = p;
  set_bwd_strides(b);
  b.deterministic = deterministic;
  b.dout = dout.dev;
  flashmask::plan_bwd_cuda(b, head_group ? head_group : harness_env_int("HARNESS_BWD_HEAD_GROUP", 0),
                          max_steps >= 0 ? max_steps : harness_env_int("HARNESS_BWD_GROUP_MAX_STEPS", -1));
  CHECK(cudaMalloc(&dqa, flashmask::bwd_dq_accum_elems(b) * 4));
  dka = dva = nullptr;
  if (!b.dkv_direct) {  // the fp32 slots; none where the kernel stores dK/dV itself (the op alike)
    CHECK(cudaMalloc(&dka, size_t(s) * b.accum_heads_k * d * 4));
    CHECK(cudaMalloc(&dva, size_t(s) * b.accum_heads_k * dv * 4));
  }
  CHECK(cudaMalloc(&delta, size_t(h) * s * 4));
  float* row_stats = nullptr;
  if (const int64_t n = flashmask::bwd_row_stats_elems(b)) CHECK(cudaMalloc(&row_stats, n * 4));
  void *dk_heads = nullptr, *dv_heads = nullptr;  // 16-bit, dkv_direct with GQA
  if (const int64_t n = flashmask::bwd_dkv_heads_elems(b, false)) CHECK(cudaMalloc(&dk_heads, n * 2));
  if (const int64_t n = flashmask::bwd_dkv_heads_elems(b, true)) CHECK(cudaMalloc(&dv_heads, n * 2));
  b.dout = dout.dev, b.dq = dq, b.dk = dk, b.dv = dv_grad, b.dq_accum = dqa, b.dk_accum = dka,
  b.dv_accum = dva, b.softmax_d = delta, b.row_stats = row_stats, b.dk_heads = dk_heads, b.dv_heads = dv_heads;
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  auto median_ms = [&](auto fn) {
    std::vector<float> t;
    for (int i = 0; i < 7; ++i) {
      CHECK(cudaEventRecord(e0, g_stream));
      fn();
      CHECK(cudaEventRecord(e1, g_stream));
      CHECK(cudaEventSynchronize(e1));
      float ms;
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (i > 0) t.push_back(ms);  // first run warms up
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const float fwd = median_ms([&] { flashmask::run_fwd_cuda(p, g_stream); });
  const float bwd = g_forward_only ? 0.f : median_ms([&] { flashmask::run_bwd_cuda(b, g_stream); });
  if (!g_forward_only && kernel == GpuKernel::kSm90 && check_cta_order(b) != 0) {
    std::printf("FAILED: %s %d: the sm90 backward's CTA order\n", name, s);
    std::exit(3);
  }
  // Zeroing, delta and the fp32 -> bf16 conversion: the part of bwd outside
  // the main kernel (and the mask summary). The sm90 backward converts dQ,
  // and under fitted grouping (its default) dK/dV, in its own finish kernel
  // (sm90 launch_finish), so there this is zeroing and delta only.
  const float around = g_forward_only ? 0.f
                                      : median_ms([&] { flashmask::cuda::bwd_prepare(b, g_stream); }) +
                                            median_ms([&] { flashmask::cuda::bwd_finish(b, g_stream); });
  // QK^T and PV: 2 x area x H x (D + Dv) (4 x area x H x D when Dv = D).
  const double flops = 2.0 * unmasked_area(s, causal, mask.empty() ? 0 : cols, mask) * h * (d + dv);
  std::printf("| %s%s | %s | %d | %d:%d | %d/%d | %d/%d | %.3f | %.1f | %.3f | %.1f | %.1f | %.3f |\n",
              kernel == GpuKernel::kSm90 ? "sm90" : "fa2", deterministic ? " det" : "", name, s, h, hk, d, dv,
              b.bwd_head_group, b.bwd_group_max_steps,
              fwd, flops / fwd / 1e9, bwd, 2.5 * flops / bwd / 1e9, 3.5 * flops / (fwd + bwd) / 1e9, around);
  for (void* ptr : {(void*)q.dev, (void*)k.dev, (void*)v.dev, (void*)dout.dev, (void*)o, (void*)lse,
                    (void*)dq, (void*)dk, (void*)dv_grad, (void*)dqa, (void*)dka, (void*)dva, (void*)delta,
                    (void*)dmask, (void*)bounds, (void*)row_stats, dk_heads, dv_heads})
    if (ptr) CHECK(cudaFree(ptr));
}

// The sm90 kernels at head dim d (value: paired_value_dim), bf16, 32:8, at 8K
// and 32K: causal, causal document, 128-512-token documents (with short_docs)
// and sliding window. --time-hd's timings, and --time-split-bwd's without the
// short documents; the same mask instances either way (documents drawn first).
void time_head_dim_masks(int d, bool short_docs, std::mt19937& rng) {
  for (int s : {8192, 32768}) {
    std::mt19937 mask_rng(s);
    const std::vector<int32_t> docs = timing_docs(s, mask_rng);
    time_case("causal", s, 32, 8, d, GpuKernel::kSm90, rng);
    time_case("causal_document", s, 32, 8, d, GpuKernel::kSm90, rng, docs);
    if (short_docs) time_case("short_documents", s, 32, 8, d, GpuKernel::kSm90, rng, timing_short_docs(s, mask_rng));
    time_case("sliding_window", s, 32, 8, d, GpuKernel::kSm90, rng, timing_window(s));
  }
}

// One case, the backward once per divisor of the GQA group as its query heads
// per CTA: every key block grouped alike (0; the sm90 kernels only), and
// fitted per key block: 12 steps mixes grouped and one-head key blocks in
// these small cases; -1 is the default (every key block of these fits in 80).
// Returns the failures.
int check_head_groups(const Case& c, GpuKernel kernel, bool deterministic, std::mt19937& rng) {
  int failures = 0;
  const int group = c.h / c.hk;
  for (int hg = 1; hg <= group; ++hg) {
    if (group % hg != 0) continue;
    for (int steps : {0, 12, -1}) {
      if (steps != 0 && (deterministic || hg == 1)) continue;  // the plan ignores them there
      if (steps == 0 && hg > 1 && kernel == GpuKernel::kFA2) continue;  // FA2-class groups are fitted only
      failures += !check_case(c, kernel, deterministic, hg, steps, rng);
    }
  }
  return failures;
}


// --mma-peak: the mma.sync rate (m16n8k16, fp32 accumulate) with nothing else
// in the loop, the ceiling of the FA2-class kernels (the A100 estimate in
// NOTES.md divides by it). 8 independent accumulator chains per warp (the
// HMMA latency hidden within the warp too), operands in registers.
template <bool kBf16>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}
constexpr int kPeakChains = 8, kPeakThreads = 128;
template <bool kBf16>
__global__ void __launch_bounds__(kPeakThreads) mma_peak_kernel(int iters, int write, float* out, long long* cycles) {
  // Operands from the thread index (small values, no overflow): nothing to fold.
  const uint32_t base = kBf16 ? 0x3b003b00u : 0x1c001c00u, t = threadIdx.x & 3;
  const uint32_t a[4] = {base | t, base | (t ^ 1), base | (t ^ 2), base | (t ^ 3)}, b[2] = {base | (t << 16), base};
  float c[kPeakChains][4] = {};
  const long long t0 = clock64();
#pragma unroll 4
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int j = 0; j < kPeakChains; ++j) mma_16816<kBf16>(c[j], a, b);
  }
  const long long t1 = clock64();
  // write is 0 at run time, unknown at compile time: the chains stay live.
  if (write) {
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kPeakChains; ++j) sum += c[j][0] + c[j][1] + c[j][2] + c[j][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *cycles = t1 - t0;
}

// About `ms` of mma.sync at 4 CTAs per SM: the clocks out of idle before a
// timing (--mma-peak, --time-fa2).
void warm_up_gpu(float ms) {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float* out;
  long long* cycles;
  CHECK(cudaMalloc(&out, size_t(4) * sms * kPeakThreads * 4));
  CHECK(cudaMalloc(&cycles, 8));
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::duration<float, std::milli>(std::chrono::steady_clock::now() - start).count() < ms) {
    mma_peak_kernel<true><<<4 * sms, kPeakThreads>>>(1 << 14, 0, out, cycles);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
  }
  CHECK(cudaFree(out));
  CHECK(cudaFree(cycles));
}

// Best of 3 timed launches after one warm-up, at 1-8 CTAs of 4 warps per SM
// (all resident: one wave); the SM clock during the run from block 0's
// clock64() span over the event time.
template <bool kBf16>
double mma_peak(int sms, const char* name) {
  const int iters = 1 << 17;
  float* out;
  long long* cycles;
  CHECK(cudaMalloc(&out, size_t(8) * sms * kPeakThreads * 4));
  CHECK(cudaMalloc(&cycles, 8));
  int resident = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, mma_peak_kernel<kBf16>, kPeakThreads, 0));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  double best = 0;
  for (int per_sm : {1, 2, 4, 8}) {
    if (per_sm > resident) continue;
    const int grid = per_sm * sms;
    float best_ms = 1e30f;
    long long best_cycles = 0;
    for (int i = 0; i < 4; ++i) {
      CHECK(cudaEventRecord(e0));
      mma_peak_kernel<kBf16><<<grid, kPeakThreads>>>(iters, 0, out, cycles);
      CHECK(cudaGetLastError());
      CHECK(cudaEventRecord(e1));
      CHECK(cudaEventSynchronize(e1));
      float ms;
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      long long cyc;
      CHECK(cudaMemcpy(&cyc, cycles, 8, cudaMemcpyDeviceToHost));
      if (i > 0 && ms < best_ms) best_ms = ms, best_cycles = cyc;  // first launch warms up
    }
    const double flops = double(grid) * (kPeakThreads / 32) * iters * kPeakChains * (2.0 * 16 * 8 * 16);
    const double tflops = flops / best_ms / 1e9, mhz = best_cycles / (best_ms * 1e3);
    best = std::max(best, tflops);
    std::printf("| %s | %d | %.3f | %.1f | %.0f | %.0f |\n", name, per_sm, best_ms, tflops, mhz,
                tflops * 1e12 / (sms * mhz * 1e6));
  }
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  CHECK(cudaFree(out));
  CHECK(cudaFree(cycles));
  return best;
}

// The table time_case's rows belong to (--time, --time-hd256, --time-hd192, --time-hd96).
void print_time_header() {
  std::printf("| kernel | mask | S | H:Hk | D/Dv | bwd heads/CTA / max steps | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | fwd+bwd TFLOP/s | bwd prep+finish ms |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
}

int main(int argc, char** argv) {
  CHECK(cudaStreamCreate(&g_stream));
  const bool timing = argc > 1 && std::string(argv[1]) == "--time";
  // --time-fwd: the sm90 forward's schedules (sm90_launch.cuh reads them
  // from the environment at each launch): the default (intra-warpgroup
  // overlap, a GQA group's heads side by side), the same with one head's
  // query blocks side by side, the serial loop and pingpong, checked on every
  // case, then all but pingpong (slower, NOTES.md v8a/v11) timed interleaved,
  // case by case, so that clock drift hits all alike.
  const bool time_fwd = argc > 1 && std::string(argv[1]) == "--time-fwd";
  // --time-hd256, --time-hd192 (value 128), --time-hd96: a head dim of the
  // Hopper kernels beside 64/128 (non-deterministic backward): its cases checked, then
  // causal, causal document, 128-512-token documents and sliding window at 8K
  // and 32K timed (bf16, 32:8 heads), and the backward's head grouping.
  const std::string mode = argc > 1 ? argv[1] : "";
  auto mode_head_dim = [&](const char* prefix) {
    for (int d : {80, 96, 192, 256}) {
      if (mode == prefix + std::to_string(d)) return d;
    }
    return 0;
  };
  const int time_hd = mode_head_dim("--time-hd");
  // --check-hd256, --check-hd192, --check-hd96: that head dim's cases once
  // each (default grouping) and a case of about 4 tiles per CTA, nothing
  // timed: small enough for compute-sanitizer.
  const int check_hd = mode_head_dim("--check-hd");
  struct Schedule {
    const char* name;
    const char* overlap;
    const char* pingpong;
    const char* gqa_tiles;
  };
  const Schedule schedules[] = {{"default", "1", "0", "1"},
                                {"head_tiles", "1", "0", "0"},
                                {"serial", "0", "0", "1"},
                                {"pingpong", "0", "1", "1"}};
  const int timed_schedules = 3;
  auto use_schedule = [](const Schedule& sc) {
    setenv("PADDLE_FLASHMASK_SM90_FWD_OVERLAP", sc.overlap, 1);
    setenv("PADDLE_FLASHMASK_SM90_FWD_PINGPONG", sc.pingpong, 1);
    setenv("PADDLE_FLASHMASK_SM90_FWD_GQA_TILES", sc.gqa_tiles, 1);
  };
  std::mt19937 rng(1234);
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
#ifdef FLASHMASK_HARNESS_VARIANT
  std::printf("# %s, cc %d.%d, variant %s\n", prop.name, prop.major, prop.minor, FLASHMASK_HARNESS_VARIANT);
#else
  std::printf("# %s, cc %d.%d\n", prop.name, prop.major, prop.minor);
#endif
  if (mode == "--mma-peak") {
    int sms = 0, clock_khz = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    std::printf("| mma.sync m16n8k16, f32 accumulate | CTAs/SM (4 warps, %d chains each) | ms | TFLOP/s | SM MHz (clock64 / time) | flop/clk/SM |\n"
                "|---|---|---|---|---|---|\n",
                kPeakChains);
    warm_up_gpu(300.f);
    const double bf16 = mma_peak<true>(sms, "bf16"), fp16 = mma_peak<false>(sms, "fp16");
    std::printf("mma_peak: bf16 %.1f TFLOP/s, fp16 %.1f TFLOP/s; %d SMs, cudaDevAttrClockRate %d kHz\n", bf16, fp16,
                sms, clock_khz);
    return 0;
  }
  // --time-fa2: the FA2-class kernels' timings (bf16, 32:8 heads), nothing
  // checked (--check-fa2 does that): causal at 8K and 16K for head dims 64, 80,
  // 96, 128 and 256; causal document, sliding window and short documents at 8K and
  // 32K (D=128; the masks of --time-hd256); deterministic causal 16K.
  // --timeline: a build with -DFLASHMASK_EXP_TIMELINE (build_variant.sh with
  // EXTRA_NVCC_FLAGS and EXTRA_SM90_NVCC_FLAGS) records, for each CTA of the
  // FA2-class staged backward and of the sm90 backward, and of the FA2-class
  // forward, its SM, globaltimer at entry and clock64 at entry, at its first
  // step, after its loop and at exit, and its steps: printed as "tl," lines per
  // case (the last of time_case's runs; the forward's as case "fa2fwd_<mask>"),
  // for an offline look at where a CTA's time goes.
  if (mode == "--timeline") {
    if (&flashmask::cuda::g_exp_timeline == nullptr) {
      std::printf("--timeline: not a FLASHMASK_EXP_TIMELINE build\n");
      return 1;
    }
    constexpr size_t kRecords = size_t(1) << 20;
    unsigned long long *records, *fwd_records;
    CHECK(cudaMalloc(&records, kRecords * 8 * sizeof(unsigned long long)));
    CHECK(cudaMalloc(&fwd_records, kRecords * 8 * sizeof(unsigned long long)));
    std::vector<unsigned long long> host(kRecords * 8);
    auto print_records = [&](const unsigned long long* device, const std::string& name) {
      CHECK(cudaMemcpy(host.data(), device, host.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < kRecords; ++i) {
        const unsigned long long* r = &host[i * 8];
        if (r[1] == 0) continue;
        std::printf("tl,%s,%zu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu\n", name.c_str(), i, r[0], r[1], r[2],
                    r[3], r[4], r[5], r[6], r[7] >> 32, r[7] & 0xffffffffull);
      }
    };
    warm_up_gpu(300.f);
    print_time_header();
    auto run = [&](const char* name, int s, const std::vector<int32_t>& mask, GpuKernel kernel) {
      CHECK(cudaMemset(records, 0, kRecords * 8 * sizeof(unsigned long long)));
      CHECK(cudaMemset(fwd_records, 0, kRecords * 8 * sizeof(unsigned long long)));
      flashmask::cuda::g_exp_timeline = records;
      if (&flashmask::cuda::g_exp_timeline_fwd != nullptr) flashmask::cuda::g_exp_timeline_fwd = fwd_records;
      time_case(name, s, 32, 8, 128, kernel, rng, mask);
      flashmask::cuda::g_exp_timeline = nullptr;
      if (&flashmask::cuda::g_exp_timeline_fwd != nullptr) flashmask::cuda::g_exp_timeline_fwd = nullptr;
      const std::string family = kernel == GpuKernel::kSm90 ? "sm90" : "fa2";
      print_records(records, family + "_" + name);
      if (kernel == GpuKernel::kFA2) print_records(fwd_records, "fa2fwd_" + std::string(name));
    };
    for (GpuKernel kernel : {GpuKernel::kFA2, GpuKernel::kSm90}) {
      std::mt19937 mask_rng(8192);
      run("window128", 16384, timing_window(16384, 128), kernel);
      run("window1024", 16384, timing_window(16384, 1024), kernel);
      run("docs512", 16384, fixed_docs(16384, 512), kernel);
      run("causal", 16384, {}, kernel);
      run("causal8k", 8192, {}, kernel);
      run("window1024_8k", 8192, timing_window(8192, 1024), kernel);
      run("causal_document", 8192, timing_docs(8192, mask_rng), kernel);
      run("short_documents", 8192, timing_short_docs(8192, mask_rng), kernel);
    }
    CHECK(cudaFree(records));
    CHECK(cudaFree(fwd_records));
    return 0;
  }
  // --time-list-sweep: what a CTA costs beyond its live steps. Sliding windows
  // and documents of one length (16K, 32:8, D=128), both kernel families: the
  // main kernel's time (bwd minus prep+finish) against the live tiles, fitted
  // afterwards as a fixed cost a CTA plus a cost a live step.
  if (mode == "--time-list-sweep") {
    warm_up_gpu(300.f);
    print_time_header();
    for (GpuKernel kernel : {GpuKernel::kFA2, GpuKernel::kSm90}) {
      for (int w : {128, 256, 512, 1024, 2048, 4096})
        time_case(("window" + std::to_string(w)).c_str(), 16384, 32, 8, 128, kernel, rng, timing_window(16384, w));
      for (int len : {256, 512, 1024, 2048, 4096})
        time_case(("docs" + std::to_string(len)).c_str(), 16384, 32, 8, 128, kernel, rng, fixed_docs(16384, len));
      time_case("causal", 16384, 32, 8, 128, kernel, rng);
    }
    return 0;
  }
  if (mode == "--time-fa2") {
    const int hk = timing_kv_heads(mode);  // 32 query heads over hk
    if (hk == 0) return 2;
    warm_up_gpu(300.f);
    print_time_header();
    for (int d : {64, 80, 96, 128, 256}) {
      if (split_bwd_skips(d)) continue;  // as --check-fa2
      for (int s : {8192, 16384}) time_case("causal", s, 32, hk, d, GpuKernel::kFA2, rng);
    }
    for (int s : {8192, 32768}) {
      std::mt19937 mask_rng(s);
      const std::vector<int32_t> docs = timing_docs(s, mask_rng), short_docs = timing_short_docs(s, mask_rng),
                                 window = timing_window(s);
      time_case("causal_document", s, 32, hk, 128, GpuKernel::kFA2, rng, docs);
      time_case("sliding_window", s, 32, hk, 128, GpuKernel::kFA2, rng, window);
      time_case("short_documents", s, 32, hk, 128, GpuKernel::kFA2, rng, short_docs);
    }
    time_case("causal", 16384, 32, hk, 128, GpuKernel::kFA2, rng, {}, true);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--profile") {
    // Only causal document, then sliding window, at 8K (sm90, defaults): for
    // Nsight Compute, each kernel launched 7 times per case.
    std::mt19937 mask_rng(8192);
    time_case("causal_document", 8192, 32, 8, 128, GpuKernel::kSm90, rng, timing_docs(8192, mask_rng));
    time_case("sliding_window", 8192, 32, 8, 128, GpuKernel::kSm90, rng, timing_window(8192));
    return 0;
  }
  if (mode == "--time-fwd-masks" || mode == "--time-bwd-masks") {
    // For A/B calls that run several variants' binaries back to back, the sm90
    // kernels (defaults, bf16, 32:8 unless said): D=128 causal at 8K/16K/32K and the masks
    // with short live lists at 8K and 32K, and full (no mask, not causal: the
    // issue's 650 target) at each length; prefix-LM documents (not causal, C = 2)
    // at 8K and 32K. --time-fwd-masks times the forward
    // alone; --time-bwd-masks (a backward change) both passes, then causal,
    // causal document and sliding window at 8K for head dims 64 and 256.
    const int hk = timing_kv_heads(mode);  // 32 query heads over hk
    if (hk == 0) return 2;
    const bool backward = mode == "--time-bwd-masks";
    g_forward_only = !backward;
    print_time_header();
    for (int s : {8192, 16384, 32768}) {
      std::mt19937 mask_rng(s);
      const std::vector<int32_t> docs = timing_docs(s, mask_rng), short_docs = timing_short_docs(s, mask_rng),
                                 window = timing_window(s);
      time_case("causal", s, 32, hk, 128, GpuKernel::kSm90, rng);
      time_case("full", s, 32, hk, 128, GpuKernel::kSm90, rng, {}, false, 0, -1, /*causal=*/false);
      if (s == 16384) continue;
      time_case("causal_document", s, 32, hk, 128, GpuKernel::kSm90, rng, docs);
      time_case("short_documents", s, 32, hk, 128, GpuKernel::kSm90, rng, short_docs);
      time_case("sliding_window", s, 32, hk, 128, GpuKernel::kSm90, rng, window);
      // Prefix-LM documents, then the same documents causal two ways: causal with C = 1,
      // and not causal with C = 2 (UTE = j: the same mask through the non-causal path).
      const std::vector<int32_t> prefix_lm = timing_prefix_lm_docs(s, mask_rng);
      std::vector<int32_t> same_docs(s), same_docs_noncausal(prefix_lm);
      for (int j = 0; j < s; ++j) same_docs[j] = prefix_lm[size_t(j) * 2], same_docs_noncausal[size_t(j) * 2 + 1] = j;
      time_case("prefix_lm_document", s, 32, hk, 128, GpuKernel::kSm90, rng, prefix_lm, false, 0, -1,
                /*causal=*/false, /*cols=*/2);
      time_case("its_docs_causal", s, 32, hk, 128, GpuKernel::kSm90, rng, same_docs);
      time_case("its_docs_noncausal", s, 32, hk, 128, GpuKernel::kSm90, rng, same_docs_noncausal, false, 0, -1,
                /*causal=*/false, /*cols=*/2);
    }
    if (backward) {
      std::mt19937 mask_rng(8192);
      const std::vector<int32_t> docs = timing_docs(8192, mask_rng), window = timing_window(8192);
      for (int d : {64, 256}) {
        time_case("causal", 8192, 32, hk, d, GpuKernel::kSm90, rng);
        time_case("causal_document", 8192, 32, hk, d, GpuKernel::kSm90, rng, docs);
        time_case("sliding_window", 8192, 32, hk, d, GpuKernel::kSm90, rng, window);
      }
    }
    return 0;
  }
  if (mode == "--time-split-bwd") {
    // For A/B calls on the backward of the split head dims (256, 192/128;
    // BwdTraits::kSplitHeadDim): causal, causal document and sliding window at
    // 8K and 32K (sm90, bf16, 32:8), forward and backward.
    // FLASHMASK_HARNESS_SPLIT_DIM=256 or 192: that head dim alone.
    const int only = harness_env_int("FLASHMASK_HARNESS_SPLIT_DIM", -1);  // -1: unset, both
    print_time_header();
    for (int d : {256, 192}) {
      if (only == -1 || only == d) time_head_dim_masks(d, /*short_docs=*/false, rng);
    }
    return 0;
  }
  if (mode == "--time-mask-file") {
    // One mask of the Paddle benchmark, as it builds it (benchmarks/mask_area.py's
    // bench_mask, saved as raw int32 [S, C] by benchmarks/device/dump_bench_masks.py),
    // or of benchmarks/bench_fa2_masks.py (the instances FlashAttention-2 runs as varlen
    // documents and local windows):
    //   --time-mask-file FILE S C CAUSAL(0/1) NAME [sm90|fa2]
    // timed like --time-bwd-masks' rows (bf16, 32:8 unless FLASHMASK_HARNESS_KV_HEADS, D=128;
    // the Hopper kernels unless fa2 is named), so a figure of the op's benchmark, or of a peer, can be set beside
    // the bare kernel's on the very same mask. FILE "-" is no mask (plain causal or full).
    if (argc != 7 && argc != 8) {
      std::printf("usage: --time-mask-file FILE S C CAUSAL NAME [sm90|fa2]\n");
      return 2;
    }
    const std::string family = argc == 8 ? argv[7] : "sm90";
    if (family != "sm90" && family != "fa2") {
      std::printf("--time-mask-file: kernel family must be sm90 or fa2, got %s\n", family.c_str());
      return 2;
    }
    const int s = std::atoi(argv[3]), cols = std::atoi(argv[4]);
    const bool causal = std::atoi(argv[5]) != 0;
    std::vector<int32_t> mask;
    if (std::string(argv[2]) != "-") {
      mask.resize(size_t(s) * cols);
      FILE* f = std::fopen(argv[2], "rb");
      const bool read = f != nullptr && std::fread(mask.data(), 4, mask.size(), f) == mask.size();
      if (f != nullptr) std::fclose(f);
      if (!read) {
        std::printf("--time-mask-file: cannot read %zu int32 from %s\n", mask.size(), argv[2]);
        return 2;
      }
    }
    // FLASHMASK_HARNESS_DIM: another head dim than 128 (both families' head dims), for profiles
    // of one head dim beside FA2's (benchmarks/device/ncu_fa2_peer.sh).
    const char* dim_env = std::getenv("FLASHMASK_HARNESS_DIM");
    const int dim = dim_env != nullptr && *dim_env != '\0' ? std::atoi(dim_env) : 128;
    if (dim != 64 && dim != 96 && dim != 128 && dim != 256) {
      std::printf("--time-mask-file: FLASHMASK_HARNESS_DIM must be 64, 96, 128 or 256, got %s\n", dim_env);
      return 2;
    }
    // FLASHMASK_HARNESS_KV_HEADS: the kv heads of the 32 query heads (default 8), for GQA
    // groups other than 4 (the FA2-class backward's dK/dV store rule depends on the group).
    const char* kv_env = std::getenv("FLASHMASK_HARNESS_KV_HEADS");
    const int hk = kv_env != nullptr && *kv_env != '\0' ? std::atoi(kv_env) : 8;
    if (hk < 1 || hk > 32 || 32 % hk != 0) {
      std::printf("--time-mask-file: FLASHMASK_HARNESS_KV_HEADS must divide 32, got %s\n", kv_env);
      return 2;
    }
    print_time_header();
    time_case(argv[6], s, 32, hk, dim, family == "fa2" ? GpuKernel::kFA2 : GpuKernel::kSm90, rng, mask, false, 0,
              -1, causal, cols);
    return 0;
  }
  if (mode == "--profile-32k") {
    // One 32K case (sm90, D=128, defaults) for Nsight Compute, the case named
    // by the next argument: short_documents (128-512 tokens) or sliding_window.
    const std::string which = argc > 2 ? argv[2] : "short_documents";
    std::mt19937 mask_rng(32768);
    const std::vector<int32_t> mask = which == "sliding_window" ? timing_window(32768)
                                                                : timing_short_docs(32768, mask_rng);
    time_case(which.c_str(), 32768, 32, 8, 128, GpuKernel::kSm90, rng, mask);
    return 0;
  }
  const Case cases[] = {
      {"causal", 1, 1000, 1000, 4, 2, 128, true, 0, nullptr},
      {"none", 2, 77, 77, 2, 2, 64, false, 0, nullptr},
      {"causal_sq<sk", 1, 300, 517, 4, 1, 128, true, 0, nullptr},
      {"causal_doc", 2, 1000, 1000, 4, 4, 128, true, 1, doc_mask},
      {"causal_doc", 1, 777, 777, 2, 1, 64, true, 1, doc_mask},
      {"window128", 1, 1000, 1000, 4, 2, 128, true, 2, window_mask},
      {"random4+empty", 1, 333, 333, 4, 4, 128, false, 4, random4_mask},
      {"random4+empty", 1, 1024, 1024, 2, 1, 64, false, 4, random4_mask},
      // No mask at head dim 128: the Hopper forward's 176-key tiles, a ragged last key
      // block (517 = 2 x 176 + 165) and one without (1056 = 6 x 176).
      {"none", 2, 300, 517, 4, 2, 128, false, 0, nullptr},
      {"none", 1, 1000, 1056, 4, 1, 128, false, 0, nullptr},
  };
  // Head dim 96 on the FA2-class kernels (the Hopper forward's are in sm90_only_cases),
  // and at 64 (128-row backward steps) rows that end half-way into a step (300:
  // the last step's second 64-row block is past the padded rows) with Sq < Sk,
  // and a window with GQA.
  const Case fa2_only_cases[] = {
      {"causal_sq<sk", 1, 300, 517, 4, 1, 64, true, 0, nullptr},
      {"window128", 1, 1000, 1000, 4, 2, 64, true, 2, window_mask},
      {"causal", 1, 1000, 1000, 4, 2, 96, true, 0, nullptr},
      {"none", 2, 77, 77, 2, 2, 96, false, 0, nullptr},
      {"causal_doc", 1, 777, 777, 2, 1, 96, true, 1, doc_mask},
      {"random4+empty", 1, 333, 333, 4, 4, 96, false, 4, random4_mask},
      // Each partial-tile test of the kernels that take one a call (cuda/partial_test.cuh) at
      // head dims 64, 96 and 256: non-causal C = 2 (VisibleRows from UTE), and causal C = 4
      // (the column bounds: the op takes causal C = 1 or 2, the kernels any).
      {"bidir_window", 1, 1000, 1000, 4, 2, 64, false, 2, bidir_window_mask},
      {"bidir_window", 1, 777, 777, 2, 1, 96, false, 2, bidir_window_mask},
      {"bidir_window", 1, 333, 333, 2, 1, 256, false, 2, bidir_window_mask},
      {"bidir_window", 1, 1000, 1000, 4, 2, 128, false, 2, bidir_window_mask},
      {"causal_random4", 1, 1000, 1000, 4, 2, 64, true, 4, random4_mask},
      {"causal_random4", 1, 333, 333, 4, 4, 96, true, 4, random4_mask},
      {"causal_random4", 1, 333, 333, 2, 1, 256, true, 4, random4_mask},
      {"causal_random4", 1, 1000, 1000, 4, 2, 128, true, 4, random4_mask},
  };
  // Head dim 80, both families, on 96's tiles (TMA fills the Hopper tiles'
  // columns past 80, the FA2-class loads zero them; the stores leave them out):
  // GQA, ragged lengths, Sq < Sk, documents with B = 2 and B = 1, a window,
  // fully masked rows.
  const Case hd80_cases[] = {
      {"causal", 1, 1000, 1000, 4, 2, 80, true, 0, nullptr},
      {"causal_sq<sk", 1, 300, 517, 4, 1, 80, true, 0, nullptr},
      {"none", 2, 77, 77, 2, 2, 80, false, 0, nullptr},
      {"causal_doc", 2, 1000, 1000, 4, 2, 80, true, 1, doc_mask},
      {"causal_doc", 1, 777, 777, 2, 1, 80, true, 1, doc_mask},
      {"window128", 1, 1000, 1000, 4, 2, 80, true, 2, window_mask},
      {"random4+empty", 1, 333, 333, 4, 4, 80, false, 4, random4_mask},
  };
  // Head dims 80, 96, 256 and 192/128 (q, k / v; MLA) on the Hopper kernels (--check-hd,
  // --time-hd, the default run), non-deterministic: 192/128 has no
  // deterministic backward, and a deterministic 256 runs the FA2-class one
  // (fa2_hd256_cases). The D=128 cases of the list above, causal_doc with GQA.
  std::vector<Case> sm90_only_cases(std::begin(hd80_cases), std::end(hd80_cases));
  sm90_only_cases.insert(sm90_only_cases.end(), {
      {"causal", 1, 1000, 1000, 4, 2, 96, true, 0, nullptr},
      {"causal_sq<sk", 1, 300, 517, 4, 1, 96, true, 0, nullptr},
      {"causal_doc", 2, 1000, 1000, 4, 2, 96, true, 1, doc_mask},
      {"window128", 1, 1000, 1000, 4, 2, 96, true, 2, window_mask},
      {"random4+empty", 1, 333, 333, 4, 4, 96, false, 4, random4_mask},
      {"none", 2, 77, 77, 2, 2, 96, false, 0, nullptr},
      {"causal", 1, 1000, 1000, 4, 2, 256, true, 0, nullptr},
      {"causal_sq<sk", 1, 300, 517, 4, 1, 256, true, 0, nullptr},
      {"causal_doc", 2, 1000, 1000, 4, 2, 256, true, 1, doc_mask},
      {"window128", 1, 1000, 1000, 4, 2, 256, true, 2, window_mask},
      {"random4+empty", 1, 333, 333, 4, 4, 256, false, 4, random4_mask},
      {"causal", 1, 1000, 1000, 4, 2, 192, true, 0, nullptr, 128},
      {"causal_sq<sk", 1, 300, 517, 4, 1, 192, true, 0, nullptr, 128},
      {"causal_doc", 2, 1000, 1000, 4, 2, 192, true, 1, doc_mask, 128},
      {"window128", 1, 1000, 1000, 4, 2, 192, true, 2, window_mask, 128},
      {"random4+empty", 1, 333, 333, 4, 4, 192, false, 4, random4_mask, 128},
      {"none", 2, 77, 77, 2, 2, 192, false, 0, nullptr, 128},
  });
  // Head dim 32: the FA2-class kernels only (--check-fa2).
  const Case fa2_hd32_cases[] = {
      {"causal", 1, 1000, 1000, 4, 2, 32, true, 0, nullptr},
      {"none", 2, 77, 77, 2, 2, 32, false, 0, nullptr},
      {"causal_doc", 1, 777, 777, 2, 1, 32, true, 1, doc_mask},
      {"random4+empty", 1, 333, 333, 4, 4, 32, false, 4, random4_mask},
  };
  // Head dim 256 on the FA2-class kernels (--check-fa2 and the default run;
  // both backward modes, the deterministic one included): 64-key backward CTAs
  // and 32-key dQ-pass blocks, GQA, fully masked rows, ragged lengths.
  const Case fa2_hd256_cases[] = {
      {"causal", 1, 1000, 1000, 4, 2, 256, true, 0, nullptr},
      {"causal_sq<sk", 1, 300, 517, 4, 1, 256, true, 0, nullptr},
      {"causal_doc", 1, 777, 777, 2, 1, 256, true, 1, doc_mask},
      {"random4+empty", 1, 333, 333, 4, 4, 256, false, 4, random4_mask},
  };
  int failures = 0;
  // --check-fa2: every FA2-class case (head dims 32-256), both backward modes,
  // nothing timed, no sm90: small enough for compute-sanitizer. Under
  // PADDLE_FLASHMASK_FA2_BWD=split the head dims past 128 are skipped (the op
  // refuses them: the split kernel stops at 128).
  if (mode == "--check-fa2") {
    // FLASHMASK_HARNESS_DIM=d: only the cases of head dim d (a sanitizer run on one head dim).
    const int only_dim = harness_env_int("FLASHMASK_HARNESS_DIM", 0);
    auto check_fa2 = [&](const Case& c) {
      if (only_dim > 0 && c.d != only_dim) return;
      if (split_bwd_skips(c.d)) {
        std::printf("fa2        skipped %s D%d: PADDLE_FLASHMASK_FA2_BWD=split takes head dims 32, 64, 96, 128\n",
                    c.name.c_str(), c.d);
        return;
      }
      for (bool det : {false, true}) failures += !check_case(c, GpuKernel::kFA2, det, 1, 0, rng);
      if (c.h > c.hk) failures += check_head_groups(c, GpuKernel::kFA2, false, rng);  // fitted head groups
    };
    for (const Case& c : cases) check_fa2(c);
    for (const Case& c : fa2_only_cases) check_fa2(c);
    for (const Case& c : fa2_hd32_cases) check_fa2(c);
    for (const Case& c : hd80_cases) check_fa2(c);
    for (const Case& c : fa2_hd256_cases) check_fa2(c);
    std::printf("%d failures\n", failures);
    return failures ? 1 : 0;
  }
  if (check_hd > 0) {
    for (const Case& c : sm90_only_cases) {
      if (c.d != check_hd) continue;
      failures += !check_case(c, GpuKernel::kSm90, false, 0, -1, rng);
      // 96 and 80 have the deterministic backward too (sm90 dK/dV, the FA2-class dQ pass).
      if (c.d == 96 || c.d == 80) failures += !check_case(c, GpuKernel::kSm90, true, 1, 0, rng);
    }
    failures += !check_case({"causal_doc", 2, 2048, 2048, 16, 4, check_hd, true, 1, doc_mask, paired_value_dim(check_hd)},
                            GpuKernel::kSm90, false, 4, -1, rng);
    std::printf("%d failures\n", failures);
    return failures ? 1 : 0;
  }
  if (time_hd > 0) {
    for (const Case& c : sm90_only_cases) {
      if (c.d == time_hd) failures += check_head_groups(c, GpuKernel::kSm90, false, rng);
    }
    // About 4 tiles per CTA (the cases above give each CTA one): tiles back to back.
    failures += !check_case({"causal_doc", 2, 2048, 2048, 16, 4, time_hd, true, 1, doc_mask, paired_value_dim(time_hd)},
                            GpuKernel::kSm90, false, 4, -1, rng);
    std::printf("%d failures\n", failures);
    print_time_header();
    time_head_dim_masks(time_hd, /*short_docs=*/true, rng);
    // The backward's heads per CTA against the default (up to 4, fitted per
    // key block): one head, and 4 in uniform groups (a CTA's K/V load and list
    // shared by its heads on short lists, longer CTAs at the end of the grid).
    for (int s : {8192, 32768}) {
      std::mt19937 mask_rng(s);
      const std::vector<int32_t> docs = timing_docs(s, mask_rng), window = timing_window(s);
      for (int hg : {1, 4}) {
        time_case("causal", s, 32, 8, time_hd, GpuKernel::kSm90, rng, {}, false, hg, 0);
        time_case("causal_document", s, 32, 8, time_hd, GpuKernel::kSm90, rng, docs, false, hg, 0);
        time_case("sliding_window", s, 32, 8, time_hd, GpuKernel::kSm90, rng, window, false, hg, 0);
      }
    }
    return failures ? 1 : 0;
  }
  if (time_fwd) {
    g_forward_only = true;
    for (const Schedule& sc : schedules) {
      use_schedule(sc);
      for (const Case& c : cases) failures += !check_case(c, GpuKernel::kSm90, false, 1, 0, rng);
      // About 4 tiles per CTA (the cases above give each CTA one): tiles back to back.
      failures += !check_case({"causal_doc", 2, 2048, 2048, 16, 4, 128, true, 1, doc_mask}, GpuKernel::kSm90,
                              false, 1, 0, rng);
      std::printf("%s: checked\n", sc.name);
    }
    std::printf("%d failures\n", failures);
    std::printf("| schedule | kernel | mask | S | H:Hk | D/Dv | bwd heads/CTA / max steps | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | fwd+bwd TFLOP/s | bwd prep+finish ms |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    auto time_schedules = [&](const char* name, int s, int d, const std::vector<int32_t>& mask) {
      for (int i = 0; i < timed_schedules; ++i) {
        use_schedule(schedules[i]);
        std::printf("| %s ", schedules[i].name);
        time_case(name, s, 32, 8, d, GpuKernel::kSm90, rng, mask);
      }
    };
    // Two passes: the spread between them is the run-to-run noise. 128K:
    // masked calls only (where K/V outgrow L2 and the tile order matters).
    for (int pass = 0; pass < 2; ++pass)
    for (int s : {8192, 16384, 32768, 131072}) {
      std::mt19937 mask_rng(s);
      const std::vector<int32_t> docs = timing_docs(s, mask_rng), short_docs = timing_short_docs(s, mask_rng),
                                 window = timing_window(s);
      if (s != 131072) time_schedules("causal", s, 128, {});
      if (s == 16384) {
        time_schedules("causal", s, 64, {});
        continue;
      }
      for (const auto& [name, mask] : {std::pair{"causal_document", &docs}, std::pair{"short_documents", &short_docs},
                                       std::pair{"sliding_window", &window}}) {
        time_schedules(name, s, 128, *mask);
      }
    }
    return failures ? 1 : 0;
  }
  for (const Case& c : cases) {
    for (bool det : {false, true}) {
      failures += !check_case(c, GpuKernel::kFA2, det, 1, 0, rng);
      failures += check_head_groups(c, GpuKernel::kSm90, det, rng);
    }
  }
  // No mask with about 4 tiles per CTA: the 176-key forward's persistent loop over its one Q buffer.
  failures += !check_case({"none", 2, 2048, 2100, 16, 4, 128, false, 0, nullptr}, GpuKernel::kSm90, false, 1, 0, rng);
  for (const Case& c : fa2_only_cases) {
    for (bool det : {false, true}) failures += !check_case(c, GpuKernel::kFA2, det, 1, 0, rng);
  }
  for (const Case& c : fa2_hd256_cases) {
    for (bool det : {false, true}) failures += !check_case(c, GpuKernel::kFA2, det, 1, 0, rng);
  }
  for (const Case& c : sm90_only_cases) {
    failures += check_head_groups(c, GpuKernel::kSm90, false, rng);
    if (c.d == 96) failures += check_head_groups(c, GpuKernel::kSm90, true, rng);
  }
  std::printf("%d failures\n", failures);
  if (timing) {
    print_time_header();
    for (int s : {8192, 16384}) {
      for (GpuKernel kernel : {GpuKernel::kFA2, GpuKernel::kSm90}) time_case("causal", s, 32, 8, 128, kernel, rng);
    }
    time_case("causal", 16384, 32, 8, 64, GpuKernel::kSm90, rng);
    time_case("causal", 16384, 32, 8, 128, GpuKernel::kSm90, rng, {}, true);
    // Short live lists (where per-CTA prologue and epilogue show): one query
    // head per sm90 backward CTA, 4 for every key block, and 4 fitted per key
    // block (the default, 80 steps; and 40).
    for (int s : {8192, 32768}) {
      std::mt19937 mask_rng(s);
      const std::vector<int32_t> docs = timing_docs(s, mask_rng), window = timing_window(s);
      for (auto [hg, steps] : {std::pair{1, 0}, std::pair{4, 0}, std::pair{4, -1}, std::pair{4, 40}}) {
        time_case("causal_document", s, 32, 8, 128, GpuKernel::kSm90, rng, docs, false, hg, steps);
        time_case("sliding_window", s, 32, 8, 128, GpuKernel::kSm90, rng, window, false, hg, steps);
      }
    }
    // Causal with one query head per backward CTA, against the default above.
    for (int s : {8192, 16384}) time_case("causal", s, 32, 8, 128, GpuKernel::kSm90, rng, {}, false, 1, 0);
    time_case("causal", 32768, 32, 8, 128, GpuKernel::kSm90, rng);
  }
  return failures ? 1 : 0;
}
