"""Fine-tune runner on PaddleFormers' own trainers (SFT, LoRA, DPO) with FlashMask attention.

    python -m paddlenlp_patches.paddleformers_finetune configs/paddleformers/sft.json [--key value ...]

The PaddleFormers (1.2.0) counterpart of ``paddlenlp_patches.finetune``: it needs paddleformers,
which cannot share an environment with paddlenlp 3.0.0b4 (see ``tests/run_paddleformers_tests.sh``:
run it with ``.venv-paddleformers/bin/python``). It follows PaddleFormers' ``paddleformers-cli train``
workflows (``cli/train/sft/workflow.py``, ``cli/train/dpo/workflow.py``) in a few hundred lines, with
their pieces unchanged:

- keys: one JSON object of PaddleFormers' CLI keys (``ModelArguments`` / ``DataArguments`` /
  ``FinetuningArguments``), parsed by PaddleFormers' own ``get_train_args`` (unknown keys are its
  error). ``stage`` is ``SFT`` or ``DPO``; ``fine_tuning`` is ``"LoRA"`` (PaddleFormers' default:
  ``paddleformers.peft`` LoRA on the workflows' target modules, ``lora_rank``, ``lora_alpha``) or
  ``"full"`` (PaddleFormers derives ``lora`` from it; a ``lora`` key is overridden). Two keys are
  ours: ``model_config`` (a ``LlamaConfig`` dict for a random-init model when
  ``model_name_or_path`` is null: nothing is downloaded) and ``save_final_model`` (default true:
  ``save_pretrained`` of model + tokenizer to ``output_dir``, loadable as ``model_name_or_path``). ``tokenizer_name_or_path`` null or ``"char"`` is our character tokenizer.
- data: PaddleFormers' reader and datasets (``datasets.loader.create_dataset``) on the embedded
  ``configs/data/*.jsonl``, which already are its ``erniekit`` format (``{"src", "tgt"}`` for SFT,
  ``{"src", "tgt", "response", "sort"}`` for DPO): no conversion. With ``packing`` its bin packing
  puts several examples in a row, and its collators (``collate_fn`` / ``dpo_collate_fn``) emit
  ``attn_mask_startend_row_indices`` (causal document for SFT, share-question for DPO), which
  reach ``paddle_flashmask.flashmask_attention`` through our "flashmask" attention entry.
- trainers: PaddleFormers' ``SFTTrainer`` and ``DPOTrainer`` (from ``paddleformers.cli.train``),
  with its ``FinetuningArguments`` (a ``paddleformers.trainer.TrainingArguments``).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import string
import sys
import time
from functools import partial
from typing import Any, Dict, List, Optional

if __name__ == "__main__" and not __package__:
    # Run as a file (paddle.distributed.launch takes a script path): this folder then heads sys.path,
    # and our paddleformers.py there would shadow the real paddleformers package.
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

from paddlenlp_patches.config_checks import (check_bool, check_dpo_ranges, check_local_dir,  # noqa: E402
                                             check_model_config, check_positive_int)

OUR_KEYS = ("model_config", "save_final_model")
# fused kernels are GPU-only in PaddleFormers; a random-init model on CPU must not ask for them
CPU_SAFE_FLAGS = dict(fuse_rms_norm=False, apply_rope_fusion=False, fuse_swiglu=False,
                      use_fused_linear_cross_entropy=False, use_fused_head_and_loss_fn=False)
logger = logging.getLogger("paddlenlp_patches.paddleformers_finetune")

_SPECIAL = ["<pad>", "<|begin_of_sentence|>", "</s>", "<unk>"]
_CHARS = "".join(c for c in string.printable if c not in "\t\n\r\x0b\x0c")
# jinja chat template: prompt and answer as they are (PaddleFormers' NONE_CHAT_TEMPLATE adds spaces);
# PaddleFormers' SFT data flow appends EOS to each answer itself
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def _tokenizer_class():
    from paddleformers.transformers.tokenizer_utils import PreTrainedTokenizer

    class CharTokenizer(PreTrainedTokenizer):
        """One id per character (printable ASCII, as ``paddlenlp_patches.tokenizer``), on
        PaddleFormers' tokenizer base so its data flow (``tokenize``, ``convert_tokens_to_ids``,
        ``apply_chat_template``, ``encode_chat_inputs``) works offline. BOS is named
        ``<|begin_of_sentence|>``: the name PaddleFormers' SFT data flow looks up as the begin token."""

        model_input_names = ["input_ids"]
        vocab_files_names = {"vocab_file": "char_vocab.json"}

        def __init__(self, vocab_file=None, chars: str = _CHARS, **kw):
            if vocab_file:
                with open(vocab_file, encoding="utf-8") as f:
                    chars = json.load(f)["chars"]
            self.chars = chars
            self._itos = _SPECIAL + list(chars)
            self._stoi = {t: i for i, t in enumerate(self._itos)}
            for k, v in zip(("pad_token", "bos_token", "eos_token", "unk_token"), _SPECIAL):
                kw.setdefault(k, v)
            kw.setdefault("chat_template", CHAT_TEMPLATE)
            super().__init__(**kw)

        @property
        def vocab_size(self):
            return len(self._itos)

        def get_vocab(self):
            return dict(self._stoi)

        def _tokenize(self, text, **kw):
            return list(text)

        def _convert_token_to_id(self, token):
            return self._stoi.get(token, 3)

        def _convert_id_to_token(self, index):
            return self._itos[index] if 0 <= index < len(self._itos) else "<unk>"

        def convert_tokens_to_string(self, tokens):
            return "".join(t for t in tokens if t not in _SPECIAL)

        def save_vocabulary(self, save_directory, filename_prefix=None):
            path = os.path.join(save_directory, (filename_prefix + "-" if filename_prefix else "") + "char_vocab.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump({"chars": self.chars}, f)
            return (path,)

    return CharTokenizer


def load_tokenizer(name_or_path: Optional[str]):
    """``None``/``"char"``: the character tokenizer; a directory with ``char_vocab.json`` (a run's
    output): that one; another local directory: PaddleFormers' ``AutoTokenizer`` (no downloads)."""
    cls = _tokenizer_class()
    if name_or_path in (None, "char"):
        return cls()
    if os.path.isfile(os.path.join(name_or_path, "char_vocab.json")):
        return cls(vocab_file=os.path.join(name_or_path, "char_vocab.json"))
    check_local_dir("tokenizer", name_or_path, "'char' or a local PaddleFormers checkpoint directory")
    from paddleformers.transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name_or_path)


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
        raise ValueError(f"a config must be a JSON object, got {type(cfg).__name__}")
    cfg.update(overrides or {})
    return cfg, base_dir


