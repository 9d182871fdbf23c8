"""Entry points behind the CLI: wire config -> cluster -> trainer, and tear down cleanly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from deploy.cluster import Cluster
from deploy.config import TrainConfig
from deploy.config_loading import ConfigError, resolve_model_path, save_resolved
from deploy.evaluation import EvalResult
from deploy.metrics import MetricsSink
from deploy.trainer import Trainer, TrainerState, latest_checkpoint, rewind_metrics, run_evaluations

if TYPE_CHECKING:
    from deploy.stages.uniskill import UniSkillStage

console = Console(stderr=True)

WARM_POLICY_RECIPE = ("python -m deploy sft --config deploy/configs/smoke_cpu_mixed.yaml --model runs/tiny/base "
                      "--out runs/tiny/mixed --num-tasks 40")
"""A tiny policy that wins about half of its episodes on smoke_cpu_mixed.yaml's env (the UniSkill
smoke configs' base), so that their groups hold both outcomes; the suite's `warm_model` is built
by this command."""


def uniskill_idle_hint(cfg: TrainConfig, steps: list[dict]) -> str | None:
    """What to say after a UniSkill run in which no step had a proposal candidate (so nothing was
    proposed, scored or committed); None when some step had one, or UniSkill is off."""
    if not cfg.uniskill.enabled or not steps or any(s.get("uniskill/candidates", 0) > 0 for s in steps):
        return None
    return ("uniskill: no step had a proposal candidate (a candidate needs a task group with at least two "
            "successes and two failures), so no skill was proposed. A policy "
            f"that wins about half makes some: `{WARM_POLICY_RECIPE}`, then train with "
            "--set model.path=runs/tiny/mixed")


def check_run_dir(cfg: TrainConfig, resume: bool) -> Path | None:
    """The checkpoint a run resumes from (None: it starts at step 1), or a ConfigError, before
    anything is written: without `--resume` a directory that already holds a run is refused rather
    than mixed with a new one; `--resume` needs a run (a checkpoint, or at least metrics.jsonl of a
    run stopped before its first checkpoint, which then starts over)."""
    run_dir = Path(cfg.run.output_dir)
    has_run = (run_dir / "metrics.jsonl").exists()
    if not resume:
        if has_run:
            raise ConfigError(f"{run_dir} already holds a run (metrics.jsonl): pass --resume to continue it, or "
                              "--set run.output_dir=<new dir> to start another")
        return None
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None and not has_run:
        raise ConfigError(f"--resume: {run_dir} holds no run to continue (no checkpoints/, no metrics.jsonl): "
                          "drop --resume to start it, or point run.output_dir at the run")
    return ckpt


def _prepare_run_dir(cfg: TrainConfig, resume: bool) -> Path | None:
    """`check_run_dir`; a resumed run without a checkpoint drops the steps it logged and starts over."""
    ckpt = check_run_dir(cfg, resume)
    if resume and ckpt is None:
        rewind_metrics(Path(cfg.run.output_dir) / "metrics.jsonl", 0)
        console.print(f"{cfg.run.output_dir} has no checkpoint yet: starting the run over at step 1")
    return ckpt


def _announce_ray_address(cfg: TrainConfig, run_dir: Path) -> None:
    """Write RUN/ray_address (the GCS address) so a second driver can attach while the run is
    live, e.g. to inspect the skill bank with `python -m deploy skills ls`."""
    import ray

    address = ray.get_runtime_context().gcs_address
    (run_dir / "ray_address").write_text(address + "\n")
    if cfg.uniskill.enabled:
        namespace = cfg.ray.namespace or cfg.run.name
        console.print(f"skill bank live: python -m deploy skills ls --address {address} --namespace {namespace}")


def run_training(cfg: TrainConfig, *, resume: bool = False, cluster: Cluster | None = None) -> Path:
    """Train; returns the run directory. `cluster` lets the demo reuse running actors."""
    ckpt = _prepare_run_dir(cfg, resume)
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": resolve_model_path(cfg.model.path)})})
    run_dir = Path(cfg.run.output_dir)
    save_resolved(cfg, run_dir)
    own = cluster is None
    cluster = cluster or Cluster.start(cfg, cfg.model.path)
    _announce_ray_address(cfg, run_dir)
    sink = MetricsSink(run_dir)
    trainer = Trainer(cfg, cluster, sink, TrainerState())
    try:
        if ckpt is not None:
            trainer.resume(ckpt)
            console.print(f"resumed from {ckpt} at step {trainer.state.step + 1}")
        trainer.run()
        trainer.faults.finish(trainer.state.step, cfg.run.total_steps)  # RUN/faults.json (`deploy.faults`)
        hint = uniskill_idle_hint(cfg, [json.loads(line) for line in sink.metrics_path.read_text().splitlines()])
        if hint is not None:
            console.print(hint, style="yellow", highlight=False)
    finally:
        trainer.close()
        sink.close()
        if own:
            cluster.shutdown()
    console.print(f"run written to {run_dir}")
    return run_dir


def print_eval(result: EvalResult) -> None:
    console.print(
        f"[bold]{result.label}[/] {result.split}: Avg@{result.k} {result.avg_at_k:.3f} ± {result.avg_at_k_se:.3f} "
        f"(s.e. over {result.num_tasks} tasks), Pass@{result.k} {result.pass_at_k:.3f}"
        + (f", score {result.score:.1f} ± {result.score_se:.1f}" if result.score is not None else ""))
    for ttype, r in result.per_task_type.items():
        console.print(f"    {ttype:<36} Avg@{result.k} {r.avg_at_k:.3f}  Pass@{result.k} {r.pass_at_k:.3f}  (n={r.num_tasks})"
                      + (f"  score {r.score:.1f}" if r.score is not None else ""))


def run_eval_command(cfg: TrainConfig, model_path: str, *, label: str = "eval",
                     skills: UniSkillStage | None = None, adapter: str | None = None) -> list[EvalResult]:
    """Evaluate an HF directory on the fixed set of every split of `eval.splits` with rollout
    workers only (no learner); writes eval/<label>[-<split>].json per split. `skills` fills the
    actor's skill slot (a finished UniSkill run's bank, `deploy.eval_skills`). `adapter`: a peft
    adapter directory applied on `model_path` (the base) in every engine (engine.lora_rank set)."""
    cluster = Cluster.start(cfg, resolve_model_path(model_path), with_learner=False)
    try:
        if adapter is not None:
            cluster.load_adapter(adapter, 0)
        results = run_evaluations(cluster, cfg, label=label, policy_version=0, skills=skills)
    finally:
        cluster.shutdown()
    out = Path(cfg.run.output_dir) / "eval"
    out.mkdir(parents=True, exist_ok=True)
    for result in results:
        (out / f"{result.label}.json").write_text(result.model_dump_json(indent=2))
        print_eval(result)
    return results
