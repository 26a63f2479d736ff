// Paddle registration of the FlashMask attention op: checks the tensors,
// allocates outputs through Paddle, fills the framework-neutral params and
// dispatches by place. The Python wrapper (paddle_flashmask/attention.py)
// validates arguments first and raises ValueError/TypeError; the checks here
// only guard direct calls of the raw op.
//
// The ops are named pfm_* so they never shadow Paddle's built-in
// flashmask_attention op (users may call both in one program).
//
// Kept to the custom-op API shared by Paddle 2.6 and 3.x. 2.6's dispatch
// macros lack bfloat16, so dtypes are switched by hand.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "../flashmask/cuda/env_settings.h"
#include "../flashmask/flashmask_api.h"
#include "../flashmask/mask_bounds.h"
#include "op_glue.h"
#include "paddle/extension.h"

namespace {

using flashmask_glue::rethrow_as_paddle_error;

struct Strides {
  int64_t batch, row, head;
};

// [batch, seqlen, heads, dim], contiguous.
Strides bshd_strides(const std::vector<int64_t>& s) {
  return Strides{s[1] * s[2] * s[3], s[2] * s[3], s[3]};
}
Strides bshd_strides(const paddle::Tensor& t) { return bshd_strides(t.shape()); }

// out and dout: query's batch, rows and heads with value's head dim.
std::vector<int64_t> out_shape_of(const std::vector<int64_t>& q_shape, const std::vector<int64_t>& v_shape) {
  return {q_shape[0], q_shape[1], q_shape[2], v_shape[3]};
}

void check_qkv(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& v) {
  PD_CHECK(q.shape().size() == 4 && k.shape().size() == 4 && v.shape().size() == 4,
           "flashmask_attention: query/key/value must be 4-D [batch, seqlen, heads, head_dim]");
  PD_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(),
           "flashmask_attention: query/key/value must share one dtype");
  // value may have its own head dim (MLA: q/k 192, v 128); out follows value.
  PD_CHECK(k.shape()[0] == v.shape()[0] && k.shape()[1] == v.shape()[1] && k.shape()[2] == v.shape()[2] &&
               v.shape()[3] > 0,
           "flashmask_attention: key and value differ in batch, length or heads");
  PD_CHECK(q.shape()[0] == k.shape()[0] && q.shape()[3] == k.shape()[3],
           "flashmask_attention: batch or head_dim of query and key differ");
  PD_CHECK(k.shape()[2] > 0 && q.shape()[2] % k.shape()[2] == 0,
           "flashmask_attention: query heads must be a multiple of key heads");
}

flashmask::GpuKernel core_gpu_kernel(int gpu_kernel) {
  PD_CHECK(gpu_kernel >= 0 && gpu_kernel <= 2,
           "flashmask_attention: gpu_kernel must be 0 (auto), 1 (fa2) or 2 (sm90), got " +
               std::to_string(gpu_kernel));
  return static_cast<flashmask::GpuKernel>(gpu_kernel);
}