def _resolve(path, base_dir):
    """Relative paths: the current directory first, then next to the config (comma lists too)."""
    if not isinstance(path, str) or not path:
        return path
    out = []
    for p in path.split(","):
        p = p.strip()
        if not (os.path.isabs(p) or os.path.exists(p)) and os.path.exists(os.path.join(base_dir, p)):
            p = os.path.join(base_dir, p)
        out.append(p)
    return ",".join(out)


def parse_args(cfg: Dict[str, Any], base_dir: str):
    """PaddleFormers' own parser on its keys -> (model_args, data_args, finetuning_args, ours)."""
    from paddleformers.cli.hparams import get_train_args

    cfg = dict(cfg)
    ours = {k: cfg.pop(k) for k in OUR_KEYS if k in cfg}
    for k in ("train_dataset_path", "eval_dataset_path", "model_name_or_path", "tokenizer_name_or_path"):
        if k in cfg:
            cfg[k] = _resolve(cfg[k], base_dir)
    if cfg.get("model_name_or_path") is None:
        cfg["model_name_or_path"] = ""  # ModelArguments wants a str; "" = random init from model_config
    for key in ("context_parallel_size", "sep_parallel_size"):
        if int(cfg.get(key) or 1) > 1:
            # PaddleFormers' own context parallel lives in paddlefleet's models (not on PyPI)
            raise ValueError(f"{key}={cfg[key]}: context parallel runs through the PaddleNLP runner "
                             "(python -m paddlenlp_patches.finetune with context_parallel_degree / "
                             "sep_parallel_degree), not yet through PaddleFormers")
    if "sharding" not in cfg and _is_cpu(cfg.get("device")):
        # PaddleFormers' default ("stage1") shards the optimizer over data-parallel ranks through
        # fused communication buffers that exist for gpu/npu/xpu only: plain data parallel on CPU
        cfg["sharding"] = ""
    model_args, data_args, _, _, targs = get_train_args(cfg)
    model_args.stage = model_args.stage.upper()
    targs.max_seq_len = data_args.max_seq_len  # as the workflows: the trainers and collators read it here
    if model_args.stage not in ("SFT", "DPO"):
        raise ValueError(f"stage must be SFT or DPO (fine_tuning LoRA or full), got {model_args.stage!r}")
    _check_lengths(data_args.max_seq_len, data_args.max_prompt_len)
    if "save_final_model" in ours:
        check_bool("save_final_model", ours["save_final_model"])
    if model_args.model_name_or_path:  # a hub name had gone to the network (as the PaddleNLP runner's never does)
        check_local_dir("model_name_or_path", model_args.model_name_or_path,
                        "a local PaddleFormers checkpoint, or null with model_config for a random-init model")
    if not model_args.model_name_or_path and not ours.get("model_config"):
        raise ValueError("set model_name_or_path (a local PaddleFormers checkpoint) or model_config")
    return model_args, data_args, targs, ours


