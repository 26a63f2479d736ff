#!/usr/bin/env bash
# The PaddleFormers tests in their own environment: paddleformers 1.2.0 needs aistudio-sdk >= 0.3,
# with which paddlenlp 3.0.0b4 (requirements.txt) does not import, so it cannot share the main one.
# A venv over the main site-packages (Paddle and the op come from there) with PaddleFormers' own
# pins on top; PFM_REQUIRE_PADDLEFORMERS=1 turns a missing paddleformers into a failure, not a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${PFM_PADDLEFORMERS_VENV:-.venv-paddleformers}
[ -x "$VENV/bin/python" ] || python3 -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install -q paddleformers==1.2.0 aistudio-sdk==0.3.9 "numpy<=1.26.4" "pyarrow<22"
PFM_REQUIRE_PADDLEFORMERS=1 "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/test_paddleformers.py tests/test_paddleformers_finetune.py
