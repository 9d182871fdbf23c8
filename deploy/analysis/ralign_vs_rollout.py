"""Does R_align predict a proposal's real effect? (docs/algorithms.md S8: the paper reports Spearman
rho 0.312 / 0.367 between R_align and the rollout gain, and that 24.5% / 15.6% of the positive
proposals still lose.) For analysis only: training never runs these rollouts.

For a sample of archived ADD/UPDATE proposals that have an R_align (RUN/uniskill/proposals_step_N.jsonl,
written by the trainer), play K episodes of the proposal's task with the proposed skill s~ in the
actor's skill slot and K with s_orig (the skill that was retrieved when it was proposed; no skill
when the bank had none), on the same task (same env reset seed; the in-process runner also reuses
the sampling seed, common random numbers). gain = success(s~) - success(s_orig).

`rank_stats` (pure) gives Spearman rho (average ranks for ties), the mean gain of positive and
non-positive R_align proposals and the share of positive proposals whose gain < 0.
`measure_gains` plays the episodes through an `EpisodeRunner`: `cluster_runner` (rollout workers of
a local Ray cluster started from the run's config) or `local_runner` (an engine and EnvPools in
this process). `run_ralign_vs_rollout` writes RUN/analysis/ralign_vs_rollout.{json,png}; with
`steps` it plays each listed step's proposals with the policy that scored them (`policy_at_step`:
the checkpoint after the previous step), as the paper reports steps 25 and 75 separately.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from deploy.plots import save_figure
from deploy.stages.uniskill import ProposalRecord
from envs.types import TaskSpec
from rollout_workers.types import Trajectory

EpisodeRunner = Callable[[Sequence[TaskSpec], Mapping[str, str | None], int, int], list[Trajectory]]
"""(tasks, task_id -> skill slot text, k episodes per task, seed) -> trajectories (grouped by task)."""


# ---- pure statistics -----------------------------------------------------------------------------


def average_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks; tied values share the mean of the ranks they span."""
    from scipy.stats import rankdata

    return [float(r) for r in rankdata(values, method="average")]


def spearman(x: Sequence[float], y: Sequence[float]) -> tuple[float | None, str]:
    """(rho, "") or (None, reason): Spearman's rho (ties share average ranks), with the cases
    where it is undefined named instead of returned as NaN."""
    if len(x) != len(y):
        raise ValueError(f"spearman needs paired values, got {len(x)} and {len(y)}")
    if len(x) < 3:
        return None, f"n={len(x)} < 3 pairs"
    if len(set(x)) == 1:
        return None, "R_align is constant over the sample"
    if len(set(y)) == 1:
        return None, "the rollout gain is constant over the sample (e.g. every arm always fails: raise --k)"
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).statistic), ""


@dataclass
class AlignStats:
    n: int
    spearman_rho: float | None
    rho_reason: str
    """Why rho is None ("" when it is not)."""
    n_positive: int
    n_nonpositive: int
    mean_gain_positive: float | None
    mean_gain_nonpositive: float | None
    share_positive_losing: float | None
    """Among proposals with R_align > 0: the share whose gain < 0 (None without positive ones)."""
    mean_gain: float | None


def rank_stats(r_align: Sequence[float], gain: Sequence[float]) -> AlignStats:
    """Pure: Spearman rho between R_align and the rollout gain, and the positive/negative split."""
    rho, reason = spearman(r_align, gain)
    pos = [g for r, g in zip(r_align, gain, strict=True) if r > 0]
    neg = [g for r, g in zip(r_align, gain, strict=True) if r <= 0]

    def mean(v: Sequence[float]) -> float | None:
        return sum(v) / len(v) if v else None

    return AlignStats(
        n=len(gain), spearman_rho=rho, rho_reason=reason, n_positive=len(pos), n_nonpositive=len(neg),
        mean_gain_positive=mean(pos), mean_gain_nonpositive=mean(neg),
        share_positive_losing=sum(g < 0 for g in pos) / len(pos) if pos else None, mean_gain=mean(gain))


