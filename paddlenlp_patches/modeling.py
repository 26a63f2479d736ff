"""Model builders: a tiny random-init LLaMA from a ``LlamaConfig`` dict, or a local PaddleNLP
checkpoint (``from_pretrained``). No downloads: a ``model_name_or_path`` that is not an existing
directory is refused."""

from __future__ import annotations

import os
from typing import Optional

import paddle
from paddlenlp.transformers import AutoConfig, LlamaConfig, LlamaForCausalLM

from .reward_model import LlamaForRewardModel

# flags that must stay off on CPU (GPU-only fused kernels) unless the config sets them
CPU_SAFE_FLAGS = {"use_fused_rms_norm": False, "use_fused_rope": False}


def _model_class(task: str):
    if task == "rm":
        return LlamaForRewardModel
    return LlamaForCausalLM


def build_config(model_name_or_path: Optional[str], model_config: Optional[dict], vocab_size: int,
                 use_flash_attention: bool = True):
    overrides = dict(CPU_SAFE_FLAGS)
    overrides.update(model_config or {})
    overrides["use_flash_attention"] = bool(use_flash_attention)
    if model_name_or_path:
        if not os.path.isdir(model_name_or_path):
            raise FileNotFoundError(f"model_name_or_path={model_name_or_path!r} is not a local directory "
                                    "(this runner never downloads; use null for the tiny embedded model)")
        config = AutoConfig.from_pretrained(model_name_or_path)
        for k, v in overrides.items():
            setattr(config, k, v)
        return config
    overrides.setdefault("vocab_size", vocab_size)
    if overrides["vocab_size"] is None:
        overrides["vocab_size"] = vocab_size
    if overrides["vocab_size"] < vocab_size:
        raise ValueError(f"model_config.vocab_size={overrides['vocab_size']} < tokenizer vocab {vocab_size}")
    overrides.setdefault("seq_length", overrides.get("max_position_embeddings", 2048))
    return LlamaConfig(**overrides)


def build_model(task: str, config, model_name_or_path: Optional[str] = None, dtype: str = "float32",
                seed: Optional[int] = None):
    """``LlamaForCausalLM`` (sft/lora/dpo) or ``LlamaForRewardModel`` (rm)."""
    cls = _model_class(task)
    if seed is not None:
        paddle.seed(seed)
    if model_name_or_path:
        return cls.from_pretrained(model_name_or_path, config=config, dtype=dtype)
    config.dtype = dtype
    return cls(config)
