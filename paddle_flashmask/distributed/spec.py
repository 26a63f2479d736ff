"""What one context-parallel call needs besides q/k/v, shared by both methods."""

from __future__ import annotations


class CallSpec:
    method = ""  # the method's name keys its cached index tensors

    def __init__(self, plan, rank, group, indices, causal, scale, gpu_kernel, deterministic, batch, place,
                 head_dim):
        self.plan, self.rank, self.group = plan, rank, group
        self.head_dim = head_dim  # the longest kernel call depends on it (long_sequence.sm90_max_seqlen)
        self.indices, self.causal, self.scale = indices, causal, scale
        self.gpu_kernel, self.deterministic = gpu_kernel, deterministic
        self.batch, self.place = batch, place
        self.W = plan.world_size
        self.L = plan.num_local_rows(rank)

    def index(self, name, build):
        """An int64 index tensor of this rank and batch size, built once per plan and place."""
        return self.plan._cached_index((self.method, name, self.rank, self.batch), build, self.place)
