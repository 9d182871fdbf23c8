"""The skill bank survives its Redis server's and its actor's death.

On a real local Ray cluster with the named "skillbank" actor and its private server: the server
SIGKILLed between calls is restarted from its AOF by the actor; the actor killed with calls in flight
is restarted by Ray on the same data directory and password, the old server does not linger, and
the calls are resubmitted without a decision or an edit twice. End to end, a UniSkill training run
with `faults.kill=skillbank_redis|skillbank_actor` at step 1 finishes every step, and the bank it
leaves (read back from its AOF after the run) agrees with the step metrics and the proposal archive:
every proposal decided once, every accepted edit once in the history, one version per writing step."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from skillbank_service.config import SkillBankConfig
from skillbank_service.types import CriticVerdict, ScoredProposal
from tests.deploy.shared_runs import shared_head, train_cmd

ROOT = Path(__file__).resolve().parents[2]
NS = "faults_skillbank"
OK = CriticVerdict(op_reasonable=True, content_supported=True, passed=True, critic="rule")
ENV = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}

pytestmark = [pytest.mark.ray, pytest.mark.redis, pytest.mark.slow]


def _proposals(step: int, n: int) -> list[ScoredProposal]:
    return [ScoredProposal(candidate_id=f"st{step}-c{i}", step=10 + step, op="add", task_type="heat", verdict=OK,
                           r_align=0.1 + 0.01 * i, delta_plus=0.2,
                           text=f"Step {step}, rule {i}: take the food to the microwave and heat it there.")
            for i in range(n)]


def _check_bank(bank, *, decided: int, commits: int) -> None:
    import ray

    decisions, history = ray.get(bank.decisions.remote()), ray.get(bank.history.remote())
    cids = [d.candidate_id for d in decisions]
    assert len(cids) == decided == len(set(cids))
    assert sorted(h.candidate_id for h in history) == sorted(d.candidate_id for d in decisions
                                                              if d.outcome == "accepted")
    assert ray.get(bank.version.remote()) == commits


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def cluster():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="faults_skillbank_driver")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def test_bank_survives_its_server_and_its_actor(cluster, tmp_path):
    import ray

    from deploy.skillbank_actor import (
        RemoteSkillBank,
        crash_skillbank_redis,
        get_or_create_skillbank,
        kill_skillbank_actor,
        shutdown_skillbank,
    )

    data_dir = tmp_path / "skillbank"
    cfg = SkillBankConfig(key_prefix=NS, embedding_model="hashing", data_dir=str(data_dir))
    handle = get_or_create_skillbank(cfg, NS)
    bank = RemoteSkillBank(handle)
    try:
        assert bank.apply(_proposals(1, 3)).bank_version == 1
        password = (data_dir / "password").read_text()
        first_pid = json.loads((data_dir / "server.pid").read_text())["pid"]

        crash_skillbank_redis(handle)  # SIGKILL: the actor learns of it on its next call
        assert not _alive(first_pid)
        res = bank.apply(_proposals(2, 2))
        assert [d.outcome for d in res.decisions] == ["accepted"] * 2 and res.bank_version == 2
        assert ray.get(handle.server_restarts.remote()) == 1
        assert bank.retrieve_many(["heat the food"], k=1)[0]  # embeddings came back from the AOF
        _check_bank(handle, decided=5, commits=2)

        second_pid = json.loads((data_dir / "server.pid").read_text())["pid"]
        in_flight = [handle.apply.remote(_proposals(3, 2)), handle.retrieve_many.remote(["heat"], 1, None)]
        kill_skillbank_actor(handle)  # Ray restarts it and resubmits the calls
        applied, retrieved = ray.get(in_flight, timeout=180)
        assert [d.outcome for d in applied.decisions] == ["accepted"] * 2 and applied.bank_version == 3
        assert retrieved[0]
        again = bank.apply(_proposals(3, 2))  # a caller repeating the commit changes nothing
        assert again.replayed == 2 and again.decisions == applied.decisions
        assert ray.get(handle.server_restarts.remote()) == 0  # a fresh incarnation, not a crash restart
        deadline = time.monotonic() + 20
        while _alive(second_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(second_pid), "the killed actor's server lingers"
        third_pid = json.loads((data_dir / "server.pid").read_text())["pid"]
        assert third_pid != second_pid and _alive(third_pid)
        assert (data_dir / "password").read_text() == password
        _check_bank(handle, decided=7, commits=3)
    finally:
        shutdown_skillbank(handle)


# ---- end to end: a training run with the fault injected --------------------------------------

PREFIX = "smoke-uniskill"  # uniskill.bank.key_prefix of smoke_cpu_uniskill.yaml
SEEDED = ["Examine objects under the desklamp: find the lamp first, then carry the object to it.",
          "Look around every receptacle once before taking anything, then turn on the desklamp.",
          "To examine something in the light, hold it and use the desklamp next to it."]


def _bank(run: Path):
    """The run's bank on its AOF in RUN/skillbank (a server of our own, run before or after training)."""
    from skillbank_service.service import SkillBankService

    return SkillBankService(SkillBankConfig(data_dir=str(run / "skillbank"), key_prefix=PREFIX,
                                            embedding_model="hashing"))


