"""The fine-tune runner's own checks of what a config or the data hands it: each mistake raises
a ValueError naming the key before anything trains (a string "false" had read as true, a float
``lora_alpha`` had been truncated to 0, a padded row had run past the model's positions into NaN
weights), and the reward model's accuracy counts pairs, not batches."""

import numpy as np
import pytest

from paddlenlp_test_env import QUIET, cfg, require_paddlenlp, restore_flashmask_patch  # noqa: E402,F401

require_paddlenlp()

import paddle  # noqa: E402

from paddlenlp_patches import collators, finetune  # noqa: E402
from paddlenlp_patches.cli import parse_value  # noqa: E402
from paddlenlp_patches.data import DataFormatError, read_jsonl  # noqa: E402



def _split(**overrides):
    config, _ = finetune.load_config(cfg(overrides.pop("_stage", "sft")), overrides)
    return finetune.split_config(config)


def test_python_spellings_on_the_command_line():
    assert parse_value("False") is False and parse_value("True") is True and parse_value("None") is None
    assert parse_value("false") is False and parse_value("FALSE") == "FALSE"


@pytest.mark.parametrize("key", ["zero_padding", "greedy_zero_padding", "flash_mask", "use_flash_attention",
                                 "lora", "save_final_model"])
def test_runner_flags_must_be_bools(key):
    with pytest.raises(ValueError, match=f"{key} must be true or false, got 'false'"):
        _split(**{key: "false"})


@pytest.mark.parametrize("key, value", [("max_length", 256.7), ("src_length", -1), ("src_length", 0),
                                        ("pad_to_multiple_of", 0), ("pad_to_multiple_of", -4),
                                        ("lora_rank", 0), ("max_seq_len", "512"),
                                        ("gradient_accumulation_steps", 0), ("per_device_train_batch_size", 0)])
def test_lengths_and_counts_must_be_positive_ints(key, value):
    with pytest.raises(ValueError, match=f"{key} must be an int >= 1"):
        _split(**{key: value})


@pytest.mark.parametrize("overrides, message", [
    (dict(lora_alpha=0), "lora_alpha must be a number > 0"),
    (dict(lora_alpha="16"), "lora_alpha must be a number > 0"),
    (dict(lora_dropout=1.0), r"lora_dropout must be a number in \[0, 1\)"),
    (dict(lora_target_modules="q_proj"), "lora_target_modules must be a non-empty list of regexes"),
    (dict(lora_target_modules=[]), "lora_target_modules must be a non-empty list of regexes"),
])
def test_lora_options(overrides, message):
    with pytest.raises(ValueError, match=message):
        _split(_stage="lora", **overrides)


def test_a_fractional_lora_alpha_scales_the_adapters(tmp_path):
    from paddlenlp_patches.lora import apply_lora

    out = finetune.run(cfg("lora"), dict(QUIET, max_steps=1, lora_alpha=0.5, output_dir=str(tmp_path)))
    model = out["trainer"].model
    scales = [m.scaling for m in model.sublayers() if hasattr(m, "lora_A")]
    assert scales and scales == pytest.approx([0.5 / 8] * len(scales))  # lora_rank 8; int(0.5) had made it 0
    with pytest.raises(ValueError, match="a list of regexes, got the string"):
        apply_lora(model.model, r=4, target_modules=".*q_proj")


@pytest.mark.parametrize("overrides, message", [
    (dict(beta="abc"), "beta must be a number"),
    (dict(beta=None), "beta must be a number"),
    (dict(label_smoothing="x"), "label_smoothing must be a number"),
    (dict(loss_type="sigmod"), "loss_type must be one of"),
    (dict(reference_free="false"), "reference_free must be true or false"),
    (dict(ref_model_update_steps=2.5), "ref_model_update_steps must be an int"),
    (dict(lora=True, ref_model_update_steps=1), "cannot be combined with lora"),
])
def test_dpo_options(overrides, message):
    with pytest.raises(ValueError, match=message):
        _split(_stage="dpo", **overrides)


