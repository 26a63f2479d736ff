"""The device-call summaries that set our FA2-class kernels beside FlashAttention-2
(benchmarks/device/fa2_steps_summary.py, fa2_masks_summary.py): which FA2 record they read and how."""

import json

from script_loader import load_script


def _load(name):
    return load_script(f"benchmarks/device/{name}.py")


def _peer(impl, fwd_tf, fwd_ms, fwd_b2b_ms):
    return "peer_json: " + json.dumps(dict(
        impl=impl, mask="causal", seqlen=8192, heads=32, heads_k=8, dim=128, fwd_ms=fwd_ms, bwd_ms=5.0,
        fwd_tflops=fwd_tf, bwd_tflops=270.0, fwd_b2b_ms=fwd_b2b_ms, bwd_b2b_ms=None if fwd_b2b_ms is None else 5.0))


def test_steps_summary_prefers_native_gqa_fa2_back_to_back(tmp_path):
    steps = _load("fa2_steps_summary")
    log = tmp_path / "fa2_steps.log"
    # the repeated-K/V peer comes last in the log and is faster per call: the native one still wins
    log.write_text("\n".join([_peer("fa2_gqa_causal", 300.0, 2.0, 1.9), _peer("sdpa_flash_causal", 310.0, 2.0, None)]))
    common = steps.parse_common(str(log))
    fwd, bwd = common["peers"]["causal 8K D128"]
    assert common["peer_impl"]["causal 8K D128"] == "fa2_gqa_causal"
    assert abs(fwd - 300.0 * 2.0 / 1.9) < 1e-9 and abs(bwd - 270.0) < 1e-9


def test_steps_summary_falls_back_to_the_sdpa_peer(tmp_path):
    steps = _load("fa2_steps_summary")
    log = tmp_path / "fa2_steps.log"
    log.write_text(_peer("sdpa_flash_causal", 280.0, 2.0, None) + "\n")
    common = steps.parse_common(str(log))
    assert common["peers"]["causal 8K D128"] == (280.0, 270.0)


def test_masks_summary_sets_each_side_against_its_own_causal(tmp_path):
    masks_summary = _load("fa2_masks_summary")
    (tmp_path / "fa2_masks.log").write_text("\n".join([
        "## ours pass 1 (h)",
        "| fa2 | causal | 8192 | 32:8 | 128/128 | 1/0 | 1.7 | 320.0 | 4.7 | 290.0 | 300 | 0.1 |",
        "| fa2 | causal_document | 8192 | 32:8 | 128/128 | 1/0 | 0.4 | 240.0 | 1.6 | 200.0 | 210 | 0.1 |",
        "FAILED: sm90 causal 8192 (exit 1)",
        "## fa2 peer",
    ]) + "\n")
    with open(tmp_path / "fa2_peer.jsonl", "w") as f:
        for mask, tf in (("causal", 300.0), ("causal_document", 200.0)):
            f.write(json.dumps(dict(impl="fa2_native_gqa", mask=mask, seqlen=8192, fwd_tflops=tf - 10,
                                    bwd_tflops=tf - 20, fwd_b2b_tflops=tf, bwd_b2b_tflops=tf - 10)) + "\n")
    assert masks_summary.main([str(tmp_path)]) == 0
    text = (tmp_path / "fa2_masks_summary.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| causal_document | 8K"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # ours 240 / FA2 200 back to back; ours 240/320 and FA2 200/300 of their causal
    assert cells[4] == "1.20" and cells[8] == "0.75, 0.69" and cells[9] == "0.67, 0.66"
    assert "FAILED: sm90 causal 8192 (exit 1)" in text


def test_masks_ab_summary_sets_each_variant_against_the_first():
    ab = _load("masks_ab_summary")
    row = "{v} | {p} | fa2 | sliding_window | 8192 | 32:8 | 128/128 | 1/0 | 0.485 | 266.1 | {bwd} | 222.1 | 233.1 | {prep} |"
    lines = [row.format(v="main", p=1, bwd="1.452", prep="0.198"), "main | 1 | sm90 | x | 8192 | NO ROW",
             row.format(v="new", p=1, bwd="1.400", prep="0.150"), row.format(v="main", p=2, bwd="1.455", prep="0.199"),
             row.format(v="new", p=2, bwd="1.390", prep="0.149")]
    rows = ab.parse(lines)
    assert [r["variant"] for r in rows] == ["main", "new", "main", "new"]
    table = ab.summarise(rows).splitlines()
    assert len(table) == 3
    cells = [c.strip() for c in table[2].strip("|").split("|")]
    assert cells[:3] == ["fa2", "sliding_window", "8K"]
    assert cells[3] == "1.452/1.455" and cells[4] == "0.198/0.199"
    assert cells[-1] == f"{1.452 / 1.390:.3f}"