# ---- proposals ----------------------------------------------------------------------------------------


def load_proposals(run_dir: Path) -> list[ProposalRecord]:
    """Every archived proposal of the run, in step order."""
    files = sorted(Path(run_dir, "uniskill").glob("proposals_step_*.jsonl"))
    # split on "\n" only: str.splitlines() also breaks at U+2028 / U+0085, which JSON leaves unescaped
    return [ProposalRecord.model_validate_json(line) for p in files for line in p.read_text().split("\n")
            if line.strip()]


def eligible(records: Sequence[ProposalRecord]) -> list[ProposalRecord]:
    """ADD/UPDATE proposals after warm-up with a text and an R_align (unscored ones have none)."""
    return [r for r in records
            if r.op in ("add", "update") and not r.warmup and r.r_align is not None and r.text.strip()]


def sample_proposals(records: Sequence[ProposalRecord], n: int, seed: int) -> list[ProposalRecord]:
    """Up to n eligible proposals drawn uniformly at random, returned in (step, candidate) order."""
    pool = eligible(records)
    picked = random.Random(seed).sample(pool, min(n, len(pool)))
    return sorted(picked, key=lambda r: (r.step, r.candidate_id))


# ---- rollouts ------------------------------------------------------------------------------------------


@dataclass
class ProposalGain:
    step: int
    candidate_id: str
    task_id: str
    task_type: str
    op: str
    r_align: float
    success_new: float
    success_orig: float
    gain: float
    episodes: int
    """Episodes per arm (K)."""
    decision: str | None


def _rounds(props: Sequence[ProposalRecord]) -> list[list[ProposalRecord]]:
    """Split so that a task appears at most once per round (the skill slot is keyed by task_id)."""
    rounds: list[list[ProposalRecord]] = []
    for p in props:
        for r in rounds:
            if all(q.task.task_id != p.task.task_id for q in r):
                r.append(p)
                break
        else:
            rounds.append([p])
    return rounds


def _success(trajs: Sequence[Trajectory], task_id: str) -> tuple[float, int]:
    mine = [t.success for t in trajs if t.task.task_id == task_id]
    if not mine:
        raise RuntimeError(f"the runner returned no episode of task {task_id!r}")
    return sum(mine) / len(mine), len(mine)


def measure_gains(props: Sequence[ProposalRecord], runner: EpisodeRunner, *, k: int, seed: int) -> list[ProposalGain]:
    """K episodes per arm and proposal: s~ in the skill slot vs s_orig, same tasks, same seed per round."""
    out: list[ProposalGain] = []
    for i, rnd in enumerate(_rounds(props)):
        tasks = [p.task for p in rnd]
        round_seed = seed * 1000 + i
        new = runner(tasks, {p.task.task_id: p.text for p in rnd}, k, round_seed)
        orig = runner(tasks, {p.task.task_id: p.orig_text for p in rnd}, k, round_seed)
        for p in rnd:
            s_new, n_new = _success(new, p.task.task_id)
            s_orig, _ = _success(orig, p.task.task_id)
            out.append(ProposalGain(step=p.step, candidate_id=p.candidate_id, task_id=p.task.task_id,
                                    task_type=p.task_type, op=p.op or "", r_align=float(p.r_align or 0.0),
                                    success_new=s_new, success_orig=s_orig, gain=s_new - s_orig, episodes=n_new,
                                    decision=p.decision))
    return sorted(out, key=lambda g: (g.step, g.candidate_id))


def local_runner(engine, pools: Sequence, rollout_cfg, *, temperature: float) -> EpisodeRunner:
    """Episodes in this process (`rollout_workers.loop.run_episodes`); both arms of a round get the
    same sampling seed."""
    from rollout_workers.loop import run_episodes

    def run(tasks, skill_texts, k, seed):
        trajs, _ = run_episodes(engine, pools, tasks, group_size=k, policy_version=0, cfg=rollout_cfg,
                                temperature=temperature, seed=seed, skill_texts=skill_texts)
        return trajs

    return run