def test_or_and_simpo_run_reference_free():
    for loss_type in ("simpo", "or"):
        _, dpo, _, _ = _split(_stage="dpo", loss_type=loss_type)
        assert dpo["reference_free"] is True
    _, dpo, _, _ = _split(_stage="dpo")
    assert dpo["reference_free"] is False


def test_padded_rows_must_fit_the_positions(tmp_path):
    # max_length 512 fits the tiny model's 512 positions; padded to a multiple of 300 it is 600
    with pytest.raises(ValueError, match="reach 600 tokens, past the model's max_position_embeddings 512"):
        finetune.run(cfg("sft"), dict(QUIET, max_steps=1, max_length=512, pad_to_multiple_of=300,
                                      output_dir=str(tmp_path)))
    finetune.run(cfg("sft"), dict(QUIET, max_steps=1, max_length=512, pad_to_multiple_of=256,
                                  output_dir=str(tmp_path)))  # 512 exactly: fits


def test_resuming_dpo_with_reference_updates_is_refused(tmp_path, monkeypatch):
    from paddlenlp_patches import checkpoint

    monkeypatch.setattr(checkpoint, "resolve_resume", lambda value, output_dir: str(tmp_path / "checkpoint-4"))
    with pytest.raises(ValueError, match="resuming DPO with ref_model_update_steps > 0"):
        finetune.run(cfg("dpo"), dict(QUIET, max_steps=1, ref_model_update_steps=2, output_dir=str(tmp_path)))


def test_an_explicit_dev_set_wins_over_the_directory(tmp_path):
    (tmp_path / "train.json").write_text('{"src": "a=", "tgt": "b"}\n')
    (tmp_path / "dev.json").write_text('{"src": "c=", "tgt": "d"}\n')
    other = tmp_path / "other_dev.jsonl"
    other.write_text('{"src": "e=", "tgt": "f"}\n')
    opts, _, _, _ = _split(dataset_name_or_path=str(tmp_path), dev_dataset_path=str(other))
    assert finetune._data_paths(opts, str(tmp_path)) == (str(tmp_path), str(other))
    opts, _, _, _ = _split(dataset_name_or_path=str(tmp_path), dev_dataset_path=None)
    assert finetune._data_paths(opts, str(tmp_path)) == (str(tmp_path), str(tmp_path))


def test_a_line_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes('{"src": "a=", "tgt": "b"}\n{"src": "caf\xe9=", "tgt": "d"}\n'.encode("latin-1"))
    with pytest.raises(DataFormatError, match=r"latin1.jsonl:2: not UTF-8"):
        read_jsonl(str(path))
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes('\ufeff{"src": "a=", "tgt": "b"}\n'.encode("utf-8"))
    assert read_jsonl(str(bom))[0][1] == {"src": "a=", "tgt": "b"}


@pytest.mark.parametrize("value", [0, -4, 2.0, True])
def test_collator_padding_multiple(value):
    with pytest.raises(ValueError, match="pad_to_multiple_of must be an int >= 1"):
        collators.COLLATORS["sft"](0, pad_to_multiple_of=value)


def test_reward_accuracy_counts_pairs_not_batches(monkeypatch):
    from paddlenlp.trainer import Trainer

    from paddlenlp_patches.trainer import RewardTrainer

    logged = []
    monkeypatch.setattr(Trainer, "log", lambda self, logs, **kw: logged.append(dict(logs)))
    trainer = RewardTrainer.__new__(RewardTrainer)  # compute_loss and log only

    class Model:
        training = False

        def __init__(self, chosen, rejected):
            self.out = (paddle.to_tensor(0.5), paddle.to_tensor(chosen), paddle.to_tensor(rejected))

        def __call__(self, **inputs):
            return self.out

    trainer.compute_loss(Model([1.0, 0.0, 2.0], [0.0, 1.0, 1.0]), {})  # 2 of 3 pairs
    trainer.compute_loss(Model([3.0], [1.0]), {})  # 1 of 1
    trainer.log({"eval_loss": 0.4})
    assert logged[-1]["eval_accuracy"] == 0.75  # 3 of 4 pairs (the batches' mean would be 0.8333)
    trainer.log({"eval_loss": 0.4})
    assert "eval_accuracy" not in logged[-1]  # counted afresh after each log
    assert np.isclose(logged[0]["eval_loss"], 0.4)


