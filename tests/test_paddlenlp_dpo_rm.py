"""DPO and reward model: shared-prompt packing (several triples per row, share-question indices)
gives the same per-answer log-probs, rewards and losses as separate chosen/rejected sequences."""

from types import SimpleNamespace

import numpy as np
import pytest

from paddlenlp_test_env import require_paddlenlp  # noqa: E402

require_paddlenlp()

import paddle  # noqa: E402
import paddle.nn.functional as F  # noqa: E402

import paddlenlp_patches as pp  # noqa: E402
from paddlenlp.transformers import LlamaForCausalLM  # noqa: E402
from paddlenlp.trl import DPOCriterion  # noqa: E402
from paddlenlp_patches.collators import DPOCollator, RMCollator  # noqa: E402
from paddlenlp_patches.data import _Encoder, tokenize_dpo, tokenize_rm  # noqa: E402
from paddlenlp_patches.modeling import build_config  # noqa: E402
from paddlenlp_patches.packing import pack_records  # noqa: E402
from paddlenlp_patches.reward_model import LlamaForRewardModel  # noqa: E402
from paddlenlp_patches.tokenizer import CharTokenizer  # noqa: E402

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 256}
TOK = CharTokenizer()
ENC = _Encoder(TOK)
BETA = 0.1
EXAMPLES = [
    {"prompt": "reverse(abcde)=", "chosen": "edcba", "rejected": "abcde"},
    {"prompt": "add(12,30)=", "chosen": "42", "rejected": "43"},
    {"prompt": "upper(xyz)=", "chosen": "XYZ", "rejected": "Xyz"},
    {"prompt": "sort(dcba)=", "chosen": "abcd", "rejected": "dcba"},
    {"prompt": "len(hello)=", "chosen": "5", "rejected": "4"},
    {"prompt": "reverse(qwerty)=", "chosen": "ytrewq", "rejected": "qwerty"},
]


@pytest.fixture(autouse=True)
def _patch():
    pp.enable_flashmask()
    yield
    pp.disable_flashmask()


def causal_lm(seed):
    paddle.seed(seed)
    m = LlamaForCausalLM(build_config(None, TINY, len(TOK)))
    m.eval()
    return pp.enable_flashmask(m)


def dpo_config():
    return SimpleNamespace(beta=BETA, loss_type="sigmoid", label_smoothing=0.0, simpo_gamma=0.5, dpop_lambda=50,
                           pref_loss_ratio=1.0, sft_loss_ratio=0.0, reference_free=False, lora=False,
                           ref_model_update_steps=-1)


def packed_dpo_batch():
    rows = pack_records([tokenize_dpo(e, ENC, 64, 32) for e in EXAMPLES], 64, greedy=True)
    assert len(rows) < len(EXAMPLES) and max(len(r["response_indexs"]) for r in rows) >= 3
    batch = {k: paddle.to_tensor(v) for k, v in DPOCollator()(rows).items()}
    return rows, batch


def packed_logps(model, batch, criterion):
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                   attn_mask_startend_row_indices=batch["attn_mask_startend_row_indices"])[0]
    labels = (batch["chosen_labels"], batch["rejected_labels"], batch["response_indexs"], None, None)
    c, r = criterion(logits, labels)
    return c.numpy(), r.numpy()


def separate_logp(model, prompt, answer):
    """Sum of log p(answer + EOS | prompt), one unpacked sequence, plain causal attention."""
    p = TOK.encode(prompt)["input_ids"]
    a = TOK.encode(answer, add_special_tokens=False)["input_ids"] + [TOK.eos_token_id]
    ids = paddle.to_tensor([p + a])
    logp = F.log_softmax(model(input_ids=ids)[0].astype("float32"), axis=-1).numpy()[0]
    return sum(logp[len(p) - 1 + t, tok] for t, tok in enumerate(a))


