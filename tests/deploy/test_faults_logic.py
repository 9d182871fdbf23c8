"""The fault machinery without a training run: when the injector fires and what it records, the
`faults/*` bookkeeping, metrics.jsonl rewinding, the driver's reaper on a real process tree, and
the timeouts that turn a hang into an error (actor calls on a local Ray, torch collectives)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.config_loading import load_config
from deploy.faults import FaultInjector, FaultLog, FaultRecord, survived_line
from deploy.recovery import Recovery
from deploy.trainer import rewind_metrics


def _cfg(tmp_path: Path, *sets: str):
    return load_config(None, [f"run.output_dir={tmp_path}", "run.total_steps=3", *sets])


class _Cluster:
    """What the injector touches on a cluster, without Ray."""

    def __init__(self):
        self.on_submit = None
        self.recoveries: list[Recovery] = []

    def drain_recoveries(self):
        out, self.recoveries = self.recoveries, []
        return out


def _injector(tmp_path: Path, *sets: str) -> tuple[FaultInjector, _Cluster, list]:
    inj = FaultInjector(_cfg(tmp_path, "faults.enabled=true", *sets))
    cluster, killed = _Cluster(), []
    inj.bind(cluster, bank=lambda: None, checkpoint=lambda: killed.append("checkpoint") or tmp_path,
             has_checkpoint=lambda step: False)
    component = inj.component
    setattr(inj, f"_kill_{component}", lambda step: killed.append((component, step)))
    return inj, cluster, killed


def test_injection_off_does_nothing_and_logs_only_real_failures(tmp_path):
    inj = FaultInjector(_cfg(tmp_path))
    cluster = _Cluster()
    inj.bind(cluster, bank=lambda: None, checkpoint=lambda: tmp_path, has_checkpoint=lambda step: False)
    assert cluster.on_submit is None
    for stage in ("retrieve", "rollout", "learn"):
        inj.stage(stage, 1)
    assert not inj.fired and inj.step_metrics(1) == {}
    cluster.recoveries.append(Recovery("rollout_worker", "rollout_worker_0", 2.5, {"lost_calls": 1.0}))
    assert inj.step_metrics(2) == {"faults/restarts": 1.0, "faults/recovery_s": 2.5, "faults/lost_calls": 1.0}
    assert inj.finish(3, 3) is None and not (tmp_path / "faults.json").exists()


def test_a_mid_call_fault_fires_once_while_its_call_is_in_flight(tmp_path, monkeypatch):
    monkeypatch.setattr("deploy.faults.KILL_DELAY_S", 0.0)
    inj, cluster, killed = _injector(tmp_path, "faults.kill=learner", "faults.at_step=2")
    assert cluster.on_submit == inj.in_flight
    inj.stage("learn", 1)
    cluster.on_submit("train")
    assert killed == []  # before at_step
    inj.stage("rollout", 2)
    cluster.on_submit("collect")
    inj.stage("learn", 2)
    assert killed == []  # armed, not fired: the update is not running yet
    cluster.on_submit("train")
    assert killed == [("learner", 2)]
    inj.stage("learn", 2)  # a replay of the step after a restart
    cluster.on_submit("train")
    assert killed == [("learner", 2)]
    record = json.loads((tmp_path / "faults.json").read_text())
    assert (record["component"], record["at_step"], record["fired_step"]) == ("learner", 2, 2)
    cluster.recoveries.append(Recovery("learner", "learner group", 12.0, {"replayed_steps": 1.0}))
    assert inj.step_metrics(2)["faults/killed"] == 1.0
    assert inj.finish(3, 3) == "faults survived: learner at step 2, restarts 1, steps completed 3/3"


def test_a_stage_fault_fires_at_its_stage_and_needs_a_skill_bank(tmp_path):
    inj, cluster, killed = _injector(tmp_path, "faults.kill=skillbank_actor", "faults.at_step=1")
    inj.stage("sample", 1)
    assert killed == []
    inj.stage("retrieve", 1)
    assert killed == [("skillbank_actor", 1)]
    real = FaultInjector(_cfg(tmp_path / "b", "faults.enabled=true", "faults.kill=skillbank_redis"))
    real.bind(cluster, bank=lambda: None, checkpoint=lambda: tmp_path, has_checkpoint=lambda step: False)
    with pytest.raises(ValueError, match="uniskill.enabled"):
        real.stage("retrieve", 1)


def test_a_driver_fault_checkpoints_first_and_its_resume_counts_the_restart(tmp_path, monkeypatch):
    monkeypatch.setattr("deploy.faults.KILL_DELAY_S", 0.0)
    inj, cluster, killed = _injector(tmp_path, "faults.kill=driver", "faults.at_step=2")
    inj.stage("rollout", 2)
    assert killed == ["checkpoint"]  # the resumed run continues from here
    cluster.on_submit("collect")
    assert killed == ["checkpoint", ("driver", 2)]
    resumed, cluster2, killed2 = _injector(tmp_path, "faults.kill=driver", "faults.at_step=2")
    assert resumed.fired
    resumed.stage("rollout", 2)
    cluster2.on_submit("collect")
    assert killed2 == []  # a fault fires once per run directory
    metrics = resumed.step_metrics(2)
    assert metrics["faults/restarts"] == 1.0 and metrics["faults/resumed_at_step"] == 2.0
    assert metrics["faults/recovery_s"] >= 0
    assert resumed.finish(3, 3) == "faults survived: driver at step 2, restarts 1, steps completed 3/3"


def test_a_fault_after_the_last_step_is_refused(tmp_path):
    with pytest.raises(ValueError, match="never fire"):
        FaultInjector(_cfg(tmp_path, "faults.enabled=true", "faults.kill=env_pool", "faults.at_step=4"))


def test_fault_log_counts_per_step_and_in_total():
    log = FaultLog(always=True)
    log.killed(1)
    log.add(1, [Recovery("env_pool", "env_pool_0", 1.5)])
    log.add(3, [Recovery("learner", "g", 4.0, {"replayed_steps": 2.0}), Recovery("learner", "g", 6.0)])
    assert log.metrics(1) == {"faults/restarts": 1.0, "faults/killed": 1.0, "faults/recovery_s": 1.5}
    assert log.metrics(2) == {"faults/restarts": 0.0}
    assert log.metrics(3) == {"faults/restarts": 2.0, "faults/recovery_s": 10.0, "faults/replayed_steps": 2.0}
    assert log.metrics(3) == {"faults/restarts": 0.0}  # logged once
    assert log.restarts == 3
    assert FaultLog().metrics(1) == {}


def test_fault_record_round_trips_and_renders_the_last_line(tmp_path):
    rec = FaultRecord("rollout_worker", 1, 1, 123.0, restarts=1, steps_completed=2, total_steps=2)
    rec.save(tmp_path)
    assert FaultRecord.load(tmp_path) == rec
    assert rec.line() == survived_line("rollout_worker", 1, 1, 2, 2) == \
        "faults survived: rollout_worker at step 1, restarts 1, steps completed 2/2"
    assert FaultRecord.load(tmp_path / "none") is None


def test_rewind_drops_the_steps_to_be_replayed(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in (1, 2, 3)))
    assert rewind_metrics(path, 1) == 2
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1]
    assert rewind_metrics(path, 5) == 0
    assert rewind_metrics(tmp_path / "absent.jsonl", 0) == 0


# ---- the driver's reaper ------------------------------------------------------------------------
_TREE = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    from deploy.reaper import _alive as alive

    return alive(pid)


def test_reaper_kills_the_dead_drivers_descendants_and_marked_processes(tmp_path):
    """A stand-in driver starts the reaper, a child that detaches into its own session, and a
    grandchild; SIGKILL of the driver leaves none of them running."""
    driver_src = f"""
