"""benchmarks/report.py on small synthetic result files: the numbers in its tables,
the speed-up column and target marks, the causal 16K line, old-format records
(impl "paddle_flashmask" = fa2), later-wins merging, error records, head dims kept
apart and named ("192/128"), and the plot; benchmarks/mask_area.py's FLOP count."""

import json
import os

import numpy as np
import pytest
from script_loader import load_script


def _load(name):
    return load_script(f"benchmarks/{name}.py")


report = _load("report")
mask_area = _load("mask_area")


def rec(impl, mask, seqlen, fwd_ms, bwd_ms, fwd_tflops, bwd_tflops, heads=32, heads_k=8, dim=128, **extra):
    return dict(impl=impl, mask=mask, seqlen=seqlen, heads=heads, heads_k=heads_k, dim=dim, dtype="bfloat16",
                device="Test GPU", fwd_ms=fwd_ms, bwd_ms=bwd_ms, fwd_tflops=fwd_tflops,
                bwd_tflops=bwd_tflops, **extra)


def write(path, records):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))


def tables(markdown):
    """{(section, mask): {column: cell}} from the report's markdown."""
    out, section, header = {}, None, None
    for line in markdown.splitlines():
        if line.startswith("## "):
            section, header = line[3:].strip(), None
        elif line.startswith("| mask"):
            header = [c.strip() for c in line.strip().strip("|").split("|")]
        elif line.startswith("|") and header and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            assert len(cells) == len(header), line
            out[(section, cells[0])] = dict(zip(header, cells))
    return out


@pytest.fixture
def results(tmp_path):
    # An old run: FA2-class records under the old impl name, one config only there.
    old = tmp_path / "old_run"
    write(str(old / "gpu_results.jsonl"), [
        rec("paddle_flashmask", "causal", 8192, 9.0, 9.0, 10.0, 10.0, peak_gib=0.5),  # overridden below
        rec("paddle_flashmask", "causal", 4096, 2.0, 8.0, 200.0, 125.0, peak_gib=0.25),
    ])
    new = tmp_path / "new_run"
    write(str(new / "gpu_results.jsonl"), [
        # fwd+bwd = (500*1 + 300*4) / 5 = 340
        rec("paddle_flashmask_sm90", "causal", 8192, 1.0, 4.0, 500.0, 300.0, peak_gib=0.56,
            fwd_b2b_ms=0.8, bwd_b2b_ms=3.2),
        rec("paddle_flashmask_fa2", "causal", 8192, 2.0, 8.0, 200.0, 125.0, peak_gib=0.56),
        rec("paddle_flashmask_sm90", "causal_document", 8192, 2.0, 3.0, 100.0, 150.0, peak_gib=0.56),
        rec("paddle_flashmask_fa2", "causal_document", 8192, 4.0, 6.0, 50.0, 75.0, peak_gib=0.56),
        rec("paddle_flashmask_sm90", "share_question", 8192, 1.0, 2.0, 300.0, 200.0, peak_gib=0.56),
        rec("paddle_flashmask_sm90", "causal", 16384, 4.0, 14.0, 600.4, 380.2, peak_gib=1.1),
        rec("paddle_flashmask_sm90", "causal", 16384, 3.0, 10.0, 560.0, 410.0, heads_k=32, peak_gib=1.9),
    ])
    write(str(new / "peer_results.jsonl"), [
        # sm90/Flex: 7.5 / 5 = 1.50 (meets 1.3); Flex fwd+bwd = (200*2.5 + 250*5) / 7.5 = 233.3
        # back to back: (2.4 + 4.8) / (0.8 + 3.2) = 1.80
        rec("flex_attention", "causal", 8192, 2.5, 5.0, 200.0, 250.0, mask_build_ms=1.44,
            fwd_b2b_ms=2.4, bwd_b2b_ms=4.8),
        rec("sdpa_dense_mask", "causal", 8192, 5.0, 10.0, 100.0, 125.0),
        rec("sdpa_flash_causal", "causal", 8192, 3.0, 6.0, 300.0, 250.0),
        # 6 / 5 = 1.20 (misses 1.3)
        rec("flex_attention", "causal_document", 8192, 2.4, 3.6, 80.0, 90.0, mask_build_ms=1.5),
        rec("sdpa_dense_mask", "causal_document", 8192, 8.0, 12.0, 20.0, 25.0),
        dict(impl="flex_attention", mask="share_question", seqlen=8192, heads=32, heads_k=8,
             error="RuntimeError: out of memory", device="Test GPU"),
    ])
    return str(old), str(new)


