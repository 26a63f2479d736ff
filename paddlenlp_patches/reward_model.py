"""A scalar reward head on the LLaMA backbone (PaddleNLP's ``LlamaModelForScore`` from
``llm/alignment/rm/flashmask``, which is not in the wheel).

Batches come from :class:`paddlenlp_patches.collators.RMCollator`: prompt + chosen + rejected
share one sequence (share-question indices), ``response_indexs`` ``[N, 3]`` = (row, chosen_last,
rejected_last). The reward of an answer is ``score_head(hidden[last token of the answer])``;
loss = ``-log_sigmoid(r_chosen - r_rejected).mean()``.
"""

from __future__ import annotations

import paddle
import paddle.nn.functional as F
from paddle import nn
from paddlenlp.transformers import LlamaModel, LlamaPretrainedModel

from . import context_parallel


class LlamaForRewardModel(LlamaPretrainedModel):
    """``from_pretrained`` of a LLaMA causal-LM checkpoint loads the backbone; the score head
    starts random (it is reported as missing, ``lm_head`` as unused)."""

    _keys_to_ignore_on_load_missing = [r"score_head"]
    _keys_to_ignore_on_load_unexpected = [r"lm_head", r"self_attn.rotary_emb.inv_freq"]

    def __init__(self, config):
        super().__init__(config)
        self.llama = LlamaModel(config)
        self.score_head = nn.Linear(config.hidden_size, 1, bias_attr=False)

    def get_input_embeddings(self):
        return self.llama.embed_tokens

    def set_input_embeddings(self, value):
        self.llama.embed_tokens = value

    def rewards(self, input_ids, response_indexs, position_ids=None, attention_mask=None,
                attn_mask_startend_row_indices=None):
        """``(chosen_rewards [N], rejected_rewards [N])`` for the N triples of the batch."""
        hidden = self.llama(input_ids, position_ids=position_ids, attention_mask=attention_mask,
                            attn_mask_startend_row_indices=attn_mask_startend_row_indices,
                            return_dict=False, use_cache=False)[0]
        ri = response_indexs.astype("int64")
        cp_batch = context_parallel.active()
        if cp_batch is not None:
            # context parallel: hidden holds this rank's rows; score them all and gather the
            # [B, S] scores over the group (cheap: one value per token), then pick as below
            scores = cp_batch.gather_tokens(self.score_head(hidden).squeeze(-1))
            return (paddle.gather_nd(scores, paddle.stack([ri[:, 0], ri[:, 1]], axis=-1)),
                    paddle.gather_nd(scores, paddle.stack([ri[:, 0], ri[:, 2]], axis=-1)))
        chosen = paddle.gather_nd(hidden, paddle.stack([ri[:, 0], ri[:, 1]], axis=-1))
        rejected = paddle.gather_nd(hidden, paddle.stack([ri[:, 0], ri[:, 2]], axis=-1))
        return self.score_head(chosen).squeeze(-1), self.score_head(rejected).squeeze(-1)

    def forward(self, input_ids, position_ids=None, attention_mask=None, attn_mask_startend_row_indices=None,
                response_indexs=None, **unused):
        if response_indexs is None:
            raise ValueError("LlamaForRewardModel needs response_indexs [N, 3] = (row, chosen_last, rejected_last)")
        r_c, r_r = self.rewards(input_ids, response_indexs, position_ids, attention_mask,
                                attn_mask_startend_row_indices)
        loss = -F.log_sigmoid(r_c.astype("float32") - r_r.astype("float32")).mean()
        return loss, r_c, r_r
