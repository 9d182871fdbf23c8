"""ScienceWorld through the public interface only (plugins/scienceworld_env): the package imports
nothing of the core but `envs.api`; tasks are ScienceWorld's own train/dev/test variations, actions
its valid-action list, the score its 0-100 score (success at 100); a missing Java is one clear
error; and ScienceWorld's gold action sequences, replayed through the wrapper, win every task
(`python -m deploy env replay --env scienceworld --gold --tasks N`: here 5 tasks over 5 types,
about 15 s; the 30-task record is bench/scienceworld_gold.py's, docs/results.md)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

ROOT = Path(__file__).resolve().parents[2]
SPEC = "scienceworld_env.plugin:ScienceWorldPlugin"
CORE = {"envs", "routing", "rollout_workers", "learner", "skillbank_service", "deploy", "weightsync"}
OUTSIDE_PACKAGES = [ROOT / "plugins" / "scienceworld_env" / "scienceworld_env",
                    ROOT / "examples" / "custom_env" / "keyroom_env"]


@pytest.fixture(autouse=True)
def _own_plugin_env(monkeypatch):
    """Plugins a test registers by spec are passed on through the environment: keep that to the test."""
    from envs.registry import PLUGINS_ENV

    monkeypatch.setenv(PLUGINS_ENV, "")


def _core_imports(package: Path) -> set[str]:
    found = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            found |= {n for n in names if n.split(".")[0] in CORE}
    return found


@pytest.mark.parametrize("package", OUTSIDE_PACKAGES, ids=lambda p: p.name)
def test_outside_packages_import_only_the_public_interface(package):
    assert _core_imports(package) == {"envs.api"}


def test_a_missing_java_is_one_clear_error(monkeypatch, tmp_path):
    from scienceworld_env import simulator

    monkeypatch.setenv("PATH", str(tmp_path))  # no java on it
    with pytest.raises(RuntimeError, match="`java` is not on the PATH: install a Java 17 runtime .*default-jre-headless"):
        simulator.require_java()
    with pytest.raises(ValidationError, match="ScienceWorld needs Java.*default-jre-headless"):
        from envs.config import EnvConfig

        EnvConfig(plugin=SPEC)


def test_unknown_options_and_tasks_are_refused():
    from envs.config import EnvConfig

    with pytest.raises(ValidationError, match="env.options for scienceworld: .*simplification"):
        EnvConfig(plugin=SPEC, options={"simplification": "easy"})
    with pytest.raises(ValidationError, match=r"unknown ScienceWorld tasks \['boil-eggs'\]; known: boil, "):
        EnvConfig(plugin=SPEC, options={"task_names": ["boil-eggs"]})


@pytest.mark.slow
def test_tasks_actions_and_score_come_from_scienceworld():
    from envs.config import EnvConfig
    from envs.pool import EnvPool
    from envs.registry import get_plugin
    from envs.tasks import task_list

    cfg = EnvConfig(plugin=SPEC, options={"task_names": ["find-living-thing"], "max_admissible": 6}, max_steps=2)
    splits = {s: task_list(cfg, s) for s in ("train", "valid_seen", "valid_unseen")}
    ids = {s: {t.task_id for t in tasks} for s, tasks in splits.items()}
    assert all(ids.values()) and not (ids["train"] & ids["valid_seen"] or ids["train"] & ids["valid_unseen"]
                                      or ids["valid_seen"] & ids["valid_unseen"])  # ScienceWorld's own splits
    train = splits["train"]
    assert [t.seed for t in train] == list(range(len(train))) and {t.task_type for t in train} == {"find-living-thing"}
    pool = EnvPool(cfg, 1)
    try:
        (first,) = pool.reset([0], [train[0]])
        assert first.observation.startswith("Your task is to find a(n) living thing")
        assert get_plugin("scienceworld").instruction(first.observation).startswith("Your task is to find")
        assert len(first.admissible_actions) == 6 and list(first.admissible_actions) == sorted(first.admissible_actions)
        (second,) = pool.step([0], ["look around"])
        assert not second.won and second.info["score"] >= 0 and not second.done
        (third,) = pool.step([0], ["look around"])
        assert third.done and third.truncated and not third.won  # env.max_steps=2
    finally:
        for env in pool._envs:  # stop the JVM now rather than at exit
            env.close()


@pytest.mark.slow
def test_gold_replay_wins_every_task():
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    res = subprocess.run([sys.executable, "-m", "deploy", "env", "replay", "--env", "scienceworld", "--gold",
                          "--tasks", "5"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    lines = res.stdout.strip().splitlines()
    assert lines[-2:] == ["5 tasks over 5 task types", "scienceworld gold replay: 5/5 won"], res.stdout + res.stderr
    assert res.returncode == 0
