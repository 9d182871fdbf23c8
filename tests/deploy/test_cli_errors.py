"""User errors on the command line: the real CLI (`python -m deploy ...` in a subprocess, in an empty
working directory) prints one line on stderr naming the problem and the fix, exits 2, and shows no
traceback unless asked (--verbose, AGENTRL_VERBOSE=1). Every case fails before any actor starts.
Also: option defaults never override the config, and Ctrl-C during `train` leaves a resumable run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "deploy" / "configs" / "smoke_cpu.yaml")
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}


def _deploy(cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deploy", *args], cwd=cwd, env={**ENV, **(env or {})},
                          capture_output=True, text=True, timeout=timeout, check=False)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@dataclass(frozen=True)
class Case:
    """A command line (with `{tmp}` for the working directory, `{model}` for a model directory),
    the files it needs, and the words its one line must hold (the problem and the fix)."""

    name: str
    args: tuple[str, ...]
    words: tuple[str, ...]
    files: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


RUN_METRICS = {"run/metrics.jsonl": json.dumps({"step": 1, "success_rate": 0.5}) + "\n"}
CASES = [
    Case("sft-documented-first-run-without-a-model",  # README's `sft` with no --config: the demo's settings
         ("sft", "--model", "runs/tiny/base", "--out", "runs/tiny/sft"),
         ("model.path 'runs/tiny/base'", "build-tiny-model")),
    Case("sft-with-reasoning-turns",
         ("sft", "--config", "think.yaml", "--model", "{model}", "--out", "out"),
         ("rollout.use_think", "--set rollout.use_think=false"), files={"think.yaml": "rollout:\n  use_think: true\n"}),
    Case("train-into-an-existing-run",
         ("train", "--config", SMOKE, "--set", "model.path={model}", "--set", "run.output_dir=run"),
         ("already holds a run", "--resume", "run.output_dir=<new dir>"), files=RUN_METRICS),
    Case("train-resume-without-a-run",
         ("train", "--config", SMOKE, "--resume", "--set", "model.path={model}", "--set", "run.output_dir=run"),
         ("--resume", "holds no run to continue", "drop --resume")),
    Case("webshop-reward-missing-cases",
         ("env", "webshop-reward", "--cases", "cases.jsonl"),
         ("--cases cases.jsonl is not a file", "one reward case a line", "get_reward")),
    Case("webshop-reward-wrong-file",
         ("env", "webshop-reward", "--cases", "cases.jsonl"),
         ("cases.jsonl:1: not JSON", "--cases must be a JSONL file"), files={"cases.jsonl": "hello\n"}),
    Case("replay-missing-transcripts",
         ("env", "replay", "--env", "alfworld", "--data-path", ".", "--transcripts", "t.jsonl"),
         ("--transcripts t.jsonl is not a file", "env replay --env alfworld --data-path . --record FILE")),
    Case("replay-wrong-transcripts",
         ("env", "replay", "--env", "webshop", "--data-path", ".", "--transcripts", "t.jsonl"),
         ("t.jsonl:1", "transcripts come from", "--record FILE"), files={"t.jsonl": "[1, 2]\n"}),
    Case("set-key-typo",
         ("validate-config", "--config", SMOKE, "--set", "learner.lrr=0.1"),
         ("unknown config key learner.lrr", "from --set learner.lrr", "did you mean learner.lr")),
    Case("yaml-key-typo",
         ("validate-config", "--config", "typo.yaml"),
         ("unknown config key rollout.group_sise", "from typo.yaml", "did you mean rollout.group_size"),
         files={"typo.yaml": f"base: {SMOKE}\nrollout:\n  group_sise: 4\n"}),
    Case("bad-config-value",
         ("validate-config", "--config", SMOKE, "--set", "rollout.group_size=0"),
         ("rollout.group_size=0 is invalid", "greater than or equal to 1", "fix the value")),
    Case("missing-config-file",
         ("train", "--config", "nope.yaml"),
         ("config file nope.yaml does not exist", "deploy/configs")),
    Case("missing-model-dir",
         ("train", "--config", SMOKE, "--set", "model.path=runs/nope/base"),
         ("model.path 'runs/nope/base' is neither a directory", "build-tiny-model")),
    Case("unset-env-var",
         ("validate-config", "--config", "env.yaml"),
         ("AGENTRL_TEST_UNSET_VAR, which is not set", "export AGENTRL_TEST_UNSET_VAR=<value>"),
         files={"env.yaml": "run:\n  name: ${AGENTRL_TEST_UNSET_VAR}\n"}),
    Case("unknown-env-name",
         ("validate-config", "--config", SMOKE, "--set", "env.name=minecraft"),
         ("env.name='minecraft' is not a registered environment", "alfworld", "webshop", "env.plugin")),
    Case("replay-both-modes",
         ("env", "replay", "--env", "alfworld", "--data-path", ".", "--transcripts", "a", "--record", "b"),
         ("exactly one of", "--transcripts FILE", "--record FILE")),
    Case("experiment-publish-and-results",
         ("experiment", "run", "--grid", str(ROOT / "deploy" / "experiments" / "quick.yaml"), "--publish",
          "--results", "r"),
         ("--results DIR or --publish", "not both")),
    Case("set-without-equals",
         ("validate-config", "--config", SMOKE, "--set", "run.total_steps"),
         ("--set 'run.total_steps' has no '='", "section.key=value")),
    Case("eval-retrieval-value",
         ("eval", "--config", SMOKE, "--checkpoint", "ckpt", "--retrieval", "maybe"),
         ("--retrieval 'maybe'", "use on or off")),
    Case("missing-required-option",
         ("eval", "--config", SMOKE),
         ("Missing option '--checkpoint'", "python -m deploy eval --help")),
    Case("missing-grid-file",
         ("experiment", "report", "--grid", "nope.yaml"),
         ("grid file nope.yaml does not exist", "deploy/experiments/")),
]


def _prepare(case: Case, tmp_path: Path) -> list[str]:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # a model directory as far as the driver's checks go
    for name, text in case.files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return [a.replace("{model}", str(model)) for a in case.args]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_user_error_is_one_line_and_exit_2(case: Case, tmp_path: Path):
    res = _deploy(tmp_path, *_prepare(case, tmp_path), env=case.env)
    lines = _lines(res.stderr)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and len(lines) == 1, res.stderr[-3000:]
    assert lines[0].startswith("error: ")
    for word in case.words:
        assert word in lines[0], (word, lines[0])
    assert not (tmp_path / "results").exists() and not (tmp_path / "runs").exists()  # nothing written


def test_verbose_adds_the_traceback(tmp_path: Path):
    for args, env in ((("--verbose", "validate-config", "--config", "nope.yaml"), {}),
                      (("validate-config", "--config", "nope.yaml"), {"AGENTRL_VERBOSE": "1"})):
        res = _deploy(tmp_path, *args, env=env)
        assert res.returncode == 2
        assert "Traceback (most recent call last)" in res.stderr and "ConfigError" in res.stderr
        assert _lines(res.stderr)[-1] == "error: config file nope.yaml does not exist: check the path (the laptop " \
                                         "configs are deploy/configs/*.yaml)"


def test_option_defaults_leave_the_config_alone(tmp_path: Path, monkeypatch):
    """`sft --num-tasks/--max-steps/--minutes` and `eval --k` set their config keys only when given."""
    from typer.testing import CliRunner

    import deploy.laptop.sft
    import deploy.runner
    from deploy.cli import app

    seen = []
    monkeypatch.setattr(deploy.laptop.sft, "run_sft", lambda cfg, model, out: seen.append(cfg))
    monkeypatch.setattr(deploy.runner, "run_eval_command", lambda cfg, model, adapter=None: seen.append(cfg))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    config = tmp_path / "c.yaml"
    config.write_text("rollout:\n  use_think: false\nsft:\n  num_tasks: 7\n  max_steps: 5\n  minutes: 2.5\n"
                      f"eval:\n  k: 3\nrun:\n  output_dir: {tmp_path / 'run'}\n")
    sft = ["sft", "--config", str(config), "--model", str(model), "--out", str(tmp_path / "out")]
    evaluate = ["eval", "--config", str(config), "--checkpoint", str(model), "--verbose"]
    for args in (sft, [*sft, "--num-tasks", "9", "--max-steps", "4", "--minutes", "1"], evaluate, [*evaluate, "--k", "2"]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
    assert [(c.sft.num_tasks, c.sft.max_steps, c.sft.minutes) for c in seen[:2]] == [(7, 5, 2.5), (9, 4, 1.0)]
    assert [c.eval.k for c in seen[2:]] == [3, 2]
    res = CliRunner().invoke(app, ["sft", "--model", str(model), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output  # no --config: the laptop demo's settings, no reasoning turns
    assert not seen[-1].rollout.use_think and seen[-1].sft.max_steps is not None


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.ray
def test_ctrl_c_during_train_says_what_was_saved_and_resumes(model, tmp_path: Path):
    """A real SIGINT to the process group of a real `train` (what Ctrl-C in a terminal sends) after its
    first checkpoint: one line naming the checkpoint and `--resume`, exit 130, and a run dir that
    `train --resume` continues from that checkpoint."""
    from deploy.config_loading import load_config
    from deploy.runner import check_run_dir
    from tests.deploy.shared_runs import TORCH_LEARNER, set_flags

    run = tmp_path / "run"
    args = ["train", "--config", SMOKE, "--set", f"model.path={model}", "--set", f"run.output_dir={run}",
            "--set", "run.total_steps=100000", "--set", "run.checkpoint_every=1", "--set", "eval.at_end=false",
            "--set", "engine.engine=hf",  # the interrupt is the point here; vLLM end to end is README's first run
            *set_flags(*TORCH_LEARNER)]
    # As a terminal starts a foreground command: its own process group, SIGINT at its default. A
    # background job of a script (`make test` run with `&`, `nohup ... &`) inherits SIGINT ignored,
    # and Python then never raises KeyboardInterrupt; a handled signal is reset to its default by exec.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "deploy", *args], cwd=tmp_path, env=ENV, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, before)
    def saved() -> bool:  # some step's checkpoint is complete (its trainer state is written last)
        return any((run / "checkpoints").glob("step_*/trainer_state.json"))

    deadline = time.monotonic() + 600
    while not saved() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(1)
    assert proc.poll() is None and saved(), (proc.communicate(timeout=60)[1][-3000:] if proc.poll() is not None
                                             else "no checkpoint in 600 s")
    os.killpg(proc.pid, signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=300)
    finally:  # a run that ignored the interrupt would otherwise train on
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    said = [line for line in err.splitlines() if line.startswith("interrupted: ")]
    assert len(said) == 1, err[-3000:]
    ckpt = check_run_dir(load_config(run / "config.resolved.json"), resume=True)
    assert ckpt is not None and ckpt.parent == run / "checkpoints"
    step = int(ckpt.name.removeprefix("step_"))
    assert f"the last checkpoint is step {step} in {ckpt}" in said[0]
    assert "--resume` continues from it" in said[0] and "python -m deploy train" in said[0]