def test_report_tables(results, tmp_path):
    out = str(tmp_path / "RESULTS.md")
    assert report.main([*results, "--out", out]) == 0
    text = open(out).read()
    t = tables(text)

    row = t[("S = 8192, 32:8 heads, head dim 128", "causal")]
    assert [row["sm90 fwd"], row["sm90 bwd"], row["sm90 fwd+bwd"]] == ["500", "300", "340"]
    # the new run's fa2 record wins over the old file's (same key, later input)
    assert [row["fa2 fwd"], row["fa2 bwd"], row["fa2 fwd+bwd"]] == ["200", "125", "140"]
    assert [row["Flex fwd"], row["Flex bwd"], row["Flex fwd+bwd"]] == ["200", "250", "233"]
    # SDPA on plain causal: the flash backend, marked; fwd+bwd = (300*3 + 250*6) / 9 = 266.7
    assert [row["SDPA fwd"], row["SDPA bwd"], row["SDPA fwd+bwd"]] == ["300†", "250†", "267†"]
    speed = next(k for k in row if k.startswith("sm90/Flex"))
    assert "1.3x" in speed
    assert row[speed] == "1.50 ✓"
    assert row["ours peak GiB"] == "0.56" and row["Flex mask build ms"] == "1.4"
    assert row["sm90/Flex back to back"] == "1.80"

    row = t[("S = 8192, 32:8 heads, head dim 128", "causal_document")]
    assert row[speed] == "1.20 ✗"
    assert row["sm90/Flex back to back"] == "-"  # records without back-to-back times
    assert row["SDPA fwd+bwd"] == "23"  # dense mask: (20*8 + 25*12) / 20
    assert row["fa2 fwd+bwd"] == "65"  # (50*4 + 75*6) / 10
    # Flex failed on share_question: n/a, and no speed-up; no fa2 record there.
    row = t[("S = 8192, 32:8 heads, head dim 128", "share_question")]
    assert row["Flex fwd+bwd"] == "n/a" and row[speed] == "-" and row["fa2 fwd"] == "-"

    # the old-format-only config: fa2 from impl "paddle_flashmask", nothing for sm90
    row = t[("S = 4096, 32:8 heads, head dim 128", "causal")]
    assert row["fa2 fwd+bwd"] == "140" and row["sm90 fwd"] == "-" and row[speed] == "-"

    # causal 16K against the 550/400 targets, one line per heads config
    line = next(x for x in text.splitlines() if x.startswith("- Causal 16K, 32:8"))
    assert "fwd 600 / bwd 380" in line and "550/400" in line
    assert "fwd met" in line and "bwd not met, 0.95x" in line
    line = next(x for x in text.splitlines() if x.startswith("- Causal 16K, 32:32"))
    assert "fwd met" in line and "bwd met" in line
    assert "2 of 2 cases" not in text and "1 of 2 cases" in text  # 1.50 meets, 1.20 does not


