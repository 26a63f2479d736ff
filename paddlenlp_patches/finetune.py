"""Fine-tune runner: PaddleNLP's Trainer for sft / lora / dpo / rm with FlashMask attention.

    python -m paddlenlp_patches.finetune configs/sft.json [--max_steps 20 --output_dir out ...]
    python -m paddle.distributed.launch --nproc_per_node 2 paddlenlp_patches/finetune.py configs/sft.json

(``paddle.distributed.launch`` takes a script path, not ``-m``; on CPU it uses gloo; do not pass
``--devices`` there.)

Context parallel (one packed sequence split over the ranks of a group, needs ``flash_mask``):
``context_parallel_degree`` (``paddle_flashmask.distributed`` method ``allgather``: K/V
exchanged) or ``sep_parallel_degree`` (method ``ulysses``: all-to-all between sequence and
heads; the query and key/value heads must divide by the degree), both PaddleNLP
``TrainingArguments`` fields, not together. The world size must be a multiple of the degree; the
rest is data parallel (fleet's hybrid dp x sep groups). The ranks of a group train on the same
batches, each on its rows of every sequence; the loss is that of the whole batch, and gradients
are summed over the group, so the run follows the one-process loss curve (world = degree), or
with ``N = dp x degree`` ranks each data-parallel replica follows its curve in a plain
``dp``-rank data-parallel run. On CPU (gloo) fleet's groups are created through
:mod:`paddlenlp_patches.gloo_groups`: Paddle 3.3.1's gloo groups created side by side (dp 2 x
cp 2) collide in the global store otherwise.

A config is one JSON object (PaddleNLP's llm/config/llama/flashmask/*.json keys where they exist):

- ``stage``: ``sft`` | ``lora`` | ``dpo`` | ``rm``.
- model: ``model_name_or_path`` (a local PaddleNLP checkpoint directory; ``null`` = tiny
  random-init LLaMA built from ``model_config``, a ``LlamaConfig`` dict), ``tokenizer_name_or_path``
  (default: the model directory, else ``"char"``, our character tokenizer), ``use_flash_attention``,
  ``flash_mask``, and model flags (``fuse_attention_qkv``, ``recompute_granularity``, ...).
- data: ``dataset_name_or_path`` (sft/lora: a jsonl file or a directory with ``train.json`` /
  ``dev.json``) or ``train_dataset_path`` / ``dev_dataset_path`` (dpo/rm); lengths ``max_length`` /
  ``src_length`` (sft/lora) or ``max_seq_len`` / ``max_prompt_len`` (dpo/rm); ``zero_padding``
  (pack several examples per row), ``greedy_zero_padding``, ``on_overflow``
  (``truncate`` | ``error`` | ``skip``), ``pad_to_multiple_of``.
- LoRA: ``lora`` (implied by stage lora; allowed for dpo), ``lora_rank``, ``lora_alpha``,
  ``lora_dropout``, ``lora_target_modules``.
- DPO (PaddleNLP's DPOConfig): ``beta``, ``loss_type``, ``label_smoothing``, ``simpo_gamma``,
  ``dpop_lambda``, ``pref_loss_ratio``, ``sft_loss_ratio``, ``reference_free``,
  ``ref_model_update_steps``.
- everything else that is a ``paddlenlp.trainer.TrainingArguments`` field goes there
  (``output_dir``, ``max_steps``, ``learning_rate``, ``per_device_train_batch_size``, ...).
- ``save_final_model`` (default true): save model + tokenizer to ``output_dir`` at the end, so
  a later config can start from it with ``model_name_or_path``.

Relative input paths are looked up in the current directory, then next to the config file.
Unknown keys are an error; PaddleNLP keys without meaning here (``lazy``, ``benchmark``, ...)
are ignored with a warning.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not __package__:
    # run as a script (paddle.distributed.launch): do not let this package's modules shadow others
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import copy
import dataclasses
import json
import logging
import time
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

from paddlenlp_patches import config_checks

STAGES = ("sft", "lora", "dpo", "rm")

DEFAULTS: Dict[str, Any] = {
    "stage": "sft",
    "model_name_or_path": None,
    "tokenizer_name_or_path": None,
    "model_config": None,
    "use_flash_attention": True,
    "flash_mask": True,
    "dataset_name_or_path": None,
    "train_dataset_path": None,
    "dev_dataset_path": None,
    "max_length": 2048,
    "src_length": 1024,
    "max_seq_len": 2048,
    "max_prompt_len": 1024,
    "zero_padding": True,
    "greedy_zero_padding": True,
    "on_overflow": "truncate",
    "pad_to_multiple_of": 1,
    "lora": False,
    "lora_rank": 8,
    "lora_alpha": None,
    "lora_dropout": 0.0,
    "lora_target_modules": None,
    "save_final_model": True,
}

DPO_DEFAULTS: Dict[str, Any] = {
    "beta": 0.1,
    "loss_type": "sigmoid",
    "label_smoothing": 0.0,
    "simpo_gamma": 0.5,
    "dpop_lambda": 50,
    "pref_loss_ratio": 1.0,
    "sft_loss_ratio": 0.0,
    "reference_free": False,
    "ref_model_update_steps": -1,
}

MODEL_FLAGS = (
    "use_fused_rms_norm", "use_fused_rope", "fuse_attention_qkv", "fuse_attention_ffn",
    "recompute_granularity", "recompute_use_reentrant", "refined_recompute", "use_fused_linear_cross_entropy",
)

# PaddleNLP llm/ keys that have no meaning for this runner (accepted so their configs load)
IGNORED_KEYS = (
    "lazy", "benchmark", "autotuner_benchmark", "eval_with_do_generation", "tensor_parallel_output",
    "intokens", "use_attn_mask_startend_row_indices", "normalize_logps", "unified_checkpoint_config",
    "dpo_benchmark", "use_efficient_attention", "chat_template", "num_of_gpus", "pipeline_parallel_config",
    "tensor_parallel_config", "sharding_parallel_config", "lora_path",
)

TRAINING_DEFAULTS: Dict[str, Any] = {
    "report_to": [],
    "save_strategy": "no",
    "evaluation_strategy": "no",
    "remove_unused_columns": False,
    "dataloader_num_workers": 0,
    "disable_tqdm": False,
    "logging_steps": 10,
    "prediction_loss_only": True,
    "skip_memory_metrics": True,
}

# what PaddleNLP's LLaMA recomputes (anything else recomputed nothing, silently)
RECOMPUTE_GRANULARITIES = ("full", "full_attn", "core_attn")

# context-parallel keys (TrainingArguments fields) -> paddle_flashmask.distributed plan method
CP_METHODS = {"context_parallel_degree": "allgather", "sep_parallel_degree": "ulysses"}

logger = logging.getLogger("paddlenlp_patches.finetune")


def load_config(config, overrides: Optional[Dict[str, Any]] = None):
    """``(config dict, base_dir)`` from a JSON path or a dict, with ``overrides`` applied."""
    if isinstance(config, (str, os.PathLike)):
        with open(config, encoding="utf-8") as f:
            try:
                cfg = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{config}: invalid JSON ({e})") from None
        base_dir = os.path.dirname(os.path.abspath(config))
    else:
        cfg, base_dir = copy.deepcopy(dict(config)), os.getcwd()
    if not isinstance(cfg, dict):
        raise ValueError("a config must be a JSON object")
    cfg.update(overrides or {})
    return cfg, base_dir


def _resolve(path: Optional[str], base_dir: str) -> Optional[str]:
    if not path or os.path.isabs(path) or os.path.exists(path):
        return path
    cand = os.path.join(base_dir, path)
    return cand if os.path.exists(cand) else path


def split_config(cfg: Dict[str, Any]):
    """-> (runner options, dpo options, model flags, TrainingArguments kwargs)."""
    from paddlenlp.trainer import TrainingArguments

    targ_fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    opts = dict(DEFAULTS)
    dpo = dict(DPO_DEFAULTS)
    flags: Dict[str, Any] = {}
    targs = dict(TRAINING_DEFAULTS)
    unknown, ignored = [], []
    for k, v in cfg.items():
        if k in DEFAULTS:
            opts[k] = v
        elif k in DPO_DEFAULTS:
            dpo[k] = v
        elif k in MODEL_FLAGS:
            flags[k] = v
        elif k in targ_fields:
            targs[k] = v
        elif k in IGNORED_KEYS:
            ignored.append(k)
        else:
            unknown.append(k)
    if unknown:
        raise ValueError(f"unknown config key(s) {sorted(unknown)}: not a runner, DPO, model or "
                         "paddlenlp TrainingArguments key")
    if ignored:
        logger.warning("ignoring PaddleNLP keys without meaning here: %s", sorted(ignored))
    if opts["stage"] not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {opts['stage']!r}")
    config_checks.check_runner_options(opts)
    config_checks.check_dpo_options(dpo)
    _check_stage_keys(cfg)  # after the values' own checks, which name the value
    if dpo["loss_type"] in config_checks.REFERENCE_FREE_LOSS_TYPES:
        dpo["reference_free"] = True  # PaddleNLP's or/simpo losses take no reference model
    if opts["stage"] == "dpo" and opts["lora"] and dpo["ref_model_update_steps"] > 0:
        raise ValueError("ref_model_update_steps > 0 cannot be combined with lora: the reference is the base "
                         "model with the adapters off, which has no weights of its own to update")
    if opts["on_overflow"] not in ("truncate", "error", "skip"):
        raise ValueError(f"on_overflow must be truncate, error or skip, got {opts['on_overflow']!r}")
    for key in ("tensor_parallel_degree", "pipeline_parallel_degree"):
        if int(targs.get(key, 1) or 1) > 1:
            raise ValueError(f"{key} > 1 is not supported by this runner (data and context parallel only)")
    config_checks.check_training_length(targs.get("max_steps", -1), targs.get("num_train_epochs", 3.0))
    if "recompute_granularity" in flags and flags["recompute_granularity"] not in RECOMPUTE_GRANULARITIES:
        raise ValueError(f"recompute_granularity must be one of {RECOMPUTE_GRANULARITIES}, got "
                         f"{flags['recompute_granularity']!r}")
    if targs.get("fp16") is True and _on_cpu():
        # PaddleNLP's fp16 loss scaler has no CPU path (an AttributeError in its first step)
        raise ValueError("fp16 training needs a GPU; on the CPU use bf16 or float32 (fp16: false)")
    for key in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
        if key in targs:
            config_checks.check_positive_int(key, targs[key])  # 0 failed deep in PaddleNLP
    context_parallel(targs, opts)  # validates the context-parallel keys
    targs.setdefault("output_dir", os.path.join("output", opts["stage"]))
    config_checks.check_training_args(targs)
    if "recompute" in targs:
        flags["recompute"] = bool(targs["recompute"])
    return opts, dpo, flags, targs


# Keys only some stages read: set for another stage they were ignored without a word (a DPO run's
# dataset_name_or_path, an SFT run's max_seq_len). Per stage: its lengths and data keys, and the
# keys it does not read.
SFT_ONLY_KEYS = ("max_length", "src_length", "dataset_name_or_path")
PREFERENCE_ONLY_KEYS = ("max_seq_len", "max_prompt_len")
_PREFERENCE_READS = PREFERENCE_ONLY_KEYS + ("train_dataset_path",)
_STAGE_KEYS = {  # stage -> (what it reads, what it does not)
    "sft": (SFT_ONLY_KEYS, PREFERENCE_ONLY_KEYS + tuple(DPO_DEFAULTS)),
    "lora": (SFT_ONLY_KEYS, PREFERENCE_ONLY_KEYS + tuple(DPO_DEFAULTS)),
    "rm": (_PREFERENCE_READS, SFT_ONLY_KEYS + tuple(DPO_DEFAULTS)),
    "dpo": (_PREFERENCE_READS, SFT_ONLY_KEYS),
}


def _check_stage_keys(cfg: Dict[str, Any]) -> None:
    stage = cfg.get("stage", DEFAULTS["stage"])
    if stage not in _STAGE_KEYS:
        return  # the stage's own check names it
    reads, not_read = _STAGE_KEYS[stage]
    wrong = sorted(k for k in cfg if k in not_read)
    if wrong:
        raise ValueError(f"stage {stage!r} does not read {wrong} (it reads {', '.join(reads)}); remove them or "
                         "change the stage")


def context_parallel(targs: Dict[str, Any], opts: Optional[Dict[str, Any]] = None):
    """``(degree, method)`` of the run: ``(1, None)``, ``(d, "allgather")`` for
    ``context_parallel_degree=d`` or ``(d, "ulysses")`` for ``sep_parallel_degree=d``."""
    degrees = {}
    for key in ("context_parallel_degree", "sep_parallel_degree"):
        v = targs.get(key, -1)
        if isinstance(v, bool) or not isinstance(v, int) or (v < 1 and v != -1):
            raise ValueError(f"{key} must be an integer >= 1 (or -1: off), got {v!r}")
        if v > 1:
            degrees[key] = v
    if len(degrees) > 1:
        raise ValueError("set context_parallel_degree (allgather) or sep_parallel_degree (ulysses), not both")
    if not degrees:
        return 1, None
    (key, degree), = degrees.items()
    if opts is not None and not opts["flash_mask"]:
        raise ValueError(f"{key} > 1 needs flash_mask=true (the plan is built from the collators' indices)")
    return degree, CP_METHODS[key]


def _data_paths(opts, base_dir):
    if opts["stage"] in ("sft", "lora"):
        src = opts["dataset_name_or_path"] or opts["train_dataset_path"]
        if not src:
            raise ValueError("set dataset_name_or_path (a jsonl file or a directory with train.json)")
        src = _resolve(src, base_dir)
        if os.path.isdir(src):
            if opts["dev_dataset_path"]:  # an explicit dev set wins over the directory's own
                return src, _existing_dev_path(_resolve(opts["dev_dataset_path"], base_dir))
            dev = os.path.join(src, "dev.json")
            dev = dev if os.path.isfile(dev) else os.path.join(src, "dev.jsonl")
            return src, (src if os.path.isfile(dev) else None)
        return src, _existing_dev_path(_resolve(opts["dev_dataset_path"], base_dir))
    if not opts["train_dataset_path"]:
        raise ValueError("set train_dataset_path for dpo/rm")
    return (_resolve(opts["train_dataset_path"], base_dir),
            _existing_dev_path(_resolve(opts["dev_dataset_path"], base_dir)))


def _existing_dev_path(path):
    """A dev set that is named must exist, whether or not this run evaluates (a typo otherwise
    surfaced only in a later run with do_eval)."""
    if path and not os.path.exists(path):
        raise FileNotFoundError(f"dev_dataset_path={path!r} does not exist")
    return path


def _lengths(opts):
    if opts["stage"] in ("sft", "lora"):
        return opts["max_length"], opts["src_length"]
    return opts["max_seq_len"], opts["max_prompt_len"]


def build_datasets(opts, tokenizer, base_dir, want_eval: bool):
    from paddlenlp_patches.data import load_records
    from paddlenlp_patches.packing import pack_records

    task = opts["stage"]
    max_len, prompt_len = _lengths(opts)
    train_path, dev_path = _data_paths(opts, base_dir)

    def rows(path, split):
        recs = load_records(path, tokenizer, task, max_len, prompt_len, opts["on_overflow"], split=split)
        return pack_records(recs, max_len, opts["zero_padding"], opts["greedy_zero_padding"])

    train = rows(train_path, "train")
    dev = rows(dev_path, "dev") if (want_eval and dev_path) else None
    return train, dev


def _on_cpu() -> bool:
    import paddle

    return not paddle.is_compiled_with_cuda() or paddle.device.get_device() == "cpu"


def _check_hybrid_groups(cp_degree: int, cp_method: str) -> None:
    """Fleet's hybrid groups must be this run's dp x sep. Paddle builds them once per process
    (``fleet.init``: ``if tp._HYBRID_PARALLEL_GROUP is None: self._init_hybrid_parallel_env()``,
    else only a warning), so a later run in the same process with another degree would get the
    first run's groups. Every rank sees the same groups, so every rank raises."""
    import paddle
    from paddle.distributed import fleet

    try:
        hcg = fleet.get_hybrid_communicate_group()
    except Exception:  # noqa: BLE001 (fleet not initialised)
        hcg = None
    key = next(k for k, m in CP_METHODS.items() if m == cp_method)
    if hcg is None:
        raise RuntimeError(f"{key}={cp_degree}: fleet's hybrid groups were not created (fleet.init did not run)")
    sep, dp = hcg.get_sep_parallel_world_size(), hcg.get_data_parallel_world_size()
    want_dp = paddle.distributed.get_world_size() // cp_degree
    if (sep, dp) != (cp_degree, want_dp):
        raise ValueError(f"{key}={cp_degree} needs fleet's hybrid groups dp {want_dp} x sep {cp_degree}, but this "
                         f"process already has dp {dp} x sep {sep} from an earlier run (Paddle creates them once "
                         "per process): run each context-parallel degree in its own launch")


