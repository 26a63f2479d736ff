"""Model builders: a tiny random-init LLaMA from a ``LlamaConfig`` dict, or a local PaddleNLP
checkpoint (``from_pretrained``). No downloads: a ``model_name_or_path`` that is not an existing
directory is refused."""

from __future__ import annotations

import logging
from typing import Optional

import paddle
from paddlenlp.transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from . import config_checks
from .reward_model import LlamaForRewardModel

logger = logging.getLogger("paddlenlp_patches")

# flags that must stay off on CPU (GPU-only fused kernels) unless the config sets them
CPU_SAFE_FLAGS = {"use_fused_rms_norm": False, "use_fused_rope": False}


def _model_class(task: str):
    if task == "rm":
        return LlamaForRewardModel
    return LlamaForCausalLM


def build_config(model_name_or_path: Optional[str], model_config: Optional[dict], vocab_size: int,
                 use_flash_attention: bool = True):
    """The model config: the checkpoint's (``model_config`` is then ignored: it describes the tiny
    random-init model) or ``LlamaConfig(**model_config)``; ``use_flash_attention`` set either way."""
    if model_name_or_path:
        config_checks.check_local_dir("model_name_or_path", model_name_or_path,
                                      "use null for the tiny embedded model")
        if model_config:
            logger.warning("model_config is ignored when model_name_or_path is set (%s)", model_name_or_path)
        config = AutoConfig.from_pretrained(model_name_or_path)
        config.use_flash_attention = bool(use_flash_attention)
        return config
    config_checks.check_model_config(model_config, LlamaConfig)
    overrides = dict(CPU_SAFE_FLAGS)
    overrides.update(model_config or {})
    overrides["use_flash_attention"] = bool(use_flash_attention)
    overrides.setdefault("vocab_size", vocab_size)
    if overrides["vocab_size"] is None:
        overrides["vocab_size"] = vocab_size
    if overrides["vocab_size"] < vocab_size:
        raise ValueError(f"model_config.vocab_size={overrides['vocab_size']} < tokenizer vocab {vocab_size}")
    overrides.setdefault("seq_length", overrides.get("max_position_embeddings", 2048))
    config = LlamaConfig(**overrides)
    _check_heads(config)
    return config


def _check_heads(config):
    """Head counts that do not divide had failed as a reshape error in the first forward."""
    hidden, heads = config.hidden_size, config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if heads < 1 or hidden % heads:
        raise ValueError(f"model_config: hidden_size {hidden} must be a multiple of num_attention_heads {heads}")
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"model_config: num_attention_heads {heads} must be a multiple of num_key_value_heads "
                         f"{kv_heads}")


def build_model(task: str, config, model_name_or_path: Optional[str] = None, dtype: str = "float32",
                seed: Optional[int] = None):
    """``LlamaForCausalLM`` (sft/lora/dpo) or ``LlamaForRewardModel`` (rm)."""
    cls = _model_class(task)
    if seed is not None:
        paddle.seed(seed)
    if model_name_or_path:
        if getattr(config, "model_type", "llama") != "llama":
            if task == "rm":
                raise ValueError(f"the reward model needs a LLaMA checkpoint, got model_type={config.model_type!r}")
            logger.warning("model_type=%r: the flashmask patch rebinds LLaMA attention only; other models are "
                           "covered only if they call llama.fusion_ops with use_flash_attention=True (Qwen2)",
                           config.model_type)
            cls = AutoModelForCausalLM
        return cls.from_pretrained(model_name_or_path, config=config, dtype=dtype)
    config.dtype = dtype
    return cls(config)
