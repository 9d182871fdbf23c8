"""Side-by-side final metrics of several runs: the last evaluation (Avg@k +- s.e., Pass@k, per
task type), last-5-step means of the health metrics (response length, repeated 4-gram ratio) and
the method, as a Markdown table and a bar chart (OUT with the suffixes .md and .png)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from deploy.analysis.uniskill_plots import read_metrics
from deploy.evaluation import EvalResult

HEALTH_KEYS = ("response_len_mean", "rep4gram_ratio")
LAST_STEPS = 5


@dataclass
class RunSummary:
    run_dir: str
    name: str
    method: str
    eval_label: str | None = None
    split: str | None = None
    k: int | None = None
    avg_at_k: float = math.nan
    avg_at_k_se: float = math.nan
    pass_at_k: float = math.nan
    per_task_type: dict[str, dict[str, float]] = field(default_factory=dict)
    response_len_mean: float = math.nan
    rep4gram_ratio: float = math.nan
    steps: int = 0


def _last_eval(run_dir: Path) -> EvalResult | None:
    results = [(EvalResult.model_validate_json(p.read_text()), p.name) for p in (run_dir / "eval").glob("*.json")]
    if not results:
        return None
    return max(results, key=lambda rp: (rp[0].policy_version, rp[1]))[0]


def _health(run_dir: Path) -> tuple[dict[str, float], int]:
    path = run_dir / "metrics.jsonl"
    records = read_metrics(run_dir) if path.exists() else []
    out = {}
    for key in HEALTH_KEYS:
        vals = [float(r[key]) for r in records if isinstance(r.get(key), (int, float))][-LAST_STEPS:]
        out[key] = sum(vals) / len(vals) if vals else math.nan
    return out, len(records)


def summarize_run(run_dir: Path) -> RunSummary:
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.resolved.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    run, method_section = ((cfg.get(k) if isinstance(cfg, dict) else None) for k in ("run", "method"))
    name = (run.get("name") if isinstance(run, dict) else None) or run_dir.name
    method = method_section.get("name", "?") if isinstance(method_section, dict) else "?"
    health, steps = _health(run_dir)
    s = RunSummary(run_dir=str(run_dir), name=name, method=method, steps=steps, **health)
    ev = _last_eval(run_dir)
    if ev is not None:
        s.eval_label, s.split, s.k = ev.label, ev.split, ev.k
        s.avg_at_k, s.avg_at_k_se, s.pass_at_k = ev.avg_at_k, ev.avg_at_k_se, ev.pass_at_k
        s.per_task_type = {t: {"avg_at_k": r.avg_at_k, "pass_at_k": r.pass_at_k, "num_tasks": r.num_tasks}
                           for t, r in sorted(ev.per_task_type.items())}
    return s


def _f(x: float, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def to_markdown(summaries: list[RunSummary]) -> str:
    types = sorted({t for s in summaries for t in s.per_task_type})
    head = ["run", "method", "eval", "Avg@k ± s.e.", "Pass@k", *[f"{t} Avg@k" for t in types],
            f"resp len (last {LAST_STEPS})", f"rep4gram (last {LAST_STEPS})", "steps"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summaries:
        ev = f"{s.eval_label} ({s.split}, k={s.k})" if s.eval_label else "-"
        avg = f"{_f(s.avg_at_k)} ± {_f(s.avg_at_k_se)}" if not math.isnan(s.avg_at_k) else "-"
        per = [_f(s.per_task_type[t]["avg_at_k"]) if t in s.per_task_type else "-" for t in types]
        row = [s.name, s.method, ev, avg, _f(s.pass_at_k), *per, _f(s.response_len_mean, 1),
               _f(s.rep4gram_ratio), str(s.steps)]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def plot(summaries: list[RunSummary], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    x = np.arange(len(summaries))
    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(summaries) + 2), 4))
    avg = np.nan_to_num(np.array([s.avg_at_k for s in summaries], dtype=float))
    se = np.nan_to_num(np.array([s.avg_at_k_se for s in summaries], dtype=float))
    pas = np.nan_to_num(np.array([s.pass_at_k for s in summaries], dtype=float))
    ax.bar(x - 0.2, avg, 0.4, yerr=se, capsize=4, label="Avg@k ± s.e.")
    ax.bar(x + 0.2, pas, 0.4, label="Pass@k")
    ax.set_xticks(x, [f"{s.name}\n({s.method})" for s in summaries])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success")
    ax.set_title("Final evaluation per run")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def compare_runs(run_dirs: list[Path], *, out: Path) -> list[RunSummary]:
    """Summaries in the given order; writes out.with_suffix('.md') and out.with_suffix('.png')."""
    summaries = [summarize_run(Path(d)) for d in run_dirs]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(to_markdown(summaries))
    plot(summaries, out.with_suffix(".png"))
    return summaries