def _is_main_process() -> bool:
    import paddle

    return paddle.distributed.get_rank() == 0


def _print(*a):
    if _is_main_process():
        print(*a, flush=True)


def run(config, overrides: Optional[Dict[str, Any]] = None, callbacks: Optional[List] = None) -> Dict[str, Any]:
    """Run one config (path or dict). Returns a summary: losses, tokens/s, peak memory, ..."""
    cfg, base_dir = load_config(config, overrides)
    opts, dpo_opts, flags, targs = split_config(cfg)

    import paddle
    from paddlenlp.trainer import TrainingArguments

    import paddlenlp_patches as pp
    from paddlenlp_patches import collators, modeling, trainer as pp_trainer
    from paddlenlp_patches.checkpoint import check_same_run, resolve_resume
    from paddlenlp_patches.tokenizer import load_tokenizer, pad_token_id

    stage = opts["stage"]
    use_lora = stage == "lora" or opts["lora"]
    if use_lora and stage == "rm":
        raise ValueError("lora is supported for sft/lora/dpo, not rm")
    cp_degree, cp_method = context_parallel(targs, opts)
    if cp_degree > 1:
        world = paddle.distributed.get_world_size()
        key = next(k for k, m in CP_METHODS.items() if m == cp_method)
        if world % cp_degree:
            raise ValueError(f"{key}={cp_degree} does not divide the world size {world}: launch a multiple of "
                             f"{cp_degree} processes (python -m paddle.distributed.launch --nproc_per_node N "
                             "paddlenlp_patches/finetune.py ...)")
        # we shard per batch from the collators' global indices: PaddleNLP must not split the inputs
        targs["split_inputs_sequence_dim"] = False
    if paddle.distributed.get_world_size() > 1:
        # gloo (CPU): fleet's dp and sep groups are created side by side; Paddle's gloo groups
        # collide in the global store unless each rendezvouses on its own (see gloo_groups)
        from paddlenlp_patches import gloo_groups

        gloo_groups.install()
    args = TrainingArguments(**targs)  # with sep/cp > 1: fleet.init with dp x sep hybrid groups
    # a partial or corrupt checkpoint stops here, before anything trains, on every rank
    resume = resolve_resume(args.resume_from_checkpoint, args.output_dir)
    if resume is not None:
        check_same_run(resume, stage, use_lora)
        if stage == "dpo" and dpo_opts["ref_model_update_steps"] > 0:
            raise ValueError("resuming DPO with ref_model_update_steps > 0 is not supported: checkpoints hold "
                             "neither the reference model's updated weights nor PaddleNLP's step count that times "
                             "its updates, so the resumed curve would differ")
    cp = None
    if cp_degree > 1:
        from paddle_flashmask.distributed import get_context_parallel_group

        from paddlenlp_patches.context_parallel import ContextParallel

        _check_hybrid_groups(cp_degree, cp_method)
        cp = ContextParallel(cp_degree, cp_method, group=get_context_parallel_group())
    # flash_mask or use_flash_attention: our op (PaddleNLP's flash path is GPU-only and drops dense
    # masks on CPU); both off: PaddleNLP's own eager path with dense masks (the baseline)
    patch = opts["flash_mask"] or opts["use_flash_attention"]
    if patch:
        pp.enable_flashmask()
    else:
        pp.disable_flashmask()

    model_path = _resolve(opts["model_name_or_path"], base_dir)
    tok_path = _resolve(opts["tokenizer_name_or_path"], base_dir) or model_path
    tokenizer = load_tokenizer(tok_path)
    train_rows, dev_rows = build_datasets(opts, tokenizer, base_dir, bool(args.do_eval))

    model_cfg = modeling.build_config(model_path, opts["model_config"], len(tokenizer),
                                      use_flash_attention=opts["use_flash_attention"])
    for k, v in flags.items():
        setattr(model_cfg, k, v)
    if len(tokenizer) > model_cfg.vocab_size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens, the model only {model_cfg.vocab_size}")
    if cp_method == "ulysses":
        # the same config on every rank: every rank raises here, before any training collective
        heads = int(model_cfg.num_attention_heads)
        kv_heads = int(getattr(model_cfg, "num_key_value_heads", None) or heads)
        if heads % cp_degree or kv_heads % cp_degree:
            raise ValueError(f"sep_parallel_degree={cp_degree} (ulysses) needs the query heads ({heads}) and "
                             f"key/value heads ({kv_heads}) divisible by it; use context_parallel_degree "
                             "(allgather) instead")
    max_len = _lengths(opts)[0]
    if getattr(model_cfg, "max_position_embeddings", max_len) < max_len:
        raise ValueError(f"max length {max_len} exceeds the model's max_position_embeddings "
                         f"{model_cfg.max_position_embeddings}")
    config_checks.check_padded_length(max_len, opts["pad_to_multiple_of"],
                                      getattr(model_cfg, "max_position_embeddings", None))
    # Parameter names (which key the optimizer's checkpointed state) restart from 0 in
    # every run, also when a process runs several: a resumed run matches its checkpoint.
    with paddle.utils.unique_name.guard():
        model = modeling.build_model(stage, model_cfg, model_path, seed=args.seed)
        ref_model = None
        if stage == "dpo" and not use_lora and not dpo_opts["reference_free"]:
            ref_model = modeling.build_model(stage, copy.deepcopy(model_cfg), model_path, seed=args.seed)
            ref_model.set_state_dict(model.state_dict())
            for p in ref_model.parameters():
                p.stop_gradient = True
        if use_lora:
            from paddlenlp_patches.lora import apply_lora

            model = apply_lora(model, r=opts["lora_rank"], lora_alpha=opts["lora_alpha"],
                               lora_dropout=opts["lora_dropout"], target_modules=opts["lora_target_modules"])
    if patch:
        pp.enable_flashmask(model)
        if ref_model is not None:
            pp.enable_flashmask(ref_model)
    if cp is not None:
        for m in (model, ref_model):
            if m is not None:
                pp.enable_context_parallel(m)

    collate = collators.COLLATORS[stage](pad_token_id(tokenizer), flash_mask=opts["flash_mask"],
                                         pad_to_multiple_of=opts["pad_to_multiple_of"], count_tokens=True)
    history = pp_trainer.LossHistory()
    common = dict(args=args, train_dataset=train_rows, eval_dataset=dev_rows, data_collator=collate,
                  tokenizer=tokenizer, callbacks=[history, pp_trainer.RunMarker(stage, use_lora)] + list(callbacks or []),
                  context_parallel=cp)
    if stage in ("sft", "lora"):
        trainer = pp_trainer.FlashmaskTrainer(model=model, **common)
    elif stage == "dpo":
        dpo_cfg = SimpleNamespace(lora=use_lora, **dpo_opts)
        trainer = pp_trainer.FlashmaskDPOTrainer(model=model, ref_model=ref_model, dpo_config=dpo_cfg, **common)
    else:
        trainer = pp_trainer.RewardTrainer(model=model, **common)

    n_params = sum(int(p.numel()) for p in model.parameters())
    n_train = sum(int(p.numel()) for p in model.parameters() if not p.stop_gradient)
    real = sum(len(r["input_ids"]) for r in train_rows)
    docs = sum(len(r["doc_lens"]) for r in train_rows)
    _print(f"[finetune] stage={stage} params={n_params} trainable={n_train} rows={len(train_rows)} "
           f"examples={docs} real_tokens={real} max_length={max_len} zero_padding={opts['zero_padding']} "
           f"flash_mask={opts['flash_mask']} use_flash_attention={opts['use_flash_attention']} "
           f"world_size={paddle.distributed.get_world_size()} device={paddle.device.get_device()}"
           + (f" context_parallel={cp.degree}x{cp.method} data_parallel={args.dataset_world_size}" if cp else ""))
    if patch:
        import paddle_flashmask

        paddle_flashmask.build()  # load (or JIT-build, ~20 s once) the op before timing starts
    t0 = time.time()
    with paddle.utils.unique_name.guard():  # optimizer state names too (see the models above)
        trainer.train(resume_from_checkpoint=resume)
    wall = time.time() - t0
    summary: Dict[str, Any] = {
        "stage": stage,
        "losses": history.losses(),
        "local_losses": trainer.local_losses(),  # this rank's own (the logged loss is the mean of all)
        "logs": history.logs,
        "train_seconds": round(trainer.pfm_train_seconds, 3),
        "train_tokens": int(trainer.pfm_train_tokens),
        "tokens_per_second": round(trainer.pfm_train_tokens / max(trainer.pfm_train_seconds, 1e-9), 1),
        "peak_memory_MB": round(pp_trainer.peak_memory_mb(), 1),
        "output_dir": args.output_dir,
        "trainable_params": n_train,
        "params": n_params,
        "trainer": trainer,
    }
    evals = [d for d in history.logs if "eval_loss" in d]
    if dev_rows is not None and not (evals and evals[-1]["step"] == trainer.state.global_step):
        trainer.evaluate()
        evals = [d for d in history.logs if "eval_loss" in d]
    if evals:
        summary["eval"] = {k: v for k, v in evals[-1].items()
                           if k.startswith("eval_") and "runtime" not in k and "per_second" not in k}
    if opts["save_final_model"]:
        trainer.save_model()
        if trainer.is_world_process_zero():
            tokenizer.save_pretrained(args.output_dir)
    losses = summary["losses"]
    if losses:
        _print(f"[finetune] done in {wall:.1f}s: loss {losses[0][1]:.4f} (step {losses[0][0]}) -> "
               f"{losses[-1][1]:.4f} (step {losses[-1][0]}), {summary['tokens_per_second']:.0f} tokens/s, "
               f"peak memory {summary['peak_memory_MB']:.0f} MB"
               + (f", eval {summary['eval']}" if "eval" in summary else ""))
    return summary


def main(argv=None):
    from paddlenlp_patches import cli

    return cli.main(argv, "python -m paddlenlp_patches.finetune", "PaddleNLP fine-tuning (sft/lora/dpo/rm) with FlashMask attention.", "configs/sft.json", run)


if __name__ == "__main__":
    sys.exit(main())