def cluster_runner(cluster, *, temperature: float) -> EpisodeRunner:
    """Episodes on the rollout workers of a started `deploy.cluster.Cluster` (the workers derive
    their sampling seeds per call, so the arms share the task and its env seed, not the sampling)."""

    def run(tasks, skill_texts, k, seed):
        trajs, _ = cluster.collect(tasks, group_size=k, policy_version=0, temperature=temperature,
                                   skill_texts=dict(skill_texts))
        return trajs

    return run


# ---- result, plot, entry point --------------------------------------------------------------------------


@dataclass
class RalignVsRolloutResult:
    run_dir: str
    model_path: str
    k: int
    seed: int
    num_eligible: int
    stats: AlignStats
    by_step: dict[str, AlignStats] = field(default_factory=dict)
    gains: list[ProposalGain] = field(default_factory=list)
    models: dict[str, str] = field(default_factory=dict)
    """The weights each step's arms were played with ("all" without --steps)."""
    skipped_steps: dict[str, str] = field(default_factory=dict)
    """--steps given but not analysed: step -> why (no archived ADD/UPDATE proposal with an R_align)."""
    json_path: str | None = None
    png_path: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


def summary_line(stats: AlignStats) -> str:
    rho = f"{stats.spearman_rho:+.3f}" if stats.spearman_rho is not None else f"None ({stats.rho_reason})"
    return f"spearman rho: {rho} (n={stats.n})"


def plot(result: RalignVsRolloutResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for op, color in (("add", "C2"), ("update", "C1")):
        pts = [(g.r_align, g.gain) for g in result.gains if g.op == op]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=22, alpha=0.75, color=color, label=op.upper())
    ax.axhline(0, color="black", lw=0.8)
    ax.axvline(0, color="black", lw=0.8, ls=":")
    ax.set_xlabel("R_align (raw)")
    ax.set_ylabel(f"rollout gain: success(s~) - success(s_orig), K={result.k}")
    ax.set_title(summary_line(result.stats))
    ax.grid(alpha=0.3)
    if result.gains:
        ax.legend(loc="best", fontsize=8)
    return save_figure(fig, path, dpi=120)


def analyse(gains: Sequence[ProposalGain]) -> tuple[AlignStats, dict[str, AlignStats]]:
    """Overall stats and per training step."""
    overall = rank_stats([g.r_align for g in gains], [g.gain for g in gains])
    steps = sorted({g.step for g in gains})
    by_step = {str(s): rank_stats([g.r_align for g in gains if g.step == s], [g.gain for g in gains if g.step == s])
               for s in steps}
    return overall, by_step


def policy_at_step(run_dir: Path, step: int, *, base_model: str) -> str:
    """The weights that generated and scored the proposals of training step `step` (1-based): the
    pre-update policy of that step, i.e. the checkpoint written after step - 1
    (RUN/checkpoints/step_<step-1>/hf), or the run's initial model for step 1."""
    if step < 1:
        raise ValueError(f"--steps: training steps start at 1, got {step}")
    if step == 1:
        return base_model
    hf = Path(run_dir) / "checkpoints" / f"step_{step - 1:06d}" / "hf"
    if not hf.is_dir():
        have = sorted(int(p.parent.name.removeprefix("step_")) for p in (Path(run_dir) / "checkpoints").glob("step_*/hf"))
        raise ValueError(f"{run_dir}: step {step}'s proposals were scored by the policy after step {step - 1}, and "
                         f"checkpoints/step_{step - 1:06d}/hf does not exist (checkpoints of steps {have or 'none'}); "
                         f"train with run.checkpoint_every dividing {step - 1} (e.g. 1) to analyse step {step}")
    return str(hf)


