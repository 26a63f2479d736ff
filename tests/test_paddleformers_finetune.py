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
from checkpoint_damage import damaged_copy  # noqa: E402
from paddlenlp_patches import paddleformers as pfp  # noqa: E402
from paddlenlp_patches import paddleformers_finetune as pff  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "configs", "paddleformers")


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


def _resume_run(name, out_dir, callbacks=None, **overrides):
    over = dict(output_dir=out_dir, logging_steps=1, do_eval=False, evaluation_strategy="no", save_final_model=False,
                max_steps=12, save_strategy="steps", save_steps=5)
    over.update(overrides)
    s = pff.run(os.path.join(CONFIGS, f"{name}.json"), over, callbacks=callbacks)
    pfp.disable_flashmask()
    return dict(s["losses"])


@pytest.mark.parametrize("name", ["sft", "lora", "dpo"])
def test_interrupted_run_resumes_with_the_same_loss_curve(tmp_path, name):
    """A run stopped after its step-5 checkpoint and resumed from the latest one (true) repeats
    the uninterrupted curve: PaddleFormers' flex checkpoint (weights, optimizer, master weights,
    LR schedule, RNG, data position), loaded on one CPU process through the one-card fleet set-up."""
    from paddleformers.trainer.trainer_callback import TrainerCallback

    class Crash(Exception):
        pass

    class CrashAt7(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 7:
                raise Crash("simulated failure at step 7")

    full = _resume_run(name, str(tmp_path / "full"))
    out_dir = str(tmp_path / "run")
    with pytest.raises(Crash):
        _resume_run(name, out_dir, callbacks=[CrashAt7()])
    resumed = _resume_run(name, out_dir, resume_from_checkpoint="true")
    assert sorted(resumed) == list(range(6, 13)), sorted(resumed)
    np.testing.assert_allclose([resumed[s] for s in range(6, 13)], [full[s] for s in range(6, 13)], rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def flex_checkpoint(tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("pfck"))
    _resume_run("sft", out_dir, max_steps=5)
    return os.path.join(out_dir, "checkpoint-5")


@pytest.mark.parametrize("damage,match", [
    ("remove trainer_state.bin", "not a complete checkpoint: trainer_state.bin missing"),
    ("garble trainer_state.bin", "corrupt: trainer_state.bin does not load"),
    ("truncate model_state/0_0.distcp", "corrupt: model_state/0_0.distcp does not load"),
    ("truncate optimizer_state/0.metadata", "corrupt: optimizer_state/0.metadata does not load"),
    ("remove scheduler.pdparams", "not a complete checkpoint: scheduler.pdparams missing"),
    ("remove saved_signal_0", "its save did not finish"),
    ("empty master_weight", "master_weight/ must hold one .metadata"),
])
def test_partial_or_corrupt_flex_checkpoint_is_an_error(tmp_path, flex_checkpoint, damage, match, op_calls):
    """Before this check PaddleFormers 1.2.0 restarted at step 1 without trainer_state.bin, and failed
    deep in unpickling on a truncated shard; now every damage stops the run before any step."""
    bad = damaged_copy(flex_checkpoint, str(tmp_path / "checkpoint-5"), damage)
    with pytest.raises(ValueError, match=match):
        _resume_run("sft", str(tmp_path / "out"), resume_from_checkpoint=bad)
    assert not op_calls  # stopped before the first step


def test_resume_true_without_a_flex_checkpoint_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no checkpoint-N directory"):
        _resume_run("sft", str(tmp_path), resume_from_checkpoint="true")


def _launch(tmp_path, log_name, *args):
    import subprocess
    import sys

    log_dir = tmp_path / log_name
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir", str(log_dir),
           os.path.join(ROOT, "paddlenlp_patches", "paddleformers_finetune.py"), os.path.join(CONFIGS, "sft.json"),
           "--max_steps", "6", "--logging_steps", "3", "--do_eval", "false", "--output_dir", str(tmp_path / "out"),
           "--save_strategy", "steps", "--save_steps", "3", *args]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    return res, [(log_dir / f"workerlog.{r}").read_text() for r in (0, 1)]


def test_two_process_cpu_data_parallel(tmp_path):
    """paddle.distributed.launch --nproc_per_node 2 paddlenlp_patches/paddleformers_finetune.py (gloo): the
    script runs as a file (our paddleformers.py must not shadow the package), plain data parallel on CPU
    (PaddleFormers' default optimizer sharding fuses buffers on GPU/NPU/XPU only), a checkpoint from each
    rank, and rank 0's final model loads; a resume on several CPU processes (Paddle's flex load reshards
    through CUDA) is refused on both ranks before any step."""
    res, logs = _launch(tmp_path, "log")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:] + logs[0][-3000:] + logs[1][-3000:]
    assert "Traceback" not in logs[0] + logs[1]
    assert "Total train batch size (w. parallel, distributed & accumulation) = 8" in logs[0]  # 2 ranks x 4 rows
    assert logs[0].count(" - loss: ") == 2
    ck = tmp_path / "out" / "checkpoint-3"
    assert (ck / "saved_signal_0").is_file() and (ck / "saved_signal_1").is_file()
    from paddleformers.transformers.llama.modeling import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(tmp_path / "out"))
    assert model.config.num_hidden_layers == 2

    res, logs = _launch(tmp_path, "log_resume", "--resume_from_checkpoint", "true")
    assert res.returncode != 0
    for log in logs:
        assert "resume_from_checkpoint with 2 CPU processes" in log and " - loss: " not in log