def test_report_fa3_class_peer_section(tmp_path, capsys):
    # sm90 and SDPA's cuDNN backend on the same unmasked calls: one row each, per call / back to back
    path = str(tmp_path / "run" / "gpu_results.jsonl")
    write(path, [
        rec("paddle_flashmask_sm90", "causal", 8192, 1.0, 4.0, 600.0, 500.0, fwd_b2b_ms=0.96, bwd_b2b_ms=4.0),
        rec("paddle_flashmask_sm90", "full", 8192, 2.0, 6.0, 650.0, 480.0),
        rec("paddle_flashmask_sm90", "causal_document", 8192, 2.0, 3.0, 100.0, 150.0),
        rec("sdpa_cudnn", "causal", 8192, 1.2, 4.4, 500.0, 454.5, fwd_b2b_ms=1.0, bwd_b2b_ms=5.0, gqa="native"),
        rec("sdpa_cudnn", "full", 8192, 2.1, 5.5, 619.0, 523.6),
        rec("fa2_gqa_causal", "causal", 8192, 1.9, 5.2, 295.0, 263.0),  # issue 15's tables read it
    ])
    out = str(tmp_path / "r.md")
    assert report.main([path, "--out", out]) == 0
    assert "unknown impl" not in capsys.readouterr().err
    t = tables(open(out).read())
    section = "sm90 against an FA3-class peer: SDPA's cuDNN backend"
    row = t[(section, "causal")]
    assert row["sm90 fwd"] == "600 / 625" and row["cuDNN fwd"] == "500 / 600"  # 600 * 1.0 / 0.96, 500 * 1.2 / 1.0
    assert row["sm90 bwd"] == "500 / 500" and row["cuDNN bwd"] == "454 / 400"
    assert t[(section, "full")]["cuDNN bwd"] == "524 / -"  # no back-to-back times in the record
    assert (section, "causal_document") not in t  # cuDNN takes no column mask

    # without cuDNN records the section is left out
    write(path, [rec("paddle_flashmask_sm90", "causal", 8192, 1.0, 4.0, 600.0, 500.0)])
    assert report.main([path, "--out", out]) == 0
    assert "FA3-class" not in open(out).read()


def test_report_plot(results, tmp_path):
    pytest.importorskip("matplotlib")
    png = str(tmp_path / "plots" / "tflops.png")
    report.main([results[1], "--out", str(tmp_path / "r.md"), "--plot", png])
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_report_refuses_input_without_our_records(tmp_path):
    path = str(tmp_path / "peers_only.jsonl")
    write(path, [rec("flex_attention", "causal", 8192, 2.5, 5.0, 200.0, 250.0)])
    with pytest.raises(SystemExit, match="no paddle_flashmask records"):
        report.main([path, "--out", str(tmp_path / "r.md")])


def test_report_keeps_head_dims_apart_and_names_them(tmp_path):
    # one file with head dim 128 (one record without "dim": 128 too), 192/128 and 256 at the same
    # (mask, S, heads): three tables, none overwriting another, each naming its head dims
    path = str(tmp_path / "mixed.jsonl")
    no_dim = rec("paddle_flashmask_fa2", "causal", 8192, 2.0, 8.0, 200.0, 125.0)
    del no_dim["dim"]
    write(path, [
        rec("paddle_flashmask_sm90", "causal", 8192, 1.0, 4.0, 500.0, 300.0),
        no_dim,
        rec("paddle_flashmask_sm90", "causal", 8192, 1.5, 5.0, 520.0, 310.0, dim=192, dim_v=128),
        rec("paddle_flashmask_sm90", "causal", 8192, 2.0, 8.0, 540.0, 320.0, dim=256, dim_v=256),
        # Flex at 192/128 only: 13 / 6.5 = 2.00 against sm90 192/128
        rec("flex_attention", "causal", 8192, 4.0, 9.0, 200.0, 180.0, dim=192, dim_v=128),
        rec("sdpa_dense_mask", "causal", 8192, 5.0, 10.0, 100.0, 125.0, dim=192, dim_v=128),
    ])
    out = str(tmp_path / "r.md")
    assert report.main([path, "--out", out]) == 0
    text = open(out).read()
    t = tables(text)
    assert {section for section, _ in t} == {"S = 8192, 32:8 heads, head dim 128",
                                             "S = 8192, 32:8 heads, head dim 192/128",
                                             "S = 8192, 32:8 heads, head dim 256"}
    row = t[("S = 8192, 32:8 heads, head dim 128", "causal")]
    assert row["sm90 fwd"] == "500" and row["fa2 fwd"] == "200" and row["Flex fwd"] == "-"
    row = t[("S = 8192, 32:8 heads, head dim 192/128", "causal")]
    assert row["sm90 fwd"] == "520" and row["fa2 fwd"] == "-" and row["Flex fwd"] == "200"
    assert row["SDPA fwd"] == "100"
    assert row[next(k for k in row if k.startswith("sm90/Flex fwd+bwd"))] == "2.00 ✓"
    row = t[("S = 8192, 32:8 heads, head dim 256", "causal")]
    assert row["sm90 fwd"] == "540" and row["Flex fwd"] == "-"
    assert "bf16, head dim 128, 192/128, 256 (query and key / value where they differ)" in text
    assert "fwd = 2·area·H·(D + Dv)" in text


