"""benchmarks/device/host_profile_summary.py: py-spy's raw samples of op_host_profile.py turned into
each function's share (or microseconds) of a call's host time."""

import pytest
from script_loader import load_script


def _summary():
    return load_script("benchmarks/device/host_profile_summary.py")


LOOP = "profiled_loop (benchmarks/device/op_host_profile.py:31)"
WRAPPER = "flashmask_attention (paddle_flashmask/attention.py:{})"


def _raw(tmp_path, lines):
    path = tmp_path / "prof.txt"
    path.write_text("".join(f"{';'.join(stack)} {count}\n" for stack, count in lines))
    return str(path)


def _rows(text):
    """{function: (inclusive, self)} from the printed table."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("function", "---"):
            rows[cells[0]] = (float(cells[1]), float(cells[2]))
    return rows


def test_shares_count_samples_inside_the_loop_once_per_function(tmp_path, capsys):
    summary = _summary()
    raw = _raw(tmp_path, [
        # outside the loop (start-up): left out
        (["<module> (x.py:1)", "import_paddle (x.py:2)"], 1000),
        # the wrapper at two lines, the op under it, the driver unnamed
        (["<module> (x.py:1)", LOOP, WRAPPER.format(10), "FlashMaskForward (flashmask_op.cc)",
          "0x7f00 (libcuda.so.1)"], 30),
        (["<module> (x.py:1)", LOOP, WRAPPER.format(12)], 10),
        # a recursive frame counts once toward its inclusive share
        (["<module> (x.py:1)", LOOP, "f (y.py:1)", "f (y.py:1)"], 10),
    ])
    summary.summarize(raw, us_per_call=100.0, min_share=0.0)
    rows = _rows(capsys.readouterr().out)
    wrapper = "flashmask_attention (paddle_flashmask/attention.py)"
    assert rows[wrapper] == (80.0, 20.0)  # 40 of 50 samples, 10 of them its own
    assert rows["FlashMaskForward (flashmask_op.cc)"] == (60.0, 0.0)
    assert rows["[libcuda.so.1]"] == (60.0, 60.0)
    assert rows["f (y.py)"] == (20.0, 20.0)
    assert not any(name.startswith(("import_paddle", "<module>", "profiled_loop")) for name in rows)


def test_min_share_leaves_out_small_functions(tmp_path, capsys):
    summary = _summary()
    raw = _raw(tmp_path, [([LOOP, "big (a.py:1)"], 99), ([LOOP, "tiny (a.py:1)"], 1)])
    summary.summarize(raw, min_share=0.05)
    rows = _rows(capsys.readouterr().out)
    assert rows["big (a.py)"] == (0.99, 0.99)
    assert "tiny (a.py)" not in rows


def test_no_loop_samples_is_an_error(tmp_path):
    summary = _summary()
    raw = _raw(tmp_path, [(["<module> (x.py:1)"], 5)])
    with pytest.raises(SystemExit, match="no samples inside profiled_loop"):
        summary.summarize(raw)
