#!/usr/bin/env bash
# The -k fa2 GPU tests past the first call's timeout (node ids from a local --collect-only).
set -uo pipefail
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT"
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
source benchmarks/device/runtime_env.sh
mapfile -t NODES < .s49_nodes.txt; timeout 200 python3 -m pytest -q -p no:cacheprovider "${NODES[@]}" > "$OUT/gpu_tests_rest.log" 2>&1
echo "gpu tests rest exit $?"; tail -3 "$OUT/gpu_tests_rest.log"
stamp "tests done"
