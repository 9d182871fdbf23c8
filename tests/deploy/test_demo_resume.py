"""`make demo` budgeted in steps and run twice: SFT runs exactly its configured optimiser steps (a
time cap fails instead of cutting it short); the demo's output directory is read before any work,
so a second run skips every finished stage and a directory with a finished SFT but no GRPO run
continues at GRPO, with the same figures as the first run."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.config_loading import ConfigError, load_config
from deploy.config_sections import SFTConfig
from deploy.laptop.demo import STATE_FILE, open_state, rl_checkpoint_step
from deploy.laptop.sft import SFTTimeCapReached, build_model_from_env, planned_steps, run_sft
from deploy.trainer import TrainerState
from tests.readme.manifest import DEMO_LINE, DEMO_TINY
from tests.readme.session import FinishedDemo

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "deploy" / "configs" / "demo_cpu.yaml"
SKIPPED = ("1/5", "2/5", "3/5", "4/5")


TINY = list(DEMO_TINY)
"""The demo shrunk to a few tasks, 2 SFT steps and 1 GRPO step: the sizes README's `make demo` test ran at."""


def _cfg(*overrides: str):
    return load_config(DEMO, [*TINY, *overrides])


def _err(capsys) -> str:
    """Captured console text with rich's line wrapping undone."""
    return " ".join(capsys.readouterr().err.split())


# ---- SFT in steps ----------------------------------------------------------------------------------
def test_planned_steps_are_epochs_of_batches_capped_by_max_steps():
    assert planned_steps(SFTConfig(epochs=4, batch_rows=32), 1669) == 212  # the demo's 4 x 53
    assert planned_steps(SFTConfig(epochs=4, batch_rows=32, max_steps=212), 1669) == 212
    assert planned_steps(SFTConfig(epochs=4, batch_rows=32, max_steps=100), 1669) == 100
    assert planned_steps(SFTConfig(epochs=1, batch_rows=32, max_steps=100), 1669) == 53


def test_demo_config_runs_the_committed_record_s_212_sft_steps_and_has_no_time_budget():
    sft = load_config(DEMO).sft
    assert sft.minutes is None and sft.epochs == 4 and sft.max_steps == 212


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    return build_model_from_env(_cfg(), tmp_path_factory.mktemp("sft") / "base", num_episodes=4)


@pytest.mark.slow
def test_sft_runs_exactly_its_configured_steps_and_a_time_cap_fails_instead(tiny_base, tmp_path):
    cfg = _cfg("sft.epochs=50")  # 50 epochs of 4-row batches: max_steps=2 decides
    summary = json.loads((run_sft(cfg, str(tiny_base), tmp_path / "sft") / "sft_summary.json").read_text())
    assert summary["optimizer_steps"] == summary["planned_steps"] == 2 and summary["stopped_by"] == "max_steps"
    log = (tmp_path / "sft" / "sft_log.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in log] == [1, 2]

    with pytest.raises(SFTTimeCapReached, match=r"after 1 of 2 steps and saved nothing.*unset it"):
        run_sft(cfg, str(tiny_base), tmp_path / "capped", minutes=1e-9)
    assert not (tmp_path / "capped").exists()


# ---- the output directory's state -----------------------------------------------------------------
def test_state_continues_the_same_config_and_refuses_another(tmp_path, capsys):
    out = tmp_path / "demo"
    state = open_state(_cfg(), out)
    assert "holds no demo: starting afresh" in _err(capsys)
    state.finish("base", 12.5)
    (out / "base").mkdir()

    again = open_state(_cfg(f"run.output_dir={tmp_path / 'moved'}"), out)  # the run dir follows OUT
    assert again.seconds == {"base": 12.5} and (out / "base").is_dir()
    assert "continuing the demo there (finished stages: base)" in _err(capsys)

    with pytest.raises(ConfigError, match=r"another config \(differs in run.seed\).*pass --out"):
        open_state(_cfg("run.seed=1"), out)
    assert (out / "base").is_dir() and json.loads((out / STATE_FILE).read_text())["stage_seconds"] == {"base": 12.5}


def test_keys_a_newer_version_added_do_not_count_as_another_config(tmp_path):
    out = tmp_path / "demo"
    open_state(_cfg(), out).finish("base", 1.0)
    recorded = json.loads((out / STATE_FILE).read_text())
    del recorded["config"]["learner"]["lr"]  # as if the config had no such key when the demo started
    (out / STATE_FILE).write_text(json.dumps(recorded))
    assert open_state(_cfg(), out).seconds == {"base": 1.0}


def test_outputs_without_a_state_file_are_refused_not_cleared(tmp_path):
    out = tmp_path / "demo"
    for name in ("base", "sft", "rl"):
        (out / name).mkdir(parents=True)
    with pytest.raises(ConfigError, match=f"no {STATE_FILE}"):
        open_state(_cfg(), out)
    assert all((out / name).is_dir() for name in ("base", "sft", "rl"))


def test_rl_progress_is_the_last_complete_checkpoint(tmp_path):
    run = tmp_path / "rl"
    assert rl_checkpoint_step(run) is None
    for step in (5, 10):
        (run / "checkpoints" / f"step_{step:06d}").mkdir(parents=True)
        TrainerState(step=step, policy_version=step).save(run / "checkpoints" / f"step_{step:06d}" / "trainer_state.json")
    (run / "checkpoints" / "step_000014" / "learner").mkdir(parents=True)  # interrupted while saving
    assert rl_checkpoint_step(run) == 10


# ---- end to end -----------------------------------------------------------------------------------
def _demo(out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled",
           "COLUMNS": "1000"}  # one console line per message
    args = [sys.executable, "-m", "deploy", "demo", "--out", str(out)]
    for item in TINY:
        args += ["--set", item]
    res = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False)
    assert res.returncode == 0, f"demo failed:\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
    return res