def _check_lengths(max_seq_len, max_prompt_len):
    """PaddleFormers takes any int; one that no example fits deletes every example (see
    _check_an_example_fits), and a prompt limit of 0 or less cuts every prompt."""
    check_positive_int("max_seq_len", max_seq_len)
    check_positive_int("max_prompt_len", max_prompt_len)
    if max_prompt_len >= max_seq_len:
        raise ValueError(f"max_prompt_len ({max_prompt_len}) must be smaller than max_seq_len ({max_seq_len})")


def _check_an_example_fits(create_dataset, dcfg, dataset_args):
    """PaddleFormers' iterator datasets run over their data again and again while training, and
    skip the examples its truncation deletes: with none left, training waited forever. One pass
    of the same data as a validation set (``is_valid``: a single pass) yields an example or ends."""
    if str(dcfg.get("dataset_type", "iterator")).lower() == "map":
        return
    probe = create_dataset(**dataset_args, **dict(dcfg, is_valid=True))
    if not any(len(item) > 0 for item in probe):
        raise ValueError(f"no training example of {dataset_args['task_group']} fits max_seq_len "
                         f"{dcfg['max_seq_len']} (max_prompt_len {dcfg['max_prompt_len']}): PaddleFormers deletes "
                         "the examples its truncation cannot fit")


def _is_cpu(device):
    """Whether a config's ``device`` (None: Paddle's current one) is the CPU."""
    if device is None:
        import paddle

        device = paddle.device.get_device()
    return str(device).lower().startswith("cpu")


def _several_cpu_processes(targs):
    """Data parallel over gloo: where PaddleFormers' flex checkpoints go through CUDA."""
    import paddle

    return paddle.distributed.get_world_size() > 1 and _is_cpu(targs.device)


def build_model(model_args, data_args, targs, model_config, dpo_config=None, seed=42):
    """The workflows' model set-up; random init (seeded) from ``model_config`` when no path."""
    import paddle
    from paddleformers.transformers import AutoConfig, AutoModelForCausalLM
    from paddleformers.transformers.configuration_utils import LlmMetaConfig
    from paddleformers.transformers.llama.configuration import LlamaConfig
    from paddleformers.transformers.llama.modeling import LlamaForCausalLM

    if model_args.model_name_or_path:
        config = AutoConfig.from_pretrained(model_args.model_name_or_path)
    else:
        check_model_config(model_config, LlamaConfig)
        config = LlamaConfig(**{**CPU_SAFE_FLAGS, **model_config})
    config._attn_implementation = model_args._attn_implementation
    config.max_sequence_length = config.seq_length = data_args.max_seq_len
    config.is_lora = model_args.lora
    LlmMetaConfig.set_llm_config(config, targs)
    if paddle.device.get_device() == "cpu":
        for k, v in CPU_SAFE_FLAGS.items():
            setattr(config, k, v)
    if dpo_config is not None:
        config.dpo_config = dpo_config  # PaddleFormers' CriterionLayer then computes the DPO loss
    # Auto* fails to map Llama in PaddleFormers 1.2.0 ("Could not find Llama"): use the class
    cls = LlamaForCausalLM if config.model_type == "llama" else AutoModelForCausalLM
    if model_args.model_name_or_path:
        return cls.from_pretrained(model_args.model_name_or_path, config=config)
    paddle.seed(seed)
    return cls(config) if cls is LlamaForCausalLM else cls.from_config(config)