// Fills everything but the data pointers' dtype-specific outputs.
flashmask::FwdParams make_fwd_params(const paddle::Tensor& q, const paddle::Tensor& k,
                                     const paddle::Tensor& v, const paddle::Tensor* indices,
                                     float softmax_scale, bool causal, int gpu_kernel) {
  flashmask::FwdParams p;
  p.gpu_kernel = core_gpu_kernel(gpu_kernel);
  p.dtype = flashmask_glue::float_dtype(q.dtype(), "flashmask_attention");
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  const Strides qs = bshd_strides(q), ks = bshd_strides(k), vs = bshd_strides(v);
  const Strides os = bshd_strides(out_shape_of(q.shape(), v.shape()));
  p.q_batch_stride = qs.batch, p.q_row_stride = qs.row, p.q_head_stride = qs.head;
  p.k_batch_stride = ks.batch, p.k_row_stride = ks.row, p.k_head_stride = ks.head;
  p.v_batch_stride = vs.batch, p.v_row_stride = vs.row, p.v_head_stride = vs.head;
  p.o_batch_stride = os.batch, p.o_row_stride = os.row, p.o_head_stride = os.head;
  p.batch = int(q.shape()[0]);
  p.seqlen_q = int(q.shape()[1]);
  p.num_heads = int(q.shape()[2]);
  p.head_dim = int(q.shape()[3]);
  p.head_dim_v = int(v.shape()[3]);
  p.seqlen_k = int(k.shape()[1]);
  p.num_heads_k = int(k.shape()[2]);
  p.softmax_scale = softmax_scale;
  p.mask.causal = causal;
  if (indices != nullptr) {
    const auto& s = indices->shape();
    PD_CHECK(indices->dtype() == paddle::DataType::INT32 && s.size() == 4,
             "flashmask_attention: startend_row_indices must be int32 [B, Hm, Sk, C]");
    PD_CHECK(s[2] == p.seqlen_k && (s[1] == 1 || s[1] == p.num_heads_k || s[1] == p.num_heads) &&
                 (s[0] == 1 || s[0] == p.batch),
             "flashmask_attention: startend_row_indices shape does not match key");
    PD_CHECK(causal ? (s[3] == 1 || s[3] == 2) : (s[3] == 2 || s[3] == 4),
             "flashmask_attention: startend_row_indices has a column count the mode does not take");
    p.mask.startend_row_indices = indices->data<int32_t>();
    p.mask.num_cols = int(s[3]);
    p.mask.num_heads = int(s[1]);
    p.mask.col_stride = s[3];
    p.mask.head_stride = s[1] == 1 ? 0 : s[2] * s[3];
    p.mask.batch_stride = s[0] == 1 ? 0 : s[1] * s[2] * s[3];
  }
  return p;
}

[[noreturn]] void unsupported_place(const paddle::Tensor& t) {
  PD_THROW("flashmask_attention: this build has no kernel for place " + t.place().DebugString() +
           " (CPU is always built; CUDA needs a GPU build of the op)");
}

// The index tensor the kernels read: the user's, a sliding window built here
// (one [1, 1, Sk, C] head broadcast over batch and heads), or none.
paddle::optional<paddle::Tensor> effective_indices(
    const paddle::optional<paddle::Tensor>& indices, const paddle::Tensor& q,
    const paddle::Tensor& k, bool causal, int window_left, int window_right) {
  if (window_left < 0 && window_right < 0) return indices;
  PD_CHECK(!indices, "flashmask_attention: window_size cannot be combined with indices");
  const int seqlen_q = int(q.shape()[1]), seqlen_k = int(k.shape()[1]);
  const int cols = causal ? 1 : 2;
  const int left = window_left < 0 ? seqlen_q : window_left;
  const int right = window_right < 0 ? seqlen_k : window_right;
  auto window = paddle::empty({1, 1, seqlen_k, cols}, paddle::DataType::INT32, q.place());
  if (q.is_cpu()) {
    flashmask::fill_window_indices_cpu(window.data<int32_t>(), seqlen_q, seqlen_k, causal, left,
                                       right);
  } else {
#if defined(FLASHMASK_WITH_CUDA)
    flashmask::fill_window_indices_cuda(window.data<int32_t>(), seqlen_q, seqlen_k, causal, left,
                                        right, q.stream());
#else
    unsupported_place(q);
#endif
  }
  return paddle::optional<paddle::Tensor>(window);
}