def _stage_files(out: Path) -> dict[str, tuple[int, int]]:
    """(mtime, size) of every stage output file: unchanged means the stage did no work."""
    return {str(p.relative_to(out)): (p.stat().st_mtime_ns, p.stat().st_size)
            for name in ("base", "eval", "sft", "rl") for p in (out / name).rglob("*") if p.is_file()}


def _last_line(res: subprocess.CompletedProcess) -> str:
    return res.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def finished_demo(readme_demo: FinishedDemo, tmp_path_factory):
    """README's tiny `make demo` (its first run, in a fresh directory), copied: (out, its demo line)."""
    assert "runs/demo holds no demo: starting afresh" in readme_demo.output
    line = re.search(DEMO_LINE, readme_demo.output)
    assert line is not None, readme_demo.output[-3000:]
    out = tmp_path_factory.mktemp("demo") / "out"
    shutil.copytree(readme_demo.out, out)
    return out, line.group(0)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.vllm
@pytest.mark.deepspeed
def test_a_second_demo_run_skips_every_finished_stage(finished_demo):
    out, first = finished_demo
    before = _stage_files(out)
    again = _demo(out)
    assert "continuing the demo there" in again.stderr
    for stage in SKIPPED:
        assert f"{stage} " in again.stderr and "skipped" in again.stderr.split(stage, 1)[1].splitlines()[0]
    assert "5/5 GRPO on local Ray (vLLM engines, DeepSpeed learner, env actors): finished earlier" in again.stderr
    assert _stage_files(out) == before
    assert _last_line(again) == first


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.vllm
@pytest.mark.deepspeed
def test_a_demo_with_a_finished_sft_but_no_rl_continues_at_rl(finished_demo, tmp_path):
    first_out, first = finished_demo
    out = tmp_path / "out"
    shutil.copytree(first_out, out)
    shutil.rmtree(out / "rl")
    before = {k: v for k, v in _stage_files(out).items() if not k.startswith("rl")}
    res = _demo(out)
    for stage in SKIPPED:
        assert "skipped" in res.stderr.split(stage, 1)[1].splitlines()[0]
    assert "finished earlier" not in res.stderr.split("5/5", 1)[1].splitlines()[0]
    assert {k: v for k, v in _stage_files(out).items() if not k.startswith("rl")} == before
    assert (out / "rl" / "checkpoints" / "step_000001" / "trainer_state.json").is_file()
    final = json.loads((out / "rl" / "eval" / "step_0001.json").read_text())
    assert final["per_task"] == json.loads((first_out / "rl" / "eval" / "step_0001.json").read_text())["per_task"]
    assert _last_line(res) == first
