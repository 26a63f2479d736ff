"""The runner with context parallel: one packed sequence split over 2 CPU ranks (gloo,
``paddle.distributed.launch``) trains exactly like one process: the same loss curve (20 steps,
max abs difference 1e-5, fp32; about 1e-6 here) for SFT, DPO (also with LoRA) and RM, with
``context_parallel_degree`` (allgather) and ``sep_parallel_degree`` (ulysses); bad degrees are
refused with a clear error.

One launch runs every case (tests/cp_finetune_driver.py), about 30 s here;
``PFM_SKIP_DISTRIBUTED=1`` skips it."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

try:  # skip (not fail) where paddlenlp is missing or broken (e.g. numpy/pyarrow too new)
    pytest.importorskip("paddlenlp.transformers", exc_type=ImportError)
except TypeError:  # pytest < 8.2 has no exc_type
    pytest.importorskip("paddlenlp.transformers")

import paddlenlp_patches as pp  # noqa: E402
from paddlenlp_patches import finetune  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "configs")
STEPS = 20
COMMON = {"max_steps": STEPS, "logging_steps": 1, "disable_tqdm": True, "do_eval": False, "save_final_model": False}
# (case id, stage, context-parallel key, extra overrides): eval on two of them (eval loss, RM
# accuracy); recompute (attention re-run inside the backward, under the batch's plan); LoRA DPO
# (reference log-probs from the policy with adapters off)
CASES = [
    ("sft-allgather", "sft", "context_parallel_degree", {"do_eval": True}),
    ("sft-ulysses-recompute", "sft", "sep_parallel_degree", {"recompute": True}),
    ("dpo-allgather", "dpo", "context_parallel_degree", {}),
    ("dpo-ulysses", "dpo", "sep_parallel_degree", {}),
    ("dpo-lora-allgather", "dpo", "context_parallel_degree", {"lora": True}),
    ("rm-allgather", "rm", "context_parallel_degree", {"do_eval": True}),
]
TOL = 1e-5


def cfg(name):
    return os.path.join(CONFIGS, f"{name}.json")


def overrides(case, out_dir, parallel: bool):
    name, stage, key, extra = case
    o = dict(COMMON, output_dir=os.path.join(str(out_dir), name + ("-cp" if parallel else "-one")), **extra)
    if parallel:
        o[key] = 2
    return o


@pytest.fixture(autouse=True)
def _restore_patch():
    yield
    pp.disable_flashmask()


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Every case with 2 ranks in one launch: {case id: summary}."""
    if os.environ.get("PFM_SKIP_DISTRIBUTED") == "1":
        pytest.skip("PFM_SKIP_DISTRIBUTED=1")
    tmp = tmp_path_factory.mktemp("cp")
    cases_file, out_file, log_dir = tmp / "cases.json", tmp / "out.json", tmp / "log"
    cases_file.write_text(json.dumps([[cfg(c[1]), overrides(c, tmp, True)] for c in CASES]))
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir", str(log_dir),
           os.path.join(ROOT, "tests", "cp_finetune_driver.py"), str(cases_file), str(out_file)]
    # one kernel thread per rank: 2 ranks on a 2-core box (results do not depend on the thread count)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PADDLE_FLASHMASK_NUM_THREADS="1")
    res = subprocess.run(cmd, cwd=str(tmp), env=env, capture_output=True, text=True, timeout=900)
    logs = {r: (log_dir / f"workerlog.{r}").read_text() if (log_dir / f"workerlog.{r}").exists() else ""
            for r in (0, 1)}
    assert res.returncode == 0 and out_file.exists(), (res.stdout[-3000:] + res.stderr[-3000:] + logs[0][-4000:]
                                                       + logs[1][-4000:])
    assert "Traceback" not in logs[0] + logs[1]
    assert "context_parallel=2xallgather data_parallel=1" in logs[0]
    assert "context_parallel=2xulysses data_parallel=1" in logs[0]
    results = json.loads(out_file.read_text())
    return {c[0]: r for c, r in zip(CASES, results)}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_two_rank_context_parallel_equals_one_process(case, launched, tmp_path):
    one = finetune.run(cfg(case[1]), overrides(case, tmp_path, False))
    cp = launched[case[0]]
    a, b = np.array(one["losses"]), np.array(cp["losses"])
    assert a.shape == (STEPS, 2) and b.shape == a.shape, (a.shape, b.shape)
    assert np.array_equal(a[:, 0], b[:, 0])
    diff = np.abs(a[:, 1] - b[:, 1]).max()
    assert diff <= TOL, (diff, a[:, 1], b[:, 1])
    if case[1] == "sft":
        assert a[-1, 1] < a[0, 1] - 0.5  # it does train
    # each batch counted once per context-parallel group: the same tokens as one process
    assert cp["train_tokens"] == one["train_tokens"]
    assert all(d.get("tokens_per_second", 0) > 0 for d in cp["logs"] if "loss" in d)
    if "eval" in one:
        assert cp["eval"].keys() == one["eval"].keys()
        for k, v in one["eval"].items():
            assert abs(cp["eval"][k] - v) <= TOL, (k, cp["eval"][k], v)


def test_context_parallel_config_errors(tmp_path):
    base = dict(COMMON, output_dir=str(tmp_path))
    # one process: a degree of 2 does not divide the world size 1
    with pytest.raises(ValueError, match=r"context_parallel_degree=2 does not divide the world size 1"):
        finetune.run(cfg("sft"), dict(base, context_parallel_degree=2))
    with pytest.raises(ValueError, match=r"sep_parallel_degree=3 does not divide the world size 1"):
        finetune.run(cfg("dpo"), dict(base, sep_parallel_degree=3))
    with pytest.raises(ValueError, match="not both"):
        finetune.run(cfg("sft"), dict(base, context_parallel_degree=2, sep_parallel_degree=2))
    with pytest.raises(ValueError, match="needs flash_mask=true"):
        finetune.run(cfg("sft"), dict(base, context_parallel_degree=2, flash_mask=False))
    with pytest.raises(ValueError, match="must be an integer"):
        finetune.run(cfg("sft"), dict(base, context_parallel_degree="2"))
    with pytest.raises(ValueError, match="tensor_parallel_degree > 1 is not supported"):
        finetune.run(cfg("sft"), dict(base, tensor_parallel_degree=2))
