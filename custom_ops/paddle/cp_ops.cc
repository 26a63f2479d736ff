// Paddle registration of the context-parallel helper ops (cp_ops.h): checks
// the tensors, allocates outputs through Paddle and dispatches by place. The
// context-parallel attention (paddle_flashmask/distributed) runs where
// Paddle's own GPU kernels may not, so all its data movement goes through
// these ops. Same conventions as flashmask_op.cc: the custom-op API shared by
// Paddle 2.6 and 3.x, dtypes switched by hand, core exceptions -> PD_THROW.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "../flashmask/cp_ops.h"
#include "op_glue.h"
#include "paddle/extension.h"

namespace {

using flashmask_glue::float_dtype;
using flashmask_glue::output_tensor;
using flashmask_glue::rethrow_as_paddle_error;

void check_same_place(const paddle::Tensor& a, const paddle::Tensor& b, const char* op) {
  PD_CHECK(a.place() == b.place(), op, ": all tensors must be on one device, got ",
           a.place().DebugString(), " and ", b.place().DebugString());
}

[[noreturn]] void unsupported_place(const paddle::Tensor& t, const char* op) {
  PD_THROW(std::string(op) + ": this build has no kernel for place " + t.place().DebugString() +
           " (CPU is always built; CUDA needs a GPU build of the op)");
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

// ---- pfm_cp_remap_indices ----------------------------------------------------

std::vector<paddle::Tensor> CpRemapIndices(const paddle::optional<paddle::Tensor>& indices,
                                           const paddle::Tensor& key_rows,
                                           const paddle::Tensor& row_table, bool causal,
                                           int chunk_size, int seqlen) {
  const char* op = "cp_remap_indices";
  PD_CHECK(key_rows.dtype() == paddle::DataType::INT64 && key_rows.shape().size() == 1,
           "cp_remap_indices: key_rows must be int64 [Sk_part]");
  PD_CHECK(row_table.dtype() == paddle::DataType::INT32 && row_table.shape().size() == 1,
           "cp_remap_indices: row_table must be int32 [n_chunks + 1]");
  PD_CHECK(chunk_size > 0, "cp_remap_indices: chunk_size must be positive, got ", chunk_size);
  PD_CHECK(seqlen > 0, "cp_remap_indices: seqlen must be positive, got ", seqlen);
  const int64_t num_chunks = (int64_t(seqlen) + chunk_size - 1) / chunk_size;
  PD_CHECK(row_table.shape()[0] == num_chunks + 1, "cp_remap_indices: row_table must have ",
           "ceil(seqlen / chunk_size) + 1 = ", num_chunks + 1, " entries, got ",
           row_table.shape()[0]);
  check_same_place(key_rows, row_table, op);

  flashmask::CpRemapParams p;
  p.causal = causal;
  p.seqlen = seqlen;
  p.key_rows = key_rows.data<int64_t>();
  p.num_keys = key_rows.shape()[0];
  p.row_table = row_table.data<int32_t>();
  p.num_chunks = int(num_chunks);
  p.chunk_size = chunk_size;
  if (indices) {
    const paddle::Tensor& t = indices.get();
    const auto& s = t.shape();
    PD_CHECK(t.dtype() == paddle::DataType::INT32 && s.size() == 4,
             "cp_remap_indices: startend_row_indices must be int32 [B, Hm, S, C]");
    PD_CHECK(s[2] == seqlen, "cp_remap_indices: startend_row_indices has ", s[2],
             " key columns, expected seqlen = ", seqlen);
    PD_CHECK(causal ? (s[3] == 1 || s[3] == 2) : (s[3] == 2 || s[3] == 4),
             "cp_remap_indices: startend_row_indices has ", s[3], " columns; causal takes 1 or 2, ",
             "non-causal 2 or 4");
    check_same_place(t, key_rows, op);
    p.indices = t.data<int32_t>();
    p.batch = s[0];
    p.heads = s[1];
    p.num_cols = int(s[3]);
    p.out_cols = causal ? 2 * p.num_cols : p.num_cols;
  } else {
    PD_CHECK(causal, "cp_remap_indices: no startend_row_indices and causal=False: no mask to remap");
    p.out_cols = 2;
  }
  auto out = output_tensor({p.batch, p.heads, p.num_keys, p.out_cols}, paddle::DataType::INT32,
                           key_rows.place());
  p.out = out.data<int32_t>();
  if (key_rows.is_cpu()) {
    rethrow_as_paddle_error([&] { flashmask::cp_remap_indices_cpu(p); });
  } else {
#if defined(FLASHMASK_WITH_CUDA)
    rethrow_as_paddle_error([&] { flashmask::cp_remap_indices_cuda(p, key_rows.stream()); });
#else
    unsupported_place(key_rows, op);
#endif
  }
  return {out};
}

std::vector<std::vector<int64_t>> CpRemapIndicesInferShape(
    const paddle::optional<std::vector<int64_t>>& indices_shape,
    const std::vector<int64_t>& key_rows_shape, const std::vector<int64_t>& row_table_shape,
    bool causal, int chunk_size, int seqlen) {
  if (!indices_shape) return {{1, 1, key_rows_shape[0], 2}};
  const auto& s = indices_shape.get();
  return {{s[0], s[1], key_rows_shape[0], causal ? 2 * s[3] : s[3]}};
}

std::vector<paddle::DataType> CpRemapIndicesInferDtype(
    const paddle::optional<paddle::DataType>& indices_dtype, const paddle::DataType& key_rows_dtype,
    const paddle::DataType& row_table_dtype) {
  return {paddle::DataType::INT32};
}

// ---- pfm_cp_merge -------------------------------------------------------------

std::vector<paddle::Tensor> CpMerge(const paddle::Tensor& out_a, const paddle::Tensor& lse_a,
                                    const paddle::Tensor& out_b, const paddle::Tensor& lse_b) {
  const char* op = "cp_merge";
  const auto& s = out_a.shape();
  PD_CHECK(s.size() == 4, "cp_merge: out_a must be 4-D [B, L, H, D], got ", shape_str(s));
  PD_CHECK(out_b.shape() == s && out_b.dtype() == out_a.dtype(),
           "cp_merge: out_b must match out_a in shape and dtype, got ", shape_str(out_b.shape()),
           " vs ", shape_str(s));
  const std::vector<int64_t> lse_shape = {s[0], s[2], s[1]};
  for (const paddle::Tensor* lse : {&lse_a, &lse_b}) {
    PD_CHECK(lse->dtype() == paddle::DataType::FLOAT32 && lse->shape() == lse_shape,
             "cp_merge: lse_a and lse_b must be float32 [B, H, L] = ", shape_str(lse_shape),
             ", got ", shape_str(lse->shape()));
  }
  check_same_place(out_a, out_b, op);
  check_same_place(out_a, lse_a, op);
  check_same_place(out_a, lse_b, op);

  flashmask::CpMergeParams p;
  p.dtype = float_dtype(out_a.dtype(), op);
  auto out = output_tensor(s, out_a.dtype(), out_a.place());
  auto lse = output_tensor(lse_shape, paddle::DataType::FLOAT32, out_a.place());
  p.out_a = out_a.data();
  p.out_b = out_b.data();
  p.lse_a = lse_a.data<float>();
  p.lse_b = lse_b.data<float>();
  p.out = out.data();
  p.lse = lse.data<float>();
  p.batch = s[0], p.seqlen = s[1], p.heads = s[2], p.head_dim = s[3];
  if (out_a.is_cpu()) {
    rethrow_as_paddle_error([&] { flashmask::cp_merge_cpu(p); });
  } else {
#if defined(FLASHMASK_WITH_CUDA)
    rethrow_as_paddle_error([&] { flashmask::cp_merge_cuda(p, out_a.stream()); });
#else
    unsupported_place(out_a, op);
#endif
  }
  return {out, lse};
}

std::vector<std::vector<int64_t>> CpMergeInferShape(const std::vector<int64_t>& out_a_shape,
                                                    const std::vector<int64_t>& lse_a_shape,
                                                    const std::vector<int64_t>& out_b_shape,
                                                    const std::vector<int64_t>& lse_b_shape) {
  return {out_a_shape, lse_a_shape};
}

std::vector<paddle::DataType> CpMergeInferDtype(const paddle::DataType& out_a_dtype,
                                                const paddle::DataType& lse_a_dtype,
                                                const paddle::DataType& out_b_dtype,
                                                const paddle::DataType& lse_b_dtype) {
  return {out_a_dtype, paddle::DataType::FLOAT32};
}

// ---- pfm_cp_accumulate --------------------------------------------------------

std::vector<paddle::Tensor> CpAccumulate(const paddle::Tensor& a, const paddle::Tensor& b) {
  const char* op = "cp_accumulate";
  // b: one or more tensors shaped like a, back to back (any shape of that size).
  PD_CHECK(a.dtype() == b.dtype() && a.numel() > 0 && b.numel() >= a.numel() &&
               b.numel() % a.numel() == 0,
           "cp_accumulate: b must hold P >= 1 tensors of a's shape and dtype back to back, got a ",
           shape_str(a.shape()), " and b ", shape_str(b.shape()));
  const int64_t pieces = b.numel() / a.numel();
  check_same_place(a, b, op);
  const flashmask::DType dtype = float_dtype(a.dtype(), op);
  auto out = output_tensor(a.shape(), a.dtype(), a.place());
  if (a.is_cpu()) {
    rethrow_as_paddle_error(
        [&] { flashmask::cp_accumulate_cpu(dtype, a.data(), b.data(), out.data(), a.numel(), pieces); });
  } else {
#if defined(FLASHMASK_WITH_CUDA)
    rethrow_as_paddle_error([&] {
      flashmask::cp_accumulate_cuda(dtype, a.data(), b.data(), out.data(), a.numel(), pieces,
                                    a.stream());
    });
#else
    unsupported_place(a, op);
#endif
  }
  return {out};
}

std::vector<std::vector<int64_t>> CpAccumulateInferShape(const std::vector<int64_t>& a_shape,
                                                         const std::vector<int64_t>& b_shape) {
  return {a_shape};
}

std::vector<paddle::DataType> CpAccumulateInferDtype(const paddle::DataType& a_dtype,
                                                     const paddle::DataType& b_dtype) {
  return {a_dtype};
}

// Bytes of one element of the dtypes the byte-moving ops take; `what` names the
// argument in the error.
int64_t element_bytes(const paddle::Tensor& t, const std::string& what) {
  switch (t.dtype()) {
    case paddle::DataType::FLOAT32:
    case paddle::DataType::INT32:
      return 4;
    case paddle::DataType::FLOAT16:
    case paddle::DataType::BFLOAT16:
      return 2;
    case paddle::DataType::INT64:
      return 8;
    default:
      PD_THROW(what + " must be float32, float16, bfloat16, int32 or int64");
  }
}

// ---- pfm_cp_gather_units ------------------------------------------------------

// No InferShape: Paddle's InferShape cannot take a std::vector<int64_t>
// attribute (out_shape), so the op runs in dynamic mode only.
std::vector<paddle::Tensor> CpGatherUnits(const paddle::Tensor& x, const paddle::Tensor& src,
                                          int64_t unit, const std::vector<int64_t>& out_shape) {
  const char* op = "cp_gather_units";
  const int64_t elem_bytes = element_bytes(x, "cp_gather_units: x");
  PD_CHECK(src.dtype() == paddle::DataType::INT64 && src.shape().size() == 1,
           "cp_gather_units: src must be int64 [N]");
  PD_CHECK(unit > 0, "cp_gather_units: unit must be positive, got ", unit);
  PD_CHECK(x.numel() % unit == 0, "cp_gather_units: x has ", x.numel(),
           " elements, not a multiple of unit = ", unit);
  int64_t out_elems = 1;
  for (int64_t d : out_shape) {
    PD_CHECK(d >= 0, "cp_gather_units: out_shape ", shape_str(out_shape), " has a negative dim");
    out_elems *= d;
  }
  const int64_t n = src.shape()[0];
  PD_CHECK(out_elems == n * unit, "cp_gather_units: out_shape ", shape_str(out_shape), " holds ",
           out_elems, " elements, but N x unit = ", n, " x ", unit, " = ", n * unit);
  check_same_place(x, src, op);
  auto out = output_tensor(out_shape, x.dtype(), x.place());
  const int64_t x_units = x.numel() / unit;
  if (x.is_cpu()) {
    rethrow_as_paddle_error([&] {
      flashmask::cp_gather_units_cpu(x.data(), x_units, src.data<int64_t>(), n, unit * elem_bytes,
                                     out.data());
    });
  } else {
#if defined(FLASHMASK_WITH_CUDA)
    rethrow_as_paddle_error([&] {
      flashmask::cp_gather_units_cuda(x.data(), x_units, src.data<int64_t>(), n, unit * elem_bytes,
                                      out.data(), x.stream());
    });
#else
    unsupported_place(x, op);
#endif
  }
  return {out};
}

std::vector<paddle::DataType> CpGatherUnitsInferDtype(const paddle::DataType& x_dtype,
                                                      const paddle::DataType& src_dtype) {
  return {x_dtype};
}

// ---- pfm_cp_concat ------------------------------------------------------------

// The pieces side by side along `axis` (every other dim equal): assembles the
// query-row or key parts of a long sequence (paddle_flashmask/long_sequence.py)
// without Paddle's own concat kernel.
std::vector<paddle::Tensor> CpConcat(const std::vector<paddle::Tensor>& xs, int axis) {
  const char* op = "cp_concat";
  PD_CHECK(!xs.empty(), "cp_concat: needs at least one tensor");
  const auto& first = xs[0].shape();
  const int rank = int(first.size());
  PD_CHECK(axis >= 0 && axis < rank, "cp_concat: axis ", axis, " is out of range for ", rank, "-D tensors");
  const int64_t elem_bytes = element_bytes(xs[0], "cp_concat: the tensors");
  std::vector<int64_t> out_shape = first;
  out_shape[axis] = 0;
  std::vector<const void*> ptrs;
  std::vector<int64_t> lens;
  for (const auto& x : xs) {
    const auto& s = x.shape();
    PD_CHECK(x.dtype() == xs[0].dtype(), "cp_concat: the tensors' dtypes differ");
    PD_CHECK(int(s.size()) == rank, "cp_concat: the tensors' ranks differ");
    for (int d = 0; d < rank; ++d) {
      PD_CHECK(d == axis || s[d] == first[d], "cp_concat: shapes ", shape_str(s), " and ", shape_str(first),
               " differ off the axis ", axis);
    }
    check_same_place(x, xs[0], op);
    out_shape[axis] += s[axis];
    ptrs.push_back(x.data());
    lens.push_back(s[axis]);
  }
  flashmask::CpConcatParams p;
  p.xs = ptrs.data();
  p.lens = lens.data();
  p.pieces = int(xs.size());
  for (int d = 0; d < axis; ++d) p.outer *= first[d];
  p.inner_bytes = elem_bytes;
  for (int d = axis + 1; d < rank; ++d) p.inner_bytes *= first[d];
  auto out = output_tensor(out_shape, xs[0].dtype(), xs[0].place());
  p.out = out.data();
  if (xs[0].is_cpu()) {
    rethrow_as_paddle_error([&] { flashmask::cp_concat_cpu(p); });
  } else {
#if defined(FLASHMASK_WITH_CUDA)
    rethrow_as_paddle_error([&] { flashmask::cp_concat_cuda(p, xs[0].stream()); });
#else
    unsupported_place(xs[0], op);
#endif
  }
  return {out};
}

std::vector<std::vector<int64_t>> CpConcatInferShape(const std::vector<std::vector<int64_t>>& shapes, int axis) {
  std::vector<int64_t> out = shapes.at(0);
  out[axis] = 0;
  for (const auto& s : shapes) out[axis] += s[axis];
  return {out};
}

std::vector<paddle::DataType> CpConcatInferDtype(const std::vector<paddle::DataType>& dtypes) {
  return {dtypes.at(0)};
}

PD_BUILD_OP(pfm_cp_remap_indices)
    .Inputs({paddle::Optional("startend_row_indices"), "key_rows", "row_table"})
    .Outputs({"out"})
    .Attrs({"causal: bool", "chunk_size: int", "seqlen: int"})
    .SetKernelFn(PD_KERNEL(CpRemapIndices))
    .SetInferShapeFn(PD_INFER_SHAPE(CpRemapIndicesInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(CpRemapIndicesInferDtype));

PD_BUILD_OP(pfm_cp_merge)
    .Inputs({"out_a", "lse_a", "out_b", "lse_b"})
    .Outputs({"out", "lse"})
    .SetKernelFn(PD_KERNEL(CpMerge))
    .SetInferShapeFn(PD_INFER_SHAPE(CpMergeInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(CpMergeInferDtype));

PD_BUILD_OP(pfm_cp_accumulate)
    .Inputs({"a", "b"})
    .Outputs({"out"})
    .SetKernelFn(PD_KERNEL(CpAccumulate))
    .SetInferShapeFn(PD_INFER_SHAPE(CpAccumulateInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(CpAccumulateInferDtype));

PD_BUILD_OP(pfm_cp_gather_units)
    .Inputs({"x", "src"})
    .Outputs({"out"})
    .Attrs({"unit: int64_t", "out_shape: std::vector<int64_t>"})
    .SetKernelFn(PD_KERNEL(CpGatherUnits))
    .SetInferDtypeFn(PD_INFER_DTYPE(CpGatherUnitsInferDtype));

PD_BUILD_OP(pfm_cp_concat)
    .Inputs({paddle::Vec("xs")})
    .Outputs({"out"})
    .Attrs({"axis: int"})
    .SetKernelFn(PD_KERNEL(CpConcat))
    .SetInferShapeFn(PD_INFER_SHAPE(CpConcatInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(CpConcatInferDtype));
