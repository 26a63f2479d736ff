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


# runner overrides for short test runs: no eval, no saved model, no progress bar
QUIET = {"disable_tqdm": True, "do_eval": False, "save_final_model": False, "logging_steps": 5}


@pytest.fixture(autouse=True)
def restore_flashmask_patch():
    """Imported by a test module: every test there leaves the PaddleNLP patch disabled."""
    yield
    import paddlenlp_patches

    paddlenlp_patches.disable_flashmask()
