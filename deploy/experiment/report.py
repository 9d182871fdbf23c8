"""A grid's results: the per-run JSON (`RunResult`), the statistics over seeds and tasks, the Markdown
table, the learning-curve PNG and RESULTS/summary.json. The statistics are pure functions of
the run results; only `write_report` touches files.

Per arm: mean +- s.e. over seeds of the final Avg@k and Pass@k (each seed one number; s.e. =
sample std / sqrt(n seeds)). Paired differences vs the reference arm: over the seeds both arms
finished, each evaluation task's success is averaged over those seeds per arm; the difference
(arm - reference) per task is then summarised over tasks as mean +- s.e. and a 95% percentile
bootstrap CI (`deploy.analysis.stats.paired_bootstrap_ci`, tasks resampled as pairs). With the
initial model's evaluation (`InitialResult`), every arm is also compared with it the same way.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from deploy.analysis.stats import paired_bootstrap_ci
from deploy.evaluation import EvalResult
from deploy.experiment.analysis_figures import analysis_figures, figures_markdown


class CurvePoint(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    step: int
    value: float


class RunResult(BaseModel):
    """RESULTS/<arm>_seed<k>.json: everything the report needs from one finished run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    grid: str
    arm: str
    seed: int
    total_steps: int
    final_eval: EvalResult
    """The end-of-training evaluation on the grid's split (per_task feeds the paired differences)."""
    success_curve: list[CurvePoint]
    """On-policy success rate per training step (metrics.jsonl `success_rate`)."""
    eval_curve: list[CurvePoint]
    """Avg@k of every evaluation of the grid's split during the run (step 0 when eval.at_start)."""
    base: str
    overrides: list[str]
    config: dict[str, Any]
    """The run's config.resolved.json."""
    commit: str
    """`git rev-parse HEAD` of the code that ran (suffixed -dirty with uncommitted changes)."""
    seconds: float
    """Wall-clock seconds of the run's `deploy train` process(es), summed over sittings."""
    model_sha256: str | None = None
    """sha256 over the initial model's weight files (`model_digest`): every run of a grid must start
    from the same model, which a grid spread over several sittings and machines must show."""


class InitialResult(BaseModel):
    """RESULTS/initial.json: the initial model under the grid's evaluation, before any training
    (grid `initial_eval`); every arm is compared with it over tasks: what training added."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    grid: str
    eval: EvalResult
    commit: str
    seconds: float
    model_sha256: str


def mean_se(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and standard error (sample std / sqrt(n)); the s.e. of fewer than 2 values is None."""
    if not values:
        raise ValueError("mean_se of no values")
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


