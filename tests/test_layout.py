"""The op package knows no integration: paddle_flashmask imports neither PaddleNLP,
PaddleFormers nor paddlenlp_patches (the runner and the model patches live there)."""

import ast
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INTEGRATIONS = ("paddlenlp", "paddleformers", "paddlenlp_patches")


def test_no_integration_import_in_the_op_package():
    offenders = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, "paddle_flashmask")):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            tree = ast.parse(open(path, encoding="utf-8").read(), path)
            for node in ast.walk(tree):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
                offenders += [f"{os.path.relpath(path, ROOT)}: {m}" for m in mods if m.split(".")[0] in INTEGRATIONS]
    assert not offenders, offenders


def test_importing_the_op_package_loads_no_integration():
    code = ("import sys, paddle_flashmask, paddle_flashmask.distributed, paddle_flashmask.masks; "
            f"print([m for m in sys.modules if m.split('.')[0] in {INTEGRATIONS!r}])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
