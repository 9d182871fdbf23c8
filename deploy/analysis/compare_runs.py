"""Side-by-side final metrics of several runs: the last evaluation (Avg@k +- s.e., Pass@k, per
task type), last-5-step means of the health metrics (response length, repeated 4-gram ratio) and
the method, as a Markdown table and a bar chart (OUT with the suffixes .md and .png).

Inputs are run directories or committed results files (results/*.json, deploy/analysis/
results_tables.py), rendered in the `runs` layout or in a paper's (`smrc_sd`, `uniskill`); a run
evaluated on several splits gives one row per split (or only `split`). `export_results` writes the
rows of run directories as a results file with the command and the commit."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from deploy.analysis.results_tables import LAYOUTS, ResultRow, ResultsFile, read_results
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


def _evals(run_dir: Path) -> list[tuple[EvalResult, str]]:
    return [(EvalResult.model_validate_json(p.read_text()), p.name) for p in sorted((run_dir / "eval").glob("*.json"))]


def _last_eval(run_dir: Path, split: str | None = None) -> EvalResult | None:
    """The last evaluation (of `split` when given; else valid_unseen when the last policy was evaluated
    on it, else the last file of the last policy version)."""
    results = [rp for rp in _evals(run_dir) if split is None or rp[0].split == split]
    if not results:
        return None
    last = max(rp[0].policy_version for rp in results)
    finals = [rp for rp in results if rp[0].policy_version == last]
    unseen = [rp for rp in finals if rp[0].split == "valid_unseen"]
    return max(unseen or finals, key=lambda rp: rp[1])[0]


def _health(run_dir: Path) -> tuple[dict[str, float], int]:
    path = run_dir / "metrics.jsonl"
    records = read_metrics(run_dir) if path.exists() else []
    out = {}
    for key in HEALTH_KEYS:
        vals = [float(r[key]) for r in records if isinstance(r.get(key), (int, float))][-LAST_STEPS:]
        out[key] = sum(vals) / len(vals) if vals else math.nan
    return out, len(records)


def summarize_run(run_dir: Path, split: str | None = None) -> RunSummary:
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.resolved.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    run, method_section = ((cfg.get(k) if isinstance(cfg, dict) else None) for k in ("run", "method"))
    name = (run.get("name") if isinstance(run, dict) else None) or run_dir.name
    method = method_section.get("name", "?") if isinstance(method_section, dict) else "?"
    health, steps = _health(run_dir)
    s = RunSummary(run_dir=str(run_dir), name=name, method=method, steps=steps, **health)
    ev = _last_eval(run_dir, split)
    if ev is not None:
        s.eval_label, s.split, s.k = ev.label, ev.split, ev.k
        s.avg_at_k, s.avg_at_k_se, s.pass_at_k = ev.avg_at_k, ev.avg_at_k_se, ev.pass_at_k
        s.per_task_type = {t: {"avg_at_k": r.avg_at_k, "pass_at_k": r.pass_at_k, "num_tasks": r.num_tasks}
                           for t, r in sorted(ev.per_task_type.items())}
    return s


def _run_method(cfg: dict) -> tuple[str, bool | None]:
    """(method label, retrieval at eval): the UniSkill variant for UniSkill runs, else method.name."""
    method = (cfg.get("method") or {}).get("name", "?") if isinstance(cfg.get("method"), dict) else "?"
    u = cfg.get("uniskill") if isinstance(cfg.get("uniskill"), dict) else {}
    if not u.get("enabled"):
        return method, None
    variant = u.get("variant", "uniskill")
    return (variant if method == "grpo" else f"{variant}+{method}"), bool(u.get("retrieval_at_eval", True))


def run_rows(run_dir: Path, split: str | None = None) -> list[ResultRow]:
    """One row per split evaluated with the run's last policy (only `split` when given). Response
    length and repeated 4-gram ratio come from the evaluation when it recorded them, else from the
    last 5 training steps."""
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.resolved.json"
    try:
        cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    except ValueError:
        cfg = {}
    cfg = cfg if isinstance(cfg, dict) else {}
    summary = summarize_run(run_dir, split)
    method, retrieval = _run_method(cfg)
    model = (cfg.get("model") or {}).get("path") if isinstance(cfg.get("model"), dict) else None
    env = (cfg.get("env") or {}).get("name", "alfworld") if isinstance(cfg.get("env"), dict) else "alfworld"
    last = _last_eval(run_dir, split)
    evals = [] if last is None else [ev for ev, _ in _evals(run_dir) if ev.policy_version == last.policy_version
                                     and (split is None or ev.split == split)]
    rows = []
    for ev in evals or [None]:
        rows.append(ResultRow(
            name=summary.name, method=method, model=model, env=str(env),
            split=ev and ev.split, k=ev and ev.k, avg_at_k=ev and ev.avg_at_k, avg_at_k_se=ev and ev.avg_at_k_se,
            pass_at_k=ev and ev.pass_at_k, score=ev and ev.score,
            per_task_type={t: r.avg_at_k for t, r in sorted(ev.per_task_type.items())} if ev else {},
            response_len_mean=_finite(ev.response_len_mean if ev and ev.response_len_mean is not None
                                      else summary.response_len_mean),
            rep4gram_ratio=_finite(ev.rep4gram_ratio if ev and ev.rep4gram_ratio is not None else summary.rep4gram_ratio),
            steps=summary.steps, retrieval=retrieval))
    return rows


def _finite(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else x


def load_rows(inputs: list[Path], split: str | None = None) -> list[ResultRow]:
    """Rows of every input in order: a run directory's evaluations, or a results file's rows."""
    rows: list[ResultRow] = []
    for item in map(Path, inputs):
        if item.is_dir():
            rows.extend(run_rows(item, split))
        elif item.suffix == ".json" and item.is_file():
            rows.extend(r for r in read_results(item).rows if split is None or r.split in (None, split))
        else:
            raise ValueError(f"{item}: neither a run directory nor a results JSON file (results/*.json)")
    return rows


def plot(rows: list[ResultRow], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    def arr(values):
        return np.nan_to_num(np.array([np.nan if v is None else v for v in values], dtype=float))

    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(rows) + 2), 4))
    ax.bar(x - 0.2, arr(r.avg_at_k for r in rows), 0.4, yerr=arr(r.avg_at_k_se for r in rows), capsize=4,
           label="Avg@k ± s.e.")
    ax.bar(x + 0.2, arr(r.pass_at_k for r in rows), 0.4, label="Pass@k")
    ax.set_xticks(x, [f"{r.name}\n({r.method}{', ' + r.split if r.split else ''})" for r in rows], fontsize=7)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success")
    ax.set_title("Final evaluation per run")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def compare_runs(inputs: list[Path], *, out: Path, layout: str = "runs", split: str | None = None) -> list[ResultRow]:
    """Rows in the given order; writes out.with_suffix('.md') (the layout) and out.with_suffix('.png')."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}: {', '.join(LAYOUTS)}")
    rows = load_rows(inputs, split)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(LAYOUTS[layout](rows))
    plot(rows, out.with_suffix(".png"))
    return rows


def export_results(run_dirs: list[Path], path: Path, *, title: str, command: str, split: str | None = None,
                   setup: str = "") -> ResultsFile:
    """Write the rows of `run_dirs` as a results file (results/*.json) stamped with the command and
    the commit (`git rev-parse HEAD` of this checkout; None outside a git checkout)."""
    import subprocess

    res = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False,
                         cwd=Path(__file__).resolve().parent)
    commit = res.stdout.strip() if res.returncode == 0 else None
    doc = ResultsFile(title=title, provenance=f"measured: `{command}` at commit {commit}", command=command,
                      commit=commit, setup=setup, rows=[r for d in run_dirs for r in run_rows(Path(d), split)])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc.model_dump_json(indent=2) + "\n")
    return doc