@pytest.mark.parametrize("dims,label", [((128, 128), "128"), ((192, 128), "192/128"), ((64, 32), "64/32")])
def test_report_head_dims_label(dims, label):
    assert report.dims_label(dims) == label
    assert report.head_dims_of(dict(dim=dims[0], dim_v=dims[1])) == dims
    assert report.head_dims_of(dict(dim=dims[0])) == (dims[0], dims[0])  # older records: value alike
    assert report.head_dims_of({}) == (128, 128)  # the oldest: head dim 128


def test_flops_count_value_head_dim_of_its_own():
    # fwd = 2 * area * H * (D + Dv): Q K^T over D, P V over Dv; bwd 2.5 x fwd
    S, H = 64, 4
    area = S * (S + 1) / 2  # plain causal
    fwd, bwd = mask_area.attention_flops(None, True, S, S, H, 192, head_dim_v=128)
    assert fwd == 2 * area * H * (192 + 128) and bwd == 2.5 * fwd
    fwd, bwd = mask_area.attention_flops(None, True, S, S, H, 128)  # value alike: 4 * area * H * D
    assert fwd == 4 * area * H * 128 and bwd == 2.5 * fwd
    assert mask_area.attention_flops(None, True, S, S, H, 128, head_dim_v=128)[0] == fwd


def test_bench_value_head_dim_default_is_the_gpu_kernels():
    # mask_area (no Paddle: the peers' process has none) repeats validation.GPU_VALUE_HEAD_DIMS
    from paddle_flashmask import validation

    for dim in validation.GPU_HEAD_DIMS:
        assert mask_area.gpu_value_head_dim(dim) == validation.gpu_value_head_dim(dim), dim
    assert mask_area.gpu_value_head_dim(192) == 128 and mask_area.gpu_value_head_dim(48) == 48


report_cp_multi_gpu = _load("report_cp_multi_gpu")


def cp_rec(device, mask, S, W, method, t1_ms, steps, **extra):
    return dict(device=device, mask=mask, seqlen=S, world_size=W, method=method, layout="local", t1_ms=t1_ms,
                step_ms=steps, compute_ms=[s * 0.9 for s in steps], exchanges_ms=[1.0] * W,
                busiest_over_mean=max(steps) / (sum(steps) / W),
                efficiency=None if t1_ms is None else t1_ms / (W * max(steps)), tflops_per_gpu=400.0, **extra)


