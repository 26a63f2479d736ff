# Sourced by a device call's script (benchmarks/results/<chip>/<session>/.../call.sh): the preamble
# every such script had written out (the repo root, $OUT and its logs/, the call's clock), unpacking
# harness variants, a compute-sanitizer run summed up in one line, and packing the logs at the end.
#   source benchmarks/device/call_lib.sh   (from the repo root; call_begin cds there anyway)
#   call_begin; unpack_harness base new; sanitize memcheck flashmask 90 check .gpu_variants/new/flashmask_harness --check-fa2
#   ...; pack_logs
# $OUT (default /tmp/pfm_out) comes back from the device; $OUT/summary.txt gets every stamp.
CALL_LIB_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# The repo root, $OUT/logs, the call's clock.
call_begin() {
  cd "$CALL_LIB_ROOT" || { echo "FATAL: cd to the repo root"; exit 1; }
  OUT=${OUT:-/tmp/pfm_out}
  mkdir -p "$OUT/logs"
  T0=$(date +%s)
}

# stamp MESSAGE: "[seconds since call_begin] MESSAGE" to stdout and $OUT/summary.txt.
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/summary.txt"; }

# Seconds left of LIMIT (default the call's 575) since call_begin.
seconds_left() { echo $(( ${1:-${CALL_LIMIT_S:-575}} - ($(date +%s) - T0) )); }

# unpack_harness VARIANT...: .gpu_variants/VARIANT/flashmask_harness from its .xz (carried packed:
# the carry limit is 64 MiB), executable; a FATAL line and exit 1 where one is missing.
unpack_harness() {
  local v bin
  for v in "$@"; do
    bin=.gpu_variants/$v/flashmask_harness
    if [ -f "$bin.xz" ]; then xz -dkf "$bin.xz"; fi
    [ -f "$bin" ] || { stamp "FATAL: $bin missing (harness/build_variant.sh $v)"; exit 1; }
    chmod +x "$bin"
  done
}

# last_match REGEX FILE: the file's last line matching REGEX (empty if none).
last_match() { grep -E "$1" "$2" 2>/dev/null | tail -1; }

# check_run NAME SECONDS BINARY ARGS...: a harness check list, its log in $OUT/logs/NAME.log, one
# stamped line (exit status, the harness's "N failures" line) and its first failing lines.
check_run() {
  local name=$1 t=$2; shift 2
  timeout -k 10 "$t" "$@" > "$OUT/logs/$name.log" 2>&1
  stamp "$name exit $? | $(last_match '^[0-9]+ failures' "$OUT/logs/$name.log")"
  grep -E " FAIL$|NOT-IDENTICAL|error|what\(\)" "$OUT/logs/$name.log" | head -5 | tee -a "$OUT/summary.txt"
}

# sanitize TOOL KERNELS SECONDS NAME BINARY ARGS...: compute-sanitizer's TOOL over the kernels whose
# names contain KERNELS, its log in $OUT/logs/NAME.log, one stamped line (exit status, the tool's
# summary, the harness's failures line, how many checks passed before any time limit).
sanitize() {
  local tool=$1 kernels=$2 t=$3 name=$4; shift 4
  timeout -k 10 "$t" compute-sanitizer --tool "$tool" --kernel-name "kns=$kernels" --error-exitcode 9 "$@" \
    > "$OUT/logs/$name.log" 2>&1
  stamp "$name ($tool) exit $?: $(last_match 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/logs/$name.log") |" \
        "$(last_match '^[0-9]+ failures' "$OUT/logs/$name.log") | ok lines $(grep -c ' ok$' "$OUT/logs/$name.log")"
}

# pack_logs [DIR...]: $OUT/logs and the DIRs of $OUT into $OUT/logs.tar.xz (fewer files come back),
# then removed.
pack_logs() {
  local dirs=(logs "$@")
  tar -C "$OUT" -cJf "$OUT/logs.tar.xz" "${dirs[@]}" && (cd "$OUT" && rm -rf "${dirs[@]}")
  stamp "logs packed"
}
