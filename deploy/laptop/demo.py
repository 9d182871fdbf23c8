"""`make demo`: the whole laptop pipeline on local Ray, with success on a fixed valid_unseen set at
three points: random init, after the SFT cold start, after GRPO. The last line printed is
`demo success rate (valid_unseen): X.XXX -> Y.YYY` (X after SFT, Y after RL), i.e. what RL added.

Every stage's work is a count of steps, never a time budget, so for a given seed the result does
not depend on the machine's speed or load. The demo can be run again into the same directory: it
first reads OUT/demo_state.json (the config the directory was started with and the stages that
finished, rewritten atomically after each stage) and skips the finished stages, continues GRPO from
its last checkpoint, or starts afresh when the directory holds no demo. It never clears a directory:
one that holds another config's demo is refused with a one-line ConfigError.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.config import TrainConfig
from deploy.config_loading import ConfigError
from deploy.evaluation import EvalResult, paired_difference
from deploy.plots import save_figure
from deploy.runner import console, print_eval, run_eval_command, run_training
from deploy.trainer import TrainerState, latest_checkpoint

STATE_FILE = "demo_state.json"
OUTPUTS = ("base", "eval", "sft", "rl", "plots", "demo_summary.json")
"""What a demo writes under OUT (besides its state file and logs/)."""


def _with(cfg: TrainConfig, **sections) -> TrainConfig:
    """Copy with some sections' fields replaced, re-validated."""
    tree = cfg.model_dump()
    for section, values in sections.items():
        tree[section].update(values)
    return TrainConfig.model_validate(tree)


def _plot(points: list[tuple[str, EvalResult]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    names = [n for n, _ in points]
    ax.bar(names, [r.avg_at_k for _, r in points], yerr=[r.avg_at_k_se for _, r in points], capsize=6,
           color=["#bbbbbb", "#6a9fd4", "#d4766a"][: len(points)])
    for i, (_, r) in enumerate(points):
        ax.text(i, r.avg_at_k + r.avg_at_k_se + 0.01, f"{r.avg_at_k:.3f}", ha="center", fontsize=9)
    r0 = points[0][1]
    ax.set_ylabel(f"Avg@{r0.k} success ({r0.split}, {r0.num_tasks} tasks)")
    ax.set_ylim(0, 1)
    ax.set_title("embedded demo: success on fixed unseen tasks (± s.e.)", fontsize=10)
    return save_figure(fig, out)


# ---- the output directory's state ---------------------------------------------------------------
def _config_record(cfg: TrainConfig) -> dict[str, Any]:
    """The config as JSON, less the run directory (which follows OUT, so a moved demo still matches)."""
    tree = json.loads(cfg.model_dump_json())
    del tree["run"]["output_dir"]
    return tree


def _differing_keys(recorded: Any, now: Any, prefix: str = "") -> list[str]:
    """Recorded keys whose value differs now (keys a newer version added are not compared)."""
    if isinstance(recorded, dict) and isinstance(now, dict):
        return [k for key in sorted(recorded.keys() & now.keys())
                for k in _differing_keys(recorded[key], now[key], f"{prefix}{key}.")]
    return [] if recorded == now else [prefix.rstrip(".")]


@dataclass
class DemoState:
    """OUT/demo_state.json: the config the demo was started with and, per finished stage, its seconds."""

    path: Path
    config: dict[str, Any]
    seconds: dict[str, float]

    def done(self, stage: str) -> bool:
        return stage in self.seconds

    def finish(self, stage: str, seconds: float) -> None:
        """Record a finished stage; written last and atomically, so an interrupted stage is redone."""
        self.seconds[stage] = seconds
        self.save()

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"config": self.config, "stage_seconds": self.seconds}, indent=2))
        tmp.replace(self.path)


def _refuse(out: Path, problem: str) -> ConfigError:
    return ConfigError(f"{out} {problem}, which this demo will not overwrite: "
                       f"pass --out <a new directory> or delete {out}")


def open_state(cfg: TrainConfig, out: Path) -> DemoState:
    """Before any work: continue the demo in OUT, or start afresh when OUT holds none; says which.
    A directory holding another config's demo, or demo outputs without a state file, is refused
    (ConfigError), never cleared."""
    out.mkdir(parents=True, exist_ok=True)
    config, path = _config_record(cfg), out / STATE_FILE
    if not path.exists():
        if any((out / name).exists() for name in OUTPUTS):
            raise _refuse(out, f"holds demo outputs but no {STATE_FILE} (an older version's or another tool's)")
        console.print(f"[bold]{out}[/] holds no demo: starting afresh")
        state = DemoState(path, config, {})
        state.save()
        return state
    try:
        recorded = json.loads(path.read_text())
        changed = _differing_keys(recorded["config"], config)
    except (ValueError, KeyError):
        raise _refuse(out, f"has an unreadable {STATE_FILE}") from None
    if changed:
        raise _refuse(out, f"holds a demo of another config (differs in {', '.join(changed[:4])}"
                           f"{' ...' * (len(changed) > 4)})")
    seconds = dict(recorded.get("stage_seconds", {}))
    console.print(f"[bold]{out}[/]: continuing the demo there (finished stages: {', '.join(seconds) or 'none'})")
    return DemoState(path, config, seconds)


