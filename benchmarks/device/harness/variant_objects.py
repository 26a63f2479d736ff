"""The op's CUDA objects for one harness variant (build_variant.sh), compiled from a source tree
(a git worktree of some revision, or the working tree) for sm_90a, reusing any object built before
from the same inputs.

    python3 benchmarks/device/harness/variant_objects.py TREE OUT_DIR [CACHE_ROOT]

The source list and nvcc flags are TREE's own (its paddle_flashmask/_op_sources.py, loaded by path,
so a revision that adds a source builds it). Each object carries a key (OUT_DIR/<obj>.key): the
toolkit, the flags and the content of every file of TREE it includes (`nvcc -M`). An object whose key
matches one in any directory under CACHE_ROOT (default: OUT_DIR's parent) is hard-linked rather than
compiled, so a step that changes only the forward recompiles only the forward's files.

One exception, so that a change of kernel_traits.h does not rebuild the Hopper kernels (~5 min on
2 cores): the sm90 sources include ../kernel_traits.h for kMaskBlockN alone (sm90_block_list.cuh),
so their keys take that header's kMaskBlockN line instead of its whole text. A change to anything else the
sm90 kernels include (flashmask_params.h, mask_bounds.h, workspace.h, ...) rebuilds them.

EXTRA_NVCC_FLAGS (e.g. -DFLASHMASK_EXP_NO_DQ_ATOMICS, a timing-only knock-out) go to the non-sm90
sources only, EXTRA_SM90_NVCC_FLAGS to the sm90 ones; both into their keys.
"""

