"""Live inspection of the skill bank: the named actor "skillbank" in a run's namespace (started
here on a real local Ray cluster, with its own private redis-server) is read by a *separate*
driver process through `python -m deploy skills {ls,show,history,stats}`."""

import subprocess
import sys
from pathlib import Path

import pytest

from skillbank_service.config import SkillBankConfig
from skillbank_service.types import CriticVerdict, ScoredProposal

pytestmark = [pytest.mark.ray, pytest.mark.redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
NS = "skills_cli_run"
OK = CriticVerdict(op_reasonable=True, content_supported=True, passed=True, critic="rule")


@pytest.fixture(scope="module")
def cluster():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="skills_cli_driver")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def skills_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deploy", "skills", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=240, check=False)


def test_second_driver_reads_the_live_bank(cluster):
    import ray

    from deploy.skillbank_actor import get_or_create_skillbank, get_skillbank, shutdown_skillbank

    cfg = SkillBankConfig(key_prefix=NS, embedding_model="hashing")
    bank = get_or_create_skillbank(cfg, NS, detached=True)
    try:
        assert get_or_create_skillbank(cfg, NS, detached=True)._actor_id == bank._actor_id  # get_if_exists
        assert get_skillbank(NS)._actor_id == bank._actor_id
        props = [ScoredProposal(candidate_id="p1", step=5, op="add", task_type="heat", verdict=OK, r_align=0.2,
                                delta_plus=0.3, text="To heat food, take it to the microwave and heat it there."),
                 ScoredProposal(candidate_id="p2", step=5, op="add", task_type="cool", verdict=OK, r_align=0.1,
                                delta_plus=0.1, text="To cool food, take it to the fridge and cool it there."),
                 ScoredProposal(candidate_id="p3", step=5, op="add", task_type="cool", verdict=OK, r_align=-0.1,
                                delta_plus=0.1, text="Look around before acting in a new room always.")]
        ray.get(bank.apply.remote(props))
        upd = ScoredProposal(candidate_id="p4", step=6, op="update", target_skill_id="s000001", task_type="heat",
                             verdict=OK, r_align=0.05, delta_plus=0.05,
                             text="To heat food, open the microwave, put the food in and heat it with it.")
        ray.get(bank.apply.remote([upd]))

        common = ["--address", cluster, "--namespace", NS]
        ls = skills_cli("ls", *common)
        assert ls.returncode == 0, ls.stderr
        assert "version 2, 2 skills" in ls.stdout and "s000001" in ls.stdout and "s000002" in ls.stdout
        assert "open the microwave" in ls.stdout and "Look around" not in ls.stdout

        show = skills_cli("show", "s000001", *common)
        assert show.returncode == 0, show.stderr
        assert "p4" in show.stdout and "revision" in show.stdout and "+0.050000" in show.stdout

        hist = skills_cli("history", "s000001", *common)
        assert hist.returncode == 0, hist.stderr
        assert "2 edits" in hist.stdout and "add" in hist.stdout and "update" in hist.stdout

        stats = skills_cli("stats", *common, "--decisions", "5")
        assert stats.returncode == 0, stats.stderr
        rows = [" ".join(line.replace("│", " ").split()) for line in stats.stdout.splitlines()]
        assert {"edits adds 2", "edits updates 1", "skills cool 1", "skills heat 1", "decisions accepted 3",
                "decisions rejected 1", "not accepted r_align 1"} <= set(rows), stats.stdout
        assert "p3" in stats.stdout  # the decisions log

        missing = skills_cli("ls", "--address", cluster, "--namespace", "no_such_run")
        assert missing.returncode == 2 and "no_such_run" in missing.stderr
    finally:
        shutdown_skillbank(bank)