# ---- stages -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stage:
    key: str
    title: str
    output: Path
    work: Callable[[], object]


def _run_stage(stage: Stage, state: DemoState) -> None:
    """Skip a stage that finished (state and output both there); else redo it from scratch."""
    if state.done(stage.key) and stage.output.exists():
        console.print(f"{stage.title}: finished earlier ({stage.output}), skipped")
        return
    console.rule(f"[bold]{stage.title}")
    if stage.output.is_dir():  # an interrupted stage's leftovers
        shutil.rmtree(stage.output)
    start = time.perf_counter()
    stage.work()
    state.finish(stage.key, time.perf_counter() - start)


def rl_checkpoint_step(run_dir: Path) -> int | None:
    """The step of the GRPO run's last complete checkpoint; None when it has none."""
    ckpt = latest_checkpoint(run_dir)
    return None if ckpt is None else TrainerState.load(ckpt / "trainer_state.json").step


def _final_eval_path(run_dir: Path, total_steps: int) -> Path:
    return run_dir / "eval" / f"step_{total_steps:04d}.json"


def _run_rl(cfg: TrainConfig, state: DemoState, title: str) -> Path:
    """GRPO: skipped when finished (the last step checkpointed after its evaluation), continued
    from its last checkpoint, or run from the start."""
    run_dir, total = Path(cfg.run.output_dir), cfg.run.total_steps
    step = rl_checkpoint_step(run_dir)
    if step == total and _final_eval_path(run_dir, total).exists():
        console.print(f"{title}: finished earlier ({run_dir}, {total} steps), skipped")
        return run_dir
    console.rule(f"[bold]{title}")
    start = time.perf_counter()
    if step is not None:
        console.print(f"continuing the GRPO run in {run_dir} from its checkpoint at step {step} of {total}")
        run_training(cfg, resume=True)
    else:
        if run_dir.exists():
            console.print(f"{run_dir} holds a GRPO run interrupted before its first checkpoint: starting it afresh")
            shutil.rmtree(run_dir)
        run_training(cfg)
    state.finish("rl", time.perf_counter() - start)
    return run_dir


# ---- the demo -----------------------------------------------------------------------------------
def run_demo(cfg: TrainConfig, out: Path) -> dict:
    from deploy.laptop.sft import build_model_from_env, run_sft

    state = open_state(cfg, out)
    base, sft_dir, evals = out / "base", out / "sft", out / "eval"
    eval_cfg = _with(cfg, run={"output_dir": str(out)})
    for stage in (
        Stage("base", "1/5 build the tiny model (tokenizer + random init)", base,
              lambda: build_model_from_env(cfg, base)),
        Stage("eval_random_init", "2/5 evaluate the random-init policy", evals / "random_init.json",
              lambda: run_eval_command(eval_cfg, str(base), label="random_init")),
        Stage("sft", "3/5 SFT cold start on expert demonstrations", sft_dir, lambda: run_sft(cfg, str(base), sft_dir)),
        Stage("eval_sft", "4/5 evaluate the SFT policy", evals / "after_sft.json",
              lambda: run_eval_command(eval_cfg, str(sft_dir), label="after_sft")),
    ):
        _run_stage(stage, state)
    rl_cfg = _with(cfg, model={"path": str(sft_dir)}, eval={"at_end": True})
    run_dir = _run_rl(rl_cfg, state, "5/5 GRPO on local Ray (vLLM engines, DeepSpeed learner, env actors)")
    results = [evals / "random_init.json", evals / "after_sft.json", _final_eval_path(run_dir, rl_cfg.run.total_steps)]
    return _summarize(out, state, [EvalResult.model_validate_json(p.read_text()) for p in results])


def _summarize(out: Path, state: DemoState, results: list[EvalResult]) -> dict:
    """Plot, demo_summary.json and the console summary; quick, so redone on every run."""
    print_eval(results[-1])
    points = list(zip(("random init", "after SFT", "after RL"), results, strict=True))
    plot = _plot(points, out / "plots" / "demo_success.png")
    _, r_sft, r_rl = results
    gain = paired_difference(r_sft, r_rl)
    summary: dict[str, Any] = {name: r.model_dump() for name, r in points}
    summary["rl_gain_paired"] = gain.model_dump()
    summary["stage_seconds"] = dict(state.seconds)
    summary["minutes"] = sum(state.seconds.values()) / 60
    (out / "demo_summary.json").write_text(json.dumps(summary, indent=2))
    stages = "  ".join(f"{k} {v / 60:.1f}" for k, v in state.seconds.items())
    console.print(f"plot: {plot}   summary: {out / 'demo_summary.json'}   "
                  f"total {summary['minutes']:.1f} min of work (per stage: {stages})")
    for name, r in points:
        console.print(f"  {name:<12} Avg@{r.k} = {r.avg_at_k:.3f} ± {r.avg_at_k_se:.3f}   Pass@{r.k} = {r.pass_at_k:.3f}")
    console.print(f"  RL gain over SFT (paired over the same {gain.num_tasks} tasks): "
                  f"{gain.mean:+.3f} ± {gain.se:.3f} s.e.")
    print(f"demo success rate ({r_rl.split}): {r_sft.avg_at_k:.3f} -> {r_rl.avg_at_k:.3f}", flush=True)
    return summary
