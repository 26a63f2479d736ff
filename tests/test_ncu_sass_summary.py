"""benchmarks/device/ncu_sass_summary.py's opcode counts (the Nsight Compute source pages that set
our FA2-class kernels beside FlashAttention-2 by executed instructions)."""

from script_loader import load_script


def _summary():
    return load_script("benchmarks/device/ncu_sass_summary.py")


def _source_page(tmp_path, name, lines):
    # as `ncu --page source --csv --print-source sass` writes it: the kernel's name, then the table
    rows = ['"Kernel Name","void kernel(Params)"',
            '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_wait"']
    rows += [f'"0x{i:x}","{src}","{samples}","{executed}","{samples}"' for i, (src, samples, executed) in enumerate(lines)]
    path = tmp_path / name
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_opcodes_sum_mnemonics_past_predicates_and_modifiers(tmp_path):
    summary = _summary()
    page = _source_page(tmp_path, "ours.csv", [
        ("HMMA.16816.F32.BF16 R0, R4, R8, R0", 10, "1,000"),
        ("@P2 BRA 0x100", 3, "200"),
        ("@!PT LDS RZ, [RZ]", 0, "50"),
        ("HMMA.16816.F32.BF16 R2, R4, R8, R2", 5, "1,000"),
        ("IMAD.MOV.U32 R1, RZ, RZ, R2", 1, "300"),
    ])
    counts = summary.by_opcode(summary.read_rows(page))
    assert counts["HMMA"] == [2000.0, 15.0]
    assert counts["BRA"] == [200.0, 3.0]
    assert counts["LDS"] == [50.0, 0.0]
    assert counts["IMAD"] == [300.0, 1.0]
    assert "@P2" not in counts and "@!PT" not in counts


def test_opcodes_side_by_side(tmp_path, capsys):
    summary = _summary()
    ours = _source_page(tmp_path, "ours.csv", [("IMAD R1, R2, R3, RZ", 1, "700"), ("HMMA.16816 R0", 2, "100")])
    peer = _source_page(tmp_path, "peer.csv", [("HMMA.16816 R0", 2, "100"), ("LDL R4, [R1]", 9, "40")])
    summary.print_opcodes(ours, peer)
    out = capsys.readouterr().out.splitlines()
    table = {line.split()[0]: line.split() for line in out[2:]}
    assert table["IMAD"][1:4] == ["700", "0", "700"]
    assert table["LDL"][1:4] == ["0", "40", "-40"]
    assert table["HMMA"][3] == "0"
    assert table["total"][1:3] == ["800", "140"]


def test_counts_group_lines_by_how_often_they_ran(tmp_path, capsys):
    summary = _summary()
    page = _source_page(tmp_path, "ours.csv", [
        ("HMMA.16816 R0", 60, "2,000"),  # the step body: 2000 runs
        ("LDS R1, [R2]", 20, "2,000"),
        ("REDG.E.ADD.F32 [R2], R1", 15, "320"),  # an epilogue loop: 320 runs
        ("EXIT", 5, "20"),  # once a warp
        ("BRA 0x0", 0, "0"),
    ])
    summary.print_counts([page])
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["2,000"][1:] == ["2", "0.800", "80", "4,000"]
    assert rows["320"][1:] == ["1", "0.150", "15", "320"]
    assert rows["20"][1:] == ["1", "0.050", "5", "20"]
    assert list(rows)[:3] == ["2,000", "320", "20"]  # by samples
