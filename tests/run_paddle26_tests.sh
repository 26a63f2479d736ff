#!/usr/bin/env bash
# The op's tests on Paddle 2.6 (CPU), which the project supports beside 3.x (and whose GPU build
# is the device runtime's). Paddle 2.6.2 cannot share the main environment (paddlepaddle 3.3.1),
# so it gets a venv of its own. The PaddleNLP/PaddleFormers tests skip there (their packages need
# Paddle 3), and the CUDA compile test, independent of the Paddle version, runs in the main suite.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${PFM_PADDLE26_VENV:-.venv-paddle26}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q paddlepaddle==2.6.2 "numpy<=1.26.4" pytest hypothesis matplotlib
"$VENV/bin/python" -c "import paddle; assert paddle.__version__ == '2.6.2', paddle.__version__"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests --ignore tests/test_cuda_compile.py