// Paddle's block_mask: int32 [B or 1, 1, Hk or H, ceil(Sq/128), ceil(Sk/128)], 0 = the
// 128 x 128 block is masked; every kernel skips its tiles (flashmask::block_kept).
void set_block_mask(flashmask::FwdParams& p, const paddle::optional<paddle::Tensor>& block_mask,
                    const paddle::Tensor& q) {
  if (!block_mask) return;
  const auto& m = block_mask.get();
  const auto& s = m.shape();
  const int64_t rb = (p.seqlen_q + flashmask::kBlockMaskSize - 1) / flashmask::kBlockMaskSize;
  const int64_t cb = (p.seqlen_k + flashmask::kBlockMaskSize - 1) / flashmask::kBlockMaskSize;
  PD_CHECK(m.dtype() == paddle::DataType::INT32 && s.size() == 4 && (s[0] == 1 || s[0] == p.batch) &&
               (s[1] == 1 || s[1] == p.num_heads_k || s[1] == p.num_heads) && s[2] == rb && s[3] == cb,
           "flashmask_attention: block_mask must be int32 [B or 1, 1, Hk or H, ceil(Sq/128), ceil(Sk/128)]");
  PD_CHECK(m.place() == q.place(), "flashmask_attention: block_mask must be on the device of query");
  p.block_mask.data = m.data<int32_t>();
  p.block_mask.num_heads = int(s[1]);
  p.block_mask.col_blocks = int(cb);
  p.block_mask.head_stride = s[1] == 1 ? 0 : rb * cb;
  p.block_mask.batch_stride = s[0] == 1 ? 0 : s[1] * rb * cb;
}

#if defined(FLASHMASK_WITH_CUDA)
void check_cuda_config(const flashmask::FwdParams& p) {
  PD_CHECK(flashmask::cuda_supports(p.dtype, p.head_dim, p.value_head_dim()),
           "flashmask_attention on GPU takes float16/bfloat16 inputs with head_dim 32, 64, 96, 128 or 256 "
           "and value of the same head_dim, or head_dim 192 with value head_dim 128 (192/128 on the Hopper "
           "kernels only; the CPU kernel takes any value head_dim)");
}

// The sm90 backward's head grouping (flashmask::plan_bwd_cuda; NOTES.md says
// when it pays): PADDLE_FLASHMASK_SM90_BWD_HEAD_GROUP query heads per CTA at
// most (unset or 0: the default), and PADDLE_FLASHMASK_SM90_BWD_GROUP_MAX_STEPS
// the most steps of 64 query rows a grouped CTA may take (0: every key block
// grouped alike; unset: the default). cuda::env_int throws a std::exception,
// which the caller's rethrow_as_paddle_error turns into a Paddle error.
int requested_bwd_head_group() { return flashmask::cuda::env_int("PADDLE_FLASHMASK_SM90_BWD_HEAD_GROUP", 0, 0, 1024); }
int requested_bwd_group_max_steps() {
  return flashmask::cuda::env_int("PADDLE_FLASHMASK_SM90_BWD_GROUP_MAX_STEPS", -1, 0, 1 << 20);
}

paddle::Tensor gpu_workspace(int64_t elems, paddle::DataType dtype, const paddle::Tensor& like) {
  return paddle::empty({elems}, dtype, like.place());
}
#endif

}  // namespace

std::vector<paddle::Tensor> FlashMaskForward(const paddle::Tensor& q, const paddle::Tensor& k,
                                             const paddle::Tensor& v,
                                             const paddle::optional<paddle::Tensor>& indices,
                                             const paddle::optional<paddle::Tensor>& block_mask,
                                             float softmax_scale, bool causal, int window_left,
                                             int window_right, int gpu_kernel,
                                             bool deterministic) {
  // deterministic concerns only the backward (the forward has no atomics).
  check_qkv(q, k, v);
  const auto mask = effective_indices(indices, q, k, causal, window_left, window_right);
  auto out = paddle::empty(out_shape_of(q.shape(), v.shape()), q.dtype(), q.place());
  auto lse = paddle::empty({q.shape()[0], q.shape()[2], q.shape()[1]}, paddle::DataType::FLOAT32,
                           q.place());
  flashmask::FwdParams p =
      make_fwd_params(q, k, v, mask ? &mask.get() : nullptr, softmax_scale, causal, gpu_kernel);
  set_block_mask(p, block_mask, q);
  p.out = out.data();
  p.softmax_lse = lse.data<float>();
  if (q.is_cpu()) {
    flashmask::run_fwd_cpu(p);
  } else {
#if defined(FLASHMASK_WITH_CUDA)
    check_cuda_config(p);
    auto bounds = gpu_workspace(std::max<int64_t>(1, flashmask::block_bounds_elems(p)),
                                paddle::DataType::INT32, q);
    p.block_bounds = bounds.data<int32_t>();
    rethrow_as_paddle_error([&] { flashmask::run_fwd_cuda(p, q.stream()); });
#else
    unsupported_place(q);
#endif
  }
  return {out, lse};
}