@pytest.mark.parametrize("key", ["context_parallel_size", "sep_parallel_size"])
def test_context_parallel_keys_are_refused_with_a_clear_error(tmp_path, key):
    with pytest.raises(ValueError, match=f"{key}=2: context parallel runs through the PaddleNLP runner"):
        run("sft", tmp_path, max_steps=1, **{key: 2})


def test_lengths_no_example_fits_is_an_error_not_an_endless_loop(tmp_path):
    # PaddleFormers' training iterator runs over its data forever, skipping what truncation
    # deletes: with max_seq_len 8 every example is deleted and training had waited for ever
    with pytest.raises(ValueError, match="no training example of .* fits max_seq_len 8"):
        run("sft", tmp_path, max_steps=2, max_seq_len=8, max_prompt_len=4)
    for over, match in [(dict(max_seq_len=-5), "max_seq_len must be an int >= 1"),
                        (dict(max_prompt_len=0), "max_prompt_len must be an int >= 1"),
                        (dict(max_seq_len=64, max_prompt_len=64), "max_prompt_len .64. must be smaller"),
                        (dict(save_final_model="false"), "save_final_model must be true or false")]:
        with pytest.raises(ValueError, match=match):
            run("sft", tmp_path, max_steps=1, **over)


@pytest.mark.parametrize("name, over, match", [
    # LlamaConfig kept the typo as an unread attribute and built its default model (32 layers)
    ("sft", dict(model_config={"num_hidden_layer": 1}), "did you mean 'num_hidden_layers'"),
    ("dpo", dict(beta=0.0), "beta must be > 0"),  # trained nothing; below 0, the reverse preference
    ("dpo", dict(label_smoothing=0.9), r"label_smoothing must be in \[0, 0.5\]"),
    # a name that is no local folder went to the network (a download, or an error naming no key)
    ("sft", dict(model_name_or_path="someorg/some-model"), "is not a local directory"),
])
def test_model_and_dpo_values_that_ran_without_a_word(tmp_path, name, over, match):
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        run(name, tmp_path, max_steps=1, **over)


def test_bad_config_files_name_the_problem(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"stage": "SFT",')
    with pytest.raises(ValueError, match="bad.json: invalid JSON"):
        pff.run(str(bad))
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="a config must be a JSON object, got list"):
        pff.run(str(bad))
