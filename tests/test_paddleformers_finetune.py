"""The PaddleFormers fine-tune runner (paddlenlp_patches.paddleformers_finetune): SFT, LoRA and DPO
through PaddleFormers' own data flow, collators and trainers on the embedded tiny data (CPU), with
packed rows whose attn_mask_startend_row_indices reach paddle_flashmask.flashmask_attention. Skipped
where paddleformers is not importable (it cannot share an environment with paddlenlp 3.0.0b4; see
tests/run_paddleformers_tests.sh, which sets PFM_REQUIRE_PADDLEFORMERS=1)."""

import math
import os

import numpy as np
import pytest

try:
    from paddleformers.cli.train.sft.sft_trainer import SFTTrainer  # noqa: F401
    from paddleformers.nn.attention.interface import AttentionInterface  # noqa: F401
except ImportError as e:  # not installed, or installed next to paddlenlp's aistudio-sdk 0.2.6
    if os.environ.get("PFM_REQUIRE_PADDLEFORMERS") == "1":  # tests/run_paddleformers_tests.sh: must run
        raise
    pytest.skip(f"paddleformers is not importable: {e}", allow_module_level=True)

import paddle_flashmask  # noqa: E402
from paddlenlp_patches import paddleformers as pfp  # noqa: E402
from paddlenlp_patches import paddleformers_finetune as pff  # noqa: E402

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "paddleformers")


@pytest.fixture(autouse=True)
def _restore_entry():
    pfp.disable_flashmask()
    yield
    pfp.disable_flashmask()


@pytest.fixture
def op_calls(monkeypatch):
    """Every call of paddle_flashmask.flashmask_attention: (q shape, indices shape or None, causal)."""
    calls = []
    real = paddle_flashmask.flashmask_attention

    def spy(q, k, v, startend_row_indices=None, *a, **kw):
        calls.append((list(q.shape), None if startend_row_indices is None else list(startend_row_indices.shape),
                      kw.get("causal")))
        return real(q, k, v, startend_row_indices, *a, **kw)

    monkeypatch.setattr(paddle_flashmask, "flashmask_attention", spy)
    return calls


def run(name, tmp_path, callbacks=None, **overrides):
    over = dict(output_dir=str(tmp_path / name), logging_steps=1, do_eval=False, evaluation_strategy="no",
                save_final_model=False)
    over.update(overrides)
    return pff.run(os.path.join(CONFIGS, f"{name}.json"), over, callbacks=callbacks)


def test_sft_lowers_loss_on_packed_flashmask_rows(tmp_path, op_calls):
    s = run("sft", tmp_path, max_steps=20)
    losses = [v for _, v in s["losses"]]
    assert len(losses) == 20 and all(math.isfinite(v) for v in losses)
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5, losses
    assert s["trainable_params"] == s["params"] and not s["lora"]
    # 2 layers x 20 steps forward, every call with PaddleFormers' packed causal-document indices
    assert len(op_calls) >= 40
    assert all(ind is not None and ind[0] == 4 and ind[1:] == [1, 256, 1] and causal for _, ind, causal in op_calls)


def test_lora_trains_only_adapters(tmp_path, op_calls):
    from paddleformers.trainer.trainer_callback import TrainerCallback

    snap = {}

    class Snapshot(TrainerCallback):  # the frozen base weights before and after training
        def on_train_begin(self, args, state, control, model=None, **kw):
            snap["before"] = {n: p.numpy().copy() for n, p in model.named_parameters() if p.stop_gradient}

        def on_train_end(self, args, state, control, model=None, **kw):
            snap["after"] = {n: p.numpy().copy() for n, p in model.named_parameters() if p.stop_gradient}

    s = run("lora", tmp_path, max_steps=10, callbacks=[Snapshot()])
    model = s["trainer"].model
    trainable = [n for n, p in model.named_parameters() if not p.stop_gradient]
    assert s["lora"] and trainable and all("lora" in n for n in trainable)
    assert 0 < s["trainable_params"] < s["params"] / 4
    assert snap["before"].keys() == snap["after"].keys() and len(snap["before"]) > 10
    assert all(np.array_equal(snap["before"][n], snap["after"][n]) for n in snap["before"])
    losses = [v for _, v in s["losses"]]
    assert all(math.isfinite(v) for v in losses) and np.mean(losses[-3:]) < np.mean(losses[:3])
    assert op_calls and all(ind is not None for _, ind, _ in op_calls)


def test_dpo_loss_finite_and_changes_with_share_question_indices(tmp_path, op_calls):
    s = run("dpo", tmp_path, max_steps=10)
    losses = [v for _, v in s["losses"]]
    assert len(losses) == 10 and all(math.isfinite(v) for v in losses)
    assert abs(losses[0] - math.log(2)) < 0.05  # policy == reference at the start: -log sigmoid(0)
    assert max(losses) - min(losses) > 1e-3 and losses[-1] < losses[0]
    # policy and reference model both run our op on the packed prompt/chosen/rejected rows
    assert len(op_calls) >= 2 * 2 * 10
    assert all(ind is not None and ind[1:] == [1, 128, 1] for _, ind, _ in op_calls)


def test_dpo_batches_carry_share_question_indices(tmp_path):
    """PaddleFormers' DPO data flow + collator on the embedded data: a rejected answer's rows do not
    see the chosen answer (its columns end at the chosen answer's end), as the dense mask would."""
    from functools import partial

    from paddleformers.datasets.collate import dpo_collate_fn
    from paddleformers.datasets.loader import create_dataset

    cfg, base = pff.load_config(os.path.join(CONFIGS, "dpo.json"), {"output_dir": str(tmp_path / "d")})
    model_args, data_args, targs, _ = pff.parse_args(cfg, base)
    tok = pff.load_tokenizer("char")
    ds = create_dataset(task_group=data_args.train_dataset_path, task_group_prob="1.0", sub_dataset_type="erniekit",
                        **pff.dataset_config(model_args, data_args, targs, tok))
    it = iter(ds)
    batch = [next(it) for _ in range(2)]
    out = partial(dpo_collate_fn, tokenizer=tok, training_args=targs, max_seq_len=data_args.max_seq_len,
                  padding_free=False, use_filtered_label_loss=False)(batch)
    ind = np.asarray(out["attn_mask_startend_row_indices"])
    assert ind.shape == (2, 1, 128, 1) and ind.dtype == np.int32
    assert len(batch[0]) > 1  # several examples packed in one row
    seq = batch[0][0]  # the row's first example: prompt, chosen, rejected
    p_len, rej_start, n = seq.response_index[0] + 1, seq.response_index[1], len(seq.token_ids)
    col = ind[0, 0, :, 0]
    assert (col[:p_len] == n).all()  # the prompt: seen by the whole example, chosen and rejected
    assert (col[p_len:rej_start] == rej_start).all()  # the chosen answer: hidden from the rejected rows
    assert (col[rej_start:n] == n).all() and col[n] > n  # the rejected answer; the next example starts