std::vector<paddle::Tensor> FlashMaskBackward(const paddle::Tensor& q, const paddle::Tensor& k,
                                              const paddle::Tensor& v,
                                              const paddle::optional<paddle::Tensor>& indices,
                                              const paddle::optional<paddle::Tensor>& block_mask,
                                              const paddle::Tensor& out,
                                              const paddle::Tensor& lse,
                                              const paddle::Tensor& dout, float softmax_scale,
                                              bool causal, int window_left, int window_right,
                                              int gpu_kernel, bool deterministic) {
  check_qkv(q, k, v);
  const std::vector<int64_t> out_shape = out_shape_of(q.shape(), v.shape());
  PD_CHECK(dout.shape() == out_shape && dout.dtype() == q.dtype(),
           "flashmask_attention grad: dout must be [batch, seqlen_q, heads, value head_dim] in the dtype of query");
  // pfm_flashmask_attention_bwd takes out/lse from its caller.
  PD_CHECK(out.shape() == out_shape && out.dtype() == q.dtype(),
           "flashmask_attention grad: out must be [batch, seqlen_q, heads, value head_dim] in the dtype of query");
  PD_CHECK(lse.dtype() == paddle::DataType::FLOAT32 &&
               lse.shape() == std::vector<int64_t>({q.shape()[0], q.shape()[2], q.shape()[1]}),
           "flashmask_attention grad: softmax_lse must be float32 [batch, heads, seqlen_q]");
  const auto mask = effective_indices(indices, q, k, causal, window_left, window_right);
  auto dq = paddle::empty(q.shape(), q.dtype(), q.place());
  auto dk = paddle::empty(k.shape(), k.dtype(), k.place());
  auto dv = paddle::empty(v.shape(), v.dtype(), v.place());

  flashmask::BwdParams p;
  static_cast<flashmask::FwdParams&>(p) =
      make_fwd_params(q, k, v, mask ? &mask.get() : nullptr, softmax_scale, causal, gpu_kernel);
  set_block_mask(p, block_mask, q);
  // The CPU backward is deterministic either way; on GPU this picks the
  // atomic-free dQ kernel and one-writer dK/dV slots (see BwdParams).
  p.deterministic = deterministic;
  p.out = const_cast<void*>(out.data());
  p.softmax_lse = const_cast<float*>(lse.data<float>());
  p.dout = dout.data();
  p.dq = dq.data();
  p.dk = dk.data();
  p.dv = dv.data();
  const Strides qs = bshd_strides(q), ks = bshd_strides(k), vs = bshd_strides(v);
  const Strides os = bshd_strides(out_shape);
  p.do_batch_stride = os.batch, p.do_row_stride = os.row, p.do_head_stride = os.head;
  p.dq_batch_stride = qs.batch, p.dq_row_stride = qs.row, p.dq_head_stride = qs.head;
  p.dk_batch_stride = ks.batch, p.dk_row_stride = ks.row, p.dk_head_stride = ks.head;
  p.dv_batch_stride = vs.batch, p.dv_row_stride = vs.row, p.dv_head_stride = vs.head;
  if (q.is_cpu()) {
    flashmask::run_bwd_cpu(p);
  } else {
#if defined(FLASHMASK_WITH_CUDA)
    check_cuda_config(p);
    auto bounds = gpu_workspace(std::max<int64_t>(1, flashmask::block_bounds_elems(p)),
                                paddle::DataType::INT32, q);
    rethrow_as_paddle_error([&] {
      flashmask::plan_bwd_cuda(p, requested_bwd_head_group(), requested_bwd_group_max_steps());
    });
    auto dq_accum = gpu_workspace(flashmask::bwd_dq_accum_elems(p), paddle::DataType::FLOAT32, q);
    // [B, Sk, accum_heads_k, D or Dv]: slots as planned above; none where the
    // kernel stores dK/dV itself (dkv_direct): then, with GQA, per query head
    // in k's dtype ([B, Sk, H, D or Dv]), summed per kv head after it.
    paddle::Tensor dk_accum, dv_accum;
    if (!p.dkv_direct) {
      std::vector<int64_t> dk_accum_shape = k.shape(), dv_accum_shape = v.shape();
      dk_accum_shape[2] = dv_accum_shape[2] = p.accum_heads_k;
      dk_accum = paddle::empty(dk_accum_shape, paddle::DataType::FLOAT32, k.place());
      dv_accum = paddle::empty(dv_accum_shape, paddle::DataType::FLOAT32, v.place());
      p.dk_accum = dk_accum.data<float>();
      p.dv_accum = dv_accum.data<float>();
    } else if (p.dkv_heads_expanded()) {
      std::vector<int64_t> dk_heads_shape = k.shape(), dv_heads_shape = v.shape();
      dk_heads_shape[2] = dv_heads_shape[2] = p.num_heads;
      dk_accum = paddle::empty(dk_heads_shape, k.dtype(), k.place());
      dv_accum = paddle::empty(dv_heads_shape, v.dtype(), v.place());
      p.dk_heads = dk_accum.data();
      p.dv_heads = dv_accum.data();
    }
    auto softmax_d = paddle::empty(lse.shape(), paddle::DataType::FLOAT32, q.place());
    const int64_t row_stats_elems = flashmask::bwd_row_stats_elems(p);
    auto row_stats = gpu_workspace(std::max<int64_t>(1, row_stats_elems), paddle::DataType::FLOAT32, q);
    p.block_bounds = bounds.data<int32_t>();
    p.dq_accum = dq_accum.data<float>();
    p.softmax_d = softmax_d.data<float>();
    p.row_stats = row_stats_elems > 0 ? row_stats.data<float>() : nullptr;
    rethrow_as_paddle_error([&] { flashmask::run_bwd_cuda(p, q.stream()); });
#else
    unsupported_place(q);
#endif
  }
  return {dq, dk, dv};
}

