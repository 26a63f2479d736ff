"""Environment reads on every op call, at a fraction of os.environ.get's cost.

os.environ.get encodes the name and, for an unset variable, raises and catches a KeyError
inside Mapping.get: about 1.7 us a name on the CPU machine, 22 us for the 13 names a call
reads (a third of the wrapper's Python). On POSIX CPython os.environ keeps its contents in
a dict of bytes (os.environ._data), which every write through os.environ updates (setenv,
monkeypatch.setenv, del): a lookup there, with the name encoded once, costs about 0.1 us
and sees what os.environ.get would. Elsewhere this falls back to os.environ.get.
"""

import os

_DATA = getattr(os.environ, "_data", None)
_FAST = os.name == "posix" and isinstance(_DATA, dict)
_KEYS = {}  # name -> its bytes key in _DATA


def getenv(name, default=None):
    """os.environ.get(name, default)."""
    if not _FAST:
        return os.environ.get(name, default)
    key = _KEYS.get(name)
    if key is None:
        key = _KEYS[name] = os.fsencode(name)
    value = _DATA.get(key)
    return default if value is None else os.fsdecode(value)


class EnvNames:
    """A fixed set of names read together on every call (the kernels' tuning switches): one pass
    of dict lookups, and nothing decoded unless a name is set, where getenv for each cost a Python
    call a name (about 5 of the wrapper's 20 us a call on the CPU machine for its 13 switches)."""

    def __init__(self, names):
        self.names = tuple(names)
        self._keys = tuple(os.fsencode(name) for name in self.names) if _FAST else None

    def set_values(self):
        """[(name, value)] of the names that are set and not empty, in their order."""
        if not _FAST:
            return [(name, value) for name in self.names if (value := os.environ.get(name))]
        raw = [_DATA.get(key) for key in self._keys]
        if not any(raw):
            return []
        return [(name, os.fsdecode(value)) for name, value in zip(self.names, raw) if value]

    def raw_values(self):
        """Every name's value as stored, unset ones None: a key that changes whenever any of them
        does (the op's cache of checked calls keys on it), at one dict lookup a name."""
        if not _FAST:
            return tuple(os.environ.get(name) for name in self.names)
        return tuple(_DATA.get(key) for key in self._keys)
