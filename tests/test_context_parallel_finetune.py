"""The runner with context parallel: one packed sequence split over 2 CPU ranks (gloo,
``paddle.distributed.launch``) trains exactly like one process: the same loss curve (20 steps,
max abs difference 1e-5, fp32; about 1e-6 here) for SFT, DPO (also with LoRA) and RM, with
``context_parallel_degree`` (allgather) and ``sep_parallel_degree`` (ulysses); bad degrees are
refused with a clear error.

One launch runs every case (tests/cp_finetune_driver.py), about 30 s here.

Data parallel x context parallel: 4 ranks as dp 2 x cp 2 (``context_parallel_degree`` and
``sep_parallel_degree``; SFT and DPO, 8 steps): each data-parallel replica's own loss curve equals
that rank's curve in a plain 2-rank data-parallel run (max abs difference 1e-5; 0 to 5e-7 here),
also with an optimizer setting that exposes a mis-scaled gradient; degrees that do not fit 4
ranks are refused by every rank. Two launches (4 and 2 ranks), about 50 s here.
``PFM_SKIP_DISTRIBUTED=1`` skips the launches."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from paddlenlp_test_env import ROOT, cfg, require_paddlenlp  # noqa: E402

require_paddlenlp()

import paddlenlp_patches as pp  # noqa: E402
from paddlenlp_patches import finetune  # noqa: E402

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


def launch(nproc, cases, tmp, name):
    """Run ``cases`` (``[[config, overrides(, {"expect_error": true})], ...]``) with ``nproc`` ranks
    in one launch of tests/cp_finetune_driver.py: (rank 0's summaries, [each rank's local results],
    rank 0's worker log)."""
    cases_file, out_file, log_dir = tmp / f"{name}.json", tmp / f"{name}-out.json", tmp / f"{name}-log"
    cases_file.write_text(json.dumps(cases))
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc), "--log_dir",
           str(log_dir), os.path.join(ROOT, "tests", "cp_finetune_driver.py"), str(cases_file), str(out_file)]
    # one kernel thread per rank: 2+ ranks on a 2-core box (results do not depend on the thread count)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PADDLE_FLASHMASK_NUM_THREADS="1")
    res = subprocess.run(cmd, cwd=str(tmp), env=env, capture_output=True, text=True, timeout=900)
    logs = [(log_dir / f"workerlog.{r}").read_text() if (log_dir / f"workerlog.{r}").exists() else ""
            for r in range(nproc)]
    assert res.returncode == 0 and out_file.exists(), (res.stdout[-3000:] + res.stderr[-3000:]
                                                       + "".join(log[-4000:] for log in logs))
    assert "Traceback" not in "".join(logs)
    local = [json.loads((tmp / f"{name}-out.json.rank{r}").read_text()) for r in range(nproc)]
    return json.loads(out_file.read_text()), local, logs[0]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Every case with 2 ranks in one launch: {case id: summary}."""
    if os.environ.get("PFM_SKIP_DISTRIBUTED") == "1":
        pytest.skip("PFM_SKIP_DISTRIBUTED=1")
    tmp = tmp_path_factory.mktemp("cp")
    results, _, log0 = launch(2, [[cfg(c[1]), overrides(c, tmp, True)] for c in CASES], tmp, "cases")
    assert "context_parallel=2xallgather data_parallel=1" in log0
    assert "context_parallel=2xulysses data_parallel=1" in log0
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


# ---------------------------------------------------------------------------------------------
# data parallel x context parallel: 4 ranks as dp 2 x cp 2 against plain data parallel on 2 ranks.
# With data parallel the ranks of a context-parallel group share PaddleNLP's distributed sampler
# rank (dataset_rank = the data-parallel rank), so data-parallel replica k trains on the batches
# rank k gets in a 2-rank data-parallel run, and its own loss (computed on the whole batch by
# both ranks of its group) must follow that rank's curve. The logged loss is the mean over ranks.
DPCP_STEPS = 8
# AdamW with eps >> sqrt(v) and no clipping steps by about lr * gradient: a gradient mis-scaled
# over the sep or the dp group (mean instead of sum, or no 1/dp) changes the curve (a halved
# gradient moves it by about 0.26 in 8 steps here); the default AdamW (eps 1e-8, clipping at 1)
# would hide the scale.
SCALE_SENSITIVE = {"max_grad_norm": 0.0, "adam_epsilon": 1.0, "learning_rate": 0.5}
DPCP_CASES = [  # (case id, stage, context-parallel key, extra overrides)
    ("sft-allgather", "sft", "context_parallel_degree", {}),
    ("sft-ulysses-scale-sensitive", "sft", "sep_parallel_degree", SCALE_SENSITIVE),
    ("dpo-allgather", "dpo", "context_parallel_degree", {}),
]
# refused on 4 ranks, by every rank (before any training collective, so none hangs); they run
# after the dp 2 x cp 2 cases, in the same processes: (key, degree, extra overrides, message)
with open(cfg("sft")) as _f:
    GQA_1 = {"model_config": dict(json.load(_f)["model_config"], num_key_value_heads=1)}  # 4 query heads, 1 kv
DPCP_ERRORS = [
    ("context_parallel_degree", 3, {}, r"ValueError: context_parallel_degree=3 does not divide the world size 4"),
    ("sep_parallel_degree", 2, GQA_1, r"ValueError: sep_parallel_degree=2 \(ulysses\) needs the query heads \(4\) "
                                      r"and key/value heads \(1\) divisible by it"),
    # fleet builds its hybrid groups once per process: a later run with another degree is refused
    ("context_parallel_degree", 4, {}, r"ValueError: context_parallel_degree=4 needs fleet's hybrid groups dp 1 x "
                                       r"sep 4, but this process already has dp 2 x sep 2"),
]


def dpcp_overrides(case, out_dir, parallel: bool):
    name, stage, key, extra = case
    out = os.path.join(str(out_dir), name + ("-dpcp" if parallel else "-dp"))
    o = dict(COMMON, max_steps=DPCP_STEPS, output_dir=out, **extra)
    if parallel:
        o[key] = 2
    return o


@pytest.fixture(scope="module")
def launched_dp_cp(tmp_path_factory):
    """The cases with 4 ranks (dp 2 x cp 2, then the refused degrees) and without context parallel
    with 2 ranks (dp 2): {"dpcp": (rank 0 summaries, local results), "dp": (...), "log0": ...}."""
    if os.environ.get("PFM_SKIP_DISTRIBUTED") == "1":
        pytest.skip("PFM_SKIP_DISTRIBUTED=1")
    tmp = tmp_path_factory.mktemp("dpcp")
    errors = [[cfg("sft"), dict(COMMON, max_steps=1, output_dir=str(tmp / f"err-{j}"), **extra, **{key: degree}),
               {"expect_error": True}] for j, (key, degree, extra, _) in enumerate(DPCP_ERRORS)]
    dpcp = launch(4, [[cfg(c[1]), dpcp_overrides(c, tmp, True)] for c in DPCP_CASES] + errors, tmp, "dpcp")
    dp = launch(2, [[cfg(c[1]), dpcp_overrides(c, tmp, False)] for c in DPCP_CASES], tmp, "dp")
    return {"dpcp": dpcp[:2], "dp": dp[:2], "log0": dpcp[2]}


@pytest.mark.parametrize("i", range(len(DPCP_CASES)), ids=[c[0] for c in DPCP_CASES])
def test_data_parallel_x_context_parallel_equals_data_parallel(i, launched_dp_cp):
    name, stage, key, _ = DPCP_CASES[i]
    method = "allgather" if key == "context_parallel_degree" else "ulysses"
    assert f"context_parallel=2x{method} data_parallel=2" in launched_dp_cp["log0"]
    (cp_sum, cp_local), (dp_sum, dp_local) = launched_dp_cp["dpcp"], launched_dp_cp["dp"]
    # the reference: each data-parallel rank's own curve (its sampler rank is its rank)
    ref = {res[i]["dataset_rank"]: np.array(res[i]["local_losses"]) for res in dp_local}
    assert sorted(ref) == [0, 1]
    assert np.abs(ref[0][:, 1] - ref[1][:, 1]).max() > 1e-3  # the replicas do see different data
    # PaddleNLP's topology order (dp outermost, sep innermost): ranks 0, 1 are replica 0's group
    assert [res[i]["dataset_rank"] for res in cp_local] == [0, 0, 1, 1]
    for r, res in enumerate(cp_local):
        got, want = np.array(res[i]["local_losses"]), ref[res[i]["dataset_rank"]]
        assert got.shape == (DPCP_STEPS, 2) and np.array_equal(got[:, 0], want[:, 0]), (r, got, want)
        diff = np.abs(got[:, 1] - want[:, 1]).max()
        assert diff <= TOL, (name, r, diff, got[:, 1], want[:, 1])
    # the logged loss (mean over all ranks) and the token count (each batch once per group)
    a, b = np.array(cp_sum[i]["losses"]), np.array(dp_sum[i]["losses"])
    assert a.shape == b.shape == (DPCP_STEPS, 2) and np.abs(a[:, 1] - b[:, 1]).max() <= TOL, (a, b)
    assert cp_sum[i]["train_tokens"] == dp_sum[i]["train_tokens"]
    if stage == "sft":
        assert a[-1, 1] < a[0, 1] - 0.3  # it does train


def test_bad_context_parallel_degree_on_four_ranks_is_refused_by_every_rank(launched_dp_cp):
    (_, cp_local) = launched_dp_cp["dpcp"]
    for j, (key, degree, _, pattern) in enumerate(DPCP_ERRORS):
        for r, res in enumerate(cp_local):
            err = res[len(DPCP_CASES) + j]["error"]
            assert err is not None and re.match(pattern, err), (key, degree, r, err)
