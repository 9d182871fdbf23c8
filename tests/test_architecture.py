"""Architecture rules of docs/architecture.md, enforced in CI: the layer direction (import-linter),
empty package __init__ files, and contracts that import only stdlib + pydantic (+ numpy, whose arrays
carry token ids and log-probs)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["envs", "routing", "rollout_workers", "learner", "skillbank_service", "deploy", "weightsync"]


def test_layers_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    res = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "KEPT" in res.stdout


@pytest.mark.parametrize("package", PACKAGES)
def test_init_files_are_empty(package):
    assert (ROOT / package / "__init__.py").read_text().strip() == ""


@pytest.mark.parametrize("path", sorted(ROOT.glob("*/types.py")), ids=lambda p: p.parent.name)
def test_contract_modules_import_only_stdlib_and_pydantic(path):
    allowed_roots = {"__future__", "typing", "dataclasses", "pydantic", "numpy", "collections", "enum", *PACKAGES}
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            node.body = []  # annotation-only imports are fine
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            root = name.split(".")[0]
            assert root in allowed_roots, f"{path}: imports {name}"
            if root in PACKAGES:
                assert name == f"{root}.types", f"{path}: a contract may import only other contracts, not {name}"
