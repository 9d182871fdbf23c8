"""Fixtures shared by the end-to-end training tests of deploy/."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.config_loading import load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    """A tiny model built by the CLI (`python -m deploy build-tiny-model`), shared by every
    end-to-end training test of the session; treat it as read-only."""
    out = tmp_path_factory.mktemp("model") / "base"
    res = subprocess.run([sys.executable, "-m", "deploy", "build-tiny-model", "--out", str(out), "--num-episodes", "20"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def warm_model(model, tmp_path_factory):
    """`model` after a short SFT by the CLI (`python -m deploy sft`) on the expert demonstrations of
    smoke_cpu_mixed.yaml's env: a policy that wins about half of its episodes there, so groups of
    rollouts hold both outcomes. Shared by the end-to-end tests that need successes; read-only."""
    from deploy.runner import WARM_POLICY_RECIPE

    out = tmp_path_factory.mktemp("model") / "warm"
    config = ROOT / "deploy" / "configs" / "smoke_cpu_mixed.yaml"
    # the recipe a UniSkill run without candidates prints, on this session's tiny model
    args = WARM_POLICY_RECIPE.replace("runs/tiny/base", str(model)).replace("runs/tiny/mixed", str(out)).split()
    assert args[:3] == ["python", "-m", "deploy"] and str(config.relative_to(ROOT)) in args
    res = subprocess.run([sys.executable, *args[1:]], cwd=ROOT, capture_output=True, text=True, timeout=3600,
                         check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    sft = load_config(config).sft
    summary = json.loads((out / "sft_summary.json").read_text())
    assert summary["optimizer_steps"] == sft.epochs * -(-summary["rows"] // sft.batch_rows), summary  # every epoch ran
    return out