import subprocess, sys, time
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from deploy.reaper import start_reaper
token = start_reaper()
tree = subprocess.Popen([sys.executable, "-c", {_TREE!r}], stdout=subprocess.PIPE, text=True)
print(token, tree.pid, tree.stdout.readline().strip(), flush=True)
time.sleep(300)
"""
    driver = subprocess.Popen([sys.executable, "-c", driver_src], stdout=subprocess.PIPE, text=True)
    try:
        token, tree, grandchild = driver.stdout.readline().split()
        pids = [int(tree), int(grandchild)]
        assert all(_alive(p) for p in pids)
        time.sleep(2.5)  # two descendant snapshots
        driver.kill()
        driver.wait(timeout=10)
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in pids), "a process of the killed driver outlived it"
        from deploy.reaper import marked

        assert marked(token) == []
    finally:
        driver.kill()


def test_reaper_recognises_marked_processes_only(tmp_path):
    from deploy.reaper import TOKEN_VAR, marked, reap

    env = {**os.environ, TOKEN_VAR: "tok-test"}
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.3)
        assert marked("tok-test") == [mine.pid]
        assert reap("tok-test", grace_s=2.0) == [mine.pid]
        assert mine.wait(timeout=5) is not None and other.poll() is None
    finally:
        mine.kill()
        other.kill()


# ---- timeouts ----------------------------------------------------------------------------------
@pytest.mark.parametrize("rendezvous", ["file", "tcp"])
def test_a_collective_whose_peer_never_joins_errors_out_within_its_timeout(tmp_path, rendezvous):
    """Rank 0 of a 2-rank group whose rank 1 never comes: init_process_group raises after the
    configured timeout instead of waiting forever, on one node (FileStore) and across nodes (a
    TCPStore served by rank 0)."""
    from deploy.topology import free_tcp_port

    where = str(tmp_path / "store") if rendezvous == "file" else f"tcp://127.0.0.1:{free_tcp_port('127.0.0.1')}"
    code = f"""
