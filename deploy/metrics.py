"""Run outputs: metrics.jsonl (one line per step), eval/*.json, TensorBoard events, plots/*.png.

`rollout_metrics` is pure (trajectories -> scalars); `MetricsSink` does the I/O.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

from deploy.evaluation import EvalResult
from deploy.trackers import Tracker, make_trackers
from rollout_workers.env_profiles import rollout_profile
from rollout_workers.summaries import rep4gram_ratio
from rollout_workers.types import AnyTrajectory, Trajectory


def rollout_metrics(trajectories: Sequence[AnyTrajectory]) -> dict[str, float]:
    """On-policy rollout health: success, reward, response length, repetition, failure modes.

    For episodes of an env that reports a raw task score, also its `task_score_metric`
    (`rollout_workers.env_profiles`; WebShop: `webshop_task_score`, verl-agent's
    `webshop_task_score (not success_rate)`): their mean raw task score in [0, 1] (an episode
    without a purchase counts 0).
    """
    turns = [turn for t in trajectories for turn in t.turns]
    n_ep = max(len(trajectories), 1)
    n_turns = max(len(turns), 1)
    reasons = Counter(t.end_reason for t in trajectories)
    task_scores: dict[str, list[float]] = {}
    for t in trajectories:
        metric = rollout_profile(t.task.env).task_score_metric
        if metric is not None:
            task_scores.setdefault(metric, []).append(t.task_score or 0.0)
    extra = {metric: sum(scores) / len(scores) for metric, scores in task_scores.items()}
    return {
        "success_rate": sum(t.success for t in trajectories) / n_ep,
        "reward_mean": sum(t.score for t in trajectories) / n_ep,
        "episodes": float(len(trajectories)),
        "turns": float(len(turns)),
        "episode_len_mean": len(turns) / n_ep,
        "response_len_mean": sum(x.num_response_tokens for x in turns) / n_turns,
        "rep4gram_ratio": sum(rep4gram_ratio(x) for x in turns) / n_turns,
        "invalid_action_rate": sum(not x.action_valid for x in turns) / n_turns,
        "tokens_generated": float(sum(x.num_response_tokens for x in turns)),
        "tokens_prompt": float(sum(x.num_prompt_tokens for x in turns)),
        "episodes_env_error": float(reasons.get("env_error", 0)),
        "episodes_prompt_too_long": float(reasons.get("prompt_too_long", 0)),
        **extra,
    }


class MetricsSink:
    """Appends step records to metrics.jsonl, writes eval JSON, feeds the trackers `run.loggers`
    names (deploy/trackers.py: TensorBoard, W&B) and draws plots.

    `loggers` None = `run.loggers` of RUN/config.resolved.json (written before the sink opens; the
    resolved config is W&B's run config), or TensorBoard alone when the run has no saved config."""

    def __init__(self, run_dir: str | Path, *, loggers: Sequence[str] | None = None):
        self.run_dir = Path(run_dir)
        for sub in ("eval", "plots"):
            (self.run_dir / sub).mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        cfg_path = self.run_dir / "config.resolved.json"
        self._config = json.loads(cfg_path.read_text()) if cfg_path.exists() else None
        if loggers is None:
            run = (self._config or {}).get("run", {})
            loggers = run.get("loggers", ("tensorboard",)) if isinstance(run, dict) else ("tensorboard",)
        self.loggers = tuple(loggers)
        self._trackers: list[Tracker] | None = None

    def _active(self) -> list[Tracker]:
        if self._trackers is None:
            self._trackers = make_trackers(self.run_dir, self.loggers, config=self._config)
        return self._trackers

    def log_step(self, record: dict[str, float | int]) -> None:
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        step = int(record["step"])
        scalars = {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float))}
        for tracker in self._active():
            tracker.log_scalars(scalars, step)

    def log_eval(self, result: EvalResult, *, step: int) -> Path:
        """eval/<label>.json, and eval/<split>/* in every tracker (W&B: also the per-type table)."""
        path = self.run_dir / "eval" / f"{result.label}.json"
        path.write_text(result.model_dump_json(indent=2))
        for tracker in self._active():
            tracker.log_eval(result, step)
        return path

    def trajectories_path(self, step: int) -> Path:
        """trajectories/step_N.jsonl (written here, or by learner rank 0: `deploy.step_rows`)."""
        return self.run_dir / "trajectories" / f"step_{step:06d}.jsonl"

    def save_trajectories(self, step: int, trajectories: Sequence[Trajectory]) -> Path:
        """trajectories/step_N.jsonl: one Trajectory (exact ids, texts, actions) per line."""
        path = self.trajectories_path(step)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(t.model_dump_json() + "\n" for t in trajectories))
        return path

    def save_proposals(self, step: int, records: Sequence[BaseModel]) -> Path | None:
        """uniskill/proposals_step_N.jsonl: one UniSkill proposal record (deploy.stages.uniskill.
        ProposalRecord) per line, for `analyze ralign-vs-rollout`. Nothing written without records."""
        if not records:
            return None
        path = self.run_dir / "uniskill" / f"proposals_step_{step:06d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(r.model_dump_json() + "\n" for r in records))
        return path

    def read_steps(self) -> list[dict]:
        if not self.metrics_path.exists():
            return []
        return [json.loads(line) for line in self.metrics_path.read_text().splitlines() if line.strip()]

    def read_evals(self) -> list[EvalResult]:
        return [EvalResult.model_validate_json(p.read_text()) for p in sorted((self.run_dir / "eval").glob("*.json"))]

    def plot(self) -> list[Path]:
        """plots/success.png (on-policy and fixed-set eval), plots/loss.png and, for UniSkill runs,
        plots/skills_ops.png and plots/skills_bank.png."""
        from deploy.plots import plot_losses, plot_skills, plot_success

        steps = self.read_steps()
        evals = self.read_evals()
        return [plot_success(steps, evals, self.run_dir / "plots" / "success.png"),
                plot_losses(steps, self.run_dir / "plots" / "loss.png"),
                *plot_skills(steps, self.run_dir / "plots")]

    def close(self) -> None:
        for tracker in self._trackers or []:
            tracker.close()
        self._trackers = None