// Bit flags of flashmask::IndexError over all of `indices`, as a [1] int32
// tensor on the CPU, so the Python wrapper can name what is wrong.
std::vector<paddle::Tensor> FlashMaskCheckIndices(const paddle::Tensor& indices, int seqlen_q,
                                                  bool causal) {
  PD_CHECK(indices.dtype() == paddle::DataType::INT32 && indices.shape().size() == 4,
           "flashmask_check_indices: expected int32 [B, Hm, Sk, C]");
  auto flags = paddle::empty({1}, paddle::DataType::INT32, paddle::CPUPlace());
  const auto& s = indices.shape();
  if (indices.is_cpu()) {
    flags.data<int32_t>()[0] = flashmask::check_indices_cpu(
        indices.data<int32_t>(), s[0] * s[1] * s[2], int(s[3]), causal, seqlen_q);
  } else {
#if defined(FLASHMASK_WITH_CUDA)
    // One flag word on the device, read back once.
    auto device_flags = paddle::empty({1}, paddle::DataType::INT32, indices.place());
    flashmask::check_indices_cuda(indices.data<int32_t>(), s[0] * s[1] * s[2], int(s[3]), causal,
                                  seqlen_q, device_flags.data<int32_t>(), indices.stream());
    flags = device_flags.copy_to(paddle::CPUPlace(), /*blocking=*/true);
#else
    unsupported_place(indices);
#endif
  }
  return {flags};
}

std::vector<std::vector<int64_t>> FlashMaskForwardInferShape(
    const std::vector<int64_t>& q_shape, const std::vector<int64_t>& k_shape,
    const std::vector<int64_t>& v_shape,
    const paddle::optional<std::vector<int64_t>>& indices_shape,
    const paddle::optional<std::vector<int64_t>>& block_mask_shape) {
  return {out_shape_of(q_shape, v_shape), {q_shape[0], q_shape[2], q_shape[1]}};
}