def test_report_cp_multi_gpu(tmp_path):
    """The measured multi-GPU table: later records of a key win, the efficiency and the slowest
    rank's step are printed, a failed step (NaN) and a missing T1 read n/a; the plot is written."""
    path = tmp_path / "cp.jsonl"
    nan = float("nan")
    rows = [cp_rec("GPU A", "causal_document", 262144, 4, "allgather", 200.0, [90.0] * 4),
            cp_rec("GPU A", "causal_document", 262144, 4, "allgather", 200.0, [50.0, 40.0, 40.0, 40.0]),
            cp_rec("GPU A", "causal_document", 1048576, 4, "ulysses", None, [300.0] * 4),
            cp_rec("GPU A", "share_question", 131072, 4, "ulysses", 60.0, [nan] * 4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recs = report_cp_multi_gpu.load([str(path)])
    assert len(recs) == 3
    lines = report_cp_multi_gpu.table(recs).splitlines()
    assert "| GPU A | causal_document | 256K | 4 | allgather (local) | 200.0 | 50.0 | 1.176 | 1.000 |" in lines[2]
    assert "| 1024K | 4 | ulysses | n/a | 300.0 |" in lines[3] and "| n/a |" in lines[3]
    assert "| share_question | 128K | 4 | ulysses | 60.0 | n/a | n/a | n/a |" in lines[4]
    pytest.importorskip("matplotlib")
    png = tmp_path / "cp.png"
    report_cp_multi_gpu.plot(recs, str(png))
    assert png.stat().st_size > 1000


def test_dump_bench_masks_writes_the_benchmarks_instances(tmp_path, capsys):
    """The harness's --time-mask-file reads what bench_gpu.py passes to the op, as raw int32 [S, C]."""
    dump = load_script("benchmarks/device/dump_bench_masks.py")
    from paddle_flashmask import masks

    assert dump.main([str(tmp_path), "512", "prefix_lm_document", "causal_document"]) == 0
    lines = capsys.readouterr().out.split("\n")
    for name, line in zip(("prefix_lm_document", "causal_document"), lines):
        idx, causal = mask_area.bench_mask(masks, name, 512, 8)
        cols = idx.shape[-1]
        path = tmp_path / f"{name}_512.i32"
        assert line == f"--time-mask-file {path} 512 {cols} {int(causal)} {name}"
        np.testing.assert_array_equal(np.fromfile(path, dtype=np.int32).reshape(512, cols), idx[0, 0])
    # Batch and mask heads beyond one are not what the harness takes: refused by name.
    with pytest.raises(SystemExit, match="random_eviction"):
        dump.main([str(tmp_path), "512", "random_eviction"])


def test_dump_cp_part_mask_writes_the_parts_rows_and_keys(tmp_path, capsys, monkeypatch):
    """A context-parallel part written for --time-mask-file hides exactly what the whole mask hides
    among that rank's rows and that part's keys; a part whose key count differs from its row count,
    a rank or part out of range, are refused by name."""
    dump = load_script("benchmarks/device/dump_cp_part_mask.py")
    bench_cp = load_script("benchmarks/bench_cp_gpu.py")
    import paddle
    from paddle_flashmask import masks
    from paddle_flashmask.distributed import ContextParallelPlan, allgather

    S, W, name = 8192, 2, "global_sliding_window"
    # where group 0's keys share the own keys' call, part 1 is part 0's call
    with pytest.raises(SystemExit, match="shares part 0's kernel call"):
        dump.main([str(tmp_path), str(S), str(W), name, "0", "1"])
    monkeypatch.setattr(allgather, "FUSE_OWN", False)
    assert dump.main([str(tmp_path), str(S), str(W), name, "0", "1"]) == 0
    line = capsys.readouterr().out.strip().split("\n")[-1]
    path = tmp_path / f"{name}_{S}_w{W}_r0_p1.i32"
    idx, causal = bench_cp.long_context_mask(name, S)
    plan = ContextParallelPlan(idx, causal, W, method="allgather", seqlen=S)
    spec = allgather.Spec(plan, 0, None, paddle.to_tensor(idx), causal, 1.0, None, False, 1, paddle.CPUPlace(), 128)
    rows, keys = plan.local_rows(0), spec.part_keys(spec.groups()[0])
    assert spec.part_slots(0) is None  # rank 0's part: its keys back to back
    cols = idx.shape[-1]
    assert line == f"--time-mask-file {path} {len(keys)} {cols} 0 {name}_{S}_w{W}_r0_p1"
    part = np.fromfile(path, dtype=np.int32).reshape(1, 1, len(keys), cols)
    whole = masks.to_dense(idx, causal, seqlen_q=S)[0, 0]
    np.testing.assert_array_equal(masks.to_dense(part, False, seqlen_q=len(rows))[0, 0], whole[np.ix_(rows, keys)])
    assert whole[np.ix_(rows, keys)].any() and not whole[np.ix_(rows, keys)].all()  # a mask, not a block
    # rank 1's part of rank 0's keys: 4096 rows, 3472 keys spaced out over 3584 slots (the global
    # tokens apart from the window's keys, distributed/spacing.py)
    rows1 = plan.local_rows(1)
    spec1 = allgather.Spec(plan, 1, None, paddle.to_tensor(idx), causal, 1.0, None, False, 1, paddle.CPUPlace(), 128)
    keys1 = spec1.part_keys(spec1.groups()[0])
    slots1, length1 = spec1.part_slots(0)
    assert len(keys1) == 3472 and length1 == 3584
    with pytest.raises(SystemExit, match="3584 keys.*--pad-keys"):
        dump.main([str(tmp_path), str(S), str(W), name, "1", "1"])
    # Padded: the part's slots as its kernel call has them, then keys that hide every row.
    assert dump.main([str(tmp_path), str(S), str(W), name, "1", "1", "--pad-keys"]) == 0
    padded = np.fromfile(tmp_path / f"{name}_{S}_w{W}_r1_p1.i32", dtype=np.int32).reshape(1, 1, len(rows1), cols)
    dense1 = masks.to_dense(padded, False, seqlen_q=len(rows1))[0, 0]
    np.testing.assert_array_equal(dense1[:, slots1], whole[np.ix_(rows1, keys1)])
    padding = np.ones(len(rows1), bool)
    padding[slots1] = False
    assert not dense1[:, padding].any()
    for num_cols in (2, 4):  # the forms of a non-causal part: every band covers all rows
        hide = dump.hiding_columns(3, num_cols, 100)
        assert not masks.to_dense(hide[None, None], False, seqlen_q=100).any(), num_cols
        np.testing.assert_array_equal(hide, np.tile([0, 100] * (num_cols // 2), (3, 1)))
    with pytest.raises(SystemExit, match="RANK must be in"):
        dump.main([str(tmp_path), str(S), str(W), name, "2", "0"])
    with pytest.raises(SystemExit, match="PART must be in"):
        dump.main([str(tmp_path), str(S), str(W), name, "0", "2"])


def test_clock_summary_sets_the_log_beside_each_records_window(tmp_path, capsys):
    clocks = load_script("benchmarks/device/clock_summary.py")
    import datetime

    base = datetime.datetime(2026, 11, 27, 1, 0, 0)
    lines = []
    for i, (mhz, watts, temp, reasons) in enumerate([(1980, 600, 50, "0x0"), (1755, 690, 60, "0x4"),
                                                     (1800, 650, 58, "0x0"), (1980, 120, 40, "0x1")]):
        when = (base + datetime.timedelta(seconds=i)).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
        lines.append(f"{when}, {mhz}, {watts}, {temp}, {reasons}")
    log = tmp_path / "gpu_clocks.csv"
    log.write_text("\n".join(lines) + "\n2026/11/27 01:00:0")  # a last line cut off by the kill
    t0 = base.timestamp()
    results = tmp_path / "gpu_results.jsonl"
    results.write_text("\n".join(json.dumps(r) for r in [
        rec("paddle_flashmask_sm90", "causal", 8192, 1.0, 3.0, 500, 450, t_start=t0 + 0.5, t_end=t0 + 2.5),
        rec("paddle_flashmask_sm90", "full", 8192, 2.0, 5.0, 600, 500, t_start=t0 + 10, t_end=t0 + 11),
        dict(impl="flex_attention", mask="causal", seqlen=8192, error="OOM"),
    ]) + "\n")
    rows = clocks.summarize(clocks.load_clock_log(str(log)), [json.loads(l) for l in open(results)])
    assert len(rows) == 2  # the error record has no window
    (r1, s1), (r2, s2) = rows
    assert s1["n"] == 2 and s1["mean_mhz"] == (1755 + 1800) / 2 and s1["min_mhz"] == 1755
    assert s1["watts"] == 670 and s1["max_temp"] == 60 and s1["reasons"] == 0x4
    assert s2 is None  # no sample inside its window
    assert clocks.main([str(log), str(results)]) == 0
    out = capsys.readouterr().out
    assert "| paddle_flashmask_sm90 | causal | 8192 | 1.000 | 3.000 | 2 | 1778 (1755) | 670 | 60 | 0x4 |" in out
    assert "| paddle_flashmask_sm90 | full | 8192 | 2.000 | 5.000 | 0 | - | - | - | - |" in out


def test_rounds_summary_medians_ranges_and_same_round_ratios(tmp_path, capsys):
    rounds = _load("rounds_summary")
    ours = [rec("paddle_flashmask_sm90", "causal", 8192, ms, 4.0, t, 500.0, round=i, fwd_b2b_ms=0.9, bwd_b2b_ms=4.0)
            for i, (ms, t) in enumerate([(1.0, 600.0), (0.95, 630.0), (1.05, 570.0)], start=1)]
    peer = [rec("sdpa_cudnn", "causal", 8192, ms, 4.5, 550.0, 450.0, round=i)
            for i, ms in zip((1, 2), (1.1, 1.2))]
    write(str(tmp_path / "round1" / "gpu_results.jsonl"), ours[:1] + [
        rec("paddle_flashmask_sm90", "full", 8192, 2.0, 6.0, 650.0, 480.0)])  # no round: left out
    write(str(tmp_path / "round2" / "gpu_results.jsonl"), ours[1:] + [
        dict(impl="paddle_flashmask_sm90", mask="causal", seqlen=8192, heads=32, heads_k=8, round=4,
             error="RuntimeError: out of memory")])  # failed: left out
    write(str(tmp_path / "peers.jsonl"), peer)
    out = str(tmp_path / "rounds.md")
    assert rounds.main([str(tmp_path), "--out", out]) == 0
    text = open(out).read()
    row = next(line for line in text.splitlines() if line.startswith("| paddle_flashmask_sm90 | causal |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[5] == "3"  # rounds 1-3 (round 4 failed)
    assert cells[6] == "600 [570-630]"  # fwd per call
    # back to back: 600 * 1.0 / 0.9 = 667, 630 * 0.95 / 0.9 = 665, 570 * 1.05 / 0.9 = 665
    assert cells[7] == "665 [665-667]"
    assert cells[8] == "500 [500-500]"
    assert "| paddle_flashmask_sm90 | causal | 8192 | 32:8 | 128 | 3 |" in text
    assert "| full |" not in text
    ratio = next(line for line in text.splitlines() if line.startswith("| paddle_flashmask_sm90 | sdpa_cudnn |"))
    cells = [c.strip() for c in ratio.strip("|").split("|")]
    # rounds 1 and 2 only: (1.1 + 4.5) / 5.0 = 1.12, (1.2 + 4.5) / 4.95 = 1.1515
    assert cells[6] == "2" and cells[7] == "1.14 [1.12-1.15]" and cells[8] == "-"

    # a sweep of one round only (no round field) is not what this summary reads
    plain = str(tmp_path / "plain" / "gpu_results.jsonl")
    write(plain, [rec("paddle_flashmask_sm90", "causal", 8192, 1.0, 4.0, 600.0, 500.0)])
    with pytest.raises(SystemExit, match="no record with a round"):
        rounds.main([plain])