def _seed(run: Path) -> tuple:
    """Skills in the bank before the run starts (the run reopens RUN/skillbank): what a crash must
    not lose, and what every retrieval of the run (the first right after the kill) must serve."""
    bank = _bank(run)
    try:
        res = bank.apply([ScoredProposal(candidate_id=f"seed-{i}", step=10, op="add", task_type="look_at_obj_in_light",
                                         verdict=OK, r_align=0.3 - 0.1 * i, delta_plus=0.3, text=text)
                          for i, text in enumerate(SEEDED)])
        assert res.num_added == 3 and res.bank_version == 1
        return tuple(bank.history())
    finally:
        bank.shutdown()


def _servers_in(data_dir: Path) -> list[int]:
    """Live processes working in data_dir (a Redis server runs in its data directory)."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and _alive(int(proc.name)):
            try:
                if Path(os.readlink(proc / "cwd")) == data_dir.resolve():
                    out.append(int(proc.name))
            except OSError:
                continue
    return out


def _train(model: Path, run: Path, component: str, log: Path) -> subprocess.CompletedProcess:
    # the SFT-warmed policy wins about half of its episodes, so its groups of 8 make proposals that the
    # faulted bank must decide exactly once; 2 groups a step (the config plays 4) keep the run short
    sets = [f"model.path={model}", f"run.output_dir={run}", "run.total_steps=2", "eval.at_end=false",
            "rollout.tasks_per_step=2",
            "faults.enabled=true", f"faults.kill={component}", "faults.at_step=1", f"ray.namespace={run.parent.name}"]
    # the HF engine: this test is about the skill bank's recovery, not the engine (`shared_runs_a`)
    cmd = train_cmd(ROOT / "deploy/configs/smoke_cpu_uniskill.yaml", *sets)
    with log.open("w") as out:
        # on the test process's shared Ray cluster (`shared_head`), as a run joins a cluster that outlives it
        res = subprocess.run(cmd, cwd=ROOT, env={**ENV, "RAY_ADDRESS": shared_head()}, stdout=out,
                             stderr=subprocess.STDOUT, timeout=600, check=False)
    return subprocess.CompletedProcess(cmd, res.returncode, log.read_text(), "")


@pytest.mark.e2e
@pytest.mark.parametrize("component", ["skillbank_redis", "skillbank_actor"])
def test_uniskill_run_survives_a_skillbank_fault(component, warm_model, tmp_path):
    run = tmp_path / "run"
    seeded_history = _seed(run)
    res = _train(warm_model, run, component, tmp_path / "train.log")
    assert res.returncode == 0, res.stdout[-4000:]
    last = res.stdout.strip().splitlines()[-1]
    assert last.startswith(f"faults survived: {component} at step 1, restarts "), last
    assert last.endswith("steps completed 2/2"), last
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2] and steps[0]["faults/killed"] == 1
    assert _servers_in(run / "skillbank") == [], "a skill-bank server outlived the run"
    for f in sorted((run / "trajectories").glob("step_*.jsonl")):  # the kill came right before step 1's retrieval
        shown = {json.loads(line)["skill_text"] for line in f.read_text().splitlines()}
        assert shown and shown <= set(SEEDED), (f.name, shown)
    archived = [json.loads(line) for f in sorted((run / "uniskill").glob("proposals_step_*.jsonl"))
                for line in f.read_text().splitlines()]
    bank = _bank(run)  # the bank the run left, read back from its AOF
    try:
        decisions, history = bank.decisions(), bank.history()
        assert tuple(history[:3]) == seeded_history, "an acknowledged edit was lost"
        cids = [d.candidate_id for d in decisions]
        assert len(cids) == len(set(cids)), "a proposal was decided twice"
        assert sorted(cids) == sorted([f"seed-{i}" for i in range(3)] + [r["candidate_id"] for r in archived])
        assert sum(s.get("uniskill/proposals", 0) for s in steps) == len(archived) > 0
        accepted = sorted(d.candidate_id for d in decisions if d.outcome == "accepted")
        assert sorted(h.candidate_id for h in history) == accepted, "an edit was applied twice or lost"
        version, writes = 1, 0
        for s in steps:  # the version moves by one exactly at each step that wrote, never more
            if "uniskill/bank_version" in s:
                wrote = s["uniskill/added"] + s["uniskill/updated"] > 0
                writes += wrote
                assert s["uniskill/bank_version"] == version + wrote
                version = s["uniskill/bank_version"]
        assert bank.version() == version == 1 + writes
    finally:
        bank.shutdown()
