"""A fine-tune interrupted mid-run and resumed from its last checkpoint ends with the same
loss curve as an uninterrupted one; a partial or corrupt checkpoint stops the run with an
error naming the piece, before any step (never a silent restart from scratch)."""

import os

import numpy as np
import pytest

from checkpoint_damage import damaged_copy  # noqa: E402
from paddlenlp_test_env import cfg, require_paddlenlp  # noqa: E402

require_paddlenlp()

import paddlenlp_patches as pp  # noqa: E402
from paddlenlp.trainer import TrainerCallback  # noqa: E402
from paddlenlp_patches import finetune  # noqa: E402
from paddlenlp_patches.checkpoint import last_checkpoint  # noqa: E402

CFG = cfg("sft")
RUN = {"disable_tqdm": True, "do_eval": False, "save_final_model": False, "logging_steps": 1, "max_steps": 20,
       "save_strategy": "steps", "save_steps": 8}


@pytest.fixture(autouse=True)
def _restore_patch():
    yield
    pp.disable_flashmask()


class Crash(Exception):
    pass


class CrashAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.step:
            raise Crash(f"simulated failure at step {self.step}")


def losses(out):
    return {s: l for s, l in out["losses"]}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = finetune.run(CFG, dict(RUN, output_dir=str(tmp_path_factory.mktemp("full"))))
    pp.disable_flashmask()
    return losses(out)


def test_resumed_run_repeats_the_uninterrupted_curve(tmp_path, uninterrupted):
    out_dir = str(tmp_path / "run")
    with pytest.raises(Crash):
        finetune.run(CFG, dict(RUN, output_dir=out_dir), callbacks=[CrashAt(13)])
    assert last_checkpoint(out_dir).endswith("checkpoint-8")
    resumed = losses(finetune.run(CFG, dict(RUN, output_dir=out_dir, resume_from_checkpoint=True)))
    assert sorted(resumed) == list(range(9, 21)), sorted(resumed)
    np.testing.assert_allclose([resumed[s] for s in range(9, 21)], [uninterrupted[s] for s in range(9, 21)],
                               rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("ck"))
    finetune.run(CFG, dict(RUN, output_dir=out_dir, max_steps=8))
    pp.disable_flashmask()
    return os.path.join(out_dir, "checkpoint-8")


@pytest.mark.parametrize("damage,match", [
    ("truncate model_state.pdparams", "corrupt: model_state.pdparams does not load"),
    ("remove optimizer.pdopt", "not a complete checkpoint: optimizer.pdopt missing"),
    ("remove trainer_state.json", "trainer_state.json is missing"),
    ("garble trainer_state.json", "corrupt: trainer_state.json does not parse"),
    ("remove model_state.pdparams", "no model weights"),
])
def test_partial_or_corrupt_checkpoint_is_an_error(tmp_path, checkpoint, damage, match):
    bad = damaged_copy(checkpoint, str(tmp_path / "checkpoint-8"), damage)
    with pytest.raises(ValueError, match=match):
        finetune.run(CFG, dict(RUN, output_dir=str(tmp_path / "out"), resume_from_checkpoint=bad))


def test_resume_true_without_checkpoints_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no checkpoint-N directory"):
        finetune.run(CFG, dict(RUN, output_dir=str(tmp_path), resume_from_checkpoint=True))
    with pytest.raises(ValueError, match="is not a directory"):
        finetune.run(CFG, dict(RUN, output_dir=str(tmp_path), resume_from_checkpoint=str(tmp_path / "nope")))
