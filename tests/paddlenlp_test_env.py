"""What the PaddleNLP-integration test modules share: skipping where PaddleNLP cannot be
imported, and the paths of the runner's configs."""

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "configs")


def require_paddlenlp():
    """Skip (not fail) the calling test module where paddlenlp is missing or broken (e.g.
    numpy/pyarrow too new); call it before importing anything that imports paddlenlp."""
    try:
        pytest.importorskip("paddlenlp.transformers", exc_type=ImportError)
    except TypeError:  # pytest < 8.2 has no exc_type
        pytest.importorskip("paddlenlp.transformers")


def cfg(name):
    """Path of configs/<name>.json."""
    return os.path.join(CONFIGS, f"{name}.json")