def dataset_config(model_args, data_args, targs, tokenizer):
    """The workflows' ``dataset_config`` (PaddleFormers' data flow; jinja template backend)."""
    cfg = dict(
        tokenizer=tokenizer, processor=None, max_seq_len=data_args.max_seq_len,
        max_prompt_len=data_args.max_prompt_len, random_seed=targs.seed, num_replicas=targs.dataset_world_size,
        rank=targs.dataset_rank, num_samples_each_epoch=data_args.num_samples_each_epoch,
        buffer_size=data_args.buffer_size, random_shuffle=data_args.random_shuffle,
        greedy_intokens=data_args.greedy_intokens, packing=data_args.packing, mix_strategy=data_args.mix_strategy,
        encode_one_turn=data_args.encode_one_turn, use_template=data_args.use_template,
        is_pretraining=False, truncate_packing=data_args.truncate_packing, stage=model_args.stage,
        template_backend=data_args.template_backend, split_multi_turn=data_args.split_multi_turn,
        dataset_type=data_args.dataset_type, dtype="float32", dataset_num_proc=targs.dataset_num_proc,
        binpacking=data_args.binpacking, packing_interval=data_args.packing_interval,
        packed_idx_cache_dir=data_args.packed_idx_cache_dir, dataloader_num_workers=targs.dataloader_num_workers,
        template=data_args.template, tool_format=None, default_system=None, enable_thinking=True,
        truncation_strategy=data_args.truncation_strategy, skip_warmup=data_args.skip_warmup,
        use_attn_mask_startend_row_indices=model_args.use_attn_mask_startend_row_indices,
        use_filtered_label_loss=False, template_instance=None,
    )
    if data_args.template_backend == "custom":
        from paddleformers.datasets.template.template import get_template_and_fix_tokenizer

        cfg["template_instance"] = get_template_and_fix_tokenizer(cfg)
    return cfg


def _work_around_paddleformers_1_2():
    """Two PaddleFormers 1.2.0 bugs on one process without paddlefleet (the CPU case):
    ``Trainer.evaluation_loop`` tests ``isinstance(model.model, GPTModel)`` for a LoRA model although
    ``GPTModel`` is only imported with paddlefleet (NameError), and ``DPOTrainer._wrap_ref_model``
    calls ``fleet.distributed_model`` even with no fleet set up (AttributeError). A stand-in class
    nothing is an instance of, and a DPOTrainer that leaves the reference model unwrapped on one
    process, change nothing else."""
    import paddle
    from paddleformers.cli.train.dpo.dpo_trainer import DPOTrainer
    from paddleformers.trainer import trainer as pf_trainer

    if not hasattr(pf_trainer, "GPTModel"):
        pf_trainer.GPTModel = type("NoPaddleFleetGPTModel", (), {})

    class SingleProcessDPOTrainer(DPOTrainer):
        def _wrap_ref_model(self, model):
            if model is None or paddle.distributed.get_world_size() > 1:
                return super()._wrap_ref_model(model)
            return model

    return SingleProcessDPOTrainer


def resume_checkpoint(targs):
    """The checkpoint to resume from, checked whole (a directory, or true / "last": the latest
    ``checkpoint-N`` of ``output_dir``), else None. A partial or corrupt one raises ValueError
    naming the piece (paddlenlp_patches.checkpoint)."""
    import paddle

    from paddlenlp_patches.checkpoint import check_flex_checkpoint, resolve_resume

    world = paddle.distributed.get_world_size()
    path = resolve_resume(targs.resume_from_checkpoint, targs.output_dir,
                          check=lambda path: check_flex_checkpoint(path, world))
    if path is not None and _several_cpu_processes(targs):
        # every rank decides alike, so every rank raises: none waits in a collective
        raise ValueError(f"resume_from_checkpoint with {world} CPU processes: Paddle's flex-checkpoint load "
                         "reshards through CUDA there (paddle.distributed.flex_checkpoint); resume on GPUs, "
                         "or train on one CPU process")
    return path


def _single_process_fleet():
    """PaddleFormers loads its flex checkpoints through fleet's hybrid group, which it sets up on one
    process only where paddlefleet is installed (TrainingArguments.__post_init__); without it (the
    CPU case) a resume fails with "'Fleet' object has no attribute '_hcg'". The same one-card
    hybrid set-up, where no group exists yet."""
    import paddle
    from paddle.distributed import fleet

    if paddle.distributed.get_world_size() > 1 or getattr(fleet.fleet, "_hcg", None) is not None:
        return
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1, "sharding_degree": 1,
                               "sep_degree": 1}
    fleet.init(is_collective=True, strategy=strategy)