@pytest.mark.parametrize("model_config, message", [
    (dict(hidden_size=64, num_attention_heads=5), "hidden_size 64 must be a multiple of num_attention_heads 5"),
    (dict(num_attention_heads=4, num_key_value_heads=3), "num_attention_heads 4 must be a multiple of num_key_value_heads 3"),
])
def test_model_heads_must_divide(tmp_path, model_config, message):
    config, _ = finetune.load_config(cfg("sft"))
    with pytest.raises(ValueError, match=message):
        finetune.run(cfg("sft"), dict(QUIET, max_steps=1, output_dir=str(tmp_path),
                                      model_config=dict(config["model_config"], **model_config)))


def test_a_checkpoint_of_another_stage_is_not_resumed(tmp_path):
    out = str(tmp_path / "sft")
    finetune.run(cfg("sft"), dict(QUIET, max_steps=2, save_strategy="steps", save_steps=2, output_dir=out))
    ckpt = tmp_path / "sft" / "checkpoint-2"
    assert (ckpt / "pfm_run.json").is_file()
    with pytest.raises(ValueError, match="written by a sft run; this run is dpo"):
        finetune.run(cfg("dpo"), dict(QUIET, max_steps=3, resume_from_checkpoint=str(ckpt),
                                      output_dir=str(tmp_path / "dpo")))
    with pytest.raises(ValueError, match="written by a sft run; this run is sft with LoRA"):
        finetune.run(cfg("sft"), dict(QUIET, max_steps=3, lora=True, resume_from_checkpoint=str(ckpt),
                                      output_dir=str(tmp_path / "lora")))
    resumed = finetune.run(cfg("sft"), dict(QUIET, max_steps=3, logging_steps=1, resume_from_checkpoint=str(ckpt),
                                            output_dir=out))
    assert [s for s, _ in resumed["losses"]] == [3]  # the same stage resumes


def test_reward_eval_loss_and_accuracy_are_means_over_pairs(tmp_path):
    # PaddleNLP's evaluation loop weighs each batch's loss by its rows; packed rows hold 3-7
    # pairs each, so that mean (and a mean of batch accuracies) weighs pairs unevenly
    from paddlenlp_patches.collators import RMCollator

    out = finetune.run(cfg("rm"), dict(QUIET, max_steps=10, do_eval=True, per_device_eval_batch_size=3,
                                       output_dir=str(tmp_path)))
    trainer = out["trainer"]
    trainer.model.eval()
    chosen, rejected = [], []
    with paddle.no_grad():
        for row in trainer.eval_dataset:  # one row at a time: no batch weighting at all
            batch = {k: paddle.to_tensor(v) for k, v in RMCollator(0, True)([row]).items()}
            _, c, r = trainer.model(**batch)
            chosen += c.numpy().astype("float64").tolist()
            rejected += r.numpy().astype("float64").tolist()
    diff = np.array(chosen) - np.array(rejected)
    want_loss = float(np.mean(np.logaddexp(0.0, -diff)))  # -log sigmoid, float64
    assert out["eval"]["eval_loss"] == pytest.approx(want_loss, rel=1e-5)
    assert out["eval"]["eval_accuracy"] == round(float(np.mean(diff > 0)), 4)


# ---- found by an adversarial probe of the runner (fifty-second session): each had run on ------------------

