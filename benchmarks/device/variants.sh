# Sourced by the device scripts that run harness variants (fa2_steps.sh, masks_ab.sh, ab_sm90.sh).
# A variant is a directory of .gpu_variants (harness/build_variant.sh) holding its binary, or
# `binary_of` (the variant whose binary it runs) and `env` (KEY=VALUE lines exported for its runs):
# one build, several settings.
# The binary a variant runs.
harness_of() {
  local of=$1
  [ -f ".gpu_variants/$1/binary_of" ] && of=$(tr -d '[:space:]' < ".gpu_variants/$1/binary_of")
  echo ".gpu_variants/$of/flashmask_harness"
}
# run_variant VARIANT SECONDS ARGS...: its binary with its env file's settings, under a timeout.
run_variant() {
  local v=$1 t=$2; shift 2
  ( if [ -f ".gpu_variants/$v/env" ]; then set -a; source ".gpu_variants/$v/env"; set +a; fi
    exec timeout -k 10 "$t" "$(harness_of "$v")" "$@" )
}
# Each variant's binary is there and executable, else a FATAL line and exit 1.
check_variants() {
  local v bin
  for v in "$@"; do
    bin=$(harness_of "$v")
    [ -f "$bin" ] || { echo "FATAL: $bin missing (variant $v)"; exit 1; }
    chmod +x "$bin" 2>/dev/null
  done
}
