"""`.ci/run` runs exactly the README's test command (the line after "Tests (")."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ci_runs_the_readme_test_command():
    readme = open(os.path.join(ROOT, "README.md")).read().splitlines()
    start = next(i for i, line in enumerate(readme) if line.startswith("Tests ("))
    command = next(line.strip() for line in readme[start + 1:] if line.strip())
    assert command.startswith("python3 -m pip install") and "pytest -q tests &&" in command, command
    # PaddleFormers' tests in their own venv (it cannot share an environment with paddlenlp), then
    # the op's tests on Paddle 2.6 in another (it cannot share one with Paddle 3.x)
    assert command.endswith("bash tests/run_paddleformers_tests.sh && bash tests/run_paddle26_tests.sh"), command
    run = [line.strip() for line in open(os.path.join(ROOT, ".ci", "run")).read().splitlines()
           if line.strip() and not line.lstrip().startswith("#")]
    assert run[-1] == command
    # what the CUDA compile/SASS checks need on a clean CPU machine
    for package in ("nvidia-cutlass==", "nvidia-cuda-cuobjdump==", "nvidia-cuda-nvdisasm=="):
        assert package in command
