"""PaddleNLP integration of paddle_flashmask (PaddleNLP 3.0.0b4).

    import paddlenlp_patches as pp
    pp.enable_flashmask(model)          # LLaMA attention -> flashmask op (CPU and GPU)
    with pp.flashmask_enabled(model):   # or scoped
        ...

Modules (imported lazily, so the data utilities work without paddlenlp installed):

- ``llama_attention``: enable/disable the attention patch, context manager.
- ``tokenizer``: a character-level tokenizer (no downloads) and ``load_tokenizer``.
- ``data``: jsonl readers, validation, tokenization into SFT/DPO/RM records.
- ``packing``: greedy packing of records into rows (zero padding).
- ``collators``: SFT/LoRA, DPO and RM collators emitting indices, position ids and labels.
- ``modeling``: tiny random-init or local-checkpoint LLaMA builders.
- ``reward_model``: ``LlamaForRewardModel`` (score head, pairwise loss).
- ``lora``: ``paddlenlp.peft`` LoRA on the attention projections.
- ``trainer``: Trainer subclasses for SFT, DPO and RM that log tokens/s and peak memory.
- ``context_parallel``: one sequence split over the ranks of a group (per-batch plan, sharded
  inputs, distributed attention, losses on the global token axis).
- ``paddleformers``: the same op as PaddleFormers' "flashmask" attention entry (needs
  paddleformers; ``pp.enable_paddleformers_flashmask()`` or ``pp.paddleformers.enable_flashmask()``).
"""

import importlib

_EXPORTS = {
    "enable_flashmask": "llama_attention",
    "disable_flashmask": "llama_attention",
    "flashmask_enabled": "llama_attention",
    "is_enabled": "llama_attention",
    "flashmask_attn_func": "llama_attention",
    "CharTokenizer": "tokenizer",
    "load_tokenizer": "tokenizer",
    "DataFormatError": "data",
    "load_records": "data",
    "pack_records": "packing",
    "SFTCollator": "collators",
    "DPOCollator": "collators",
    "RMCollator": "collators",
    "LlamaForRewardModel": "reward_model",
    "apply_lora": "lora",
    "ContextParallel": "context_parallel",
    "enable_context_parallel": "context_parallel",
}

# PaddleFormers' names clash with the PaddleNLP patch's: exported under these (module, name)
_ALIASES = {
    "enable_paddleformers_flashmask": ("paddleformers", "enable_flashmask"),
    "disable_paddleformers_flashmask": ("paddleformers", "disable_flashmask"),
    "paddleformers_flashmask_enabled": ("paddleformers", "flashmask_enabled"),
}
_SUBMODULES = {"paddleformers"}

__all__ = sorted(_EXPORTS)  # not the aliases: `import *` must not need paddleformers


def __getattr__(name):
    if name in _EXPORTS:
        mod = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
        return getattr(mod, name)
    if name in _ALIASES:
        mod_name, attr = _ALIASES[name]
        return getattr(importlib.import_module(f"{__name__}.{mod_name}"), attr)
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