class ArmSummary(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    arm: str
    seeds: list[int]
    avg_at_k: float
    avg_at_k_se: float | None
    pass_at_k: float
    pass_at_k_se: float | None
    per_seed_avg_at_k: list[float]
    score: float | None = None
    """WebShop: mean over seeds of the evaluation score (None without a raw score)."""
    score_se: float | None = None
    minutes_per_run: float


class PairedSummary(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    arm: str
    reference: str
    seeds: list[int]
    """Seeds both arms finished (the per-task means are over these)."""
    num_tasks: int
    mean: float
    se: float | None
    lo: float
    hi: float


def summarize_arm(arm: str, runs: Sequence[RunResult]) -> ArmSummary:
    runs = sorted(runs, key=lambda r: r.seed)
    avg, avg_se = mean_se([r.final_eval.avg_at_k for r in runs])
    pas, pas_se = mean_se([r.final_eval.pass_at_k for r in runs])
    scores = [r.final_eval.score for r in runs if r.final_eval.score is not None]
    score, score_se = mean_se(scores) if len(scores) == len(runs) else (None, None)
    return ArmSummary(arm=arm, seeds=[r.seed for r in runs], avg_at_k=avg, avg_at_k_se=avg_se, pass_at_k=pas,
                      pass_at_k_se=pas_se, per_seed_avg_at_k=[r.final_eval.avg_at_k for r in runs],
                      score=score, score_se=score_se, minutes_per_run=sum(r.seconds for r in runs) / len(runs) / 60)


def per_task_means(runs: Sequence[RunResult]) -> dict[str, float]:
    """Task id -> success averaged over the runs (seeds); every run must cover the same tasks."""
    tasks = set(runs[0].final_eval.per_task)
    for r in runs:
        if set(r.final_eval.per_task) != tasks:
            raise ValueError(f"{r.arm} seed {r.seed} was evaluated on other tasks than {runs[0].arm} seed "
                             f"{runs[0].seed}: every run of a grid must share the evaluation (grid eval:)")
    return {t: sum(r.final_eval.per_task[t] for r in runs) / len(runs) for t in sorted(tasks)}


def paired_vs_reference(arm: str, runs: Sequence[RunResult], reference: str, ref_runs: Sequence[RunResult],
                        *, n_boot: int = 10_000) -> PairedSummary | None:
    """arm - reference over evaluation tasks, on the seeds both finished; None without a common seed."""
    seeds = sorted({r.seed for r in runs} & {r.seed for r in ref_runs})
    if not seeds:
        return None
    a = per_task_means([r for r in runs if r.seed in seeds])
    b = per_task_means([r for r in ref_runs if r.seed in seeds])
    if set(a) != set(b):
        raise ValueError(f"arms {arm} and {reference} were evaluated on different tasks")
    diffs = [a[t] - b[t] for t in a]
    mean, se = mean_se(diffs)
    _, lo, hi = paired_bootstrap_ci([a[t] for t in a], [b[t] for t in a], n_boot=n_boot)
    return PairedSummary(arm=arm, reference=reference, seeds=seeds, num_tasks=len(diffs), mean=mean, se=se,
                         lo=lo, hi=hi)


def paired_vs_initial(arm: str, runs: Sequence[RunResult], initial: InitialResult, *,
                      n_boot: int = 10_000) -> PairedSummary:
    """arm - the initial model over evaluation tasks (the arm's per-task success averaged over its seeds)."""
    a, b = per_task_means(runs), initial.eval.per_task
    if set(a) != set(b):
        raise ValueError(f"arm {arm} and the initial model were evaluated on different tasks: delete "
                         "initial.json and run the grid again to re-evaluate the initial model")
    mean, se = mean_se([a[t] - b[t] for t in a])
    _, lo, hi = paired_bootstrap_ci([a[t] for t in a], [b[t] for t in a], n_boot=n_boot)
    return PairedSummary(arm=arm, reference="initial", seeds=sorted(r.seed for r in runs), num_tasks=len(a),
                         mean=mean, se=se, lo=lo, hi=hi)


def _pm(mean: float | None, se: float | None, fmt: str = ".3f") -> str:
    if mean is None:
        return "-"
    return f"{mean:{fmt}} ± {se:{fmt}}" if se is not None else f"{mean:{fmt}} (1 seed)"


def markdown_table(arms: list[ArmSummary], paired: dict[str, PairedSummary | None], *, reference: str, k: int,
                   missing: list[str]) -> str:
    has_score = any(a.score is not None for a in arms)
    head = ["arm", "seeds", f"Avg@{k} (mean ± s.e. over seeds)", f"Pass@{k}"]
    head += ["score"] if has_score else []
    head += [f"Δ Avg@{k} vs {reference} (over tasks)", "95% CI", "min/run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a in arms:
        p = paired.get(a.arm)
        row = [a.arm, ",".join(map(str, a.seeds)), _pm(a.avg_at_k, a.avg_at_k_se), _pm(a.pass_at_k, a.pass_at_k_se)]
        row += [_pm(a.score, a.score_se, ".1f")] if has_score else []
        if a.arm == reference:
            row += ["(reference)", "", f"{a.minutes_per_run:.1f}"]
        elif p is None:
            row += ["no common seed", "", f"{a.minutes_per_run:.1f}"]
        else:
            se = f" ± {p.se:.3f}" if p.se is not None else ""
            row += [f"{p.mean:+.3f}{se} (n={p.num_tasks} tasks, seeds {','.join(map(str, p.seeds))})",
                    f"[{p.lo:+.3f}, {p.hi:+.3f}]", f"{a.minutes_per_run:.1f}"]
        lines.append("| " + " | ".join(row) + " |")
    if missing:
        lines.append("")
        lines.append(f"Not finished yet: {', '.join(missing)}.")
    return "\n".join(lines) + "\n"


def curve_band(runs: Sequence[RunResult], attr: str = "success_curve") -> tuple[list[int], list[float], list[float]]:
    """Steps present in every run, the mean over runs and the s.e. (0 with one run)."""
    curves = [{p.step: p.value for p in getattr(r, attr)} for r in runs]
    steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    means, ses = [], []
    for s in steps:
        m, se = mean_se([c[s] for c in curves])
        means.append(m)
        ses.append(se or 0.0)
    return steps, means, ses


def plot_curves(by_arm: dict[str, list[RunResult]], path: Path, *, title: str, k: int) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for arm, runs in by_arm.items():
        for ax, attr in zip(axes, ("success_curve", "eval_curve"), strict=True):
            steps, means, ses = curve_band(runs, attr)
            if not steps:
                continue
            line, = ax.plot(steps, means, marker="o" if len(steps) < 12 else None, label=f"{arm} (n={len(runs)})")
            ax.fill_between(steps, [m - s for m, s in zip(means, ses, strict=True)],
                            [m + s for m, s in zip(means, ses, strict=True)], color=line.get_color(), alpha=0.2)
    axes[0].set_title("on-policy success (mean ± s.e. over seeds)")
    axes[1].set_title(f"evaluation Avg@{k} (mean ± s.e. over seeds)")
    for ax in axes:
        ax.set_xlabel("training step")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def load_results(paths: Sequence[Path]) -> list[RunResult]:
    return [RunResult.model_validate_json(p.read_text()) for p in paths if p.is_file()]


def check_one_model(results: Sequence[RunResult], initial: InitialResult | None = None) -> None:
    """Refuse a grid whose runs (and initial evaluation) started from different initial models (a
    rebuilt testbed model)."""
    digests: dict[str | None, list[str]] = {}
    for r in results:
        digests.setdefault(r.model_sha256, []).append(f"{r.arm}_seed{r.seed}")
    if initial is not None:
        digests.setdefault(initial.model_sha256, []).append("initial.json")
    if len(digests) > 1:
        listing = "; ".join(f"{(d or 'unrecorded')[:12]}: {', '.join(keys)}" for d, keys in digests.items())
        raise ValueError(f"the grid's runs started from {len(digests)} different initial models ({listing}); "
                         "a comparison needs one: delete the results of the runs from the wrong model and run "
                         "them again from the grid's model")


def comparisons_table(pairs: Sequence[PairedSummary], k: int) -> str:
    lines = [f"| A - B | Δ Avg@{k} (mean ± s.e. over tasks) | 95% CI | tasks | seeds |", "|---|---|---|---|---|"]
    for p in pairs:
        se = f" ± {p.se:.3f}" if p.se is not None else ""
        lines.append(f"| {p.arm} - {p.reference} | {p.mean:+.3f}{se} | [{p.lo:+.3f}, {p.hi:+.3f}] | {p.num_tasks} | "
                     f"{','.join(map(str, p.seeds))} |")
    return "\n".join(lines) + "\n"


def write_report(grid_name: str, arms: Sequence[str], reference: str, results: Sequence[RunResult],
                 out_dir: Path, *, expected: Sequence[str], k: int,
                 comparisons: Sequence[tuple[str, str]] = (), initial: InitialResult | None = None) -> tuple[str, Path]:
    """README.md, curves.png and summary.json under `out_dir`; returns (the table, summary path).
    `comparisons`: further (A, B) pairs reported as A - B next to every arm vs the reference;
    `initial`: the initial model's evaluation, every arm reported as arm - initial too."""
    check_one_model(results, initial)
    by_arm = {arm: [r for r in results if r.arm == arm] for arm in arms}
    by_arm = {arm: runs for arm, runs in by_arm.items() if runs}
    summaries = [summarize_arm(arm, runs) for arm, runs in by_arm.items()]
    ref_runs = by_arm.get(reference, [])
    paired = {arm: paired_vs_reference(arm, runs, reference, ref_runs) if ref_runs else None
              for arm, runs in by_arm.items() if arm != reference}
    done = {f"{r.arm}_seed{r.seed}" for r in results}
    missing = [key for key in expected if key not in done]
    table = f"## Grid {grid_name}\n\n" + markdown_table(summaries, paired, reference=reference, k=k, missing=missing)
    extra = [p for a, b in comparisons if a in by_arm and b in by_arm
             and (p := paired_vs_reference(a, by_arm[a], b, by_arm[b])) is not None]
    if extra:
        table += "\nFurther paired differences (per task: mean over the seeds both arms finished):\n\n"
        table += comparisons_table(extra, k)
    vs_initial = []
    if initial is not None:
        vs_initial = [paired_vs_initial(arm, runs, initial) for arm, runs in by_arm.items()]
        e = initial.eval
        table += (f"\nInitial model, before training (the same evaluation): Avg@{k} {e.avg_at_k:.3f} ± "
                  f"{e.avg_at_k_se:.3f} (s.e. over tasks), Pass@{k} {e.pass_at_k:.3f}. What training added, per task "
                  f"(the arm's mean over its seeds - the initial model):\n\n" + comparisons_table(vs_initial, k))
    figures = analysis_figures(out_dir / "analysis")
    table += figures_markdown(figures)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "README.md").write_text(table)
    png = plot_curves(by_arm, out_dir / "curves.png", title=f"grid {grid_name}", k=k) if by_arm else None
    summary = {"grid": grid_name, "reference": reference, "k": k, "missing": missing,
               "model_sha256": results[0].model_sha256 if results else None,
               "arms": [s.model_dump() for s in summaries],
               "paired_vs_reference": {a: (p.model_dump() if p else None) for a, p in paired.items()},
               "comparisons": [p.model_dump() for p in extra],
               "initial": ({"avg_at_k": initial.eval.avg_at_k, "avg_at_k_se": initial.eval.avg_at_k_se,
                            "pass_at_k": initial.eval.pass_at_k, "model_sha256": initial.model_sha256,
                            "commit": initial.commit} if initial else None),
               "paired_vs_initial": {p.arm: p.model_dump() for p in vs_initial},
               "analyses": figures,
               "curves": {arm: dict(zip(("steps", "mean", "se"), curve_band(runs), strict=True))
                          for arm, runs in by_arm.items()},
               "readme_md": str(out_dir / "README.md"), "curves_png": str(png) if png else None}
    path = out_dir / "summary.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return table, path
