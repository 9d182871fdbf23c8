"""Every command of README.md's ```bash blocks, run as the README says (at tiny sizes, in a scratch copy
of the repository) or, where it cannot run here, replaced by the check tests/readme/manifest.py names.
The manifest and the README must list the same commands."""

from __future__ import annotations

import re

import psutil
import pytest

from tests.readme.blocks import bash_blocks, fenced_blocks
from tests.readme.manifest import DEMO_LINE, MANIFEST, Instead
from tests.readme.session import README, ReadmeSession, failures, readme_first_run, readme_session  # noqa: F401

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
def test_readme_block_runs(readme_session: ReadmeSession, index: int):  # noqa: F811
    result = readme_session.run(index)
    problems = failures(result, readme_session.workspace)
    assert not problems, "\n".join(problems)
    if "6390" in result.ports:  # the laptop head: stopped, and by its own kill
        assert _gcs_processes(result.ports["6390"]) == []


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.ray
def test_first_run_fixture_exposes_the_finished_run(readme_first_run, readme_session):  # noqa: F811
    assert (readme_first_run / "runs/smoke/checkpoints/step_000004/hf").is_dir()
    # every run shut its vLLM engine down at its end: no rendezvous file is left in TMPDIR
    assert not [p.name for p in readme_session.tmpdir.iterdir() if p.name.startswith(("vllm_dist_", "agentrl_vllm_"))]
