"""Damage a copy of a fine-tune checkpoint the ways a crash or a bad disk does (tests of resuming)."""

import os
import shutil


def damaged_copy(checkpoint, dest, damage):
    """Copy ``checkpoint`` to ``dest`` and apply ``damage``, "VERB NAME" (NAME relative to it):
    truncate (to a third), remove, garble (text that is neither JSON nor a pickle) or empty (a
    folder's files removed). Returns ``dest``."""
    shutil.copytree(checkpoint, dest)
    verb, name = damage.split(" ", 1)
    path = os.path.join(dest, name)
    if verb == "truncate":
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 3)
    elif verb == "remove":
        os.remove(path)
    elif verb == "garble":
        with open(path, "w") as f:
            f.write("{not json, not a pickle")
    elif verb == "empty":
        for entry in os.listdir(path):
            os.remove(os.path.join(path, entry))
    else:
        raise ValueError(f"unknown damage {damage!r}")
    return dest
