"""LoRA on the attention projections with ``paddlenlp.peft`` (the model's data path is unchanged,
so the flashmask patch applies as is)."""

from __future__ import annotations

from typing import Optional, Sequence

from paddlenlp.peft import LoRAConfig, LoRAModel

ATTENTION_TARGETS = (".*q_proj", ".*k_proj", ".*v_proj", ".*o_proj")
FUSED_QKV_TARGETS = (".*qkv_proj", ".*o_proj")


def apply_lora(model, r: int = 8, lora_alpha: Optional[float] = None, lora_dropout: float = 0.0,
               target_modules: Optional[Sequence[str]] = None, dtype: Optional[str] = None) -> LoRAModel:
    """Wrap ``model`` in a ``LoRAModel`` with only the adapters trainable.

    ``target_modules`` are regexes full-matched against sublayer names (default: q/k/v/o
    projections, or qkv/o when the model fuses qkv). ``lora_alpha`` defaults to ``2 * r``.
    """
    if target_modules is None:
        fused = getattr(model.config, "fuse_attention_qkv", False)
        target_modules = FUSED_QKV_TARGETS if fused else ATTENTION_TARGETS
    if isinstance(target_modules, str):  # list("q_proj") would be six one-letter regexes
        raise ValueError(f"target_modules must be a list of regexes, got the string {target_modules!r}")
    if lora_alpha is not None and not lora_alpha > 0:
        raise ValueError(f"lora_alpha must be > 0, got {lora_alpha!r}")
    cfg = LoRAConfig(
        target_modules=list(target_modules),
        r=int(r),
        # a float as given: int() made 0.5 a zero scale, adapters that never train
        lora_alpha=lora_alpha if lora_alpha is not None else 2 * r,
        lora_dropout=float(lora_dropout),
        dtype=dtype or getattr(model.config, "dtype", None) or "float32",
        base_model_name_or_path=getattr(model.config, "_name_or_path", None),
    )
    lora_model = LoRAModel(model, cfg)
    lora_model.mark_only_lora_as_trainable()
    if not any(not p.stop_gradient for p in lora_model.parameters()):
        raise ValueError(f"LoRA target_modules {list(target_modules)} matched no layer of the model")
    return lora_model


def trainable_parameter_names(model):
    return [n for n, p in model.named_parameters() if not p.stop_gradient]
