"""Prebuilt CUDA objects (PADDLE_FLASHMASK_CUDA_OBJECTS): a directory whose FINGERPRINT
matches may hold only some objects; those are linked as they are, the rest compiled."""

import os
import subprocess

import pytest

from paddle_flashmask import _loader, _op_sources


def _fake_nvcc(compiled):
    def run(cmd, **kwargs):
        obj = cmd[cmd.index("-o") + 1]
        compiled.append(os.path.basename(obj))
        open(obj, "wb").close()
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run


# Listing the sources says so where the CUTLASS headers are missing (the Paddle 2.6 environment).
_NO_SM90_NOTE = "ignore:paddle_flashmask. building without the sm90"


@pytest.mark.filterwarnings(_NO_SM90_NOTE)
def test_matching_directory_with_some_objects(tmp_path, monkeypatch):
    names = [os.path.basename(s) + ".o" for s in _op_sources.cuda_sources()]
    prebuilt = tmp_path / "prebuilt"
    prebuilt.mkdir()
    carried = names[::3]
    for n in carried:
        (prebuilt / n).write_bytes(b"")
    (prebuilt / "FINGERPRINT").write_text(_op_sources.cuda_fingerprint())
    compiled = []
    monkeypatch.setattr(subprocess, "run", _fake_nvcc(compiled))
    monkeypatch.setenv("PADDLE_FLASHMASK_CUDA_OBJECTS", str(prebuilt))
    objects = _loader._cuda_objects(str(tmp_path / "build"))
    assert [os.path.basename(o) for o in objects] == names
    assert sorted(compiled) == sorted(set(names) - set(carried))
    assert all(os.path.dirname(o) == str(prebuilt) for o in objects if os.path.basename(o) in carried)


@pytest.mark.filterwarnings(_NO_SM90_NOTE)
def test_stale_directory_is_not_used(tmp_path, monkeypatch):
    names = [os.path.basename(s) + ".o" for s in _op_sources.cuda_sources()]
    prebuilt = tmp_path / "prebuilt"
    prebuilt.mkdir()
    for n in names:
        (prebuilt / n).write_bytes(b"")
    (prebuilt / "FINGERPRINT").write_text("0" * 16)
    compiled = []
    monkeypatch.setattr(subprocess, "run", _fake_nvcc(compiled))
    monkeypatch.setenv("PADDLE_FLASHMASK_CUDA_OBJECTS", str(prebuilt))
    with pytest.warns(UserWarning, match="does not match"):
        objects = _loader._cuda_objects(str(tmp_path / "build"))
    assert sorted(compiled) == sorted(names)
    assert all(os.path.dirname(o) == str(tmp_path / "build" / "cuda_objects") for o in objects)


@pytest.mark.filterwarnings(_NO_SM90_NOTE)
@pytest.mark.parametrize("carried_every", [0, 3])
def test_later_process_takes_what_the_cache_holds(tmp_path, monkeypatch, carried_every):
    """Each process that loads the op lists its objects: the second compiles nothing, whether the
    first compiled all of them or only those a prebuilt directory lacked."""
    names = [os.path.basename(s) + ".o" for s in _op_sources.cuda_sources()]
    build = str(tmp_path / "build")
    carried = names[::carried_every] if carried_every else []
    if carried:
        prebuilt = tmp_path / "prebuilt"
        prebuilt.mkdir()
        for n in carried:
            (prebuilt / n).write_bytes(b"")
        (prebuilt / "FINGERPRINT").write_text(_op_sources.cuda_fingerprint())
        monkeypatch.setenv("PADDLE_FLASHMASK_CUDA_OBJECTS", str(prebuilt))
    else:
        monkeypatch.delenv("PADDLE_FLASHMASK_CUDA_OBJECTS", raising=False)
    compiled = []
    monkeypatch.setattr(subprocess, "run", _fake_nvcc(compiled))
    first = _loader._cuda_objects(build)
    assert sorted(compiled) == sorted(set(names) - set(carried))
    compiled.clear()
    second = _loader._cuda_objects(build)
    assert compiled == []
    assert second == first


@pytest.mark.filterwarnings(_NO_SM90_NOTE)
def test_unfinished_cache_is_compiled_again(tmp_path, monkeypatch):
    """Objects in the cache without its FINGERPRINT (a build that stopped part way) are not taken."""
    names = [os.path.basename(s) + ".o" for s in _op_sources.cuda_sources()]
    out_dir = tmp_path / "build" / "cuda_objects"
    out_dir.mkdir(parents=True)
    for n in names[:5]:
        (out_dir / n).write_bytes(b"partial")
    monkeypatch.delenv("PADDLE_FLASHMASK_CUDA_OBJECTS", raising=False)
    compiled = []
    monkeypatch.setattr(subprocess, "run", _fake_nvcc(compiled))
    _loader._cuda_objects(str(tmp_path / "build"))
    assert sorted(compiled) == sorted(names)
    assert (out_dir / "FINGERPRINT").read_text() == _op_sources.cuda_fingerprint()


@pytest.mark.filterwarnings(_NO_SM90_NOTE)
def test_fingerprint_covers_every_header_a_cuda_source_includes():
    """The CUDA fingerprint leaves the CPU kernels' and the Paddle glue's headers out (a change
    there keeps the objects); so no CUDA source may reach one of them through its includes."""
    import re

    hashed = set(_op_sources.cuda_header_paths())
    todo = list(_op_sources.cuda_sources()) + sorted(hashed)
    seen = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        with open(path) as f:
            for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', f.read(), re.M):
                target = os.path.normpath(os.path.join(os.path.dirname(path), name))
                if os.path.exists(target) and target.startswith(_op_sources.OPS_DIR):
                    assert target in hashed, f"{path} includes {target}, which the fingerprint leaves out"
                    todo.append(target)
    assert len(seen) > len(_op_sources.cuda_sources())
