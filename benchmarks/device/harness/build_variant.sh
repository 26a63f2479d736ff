#!/usr/bin/env bash
# One harness binary per version of the op's CUDA code, so that a single device call times several
# versions of the FA2-class kernels (benchmarks/device/fa2_steps.sh runs them all, interleaved):
#   bash benchmarks/device/harness/build_variant.sh NAME [GIT_REV]
#     -> .gpu_variants/NAME/flashmask_harness   (the only file there; it travels to the device)
# The op's CUDA sources (setup_ops.py cuda-objects's list and sm_90a flags, read from the built
# tree's own paddle_flashmask/_op_sources.py) come from GIT_REV, checked out in a temporary
# worktree, or from the working tree when GIT_REV is left out. Objects go to
# .gpu_variants_objs/NAME/ (kept): each carries a key (toolkit, flags, content of what it includes),
# and one whose key matches any variant's object is linked rather than compiled, so a step that
# changes the forward only recompiles the forward files, and the sm90 objects (~5 of the ~6 min of
# a full build on 2 cores) are compiled again only when what they include changes (their key
# ignores kernel_traits.h but for kMaskBlockN; flashmask_params.h counts: variant_objects.py).
# Build one variant at a time (they share .gpu_variants_objs).
# The harness (new modes) and the CPU reference are the working tree's, linked as build.sh does;
# where GIT_REV's API headers (custom_ops/flashmask/*.h) differ from the working tree's, the
# working tree's harness is compiled against GIT_REV's headers and CPU sources instead (the
# structs must match the objects'), and the script says so.
#   EXTRA_NVCC_FLAGS="-DFLASHMASK_EXP_NO_DQ_ATOMICS"  added to the non-sm90 sources (knock-outs)
#   EXTRA_SM90_NVCC_FLAGS="-DFLASHMASK_EXP_..."        added to the sm90 sources
# Examples: build_variant.sh base 7a95a4e; build_variant.sh fwd1 <commit>; build_variant.sh wip
# Then: the device call in benchmarks/device/fa2_steps.sh (carry [".gpu_variants"], <= 64 MiB:
# ~8 MB a variant; remove old ones with rm -r .gpu_variants/NAME).
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$PWD
T0=$(date +%s)
NAME=${1:?usage: build_variant.sh NAME [GIT_REV]}
REV=${2:-}
[[ "$NAME" =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "build_variant.sh: NAME must be [A-Za-z0-9_.-]+" >&2; exit 2; }
export PADDLE_FLASHMASK_CUDA_ARCHS=90a

if [ -n "$REV" ]; then
  COMMIT=$(git rev-parse --verify "$REV^{commit}")
  TREE=/tmp/variant_src_$NAME
  git worktree remove --force "$TREE" 2>/dev/null || true
  rm -rf "$TREE"
  git worktree prune
  git worktree add --detach "$TREE" "$COMMIT" >/dev/null
  trap 'git -C "$ROOT" worktree remove --force "$TREE" 2>/dev/null || true' EXIT
  DESC="$NAME: $(git log -1 --format='%h %s' "$COMMIT" | cut -c1-72)"
else
  TREE=$ROOT
  CHANGED=$(git status --porcelain -- custom_ops | wc -l)
  DESC="$NAME: working tree at $(git rev-parse --short HEAD), $CHANGED changed file(s) under custom_ops"
fi
DESC=$(printf %s "$DESC" | tr -cd "A-Za-z0-9 _.,:/()+=-")  # goes into a -D string
echo "building $DESC"

python3 benchmarks/device/harness/variant_objects.py "$TREE" ".gpu_variants_objs/$NAME" .gpu_variants_objs

# The harness and the CPU reference use the API structs: they must be compiled against the same
# headers as the objects.
HARNESS_SRC=benchmarks/device/harness/flashmask_harness.cu
CPU_DIR=custom_ops/flashmask/cpu
if ! diff -q <(cd "$TREE" && sha256sum custom_ops/flashmask/*.h) <(sha256sum custom_ops/flashmask/*.h) >/dev/null; then
  echo "NOTE: $REV's custom_ops/flashmask/*.h differ from the working tree's: the harness is compiled" \
       "against $REV's headers, with $REV's CPU reference sources"
  cp "$HARNESS_SRC" "$TREE/benchmarks/device/harness/flashmask_harness_variant.cu"
  HARNESS_SRC=$TREE/benchmarks/device/harness/flashmask_harness_variant.cu
  CPU_DIR=$TREE/custom_ops/flashmask/cpu
fi
CPU="$CPU_DIR/mask_prep_cpu.cc $CPU_DIR/flashmask_fwd_cpu.cc $CPU_DIR/flashmask_bwd_cpu.cc"
mkdir -p ".gpu_variants/$NAME"
BIN=.gpu_variants/$NAME/flashmask_harness
rm -f "$BIN"
# As build.sh links it, plus the variant's name (first output line).
nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fopenmp,-march=x86-64-v3 \
  "-DFLASHMASK_HARNESS_VARIANT=\"$DESC\"" \
  -o "$BIN.tmp" "$HARNESS_SRC" $CPU ".gpu_variants_objs/$NAME"/*.o -lpthread
mv "$BIN.tmp" "$BIN"
# (grep -c, not -q: an early exit would fail the pipe under pipefail)
strings "$BIN" | grep -c -- "--time-fa2" >/dev/null || { echo "build_variant.sh: $BIN lacks --time-fa2" >&2; exit 1; }
MIB=$(du -sm .gpu_variants | cut -f1)
echo "built $BIN ($(du -h "$BIN" | cut -f1)) in $(( $(date +%s) - T0 )) s;" \
     ".gpu_variants holds $MIB MiB (carry limit 64):"
ls .gpu_variants
# fa2_steps.sh takes at most 6 variants; the device call carries 64 MiB at most.
(( MIB <= 62 )) || { echo "build_variant.sh: .gpu_variants is over the carry limit: rm -r .gpu_variants/OLD" >&2
                     exit 1; }