import time
from learner.backends import init_process_group_on_node
start = time.monotonic()
try:
    init_process_group_on_node({where!r}, rank=0, world_size=2, backend="gloo", timeout_s=3)
except Exception as err:
    print("raised", type(err).__name__, round(time.monotonic() - start, 1))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2], check=False)
    words = res.stdout.split()
    assert words[:1] == ["raised"], res.stdout + res.stderr[-2000:]
    assert float(words[2]) < 30


@pytest.mark.ray
@pytest.mark.slow
def test_actor_calls_end_in_an_error_not_a_hang():
    """On a local Ray: a call that never answers raises CallTimeout naming it and the config key;
    a method's exception is raised as soon as it arrives; an actor's death is handed back by
    `gather` and raised by `get_all`."""
    import ray

    from deploy.recovery import CallTimeout, gather, get_all

    ray.init(address="local", num_cpus=1, include_dashboard=False, namespace="test_faults_logic", log_to_driver=False)
    try:
        @ray.remote(max_restarts=0)
        class Slow:
            def sleep(self, s: float) -> float:
                time.sleep(s)
                return s

            def fail(self) -> None:
                raise ValueError("a bug")

            def exit(self) -> None:
                os._exit(1)

        slow, other = Slow.remote(), Slow.remote()
        assert get_all([slow.sleep.remote(0.0)], timeout_s=60, what="warm-up") == [0.0]
        start = time.monotonic()
        with pytest.raises(CallTimeout, match=r"rollout collect: 1 call\(s\) did not answer within 1s \(ray.call_timeout_s\)"):
            get_all([slow.sleep.remote(30.0)], timeout_s=1.0, what="rollout collect")
        assert time.monotonic() - start < 10
        start = time.monotonic()
        with pytest.raises(ValueError, match="a bug"):  # not held up by the slow call listed first
            get_all([slow.sleep.remote(30.0), other.fail.remote()], timeout_s=60, what="x")
        assert time.monotonic() - start < 10
        # Not ray.kill: the kill travels apart from the calls and can arrive after the next one has
        # run. A sync actor runs one caller's calls in order, so nothing after `exit` ever runs.
        other.exit.remote()
        (value, err), = gather([other.sleep.remote(0.0)], timeout_s=30, what="dead")
        assert value is None and isinstance(err, ray.exceptions.RayActorError)
        with pytest.raises(ray.exceptions.RayActorError):
            get_all([other.sleep.remote(0.0)], timeout_s=30, what="dead")
    finally:
        ray.shutdown()
