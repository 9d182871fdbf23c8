"""Environments from outside the core train through the plugin path (`env.plugin`), end to end on
local Ray with the HF engine:

- ScienceWorld (plugins/scienceworld_env, installed by `make install`): smoke_cpu_scienceworld_smrc_sd.yaml
  (smoke_cpu_scienceworld.yaml's GRPO run with SMRC-SD on the generic observation-text tracker), 2
  steps on ScienceWorld's own train variations with its task score logged;
- KeyRoom (examples/custom_env), a user's package installed with `pip install -e` into a throwaway
  virtual environment layered on the project's .venv (the shared .venv never sees it): its config
  trains 2 steps with GRPO's loss, SMRC-SD (history matcher, generic tracker) and UniSkill."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.deploy.shared_runs import CONFIGS, ENV, shared_run, train_cmd

ROOT = Path(__file__).resolve().parents[2]
KEYROOM = ROOT / "examples" / "custom_env"

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.ray]


def _steps(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _trajectories(run: Path) -> list[dict]:
    return [json.loads(line) for f in sorted((run / "trajectories").glob("step_*.jsonl"))
            for line in f.read_text().splitlines()]


def _check_trained(run: Path, env: str, steps: int = 2) -> tuple[list[dict], list[dict]]:
    metrics, trajs = _steps(run), _trajectories(run)
    cfg = json.loads((run / "config.resolved.json").read_text())
    assert cfg["env"]["name"] == env and cfg["env"]["plugin"]
    assert [m["policy_version"] for m in metrics] == list(range(1, steps + 1))
    per_step = cfg["rollout"]["group_size"] * cfg["rollout"]["tasks_per_step"]
    assert [m["episodes"] for m in metrics] == [per_step] * steps and len(trajs) == per_step * steps
    assert all(m["episodes_env_error"] == m["episodes_prompt_too_long"] == 0 for m in metrics)
    assert {t["task"]["env"] for t in trajs} == {env} and {t["task"]["split"] for t in trajs} == {"train"}
    return metrics, trajs


def test_scienceworld_trains_through_the_plugin_path(model, tmp_path_factory):
    """smoke_cpu_scienceworld_smrc_sd.yaml: smoke_cpu_scienceworld.yaml's GRPO run plus SMRC-SD (the GRPO
    config alone is validated with every shipped config; one run keeps the suite's budget)."""
    from envs.config import EnvConfig
    from envs.tasks import task_list

    run = shared_run(tmp_path_factory, CONFIGS / "smoke_cpu_scienceworld_smrc_sd.yaml", f"model.path={model}",
                     "run.save_trajectories=true",
                     "eval.at_end=false")
    metrics, trajs = _check_trained(run, "scienceworld")
    cfg = json.loads((run / "config.resolved.json").read_text())
    train_ids = {t.task_id for t in task_list(EnvConfig.model_validate(cfg["env"]), "train")}
    assert {t["task"]["task_id"] for t in trajs} <= train_ids  # ScienceWorld's own train variations
    assert all(0.0 <= m["scienceworld_task_score"] <= 1.0 for m in metrics)  # its 0-100 score, as a fraction
    for t in trajs:
        assert t["turns"][0]["observation"].startswith("Your task is to")
        assert all(0 < len(turn["admissible_actions"]) <= 12 for turn in t["turns"])
    # SMRC-SD on the generic tracker (the tiny model wins no ScienceWorld task, so nothing is routed here;
    # KeyRoom's run below routes turns)
    assert cfg["method"]["name"] == "smrc_sd" and cfg["method"]["matcher"] == "history"
    assert all("sd/match_rate" in m and "loss/sd" in m for m in metrics)


@pytest.fixture(scope="module")
def keyroom_python(tmp_path_factory) -> Path:
    """A Python that sees the project's .venv and, installed there with `pip install -e`, the KeyRoom
    package: a throwaway virtual environment whose site-packages adds .venv's (so nothing of the
    project is copied and the shared .venv is untouched)."""
    venv = tmp_path_factory.mktemp("keyroom") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "agentrl_venv.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    res = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e",
                          str(KEYROOM)], capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    return python


def test_the_example_is_not_on_the_project_path_until_installed(keyroom_python):
    probe = "import importlib.util as u; print(u.find_spec('keyroom_env') is not None)"
    outside = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    inside = subprocess.run([str(keyroom_python), "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert (outside.stdout.strip(), inside.stdout.strip()) == ("False", "True")
    # installed, the package's entry point registers its name too (`env.name: keyroom`)
    probe = "from envs.config import EnvConfig; print(EnvConfig(name='keyroom').max_steps)"
    by_name = subprocess.run([str(keyroom_python), "-c", probe], cwd=ROOT, capture_output=True, text=True,
                             check=False)
    assert by_name.stdout.strip() == "4", by_name.stderr


def test_a_users_environment_trains_with_grpo_smrc_sd_and_uniskill(keyroom_python, model, tmp_path_factory):
    run = tmp_path_factory.mktemp("keyroom-run") / "run"
    cmd = train_cmd(KEYROOM / "config.yaml", f"model.path={model}", f"run.output_dir={run}",
                    "run.save_trajectories=true", "eval.at_end=false")
    res = subprocess.run([str(keyroom_python), *cmd[1:]], cwd=ROOT, env={**ENV, "PYTHONNOUSERSITE": "1"},
                         capture_output=True, text=True, timeout=900, check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    metrics, trajs = _check_trained(run, "keyroom")
    assert 0 < sum(t["success"] for t in trajs) < len(trajs)  # both outcomes: references and candidates exist
    assert all(m["sd/match_rate"] > 0 for m in metrics)  # SMRC-SD routed turns on the history matcher
    assert sum(m["uniskill/candidates"] for m in metrics) > 0
    assert all(m["uniskill/proposals"] == m["uniskill/candidates"] for m in metrics)
    assert "uniskill/critic_pass_rate" in metrics[-1]
