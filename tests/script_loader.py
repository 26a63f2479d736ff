"""Loads one of the repository's scripts (benchmarks/...) as a module by its path: they are not in
a package, and some import siblings the way they do when run from their own folder."""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(relpath):
    """The module of ``ROOT/relpath`` (e.g. "benchmarks/report.py"), named after the file's stem
    with a ``pfm_`` prefix, so that it does not shadow an installed module."""
    path = os.path.join(ROOT, relpath)
    name = "pfm_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
