"""Command-line overrides shared by the fine-tune runners: ``--key value`` pairs after the
config path, values parsed as JSON (``--max_steps 20``, ``--lora true``, ``--x=1``)."""

from __future__ import annotations

import json
from typing import Any, Dict, List


# Python's spellings, which json.loads would leave as strings ("False" is a true string)
_PYTHON_LITERALS = {"True": True, "False": False, "None": None}


def parse_value(text: str):
    if text in _PYTHON_LITERALS:
        return _PYTHON_LITERALS[text]
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_overrides(parser, rest: List[str]) -> Dict[str, Any]:
    """``{key: value}`` from the arguments argparse left over; a stray word is a parser error."""
    overrides: Dict[str, Any] = {}
    i = 0
    while i < len(rest):
        key = rest[i]
        if not key.startswith("--"):
            parser.error(f"expected --key value, got {key!r}")
        key = key[2:]
        if "=" in key:
            key, val = key.split("=", 1)
            i += 1
        elif i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            val, i = rest[i + 1], i + 2
        else:
            val, i = "true", i + 1
        overrides[key] = parse_value(val)
    return overrides


def main(argv, prog: str, description: str, example: str, run) -> int:
    """A runner's command line: ``prog CONFIG [--key value ...]`` -> ``run(CONFIG, overrides)``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog=prog, description=description + " Extra '--key value' pairs override config keys (values parsed as JSON).")
    parser.add_argument("config", help=f"JSON config, e.g. {example}")
    args, rest = parser.parse_known_args(argv)
    run(args.config, parse_overrides(parser, rest))
    finish_distributed()
    return 0


def finish_distributed() -> None:
    """Leave a multi-process run in step: every rank waits for the others, then closes its process
    group. Without this a rank that finished first closes its gloo sockets while a peer's transport
    thread still reads them, and that peer aborts (SIGABRT) after training had succeeded."""
    import paddle.distributed as dist

    is_initialized = getattr(dist, "is_initialized", None)  # newer than some Paddle 2.x
    if is_initialized is None or not is_initialized() or dist.get_world_size() < 2:
        return
    dist.barrier()
    destroy = getattr(dist, "destroy_process_group", None)
    if destroy is not None:
        destroy()