def _make_callback():
    from paddleformers.trainer.trainer_callback import TrainerCallback

    class LossHistory(TrainerCallback):
        """Every ``on_log`` dict with its step (the trainer's own logging)."""

        def __init__(self):
            self.logs: List[Dict[str, Any]] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs:
                self.logs.append(dict(logs, step=state.global_step))

    return LossHistory()


def run(config, overrides: Optional[Dict[str, Any]] = None, callbacks: Optional[List] = None) -> Dict[str, Any]:
    """Run one config (path or dict). Returns a summary: losses, trainable params, time, ..."""
    cfg, base_dir = load_config(config, overrides)
    model_args, data_args, targs, ours = parse_args(cfg, base_dir)

    import paddle
    from paddleformers.datasets.collate import collate_fn, dpo_collate_fn
    from paddleformers.datasets.loader import create_dataset
    from paddleformers.trainer import set_seed

    from paddlenlp_patches import paddleformers as pf

    paddle.set_device(targs.device)
    # a partial or corrupt checkpoint stops here, before anything is built or trained
    resume = resume_checkpoint(targs)
    set_seed(targs.seed)
    DPOTrainer = _work_around_paddleformers_1_2()
    pf.enable_flashmask()  # our op is PaddleFormers' "flashmask" entry from here on
    stage = model_args.stage
    tokenizer = load_tokenizer(model_args.tokenizer_name_or_path or model_args.model_name_or_path or None)
    model_config = dict(ours.get("model_config") or {})
    if model_config:
        model_config.setdefault("vocab_size", len(tokenizer))
        for k in ("pad_token_id", "bos_token_id", "eos_token_id"):
            model_config.setdefault(k, getattr(tokenizer, k))

    dpo_config = None
    if stage == "DPO":
        from paddleformers.cli.train.dpo.dpo_argument import DPOConfig

        check_dpo_ranges({k: getattr(targs, k) for k in ("beta", "label_smoothing", "pref_loss_ratio",
                                                           "sft_loss_ratio", "dpop_lambda")})
        if targs.loss_type in ("or", "simpo", "orpo"):
            targs.reference_free = True
        dpo_config = DPOConfig(
            beta=targs.beta, offset_alpha=targs.offset_alpha, simpo_gamma=targs.simpo_gamma,
            normalize_logps=targs.normalize_logps, ignore_eos_token=targs.ignore_eos_token,
            label_smoothing=targs.label_smoothing, loss_type=targs.loss_type, pref_loss_ratio=targs.pref_loss_ratio,
            sft_loss_ratio=targs.sft_loss_ratio, dpop_lambda=targs.dpop_lambda,
            ref_model_update_steps=targs.ref_model_update_steps, reference_free=targs.reference_free,
            lora=model_args.lora)
    model = build_model(model_args, data_args, targs, model_config, dpo_config, targs.seed)
    ref_model = None
    if stage == "DPO" and not targs.reference_free and not model_args.lora:
        ref_model = build_model(model_args, data_args, targs, model_config, dpo_config, targs.seed)
        ref_model.set_state_dict(model.state_dict())
    if model_args.lora:  # the workflows' create_peft_model
        from paddleformers.cli.utils import get_lora_target_modules
        from paddleformers.peft import LoRAConfig, LoRAModel

        lora_alpha = model_args.lora_alpha if model_args.lora_alpha > 0 else 2 * model_args.lora_rank
        model = LoRAModel(model, LoRAConfig(
            target_modules=get_lora_target_modules(model), r=model_args.lora_rank, lora_alpha=lora_alpha,
            rslora=model_args.rslora, lora_plus_scale=model_args.lora_plus_scale, merge_weights=False,
            dtype="float32", base_model_name_or_path=model_args.model_name_or_path or None))
    pf.enable_flashmask(model)  # also switches a loaded model whose config chose another entry
    if ref_model is not None:
        pf.enable_flashmask(ref_model)

    dcfg = dataset_config(model_args, data_args, targs, tokenizer)
    paths = dict(task_group_prob=data_args.train_dataset_prob, sub_dataset_type=data_args.train_dataset_type)
    _check_an_example_fits(create_dataset, dcfg, dict(task_group=data_args.train_dataset_path, **paths))
    train_ds = create_dataset(task_group=data_args.train_dataset_path, **paths, **dcfg)
    eval_ds = None
    if targs.do_eval and data_args.eval_dataset_path:
        eval_ds = create_dataset(task_group=data_args.eval_dataset_path, task_group_prob=data_args.eval_dataset_prob,
                                 sub_dataset_type=data_args.eval_dataset_type, is_valid=True, **dcfg)
    # packed rows are padded to max_seq_len (as the workflows do with packing)
    max_len = data_args.max_seq_len if data_args.packing else None
    history = _make_callback()
    common = dict(model=model, args=targs, train_dataset=train_ds, eval_dataset=eval_ds, tokenizer=tokenizer,
                  callbacks=[history] + list(callbacks or []))
    if stage == "SFT":
        from paddleformers.cli.train.sft.sft_trainer import SFTTrainer

        collate = partial(collate_fn, tokenizer=tokenizer, training_args=targs, model_args=model_args,
                          max_seq_len=max_len, padding_free=data_args.padding_free)
        trainer = SFTTrainer(data_collator=collate, data_args=data_args, **common)
    else:
        collate = partial(dpo_collate_fn, tokenizer=tokenizer, training_args=targs, max_seq_len=max_len,
                          padding_free=data_args.padding_free, use_filtered_label_loss=False)
        trainer = DPOTrainer(ref_model=ref_model, dpo_config=dpo_config, data_collator=collate,
                             model_with_dpo_criterion=model_args.model_with_dpo_criterion, **common)
    trainable = [p for p in model.parameters() if not p.stop_gradient]
    trainer.set_optimizer_grouped_parameters(trainable)

    n_params = sum(int(p.numel()) for p in model.parameters())
    n_train = sum(int(p.numel()) for p in trainable)
    print(f"[paddleformers_finetune] stage={stage} lora={model_args.lora} params={n_params} trainable={n_train} "
          f"max_seq_len={data_args.max_seq_len} packing={data_args.packing} "
          f"attn={model_args._attn_implementation} device={paddle.device.get_device()}", flush=True)
    import paddle_flashmask

    paddle_flashmask.build()  # load (or JIT-build once) the op before timing
    if resume is not None:
        _single_process_fleet()
    t0 = time.time()
    result = trainer.train(resume_from_checkpoint=resume)
    wall = time.time() - t0
    losses = [(d["step"], float(d["loss"])) for d in history.logs if "loss" in d]
    summary: Dict[str, Any] = dict(stage=stage, lora=bool(model_args.lora), losses=losses, logs=history.logs,
                                   train_seconds=round(wall, 3), params=n_params, trainable_params=n_train,
                                   output_dir=targs.output_dir, trainer=trainer, metrics=result.metrics)
    if eval_ds is not None:  # the trainer's last evaluation, or one now
        evals = [d for d in history.logs if "eval_loss" in d and d["step"] == trainer.state.global_step]
        ev = evals[-1] if evals else trainer.evaluate()
        summary["eval"] = {k: v for k, v in ev.items() if k.startswith("eval_") and "runtime" not in k
                           and "per_second" not in k}
    if ours.get("save_final_model", True):
        # save_pretrained, not trainer.save_model(): the Trainer's default flex checkpoint has no
        # config.json, so a later config could not start from it with model_name_or_path
        # PaddleFormers' default (flex) save gathers parameters through CUDA with several CPU
        # processes; data-parallel ranks hold whole replicas there: rank 0 writes its own
        on_gloo = _several_cpu_processes(targs)
        if not on_gloo or paddle.distributed.get_rank() == 0:
            model.save_pretrained(targs.output_dir, **({"save_checkpoint_format": None} if on_gloo else {}))
            tokenizer.save_pretrained(targs.output_dir)
    if losses:
        print(f"[paddleformers_finetune] done in {wall:.1f}s: loss {losses[0][1]:.4f} (step {losses[0][0]}) -> "
              f"{losses[-1][1]:.4f} (step {losses[-1][0]})" + (f", eval {summary['eval']}" if "eval" in summary else ""),
              flush=True)
    return summary


def main(argv=None):
    from paddlenlp_patches import cli

    return cli.main(argv, "python -m paddlenlp_patches.paddleformers_finetune", "PaddleFormers fine-tuning (SFT, LoRA, DPO) with FlashMask attention.", "configs/paddleformers/sft.json", run)


if __name__ == "__main__":
    sys.exit(main())
