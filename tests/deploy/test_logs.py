"""Console vs RUN/logs routing (`deploy.logs`): the console rule, the actor runtime_env, and the
redirects of an actor process and of the driver (each in a fresh interpreter: they change
process-wide logging state)."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy import logs

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("name", "level", "shown"), [
    ("rollout_workers.worker", logging.WARNING, True),
    ("envs.alfworld_real.games", logging.WARNING, True),
    ("deploy", logging.ERROR, True),
    ("learner.worker", logging.INFO, False),
    ("ray", logging.WARNING, True),
    ("ray._private.worker", logging.INFO, False),
    ("vllm.model_executor.model_loader.reload.layerwise", logging.WARNING, False),  # ParallelLMHead
    ("vllm.entrypoints.llm", logging.INFO, False),
    ("torch.distributed", logging.WARNING, False),
    ("DeepSpeed", logging.INFO, False),
    ("transformers.modeling_utils", logging.ERROR, True),
    ("deployment_tools", logging.WARNING, False),  # a prefix of a project name is not the project
])
def test_record_rule(name, level, shown):
    assert logs.record_to_console(name, level) is shown


def test_warning_rule(tmp_path):
    assert logs.warning_to_console(str(ROOT / "deploy" / "runner.py"))
    assert logs.warning_to_console(str(ROOT / "rollout_workers" / "engines" / "vllm_engine.py"))
    site = ROOT / ".venv" / "lib" / "python3.11" / "site-packages" / "vllm" / "triton_utils" / "dispatcher.py"
    assert not logs.warning_to_console(str(site))
    assert not logs.warning_to_console(str(ROOT / "deploy.py"))  # not inside a package
    assert not logs.warning_to_console("/usr/lib/python3.11/warnings.py")
    assert not logs.warning_to_console("<frozen importlib._bootstrap>")
    (tmp_path / "envs").mkdir()
    assert logs.warning_to_console(str(tmp_path / "envs" / "x.py"), root=tmp_path)


def test_actor_runtime_env_only_when_routed(tmp_path, monkeypatch):
    from ray._private.ray_constants import WORKER_PROCESS_SETUP_HOOK_ENV_VAR

    base = {"env_vars": {"OMP_NUM_THREADS": "1"}}
    monkeypatch.setattr(logs, "_log_dir", None)
    assert logs.actor_runtime_env(base, "rollout_worker_0") == base

    monkeypatch.setattr(logs, "_log_dir", tmp_path / "logs")
    env = logs.actor_runtime_env(base, "rollout_worker_0")["env_vars"]
    assert env["OMP_NUM_THREADS"] == "1" and base == {"env_vars": {"OMP_NUM_THREADS": "1"}}
    assert env[logs.LOG_FILE_ENV] == str(tmp_path / "logs" / "rollout_worker_0.log")
    assert env[WORKER_PROCESS_SETUP_HOOK_ENV_VAR] == logs.HOOK
    module, func = logs.HOOK.rsplit(".", 1)
    assert module == logs.__name__ and callable(getattr(logs, func))

    # a job that brings its own worker setup hook keeps it; the actor then writes to the console
    monkeypatch.setenv(WORKER_PROCESS_SETUP_HOOK_ENV_VAR, "site.hook")
    assert logs.actor_runtime_env(base, "rollout_worker_0") == base


def _python(code: str, tmp_path: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env}, check=True)


ACTOR = f"""
import logging, os, sys, warnings
from deploy import logs
framework = logging.getLogger("vllm.fake")  # as vLLM does: its own handler on stdout, no propagation
framework.addHandler(logging.StreamHandler(sys.stdout)); framework.setLevel(logging.INFO); framework.propagate = False
print("before the redirect")
logs.actor_setup_hook()
print("print from the actor")
os.system("echo c-level output of a child process")
framework.info("vllm INFO line")
framework.warning("ParallelLMHead: Failed to load weights")
logging.getLogger("torch.distributed").warning("torch warning")
logging.getLogger("rollout_workers.worker").warning("project warning")
logging.getLogger("torch.distributed").error("framework error")
warnings.warn("dependency FutureWarning", FutureWarning)
warnings.warn_explicit("project UserWarning", UserWarning, {str(ROOT / "deploy" / "runner.py")!r}, 1)
sys.stdout.flush(); sys.stderr.flush()
"""


def test_actor_process_output_goes_to_its_file(tmp_path):
    log_file = tmp_path / "run" / "logs" / "rollout_worker_0.log"
    res = _python(ACTOR, tmp_path, **{logs.LOG_FILE_ENV: str(log_file)})
    console = res.stdout + res.stderr
    text = log_file.read_text()
    for line in ("print from the actor", "c-level output of a child process", "vllm INFO line",
                 "ParallelLMHead: Failed to load weights", "torch warning", "project warning",
                 "framework error", "dependency FutureWarning", "project UserWarning"):
        assert line in text, line
    assert "before the redirect" in console and "before the redirect" not in text
    for line in ("print from the actor", "c-level", "vllm INFO", "ParallelLMHead", "torch warning", "FutureWarning"):
        assert line not in console, line
    for line in ("WARNING rollout_workers.worker: project warning", "ERROR torch.distributed: framework error",
                 "UserWarning: project UserWarning"):
        assert line in console, line
    assert text.startswith("==== rollout_worker_0 pid=")


def test_actor_hook_without_a_log_file_changes_nothing(tmp_path):
    res = _python("from deploy import logs; logs.actor_setup_hook(); print('still here')", tmp_path)
    assert res.stdout == "still here\n"


DRIVER = """
import json, logging, sys, warnings
torch_log = logging.getLogger("torch.distributed")  # as torch does: its own stderr handler
torch_log.addHandler(logging.StreamHandler()); torch_log.propagate = False
from deploy import logs
log_dir = logs.route_logs(sys.argv[1], verbose=sys.argv[2] == "1")
print(json.dumps(str(log_dir) if log_dir else None))
ray_log = logging.getLogger("ray")
ray_log.addHandler(logging.StreamHandler()); ray_log.setLevel(logging.INFO); ray_log.propagate = False
logs.divert_framework_handlers()
logs.divert_framework_handlers()  # idempotent
ray_log.info("Started a local Ray instance.")
ray_log.warning("resources cannot be scheduled")
torch_log.warning("torch warning")
logging.getLogger("deploy.trainer").warning("project warning")
logging.getLogger("deploy.trainer").info("project info")
warnings.warn("dependency FutureWarning", FutureWarning)
"""


def _driver(tmp_path: Path, run: Path, verbose: bool) -> subprocess.CompletedProcess:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    return subprocess.run([sys.executable, str(script), str(run), "1" if verbose else "0"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_driver_framework_logs_go_to_driver_log(tmp_path):
    run = tmp_path / "run"
    res = _driver(tmp_path, run, verbose=False)
    assert json.loads(res.stdout.splitlines()[0]) == str(run.resolve() / "logs")
    text = (run / "logs" / "driver.log").read_text()
    for line in ("Started a local Ray instance.", "resources cannot be scheduled", "torch warning",
                 "project warning", "FutureWarning: dependency FutureWarning"):
        assert text.count(line) == 1, line
    console = res.stderr
    assert "resources cannot be scheduled" in console and "WARNING deploy.trainer: project warning" in console
    for line in ("Started a local Ray instance.", "torch warning", "project info", "FutureWarning"):
        assert line not in console, line


def test_verbose_driver_routes_nothing(tmp_path):
    res = _driver(tmp_path, tmp_path / "run", verbose=True)
    assert json.loads(res.stdout.splitlines()[0]) is None and not (tmp_path / "run").exists()
    for line in ("Started a local Ray instance.", "torch warning", "project warning", "FutureWarning"):
        assert line in res.stderr, line