@pytest.mark.parametrize("stage, overrides, message", [
    ("dpo", dict(beta=0), "beta must be > 0"),  # trained nothing
    ("dpo", dict(beta=-0.1), "beta must be > 0"),  # learned the reverse preference
    ("dpo", dict(label_smoothing=5.0), r"label_smoothing must be in \[0, 0.5\]"),
    ("dpo", dict(sft_loss_ratio=-1.0), "sft_loss_ratio must be >= 0"),
    ("sft", dict(max_steps=0, num_train_epochs=0), "nothing to train"),  # saved the random model
    ("sft", dict(max_steps=True), "max_steps must be an int"),  # ran one step
    ("sft", dict(context_parallel_degree=-5), r"context_parallel_degree must be an integer >= 1 \(or -1: off\)"),
    ("sft", dict(recompute=True, recompute_granularity="bogus"), "recompute_granularity must be one of"),
    ("sft", dict(max_seq_len=8), r"stage 'sft' does not read \['max_seq_len'\]"),  # an SFT run ignored it
    ("dpo", dict(dataset_name_or_path="/nonexistent.jsonl"), r"stage 'dpo' does not read"),
    ("rm", dict(beta=0.2), r"stage 'rm' does not read \['beta'\]"),
    ("sft", dict(output_dir=None), "output_dir must be a path string"),  # a TypeError in posixpath
    ("sft", dict(dataset_name_or_path=5), "dataset_name_or_path must be a path string"),
    ("lora", dict(lora_target_modules=["(q_proj"]), r"lora_target_modules: '\(q_proj' is not a regex"),
    ("sft", dict(seed="x"), "seed must be an int"),  # Paddle's int() error
])
def test_runner_values_that_ran_without_a_word(stage, overrides, message):
    with pytest.raises(ValueError, match=message):
        _split(_stage=stage, **overrides)


def test_fp16_on_the_cpu_is_refused_before_training():
    if paddle.is_compiled_with_cuda():
        pytest.skip("a CUDA Paddle: fp16 may run")
    with pytest.raises(ValueError, match="fp16 training needs a GPU"):
        _split(fp16=True)  # PaddleNLP's loss scaler failed in its first step (AttributeError)


@pytest.mark.parametrize("model_config, message", [
    ({"num_hidden_layer": 1}, r"unknown LlamaConfig key\(s\) 'num_hidden_layer' \(did you mean 'num_hidden_layers'\?\)"),
    ("tiny", "model_config must be a JSON object"),
])
def test_model_config_keys_are_llama_config_fields(model_config, message):
    from paddlenlp_patches import modeling

    # LlamaConfig kept the typo as an unread attribute and built its default model (32 layers)
    with pytest.raises(ValueError, match=message):
        modeling.build_config(None, model_config, 100)


def test_a_named_dev_set_must_exist_even_without_eval(tmp_path):
    config, base = finetune.load_config(cfg("sft"), {"dev_dataset_path": str(tmp_path / "missing.jsonl"),
                                                      "do_eval": False})
    opts = finetune.split_config(config)[0]
    with pytest.raises(FileNotFoundError, match="dev_dataset_path=.*missing.jsonl.* does not exist"):
        finetune._data_paths(opts, base)


@pytest.mark.parametrize("row, message", [
    (dict(labels=[6]), r"per-token fields must be as long as input_ids \(3\), got \{'labels': 1\}"),  # broadcast
    (dict(labels=[6, 7]), r"got \{'labels': 2\}"),
    (dict(input_ids=[], labels=[], attn_mask_startend_row_indices=[], position_ids=[]), "input_ids is empty"),
    (dict(labels=None), None),
])
def test_collator_rows_are_checked(row, message):
    full = {"input_ids": [5, 6, 7], "labels": [6, 7, -100], "attn_mask_startend_row_indices": [3, 3, 3],
            "position_ids": [0, 1, 2]}
    full.update(row)
    if full["labels"] is None:
        del full["labels"]
        message = r"missing field\(s\) \['labels'\]"
    with pytest.raises(ValueError, match=message):
        collators.SFTCollator()([full])
