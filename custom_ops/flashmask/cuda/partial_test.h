// The element test of partially masked tiles in the FA2-class kernels, chosen
// per call on the host and fixed per kernel instantiation: a kernel carries
// the one test its calls need, with no branch to the others (their code and
// the registers it held were paid on every step, partial or not). Host code
// too (tests/cpp/masked_rows_check.cc); the device side is partial_test.cuh.
#pragma once

#include "../flashmask_params.h"
#include "../mask_bounds.h"

namespace flashmask {
namespace cuda {

// kVisibleRows: each key column sees one interval of query rows (no column
// mask, C = 1, non-causal C = 2): one subtraction and one compare an element.
// kMaskedRows: two masked intervals a column (causal C = 2, non-causal C = 4).
// kColumnBounds: causal C = 4 (three intervals; the op takes causal C = 1 or
// 2, the kernels any), from the column bounds.
// kRunTime: one kernel for every mask, which picks its test from the call's
// mask (the backward any of the three, the forward MaskedRows or the column
// bounds).
enum class PartialTest { kVisibleRows, kMaskedRows, kColumnBounds, kRunTime };

// The test of a call's mask, for the kernels that take one a call.
FLASHMASK_HOST_DEVICE PartialTest partial_test_of(const MaskParams& mask) {
  if (mask.startend_row_indices == nullptr || one_visible_interval(mask.num_cols, mask.causal)) {
    return PartialTest::kVisibleRows;
  }
  return mask.causal && mask.num_cols == 4 ? PartialTest::kColumnBounds : PartialTest::kMaskedRows;
}

// Whether the FA2-class kernels of head dim kHeadDim take a kernel per test,
// else kRunTime. H200, bf16 32:8, the Paddle benchmark's masks at 8K, two
// calls: a kernel per test gained at 96 2-7% in the forward (plain causal
// 7%), at 64 up to 2% in the backward and 3-5% in the forward on short
// documents, at 256 0-1%; at 128, where the kernels run at the 255-register
// limit, it lost 1-6% (plain causal's forward 4-6%), so 128 keeps the one
// kernel of before, instruction for instruction. 32 is not timed by the
// harness and keeps it too (NOTES.md, forty-seventh session).
template <int kHeadDim>
constexpr bool fa2_kernel_per_partial_test() {
  return kHeadDim != 128 && kHeadDim != 32;
}

}  // namespace cuda
}  // namespace flashmask
