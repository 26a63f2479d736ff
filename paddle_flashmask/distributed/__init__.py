"""Context parallel FlashMask: one sequence's query rows split over the ranks of a group.

    from paddle_flashmask.distributed import ContextParallelPlan, flashmask_attention
    plan = ContextParallelPlan(global_indices, causal=True, world_size=W)      # same on every rank
    q_local = plan.shard(q_global, rank)                                       # or your own rows
    out_local = flashmask_attention(q_local, k_local, v_local, global_indices, causal=True, plan=plan)

``method="allgather"`` (default) exchanges K/V and overlaps the exchange with the local
part; ``method="ulysses"`` trades sequence for heads with all-to-all.
"""

from .attention import flashmask_attention
from .comm import get_context_parallel_group
from .plan import ContextParallelPlan, plan_for

__all__ = ["ContextParallelPlan", "flashmask_attention", "get_context_parallel_group", "plan_for"]
