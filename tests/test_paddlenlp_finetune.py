"""The runner (``python -m paddlenlp_patches.finetune``): SFT lowers the loss in 20 steps on the
embedded data, LoRA trains only adapters, DPO/RM run, configs are checked, a local PaddleNLP
checkpoint (model + AutoTokenizer) loads, and a 2-process CPU data-parallel launch works."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from paddlenlp_test_env import CONFIGS, QUIET, ROOT, cfg, require_paddlenlp, restore_flashmask_patch  # noqa: E402,F401

require_paddlenlp()

import paddle  # noqa: E402

import paddlenlp_patches as pp  # noqa: E402
from paddlenlp_patches import finetune  # noqa: E402
from paddlenlp.trainer import TrainerCallback  # noqa: E402




class Snapshot(TrainerCallback):
    def on_train_begin(self, args, state, control, model=None, **kw):
        self.before = {n: p.numpy().copy() for n, p in model.named_parameters()}

    def on_train_end(self, args, state, control, model=None, **kw):
        self.after = {n: p.numpy().copy() for n, p in model.named_parameters()}
        self.trainable = {n for n, p in model.named_parameters() if not p.stop_gradient}


def test_sft_20_steps_lowers_the_loss(tmp_path):
    out = finetune.run(cfg("sft"), dict(QUIET, max_steps=20, output_dir=str(tmp_path)))
    losses = [l for _, l in out["losses"]]
    assert len(losses) == 4 and all(np.isfinite(losses))
    assert losses[-1] < losses[0] - 0.5, losses
    logs = [d for d in out["logs"] if "loss" in d]
    assert all(d["tokens_per_second"] > 0 and d["peak_memory_MB"] > 0 for d in logs)
    assert out["tokens_per_second"] > 0 and out["train_tokens"] > 20 * 4 * 100


def test_flashmask_run_equals_dense_mask_run(tmp_path):
    """The same packed SFT run through PaddleNLP's own eager path with dense block-diagonal masks
    (flash_mask=false, use_flash_attention=false, no patch) logs the same losses."""
    common = dict(QUIET, max_steps=6, logging_steps=2)
    a = finetune.run(cfg("sft"), dict(common, output_dir=str(tmp_path / "a")))
    pp.disable_flashmask()
    b = finetune.run(cfg("sft"), dict(common, output_dir=str(tmp_path / "b"), flash_mask=False,
                                      use_flash_attention=False))
    assert not pp.is_enabled()
    la, lb = np.array(a["losses"]), np.array(b["losses"])
    assert la.shape == (3, 2) and np.abs(la - lb).max() < 1e-4, (la, lb)


def test_lora_trains_only_adapters(tmp_path):
    snap = Snapshot()
    out = finetune.run(cfg("lora"), dict(QUIET, max_steps=5, output_dir=str(tmp_path)), callbacks=[snap])
    assert snap.trainable and all("lora_" in n for n in snap.trainable)
    targets = {n.split(".self_attn.")[1].split(".")[0] for n in snap.trainable}
    assert targets == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert out["trainable_params"] < out["params"] / 5
    changed = {n for n in snap.before if np.abs(snap.after[n] - snap.before[n]).max() > 0}
    assert changed and changed <= snap.trainable
    assert any("lora_B" in n for n in changed)


@pytest.mark.parametrize("stage, extra", [("dpo", {}), ("dpo", {"lora": True}), ("rm", {})])
def test_dpo_and_rm_run(tmp_path, stage, extra):
    out = finetune.run(cfg(stage), dict(QUIET, max_steps=6, logging_steps=3, output_dir=str(tmp_path), **extra))
    logs = [d for d in out["logs"] if "loss" in d]
    assert len(logs) == 2 and all(np.isfinite(d["loss"]) for d in logs)
    assert ("rewards/accuracies" if stage == "dpo" else "accuracy") in logs[0]
    if stage == "dpo" and not extra:  # policy and reference start equal: loss = log 2
        assert abs(logs[0]["loss"] - np.log(2)) < 0.05


def test_config_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown config key"):
        finetune.run(cfg("sft"), {"max_step": 3})
    with pytest.raises(ValueError, match="stage must be one of"):
        finetune.run(cfg("sft"), {"stage": "ppo"})
    with pytest.raises(FileNotFoundError, match="no downloads"):
        finetune.run(cfg("sft"), dict(QUIET, model_name_or_path="meta-llama/Llama-2-7b", output_dir=str(tmp_path)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"src": "a=", "tgt": "b"}\n{"src": "c="}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: missing field 'tgt'"):
        finetune.run(cfg("sft"), dict(QUIET, dataset_name_or_path=str(bad), dev_dataset_path=None,
                                      output_dir=str(tmp_path)))


def test_cli_overrides_parse():
    import argparse

    from paddlenlp_patches.cli import parse_overrides, parse_value

    assert parse_value("20") == 20 and parse_value("abc") == "abc"
    assert parse_value('{"a": 1}') == {"a": 1}
    parser = argparse.ArgumentParser()
    assert parse_overrides(parser, ["--max_steps", "20", "--lora", "--x=1", "--name", "abc"]) == \
        {"max_steps": 20, "lora": True, "x": 1, "name": "abc"}
    with pytest.raises(SystemExit):
        parse_overrides(parser, ["stray"])


def _spm_tokenizer_dir(path):
    """A real PaddleNLP LlamaTokenizer (sentencepiece, trained here: no download)."""
    import io

    spm = pytest.importorskip("sentencepiece")
    from paddlenlp.transformers import LlamaTokenizer

    lines = []
    with open(os.path.join(CONFIGS, "data", "sft_train.jsonl")) as f:
        for line in f:
            ex = json.loads(line)
            lines.append(json.dumps(ex["src"]) + json.dumps(ex["tgt"]))
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf, vocab_size=90,
                                   model_type="char", bos_id=1, eos_id=2, unk_id=0, pad_id=-1,
                                   character_coverage=1.0, minloglevel=2)
    os.makedirs(str(path), exist_ok=True)
    spm_file = os.path.join(str(path), "spm.model")
    with open(spm_file, "wb") as f:
        f.write(buf.getvalue())
    LlamaTokenizer(vocab_file=spm_file).save_pretrained(str(path))


def test_local_checkpoint_loads_model_and_auto_tokenizer(tmp_path):
    from paddlenlp.transformers import AutoTokenizer, LlamaForCausalLM

    from paddlenlp_patches.modeling import build_config

    ckpt = tmp_path / "ckpt"
    _spm_tokenizer_dir(ckpt)
    tok = AutoTokenizer.from_pretrained(str(ckpt))
    paddle.seed(3)
    tiny = json.load(open(cfg("sft")))["model_config"]
    model = LlamaForCausalLM(build_config(None, tiny, len(tok)))
    model.save_pretrained(str(ckpt))
    saved = {k: v.numpy() for k, v in model.state_dict().items()}

    snap = Snapshot()
    overrides = dict(QUIET, model_name_or_path=str(ckpt), max_steps=2, output_dir=str(tmp_path / "o"),
                     model_config={}, tokenizer_name_or_path=None)
    out = finetune.run(cfg("sft"), overrides, callbacks=[snap])
    assert type(out["trainer"].tokenizer).__name__ == "LlamaTokenizer"
    for name, val in snap.before.items():
        assert np.array_equal(val, saved[name]), name
    # the reward model takes the causal-LM checkpoint's backbone (score head new, lm_head unused)
    snap = Snapshot()
    out = finetune.run(cfg("rm"), dict(overrides, output_dir=str(tmp_path / "rm")), callbacks=[snap])
    assert np.array_equal(snap.before["llama.layers.0.self_attn.q_proj.weight"],
                          saved["llama.layers.0.self_attn.q_proj.weight"])


def test_sft_output_feeds_dpo(tmp_path):
    """save_final_model writes model + char tokenizer; a dpo config starts from that directory."""
    sft_dir = str(tmp_path / "sft")
    finetune.run(cfg("sft"), dict(QUIET, max_steps=2, output_dir=sft_dir, save_final_model=True))
    assert os.path.isfile(os.path.join(sft_dir, "char_tokenizer.json"))
    out = finetune.run(cfg("dpo"), dict(QUIET, max_steps=2, logging_steps=1, output_dir=str(tmp_path / "dpo"),
                                        model_name_or_path=sft_dir, model_config={}))
    assert len(out["losses"]) == 2


@pytest.mark.skipif(os.environ.get("PFM_SKIP_DISTRIBUTED") == "1", reason="PFM_SKIP_DISTRIBUTED=1")
def test_two_process_cpu_data_parallel(tmp_path):
    """python -m paddle.distributed.launch --nproc_per_node 2 paddlenlp_patches/finetune.py configs/sft.json
    (gloo on CPU, about 20 s here; PFM_SKIP_DISTRIBUTED=1 skips it). Each rank trains on its shard."""
    log_dir = tmp_path / "log"
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir", str(log_dir),
           os.path.join(ROOT, "paddlenlp_patches", "finetune.py"), cfg("sft"), "--max_steps", "6",
           "--logging_steps", "3", "--disable_tqdm", "true", "--do_eval", "false",
           "--output_dir", str(tmp_path / "out")]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    logs = {r: (log_dir / f"workerlog.{r}").read_text() for r in (0, 1)}
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:] + logs[0][-2000:] + logs[1][-2000:]
    assert "Traceback" not in logs[0] + logs[1]
    assert "world_size=2" in logs[0] and logs[0].count(" - loss: ") == 2  # rank 0 logs the all-reduced loss
    assert "Total train batch size (w. parallel, distributed & accumulation) = 8" in logs[0]  # 2 ranks x 4 rows
    assert os.path.isfile(tmp_path / "out" / "model_state.pdparams")