def test_dpo_packed_logps_and_loss_equal_separate_sequences():
    policy, ref = causal_lm(0), causal_lm(1)
    rows, batch = packed_dpo_batch()
    crit = DPOCriterion(policy.config, dpo_config=dpo_config())
    pc, pr = packed_logps(policy, batch, crit)
    rc, rr = packed_logps(ref, batch, crit)
    ids = batch["input_ids"].numpy()
    triples = []  # greedy packing reorders: find each packed triple's example by its tokens
    for b, cs, rs, re in batch["response_indexs"].numpy():
        chosen, rejected = TOK.decode(ids[b, cs + 1:rs]), TOK.decode(ids[b, rs + 1:re])
        triples.append(next(i for i, e in enumerate(EXAMPLES) if (e["chosen"], e["rejected"]) == (chosen, rejected)))
    assert sorted(triples) == list(range(len(EXAMPLES)))
    sep = {name: np.array([separate_logp(m, EXAMPLES[i]["prompt"], EXAMPLES[i][key]) for i in triples])
           for name, m, key in [("pc", policy, "chosen"), ("pr", policy, "rejected"),
                                ("rc", ref, "chosen"), ("rr", ref, "rejected")]}
    for name, got in [("pc", pc), ("pr", pr), ("rc", rc), ("rr", rr)]:
        assert np.abs(got - sep[name]).max() < 1e-5, name
    # DPO sigmoid loss through PaddleNLP's criterion == from the separate log-probs
    logits = policy(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                    attn_mask_startend_row_indices=batch["attn_mask_startend_row_indices"])[0]
    labels = (batch["chosen_labels"], batch["rejected_labels"], batch["response_indexs"],
              paddle.to_tensor(rc), paddle.to_tensor(rr))
    loss = float(crit(logits, labels)[-1])
    margin = (sep["pc"] - sep["pr"]) - (sep["rc"] - sep["rr"])
    want = float(np.mean(np.log1p(np.exp(-BETA * margin))))
    assert abs(loss - want) < 1e-5


def test_dpo_indices_equal_dense_share_question_mask():
    policy = causal_lm(0)
    rows, batch = packed_dpo_batch()
    crit = DPOCriterion(policy.config, dpo_config=dpo_config())
    pc, pr = packed_logps(policy, batch, crit)
    pp.disable_flashmask()
    eager = LlamaForCausalLM(build_config(None, TINY, len(TOK), use_flash_attention=False))
    eager.set_state_dict(policy.state_dict())
    eager.eval()
    dense = {k: paddle.to_tensor(v) for k, v in DPOCollator(flash_mask=False)(rows).items()}
    logits = eager(input_ids=dense["input_ids"], position_ids=dense["position_ids"],
                   attention_mask=dense["attention_mask"])[0]
    c, r = crit(logits, (dense["chosen_labels"], dense["rejected_labels"], dense["response_indexs"], None, None))
    assert np.abs(c.numpy() - pc).max() < 1e-5 and np.abs(r.numpy() - pr).max() < 1e-5


def test_rm_packed_rewards_equal_separate_sequences():
    paddle.seed(0)
    rm = pp.enable_flashmask(LlamaForRewardModel(build_config(None, TINY, len(TOK))))
    rm.eval()
    rows = pack_records([tokenize_rm(e, ENC, 64, 32) for e in EXAMPLES], 64, greedy=False)
    assert len(rows) < len(EXAMPLES)
    batch = {k: paddle.to_tensor(v) for k, v in RMCollator()(rows).items()}
    loss, r_c, r_r = rm(**batch)

    def reward(prompt, answer):
        ids = TOK.encode(prompt)["input_ids"] + TOK.encode(answer, add_special_tokens=False)["input_ids"] + [2]
        h = rm.llama(paddle.to_tensor([ids]), return_dict=False)[0]
        return float(rm.score_head(h[:, -1]).squeeze())

    want_c = np.array([reward(e["prompt"], e["chosen"]) for e in EXAMPLES])  # greedy=False keeps order
    want_r = np.array([reward(e["prompt"], e["rejected"]) for e in EXAMPLES])
    assert np.abs(r_c.numpy() - want_c).max() < 1e-5 and np.abs(r_r.numpy() - want_r).max() < 1e-5
    want_loss = np.mean(np.log1p(np.exp(-(want_c - want_r))))
    assert abs(float(loss) - want_loss) < 1e-5
    # trains: gradients reach the backbone and the head, all finite
    rm.train()
    rm(**batch)[0].backward()
    assert all(np.isfinite(p.grad.numpy()).all() for p in rm.parameters() if p.grad is not None)
    assert rm.score_head.weight.grad is not None and rm.llama.layers[0].self_attn.q_proj.weight.grad is not None
