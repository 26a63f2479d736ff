"""The CUDA sources compile for sm_80 and sm_90a with the machine's nvcc (CI has
no GPU; this keeps the kernels from rotting between device runs), and the
Hopper kernels' sm_90a SASS has the instructions they are built around. The
kernel core is framework-neutral, so no Paddle GPU build is needed for this."""

import glob
import importlib.util
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from paddle_flashmask import _op_sources

NVCC = shutil.which("nvcc") or next(
    (p for p in ("/usr/local/cuda/bin/nvcc",) if os.path.exists(p)), None
)
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found")


def compile_one(source, out_dir, flags):
    obj = os.path.join(out_dir, os.path.basename(source) + ".o")
    cmd = [NVCC, "-c", source, "-o", obj, "-Xptxas", "-v", *flags,
           "-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90a,code=sm_90a"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    return source, obj, res.returncode, res.stdout + res.stderr


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """Every CUDA source compiled once for sm_80 + sm_90a (shared by the tests below):
    [(source, object, returncode, nvcc/ptxas log)]."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PADDLE_FLASHMASK_CUDA_ARCHS", "80;90a")
        if not _op_sources.cutlass_include_dir():
            pytest.fail("CUTLASS/CuTe headers missing: the README's test command installs nvidia-cutlass")
        sources = _op_sources.cuda_sources()
        # The op's own nvcc flags with both archs (and, for 90a, the CuTe include
        # and FLASHMASK_WITH_SM90).
        flags = [f for f in _op_sources.nvcc_flags() if not f.startswith("-gencode")]
    out_dir = str(tmp_path_factory.mktemp("cuda_objects"))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return list(pool.map(lambda s: compile_one(s, out_dir, flags), sources))


def test_cuda_sources_compile_for_sm80_and_sm90a(compiled):
    sources = [s for s, *_ in compiled]
    assert len(sources) >= 14  # 3 head dims x 2 dtypes x fwd/bwd + prep + api
    assert any("sm90" in os.path.basename(s) and "_fwd_" in s for s in sources)
    failures = [(s, log) for s, _, rc, log in compiled if rc != 0]
    assert not failures, "\n\n".join(f"{s}:\n{log[-3000:]}" for s, log in failures)
    # ptxas serialises every wgmma of a kernel (a wait after each) where one GEMM's
    # accumulators are read in flight or a GEMM stays in flight across a branch; it says
    # so (C7514/C7520) and the kernel silently loses its overlap (NOTES.md, sm90 v12).
    serialized = [os.path.basename(s) for s, _, _, log in compiled
                  if "wgmma.mma_async instructions are serialized" in log]
    assert not serialized, f"ptxas serialised the wgmmas of: {serialized}"
    # Register budget guard (one report line per kernel and arch): head dims 32 and 64
    # must not spill; 128 runs at the 255-register limit and may spill a few words
    # (custom_ops/flashmask/cuda/NOTES.md records each version's figures).
    for source, _, _, log in compiled:
        name = os.path.basename(source)
        # mask_prep.cu: the passes around the main kernels (delta, dQ conversion) keep
        # their loads in registers; a spill there would be their bandwidth.
        if "_fwd_" in name or "_bwd_" in name or name == "mask_prep.cu":
            spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", log)]
            # The persistent sm90 forward's list builders run at the producer's
            # 24 registers and keep a few words on the stack, off the consumers'
            # path (the SASS test below holds the consumer code to no local
            # memory; NOTES.md, sm90 v5).
            if "sm90" in name:
                limit = 64 if "_fwd_" in name else 0
            elif "_bwd_dq_hdim64" in name:
                # The deterministic dQ kernel at its register limit: one word since the
                # block_mask check (NOTES.md, block_mask); head dim 32 and the rest stay at 0.
                limit = 8
            elif "_fwd_hdim96" in name:
                # The forward with its K/V copies unrolled (2026-11-26, +15%): 124 / 112 bytes
                # (sm_80 / sm_90a) at the 255-register limit, as at 128 (NOTES.md)
                limit = 128
            elif "hdim96" in name:
                # the backward at the 255-register limit: 12 bytes on sm_80 and sm_90a since
                # issue 15 step 3 (4 before; NOTES.md)
                limit = 16 if "_bwd_hdim96" in name else 0
            elif "_fwd_hdim128" in name:
                # The forward at the 255-register limit with its fragments loaded a step
                # ahead (issue 15 step 2): 124 bytes, kept off the MMA runs (NOTES.md)
                limit = 128
            elif "_bwd_hdim128" in name:
                # The backward at the 255-register limit: 44 bytes on sm_80 and sm_90a since
                # issue 15 step 3 (36 / 72 before), outside the MMA runs but for one sm_80 reload;
                # the staged kernel (grid order) 12-16 bytes since its unbranched next-block
                # copies, one reload a step, and up to 0.9% faster with it (NOTES.md)
                limit = 48
            elif "hdim256" in name:
                # issue 15 step 6 (nvcc 13.0, sm_80 / sm_90a): forward 246 / 249 registers and
                # the deterministic dQ kernel (32-key blocks) 242 / 242 do not spill; the
                # FA2-layout backward, its Q/dO copies unrolled since 2026-11-26 (+5%), at most
                # 12 bytes (bf16 since the copies' immediate destinations, 2026-11-27: none on
                # sm_80, 4 on sm_90a); the forward's ordered instantiation (kOrdered,
                # cuda/fa2_cta_order.cuh: launched only past 64K keys with a column mask) 28
                # bytes on sm_90a, its plain ones none
                limit = 16 if "_bwd_hdim256" in name else 32 if "_fwd_hdim256" in name else 0
            else:
                # the rest, the deterministic dQ kernel at 128 included, do not spill
                limit = 0
            assert spills and max(spills) <= limit, f"{name} spills {spills} bytes (limit {limit})"


def cuda_tool(name):
    """cuobjdump / nvdisasm: on PATH, in CUDA_HOME/bin, or from the nvidia-cuda-cuobjdump /
    nvidia-cuda-nvdisasm wheels (nvidia/cu13/bin, or nvidia/cuda_<tool>/bin for CUDA 12)."""
    found = shutil.which(name)
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    candidates = [os.path.join(home, "bin", name)]
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidates += sorted(glob.glob(os.path.join(root, "*", "bin", name)), reverse=True)
    return next((p for p in candidates if os.path.isfile(p) and os.access(p, os.X_OK)), None)


def sass_functions(text):
    """{mangled function name: its SASS} from `cuobjdump -sass` output."""
    funcs, name, body = {}, None, []
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if name:
                funcs[name] = "\n".join(body)
            name, body = m.group(1), []
        elif name:
            body.append(line)
    if name:
        funcs[name] = "\n".join(body)
    return funcs


def kernel_sass(cuobjdump, obj, arch, env=None):
    """{mangled function name: its SASS} of one object's `arch` code."""
    res = subprocess.run([cuobjdump, "-sass", "-arch", arch, obj], capture_output=True, text=True, env=env)
    assert res.returncode == 0, f"cuobjdump on {obj}:\n{res.stderr[-2000:]}"
    return sass_functions(res.stdout)


# What the Hopper kernels are built around, in their sm_90a SASS: wgmma (HGMMA), TMA tile
# loads (UTMALDG), setmaxnreg register reallocation between the producer warpgroup
# (gives registers back) and the consumers (take them), and no local memory (LDL/STL:
# spills or a register array indexed at run time).
SASS_MUST_HAVE = {
    "HGMMA": r"\bHGMMA\.",
    "UTMALDG": r"\bUTMALDG\b",
    "USETMAXREG.DEALLOC": r"\bUSETMAXREG\.DEALLOC\b",
    "USETMAXREG.(TRY_)ALLOC": r"\bUSETMAXREG\.(TRY_)?ALLOC\b",
}
SASS_STSM = r"\bSTSM\."  # stmatrix: the forward's O epilogue and the backward's dS hand-over
SASS_TMA_EPILOGUE = {"STSM": SASS_STSM, "UTMASTG": r"\bUTMASTG\b"}
# Generic stores (ST.E, not STG/STS): a store to shared memory whose address went
# through an integer (a swizzled cute tensor copied element by element) loses its
# state space; the backward's dS stores were 16-32 of them a step, each with 64-bit
# address arithmetic. The backward hands P/dS over by stmatrix instead.
SASS_GENERIC_STORE = r"\bST\.E[A-Z0-9.]*\s[^;]*;"
SASS_LOCAL_MEMORY = r"\b(LDL|STL)(\.[A-Z0-9]+)*\s[^;]*;"


def local_memory_by_role(body):
    """LDL/STL instructions of one kernel's SASS by warp role: each goes to the
    region opened by the last USETMAXREG before it (DEALLOC: producer,
    ALLOC: consumer; none yet: the shared prologue)."""
    found, role = {"prologue": [], "producer": [], "consumer": []}, "prologue"
    for line in body.splitlines():
        if re.search(r"\bUSETMAXREG\.DEALLOC\b", line):
            role = "producer"
        elif re.search(r"\bUSETMAXREG\.(TRY_)?ALLOC\b", line):
            role = "consumer"
        m = re.search(SASS_LOCAL_MEMORY, line)
        if m:
            found[role].append(m.group(0).strip())
    return found


def test_sm90_kernels_sass(compiled):
    cuobjdump, nvdisasm = cuda_tool("cuobjdump"), cuda_tool("nvdisasm")
    if not (cuobjdump and nvdisasm):
        pytest.skip("cuobjdump/nvdisasm not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm, "
                    "as the README's test command does)")
    env = dict(os.environ, PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ.get("PATH", ""))
    kernel_file = re.compile(r"flashmask_(fwd|bwd)_sm90_\w+\.cu$")
    expected = [s for s in _op_sources.sm90_kernel_sources() if kernel_file.search(s)]
    objects = [(s, o) for s, o, rc, _ in compiled if rc == 0 and s in expected]
    assert len(expected) >= 2 and len(objects) == len(expected), (
        f"sm90 kernel objects: {len(objects)} of {len(expected)} compiled (see the compile test)")
    problems, kernels = [], {"fwd": 0, "bwd": 0}
    for source, obj in objects:
        funcs = {n: body for n, body in kernel_sass(cuobjdump, obj, "sm_90a", env).items()
                 if re.search(r"flashmask_(fwd|bwd)_sm90_kernel", n)}
        if not funcs:
            problems.append(f"{os.path.basename(source)}: no sm_90a flashmask_*_sm90_kernel in the SASS")
        for fname, body in funcs.items():
            kernels["fwd" if "flashmask_fwd_sm90_kernel" in fname else "bwd"] += 1
            where = f"{os.path.basename(source)} ({fname[:90]})"
            for label, pattern in SASS_MUST_HAVE.items():
                if not re.search(pattern, body):
                    problems.append(f"{where}: no {label}")
            # Head dims 64, 96 and 128 store O through shared memory (stmatrix) and TMA; not
            # the 176-key tiles at 128 (FwdTraits<128, T, true>: one Q buffer, O from registers).
            if re.search(r"flashmask_fwd_sm90_kernel.*FwdTraitsILi(64|96|128)EN7cutlass\d+[a-z0-9]+_tELb0EEE", fname):
                for label, pattern in SASS_TMA_EPILOGUE.items():
                    if not re.search(pattern, body):
                        problems.append(f"{where}: no {label} (the TMA epilogue)")
            generic = re.findall(SASS_GENERIC_STORE, body)
            if generic:
                problems.append(f"{where}: {len(generic)} generic stores (ST.E), e.g. {generic[0]}")
            if "flashmask_bwd_sm90_kernel" in fname and not re.search(SASS_STSM, body):
                problems.append(f"{where}: no STSM (the dS hand-over)")
            local = local_memory_by_role(body)
            # None in any role: the consumers' main loops, and the producer warpgroup too (24
            # registers for TMA issue and the forward's list builders, which classify a tile
            # one 64-column summary at a time so as not to spill: classify_tile_parts).
            for role, found in local.items():
                if found:
                    problems.append(f"{where}: {len(found)} local-memory instructions in the {role} "
                                    f"code, e.g. {found[:3]}")
    assert not problems, "\n".join(problems)
    assert kernels["fwd"] >= 1 and kernels["bwd"] >= 1, kernels


# The backward kernels add dQ (and, with GQA, dK/dV into fp32 slots) with fire-and-forget
# REDs. One fence.sc (__threadfence()) anywhere in the FA2-class staged kernel, even on a path
# the call never took, made ptxas compile them as ATOMs that wait for their result on sm_90a
# (sm_80 kept its REDs): the backward 9-33% slower on the H200 (NOTES.md, forty-sixth session).
# The Hopper backward's release counts (its overlapped finish) must not do it either.
SASS_FP32_ADD_RED = r"\bREDG?\.E\.ADD\.F32"
SASS_FP32_ADD_ATOM = r"\bATOMG?\.E\.ADD\.F32"
BACKWARD_OBJECTS = {  # arch: (object file pattern, kernel name) of the backward kernels built for it
    "sm_80": [(r"flashmask_bwd_hdim\d+_\w+_sm80\.cu$", "flashmask_bwd_staged_kernel")],
    "sm_90a": [(r"flashmask_bwd_hdim\d+_\w+_sm80\.cu$", "flashmask_bwd_staged_kernel"),
               (r"flashmask_bwd_sm90_\w+\.cu$", "flashmask_bwd_sm90_kernel")],
}


@pytest.mark.parametrize("arch", sorted(BACKWARD_OBJECTS))
def test_backward_fp32_adds_are_reds(compiled, arch):
    cuobjdump = cuda_tool("cuobjdump")
    if not cuobjdump:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump, as the README's test command does)")
    problems, kernels = [], 0
    for file_pattern, kernel in BACKWARD_OBJECTS[arch]:
        objects = [(s, o) for s, o, rc, _ in compiled if rc == 0 and re.search(file_pattern, s)]
        assert objects, f"no {kernel} objects compiled (see the compile test)"
        for source, obj in objects:
            for fname, body in kernel_sass(cuobjdump, obj, arch).items():
                if kernel not in fname:
                    continue
                kernels += 1
                where = f"{os.path.basename(source)} ({fname[:90]})"
                if not re.search(SASS_FP32_ADD_RED, body):
                    problems.append(f"{where}: no fp32 RED (its dQ or dK/dV adds)")
                atoms = re.findall(SASS_FP32_ADD_ATOM, body)
                if atoms:
                    problems.append(f"{where}: {len(atoms)} fp32 adds compiled as ATOM (each waits for a result)")
    assert not problems, "\n".join(problems)
    assert kernels > 0


def test_sm90_forward_out_panels_match_q_layout(tmp_path):
    """The forward's TMA epilogue reads O's panels where stmatrix wrote them
    (tests/cpp/fwd_out_panels_check.cu, host code through nvcc)."""
    include = _op_sources.cutlass_include_dir()
    if not include:
        pytest.fail("CUTLASS/CuTe headers missing: the README's test command installs nvidia-cutlass")
    exe = tmp_path / "fwd_out_panels_check"
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpp", "fwd_out_panels_check.cu")
    res = subprocess.run([NVCC, "-std=c++17", "--expt-relaxed-constexpr", "-DFLASHMASK_WITH_CUDA", f"-I{include}",
                          source, "-o", str(exe)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    mismatches, checks = (int(x) for x in out.split())
    assert checks == 2 * 2 * 64 * (64 + 96 + 128)
    assert mismatches == 0, f"{mismatches} of {checks} O elements staged apart from where the TMA store reads them"
