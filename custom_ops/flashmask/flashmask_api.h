// Entry points of the kernel core. One set per backend, all taking the same
// params structs, so the framework glue only chooses by device.
#pragma once

#include <cstdint>

#include "flashmask_params.h"

namespace flashmask {

// ---- CPU --------------------------------------------------------------------
// Forward: writes out and softmax_lse (-inf on rows with every key masked).
void run_fwd_cpu(const FwdParams& params);
// Backward: writes dq, dk, dv from q, k, v, out, dout and softmax_lse.
// Deterministic: every output element is reduced by exactly one thread.
void run_bwd_cpu(const BwdParams& params);
// Sliding-window indices for one [seqlen_k, C] mask head (C = 1 when causal,
// else 2), exactly as Paddle's flashmask_attention builds them.
void fill_window_indices_cpu(int32_t* dst, int seqlen_q, int seqlen_k,
                             bool causal, int window_left, int window_right);
// OR of IndexError flags over all of `indices` [B, Hm, Sk, C] (contiguous).
int32_t check_indices_cpu(const int32_t* indices, int64_t num_columns,
                          int num_cols, bool causal, int seqlen_q);

}  // namespace flashmask
