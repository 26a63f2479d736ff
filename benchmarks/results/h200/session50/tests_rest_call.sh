#!/usr/bin/env bash
# The `fa2` GPU tests past call B's time limit (node ids from a local --collect-only, after its 881).
set -uo pipefail
OUT=${OUT:-/tmp/pfm_out}; mkdir -p "$OUT"
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
source benchmarks/device/runtime_env.sh
mapfile -t NODES < .s50_nodes.txt  # xz -dc rest_nodes.txt.xz > .s50_nodes.txt (gpu_tests/)
timeout 400 python3 -m pytest -q -p no:cacheprovider "${NODES[@]}" > "$OUT/gpu_tests_rest.log" 2>&1
stamp "gpu tests rest exit $?: $(tail -1 "$OUT/gpu_tests_rest.log")"