def _play(props: Sequence[ProposalRecord], run_dir: Path, model_path: str | None, runner: EpisodeRunner | None,
          *, k: int, seed: int) -> list[ProposalGain]:
    cluster = None
    if runner is None:
        from deploy.cluster import Cluster
        from deploy.config_loading import load_config

        if model_path is None:
            raise ValueError("model_path is required when no runner is given")
        cfg = load_config(run_dir / "config.resolved.json", [f"model.path={model_path}"])
        cluster = Cluster.start(cfg, model_path, with_learner=False)
        runner = cluster_runner(cluster, temperature=cfg.rollout.temperature)
    try:
        return measure_gains(props, runner, k=k, seed=seed)
    finally:
        if cluster is not None:
            cluster.shutdown()


def run_ralign_vs_rollout(run_dir: Path, *, model_path: str | None = None, sample: int = 32, k: int = 4,
                          seed: int = 0, out_dir: Path | None = None, runner: EpisodeRunner | None = None,
                          steps: Sequence[int] | None = None,
                          runner_for: Callable[[str], EpisodeRunner] | None = None) -> RalignVsRolloutResult:
    """Sample, play both arms (on a local cluster from RUN/config.resolved.json unless `runner` is
    given), analyse, write JSON + PNG under RUN/analysis (or out_dir).

    `steps` (the paper's per-step analysis, e.g. 25 and 75): up to `sample` proposals of each listed
    step, each step's arms played with the policy of that step (`policy_at_step`; `model_path`
    must then be None); `runner_for(model)` replaces the cluster per step in tests."""
    run_dir = Path(run_dir)
    if k < 1 or sample < 1:
        raise ValueError(f"--k ({k}) and --sample ({sample}) must be >= 1")
    records = load_proposals(run_dir)
    skipped: dict[str, str] = {}
    if not records:
        raise ValueError(f"{run_dir}/uniskill holds no proposals_step_*.jsonl: train a UniSkill run (the trainer "
                         "archives every step's proposals there)")
    if steps is None:
        props = sample_proposals(records, sample, seed)
        if not props:
            raise ValueError(f"{run_dir}: none of the {len(records)} archived proposals is an ADD/UPDATE with an "
                             "R_align (warm-up steps have none): train past uniskill.bank.warmup_steps")
        gains = _play(props, run_dir, model_path, runner, k=k, seed=seed)
        models = {"all": str(model_path or "(runner)")}
    else:
        if model_path is not None or runner is not None:
            raise ValueError("--steps loads each step's own policy: do not pass --model (or a runner)")
        base = json.loads((run_dir / "config.resolved.json").read_text())["model"]["path"]
        gains, models = [], {}
        have = sorted({r.step for r in eligible(records)})
        if not set(steps) & set(have):
            raise ValueError(f"{run_dir}: none of steps {sorted(set(steps))} has an archived ADD/UPDATE proposal with "
                             f"an R_align (steps that have: {have or 'none'})")
        for step in sorted(set(steps)):
            props = sample_proposals([r for r in records if r.step == step], sample, seed)
            if not props:  # e.g. the proposer stopped proposing edits: reported, the other steps still run
                skipped[str(step)] = f"no archived ADD/UPDATE proposal with an R_align (steps that have: {have})"
                continue
            models[str(step)] = policy_at_step(run_dir, step, base_model=base)
            step_runner = runner_for(models[str(step)]) if runner_for is not None else None
            gains += _play(props, run_dir, models[str(step)], step_runner, k=k, seed=seed)
    overall, by_step = analyse(gains)
    result = RalignVsRolloutResult(run_dir=str(run_dir), model_path=str(model_path or "(runner)"), k=k, seed=seed,
                                   num_eligible=len(eligible(records)), stats=overall, by_step=by_step, gains=gains,
                                   models=models, skipped_steps=skipped)
    out = Path(out_dir) if out_dir is not None else run_dir / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    result.png_path = str(plot(result, out / "ralign_vs_rollout.png"))
    result.json_path = str(out / "ralign_vs_rollout.json")
    Path(result.json_path).write_text(json.dumps(result.to_json(), indent=2))
    return result