std::vector<paddle::DataType> FlashMaskForwardInferDtype(
    const paddle::DataType& q_dtype, const paddle::DataType& k_dtype,
    const paddle::DataType& v_dtype, const paddle::optional<paddle::DataType>& indices_dtype,
    const paddle::optional<paddle::DataType>& block_mask_dtype) {
  return {q_dtype, paddle::DataType::FLOAT32};
}

// gpu_kernel: flashmask::GpuKernel as int (0 auto, 1 fa2, 2 sm90; GPU only).
// deterministic: bit-reproducible GPU backward (the CPU one always is).
#define FLASHMASK_ATTRS                                                                   \
  {                                                                                       \
    "softmax_scale: float", "causal: bool", "window_left: int", "window_right: int",     \
        "gpu_kernel: int", "deterministic: bool"                                         \
  }

PD_BUILD_OP(pfm_flashmask_attention)
    .Inputs({"q", "k", "v", paddle::Optional("startend_row_indices"), paddle::Optional("block_mask")})
    .Outputs({"out", "softmax_lse"})
    .Attrs(FLASHMASK_ATTRS)
    .SetKernelFn(PD_KERNEL(FlashMaskForward))
    .SetInferShapeFn(PD_INFER_SHAPE(FlashMaskForwardInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(FlashMaskForwardInferDtype));

PD_BUILD_GRAD_OP(pfm_flashmask_attention)
    .Inputs({"q", "k", "v", paddle::Optional("startend_row_indices"), paddle::Optional("block_mask"),
             "out", "softmax_lse", paddle::Grad("out")})
    .Outputs({paddle::Grad("q"), paddle::Grad("k"), paddle::Grad("v")})
    .Attrs(FLASHMASK_ATTRS)
    .SetKernelFn(PD_KERNEL(FlashMaskBackward));

// The backward as a plain op with out/lse given by the caller: context
// parallel (ring) attention merges the partial forwards over key parts and
// runs each part's backward with the merged out and lse.
std::vector<std::vector<int64_t>> FlashMaskBackwardInferShape(
    const std::vector<int64_t>& q_shape, const std::vector<int64_t>& k_shape,
    const std::vector<int64_t>& v_shape,
    const paddle::optional<std::vector<int64_t>>& indices_shape,
    const paddle::optional<std::vector<int64_t>>& block_mask_shape,
    const std::vector<int64_t>& out_shape, const std::vector<int64_t>& lse_shape,
    const std::vector<int64_t>& dout_shape) {
  return {q_shape, k_shape, v_shape};
}

std::vector<paddle::DataType> FlashMaskBackwardInferDtype(
    const paddle::DataType& q_dtype, const paddle::DataType& k_dtype,
    const paddle::DataType& v_dtype, const paddle::optional<paddle::DataType>& indices_dtype,
    const paddle::optional<paddle::DataType>& block_mask_dtype, const paddle::DataType& out_dtype, const paddle::DataType& lse_dtype,
    const paddle::DataType& dout_dtype) {
  return {q_dtype, k_dtype, v_dtype};
}

PD_BUILD_OP(pfm_flashmask_attention_bwd)
    .Inputs({"q", "k", "v", paddle::Optional("startend_row_indices"), paddle::Optional("block_mask"),
             "out", "softmax_lse", "dout"})
    .Outputs({"dq", "dk", "dv"})
    .Attrs(FLASHMASK_ATTRS)
    .SetKernelFn(PD_KERNEL(FlashMaskBackward))
    .SetInferShapeFn(PD_INFER_SHAPE(FlashMaskBackwardInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(FlashMaskBackwardInferDtype));

PD_BUILD_OP(pfm_flashmask_check_indices)
    .Inputs({"startend_row_indices"})
    .Outputs({"flags"})
    .Attrs({"seqlen_q: int", "causal: bool"})
    .SetKernelFn(PD_KERNEL(FlashMaskCheckIndices));