import hashlib
import importlib.util
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def load_op_sources(tree):
    path = os.path.join(tree, "paddle_flashmask", "_op_sources.py")
    spec = importlib.util.spec_from_file_location("_variant_op_sources", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # REPO_ROOT comes from the module's own path: the sources listed are TREE's.
    assert os.path.realpath(mod.REPO_ROOT) == os.path.realpath(tree), (mod.REPO_ROOT, tree)
    return mod


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def main(argv):
    if len(argv) not in (2, 3):
        print(__doc__)
        return 2
    tree, out_dir = os.path.realpath(argv[0]), os.path.realpath(argv[1])
    cache_root = os.path.realpath(argv[2]) if len(argv) == 3 else os.path.dirname(out_dir)
    if os.environ.get("PADDLE_FLASHMASK_CUDA_ARCHS") != "90a":
        sys.exit("variant_objects.py: set PADDLE_FLASHMASK_CUDA_ARCHS=90a (the harness is sm_90a only)")
    ops = load_op_sources(tree)
    # The harness's dispatch and its sm90 modes need the Hopper kernels (and the objects must
    # agree on FLASHMASK_WITH_SM90).
    if not ops.sm90_enabled():
        sys.exit("variant_objects.py: no sm90 build (CUTLASS headers missing?): "
                 "pip install --no-deps nvidia-cutlass==4.2.0.0")
    sources = ops.cuda_sources()
    sm90_dir = os.path.realpath(ops.SM90_DIR)
    # As _op_sources.compile_cuda_objects composes them (setup_ops.py cuda-objects).
    flags = ops.nvcc_flags() + ["-Xcompiler", "-fPIC"] + [f"-I{d}" for d in ops.cuda_include_dirs()]
    extra = shlex.split(os.environ.get("EXTRA_NVCC_FLAGS", ""))
    extra_sm90 = shlex.split(os.environ.get("EXTRA_SM90_NVCC_FLAGS", ""))
    nvcc = ops.nvcc_path()
    toolkit = subprocess.run([nvcc, "--version"], check=True, capture_output=True, text=True).stdout
    os.makedirs(out_dir, exist_ok=True)

    def is_sm90(src):
        return os.path.dirname(os.path.realpath(src)) == sm90_dir

    def src_flags(src):
        return flags + (extra_sm90 if is_sm90(src) else extra)

    def key_of(src):
        # nvcc -M: the files the source includes (preprocessing only, ~1 s).
        res = subprocess.run([nvcc, "-M", src, *src_flags(src)], capture_output=True, text=True, cwd=tree)
        if res.returncode != 0:
            raise RuntimeError(f"nvcc -M failed on {src}:\n{res.stdout}{res.stderr}")
        deps = set()
        for tok in res.stdout.replace("\\\n", " ").split(":", 1)[1].split():  # after "obj.o :"
            path = os.path.realpath(os.path.join(tree, tok))
            if path.startswith(tree + os.sep):
                deps.add(path)
        if os.path.realpath(src) not in deps:
            raise RuntimeError(f"nvcc -M on {src} did not list the source itself:\n{res.stdout}")
        h = hashlib.sha256()
        h.update(toolkit.encode())
        h.update(" ".join(f for f in src_flags(src) if not f.startswith("-I")).encode())
        h.update(os.path.relpath(src, tree).encode())
        for path in sorted(deps):
            rel = os.path.relpath(path, tree)
            with open(path, "rb") as f:
                data = f.read()
            if is_sm90(src) and rel == "custom_ops/flashmask/cuda/kernel_traits.h":
                data = b"\n".join(line for line in data.splitlines() if b"kMaskBlockN =" in line)
                if not data:
                    raise RuntimeError("kernel_traits.h has no 'kMaskBlockN =' line: the sm90 key "
                                       "exception in variant_objects.py needs a look")
            h.update(b"\0" + rel.encode() + b"\0" + sha256(data).encode())
        return h.hexdigest()

    def cached(obj_name, key):
        # This variant's own object first, then any other variant's.
        dirs = [out_dir] + sorted(os.path.join(cache_root, d) for d in os.listdir(cache_root)
                                  if os.path.isdir(os.path.join(cache_root, d)))
        for d in dirs:
            obj, key_file = os.path.join(d, obj_name), os.path.join(d, obj_name + ".key")
            if os.path.isfile(obj) and os.path.isfile(key_file):
                with open(key_file) as f:
                    if f.read().strip() == key:
                        return obj
        return None

    t0 = time.time()
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        keys = list(pool.map(key_of, sources))
    print(f"{len(sources)} sources, keys in {time.time() - t0:.0f} s", flush=True)

    def one(item):
        src, key = item
        name = os.path.basename(src) + ".o"
        obj, key_file = os.path.join(out_dir, name), os.path.join(out_dir, name + ".key")
        hit = cached(name, key)
        if hit == obj:
            return "kept"
        # Key file first removed, written last: an interrupted build leaves no false match.
        for path in (key_file, obj):
            if os.path.lexists(path):
                os.remove(path)
        if hit:
            try:
                os.link(hit, obj)
            except OSError:
                import shutil

                shutil.copyfile(hit, obj)
            how = "linked"
        else:
            t = time.time()
            tmp = obj + ".tmp.o"
            res = subprocess.run([nvcc, "-c", src, "-o", tmp, *src_flags(src)], capture_output=True, text=True,
                                 cwd=tree)
            if res.returncode != 0:
                raise RuntimeError(f"nvcc failed on {src}:\n{res.stdout}{res.stderr}")
            os.replace(tmp, obj)
            how = f"compiled ({time.time() - t:.0f} s)"
            print(f"  {name}: {how}", flush=True)
        with open(key_file, "w") as f:
            f.write(key + "\n")
        return how.split()[0]

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(one, zip(sources, keys)))
    # Objects of sources TREE no longer has would be linked by the harness's *.o glob.
    wanted = {os.path.basename(s) + ".o" for s in sources}
    for f in os.listdir(out_dir):
        if f.endswith(".o") and f not in wanted or f.endswith(".o.key") and f[:-4] not in wanted:
            os.remove(os.path.join(out_dir, f))
    counts = {k: results.count(k) for k in ("kept", "linked", "compiled")}
    print(f"{out_dir}: {counts['compiled']} compiled, {counts['linked']} linked from other variants, "
          f"{counts['kept']} kept; {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
