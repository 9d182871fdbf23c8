"""Every command of README.md's ```bash blocks, run as the README says (at tiny sizes, in a scratch copy
of the repository) or, where it cannot run here, replaced by the check tests/readme/manifest.py names.
The manifest and the README must list the same commands."""

from __future__ import annotations

import re
import shlex

import psutil
import pytest

from tests.readme.blocks import bash_blocks, fenced_blocks
from tests.readme.manifest import DEMO_LINE, MANIFEST, Instead
from tests.readme.session import README, ReadmeSession, failures
from tests.vllm_logs import VLLM_INFO

BLOCKS = bash_blocks(README)


def test_the_manifest_lists_exactly_the_readme_commands():
    readme = [c for b in BLOCKS for c in b.commands]
    assert len(readme) == len(set(readme)), "a README command appears twice; the manifest keys must be unique"
    assert sorted(set(readme) - set(MANIFEST)) == [], "README commands the test does not know (add them to the manifest)"
    assert sorted(set(MANIFEST) - set(readme)) == [], "manifest entries no longer in README.md (remove them)"
    assert all(t.reason for t in MANIFEST.values() if isinstance(t, Instead))


def test_readme_states_the_demo_line_in_the_printed_format():
    text_lines = [line for _, lines in fenced_blocks(README.read_text(), "text") for line in lines]
    assert any(re.fullmatch(DEMO_LINE, line) for line in text_lines), "README must show the demo's last line"


def test_no_readme_block_stops_every_ray_cluster():
    assert not [c for b in BLOCKS for c in b.commands if re.search(r"\bray stop\b", c)]


def test_the_laptop_heads_ports_are_its_own_by_rays_port_rules():
    """The `ray start` of README's laptop recipe, parsed by Ray's CLI and checked by Ray's own port
    rules (the suite runs it on free ports instead): no two components share a port (a client server
    port inside the workers' range stops the head), and none is left at a fixed default that another
    cluster on the machine may hold (a taken dashboard agent port leaves the head unable to run jobs)."""
    from ray._private import ray_constants
    from ray._private.parameter import RayParams
    from ray.scripts.scripts import start

    [line] = [c for b in BLOCKS for c in b.commands if " start --head " in c]
    opts = start.make_context("start", shlex.split(line.removesuffix("&"))[2:]).params
    params = RayParams(gcs_server_port=opts["port"], dashboard_port=opts["dashboard_port"],
                       ray_client_server_port=opts["ray_client_server_port"],
                       dashboard_agent_listen_port=opts["dashboard_agent_listen_port"],
                       min_worker_port=opts["min_worker_port"], max_worker_port=opts["max_worker_port"])
    params.update_pre_selected_port()  # raises ValueError naming the two components
    fixed_defaults = {ray_constants.DEFAULT_PORT, ray_constants.DEFAULT_DASHBOARD_PORT,
                      10001,  # the client server's (ray.scripts.scripts.start)
                      ray_constants.DEFAULT_DASHBOARD_AGENT_LISTEN_PORT}
    assert not fixed_defaults & params.reserved_ports, sorted(fixed_defaults & params.reserved_ports)


def _gcs_processes(port: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if f"--gcs_server_port={port}" in " ".join(p.info["cmdline"] or []):
            out.append(p)
    return out


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[f"{i}-{b.heading}" for i, b in enumerate(BLOCKS)])
def test_readme_block_runs(readme_session: ReadmeSession, index: int):
    result = readme_session.run(index)
    problems = failures(result, readme_session.workspace)
    assert not problems, "\n".join(problems)
    if "6390" in result.ports:  # the laptop head: stopped, and by its own kill
        assert _gcs_processes(result.ports["6390"]) == []


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.ray
def test_first_run_fixture_exposes_the_finished_run(readme_first_run, readme_session):
    assert (readme_first_run / "runs/smoke/checkpoints/step_000004/hf").is_dir()
    # every run shut its vLLM engine down at its end: no rendezvous file is left in TMPDIR
    assert not [p.name for p in readme_session.tmpdir.iterdir() if p.name.startswith(("vllm_dist_", "agentrl_vllm_"))]


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.ray
def test_first_run_keeps_the_console_for_the_run_and_engine_logs_in_run_logs(readme_first_run, readme_session):
    """README's first `train` (vLLM) prints the run's stages and its directory; every actor's engine and
    framework output goes to runs/smoke/logs/<actor>.log instead (`--verbose` brings it back:
    tests/deploy/test_e2e_logs.py)."""
    console = readme_session.result_of(
        "$PY -m deploy train --config deploy/configs/smoke_cpu.yaml --set model.path=runs/tiny/sft").output
    logs = readme_first_run / "runs/smoke/logs"
    names = {p.name for p in logs.glob("*.log")}
    assert {"driver.log", "rollout_worker_0.log", "learner_rank0.log", "env_pool_0.log"} <= names, names
    worker = (logs / "rollout_worker_0.log").read_text()
    assert VLLM_INFO.search(worker), worker[:2000]
    # vLLM's "ParallelLMHead: Failed to load weights" after every sync of a tied-embedding model is
    # harmless and filtered out (rollout_workers/engines/vllm_sync.py), in the log as on the console
    assert "ParallelLMHead" not in worker
    assert "Started a local Ray instance" in (logs / "driver.log").read_text()

    assert "ParallelLMHead" not in console
    assert not VLLM_INFO.search(console), console[-3000:]
    assert "NUMA binding" not in console and "reduce_op" not in console
    assert "run written to" in console and "engine and framework logs:" in console
