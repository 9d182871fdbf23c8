"""The figures a grid's pre-registered hypotheses read from its runs' analyses (docs/testbed.md):
pure reading of the JSON files `run_analyses` copied to RESULTS/analysis/<arm>_seed<k>/.

- S4 `replay_audit`: per run, the structured matcher's replayed matched turns and how many replayed
  to a win (`replay_audit.json`), and the total.
- U2 `op_collapse`: per run, the most frequent op among all proposals of the last quarter of the
  steps (steps > 0.75 x the last step; a step's op shares weighted by its proposal count, steps
  without a parsed proposal left out) and its share (`skills_growth.json`).
- U3 `ralign_vs_rollout`: per run Spearman's rho between R_align and the measured rollout gain, and
  rho pooled over every run's analysed proposals with a 95% bootstrap CI over proposals
  (`ralign_vs_rollout.json`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from deploy.analysis.ralign_vs_rollout import rank_stats, spearman

N_BOOT = 2000
"""Bootstrap replicates of the pooled Spearman rho's CI."""


def spearman_ci(x: list[float], y: list[float], *, seed: int = 0) -> tuple[float | None, float | None]:
    """95% percentile-bootstrap interval of Spearman's rho, resampling (x, y) pairs; replicates whose
    rho is undefined (a constant resample) are left out; (None, None) when fewer than 3 pairs."""
    if len(x) < 3:
        return None, None
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(N_BOOT):
        idx = rng.integers(0, len(x), size=len(x))
        rho, _ = spearman([x[i] for i in idx], [y[i] for i in idx])
        if rho is not None:
            boots.append(rho)
    if not boots:
        return None, None
    lo, hi = np.quantile(boots, [0.025, 0.975])
    return float(lo), float(hi)


def _runs(analysis_dir: Path, name: str) -> list[tuple[str, dict]]:
    return [(p.parent.name, json.loads(p.read_text())) for p in sorted(analysis_dir.glob(f"*/{name}"))]


def replay_audit_figures(analysis_dir: Path) -> dict | None:
    runs = {}
    for key, r in _runs(analysis_dir, "replay_audit.json"):
        s = r.get("matchers", {}).get("structured") or {}
        runs[key] = {"replayed": s.get("replayed", 0), "replay_success": s.get("replay_success", 0)}
    if not runs:
        return None
    total = sum(v["replayed"] for v in runs.values())
    wins = sum(v["replay_success"] for v in runs.values())
    return {"runs": runs, "replayed": total, "replay_success": wins, "rate": wins / total if total else None}


def last_quarter_top_op(series: dict) -> dict:
    """{op, share, proposals} over the last quarter of a `skills_growth.json` series."""
    steps, ops, counts = series["steps"], series["ops"], series["proposals"]
    last = max(steps) if steps else 0
    idx = [i for i, s in enumerate(steps) if s > 0.75 * last and sum(ops[o][i] for o in ops) > 0]
    n = sum(counts[i] for i in idx)
    if not n:
        return {"op": None, "share": None, "proposals": 0}
    shares = {o: sum(ops[o][i] * counts[i] for i in idx) / n for o in ops}
    top = max(shares, key=lambda o: shares[o])
    return {"op": top, "share": shares[top], "proposals": n}


def op_collapse_figures(analysis_dir: Path) -> dict | None:
    runs = {key: last_quarter_top_op(r["series"]) for key, r in _runs(analysis_dir, "skills_growth.json")}
    return {"runs": runs} if runs else None


def ralign_figures(analysis_dir: Path) -> dict | None:
    found = _runs(analysis_dir, "ralign_vs_rollout.json")
    if not found:
        return None
    pooled: list[dict] = []
    runs = {}
    for key, r in found:
        pooled += r.get("gains", [])
        runs[key] = {"n": r["stats"]["n"], "spearman_rho": r["stats"]["spearman_rho"],
                     "skipped_steps": r.get("skipped_steps", {})}
    x, y = [g["r_align"] for g in pooled], [g["gain"] for g in pooled]
    st = rank_stats(x, y)
    lo, hi = spearman_ci(x, y)
    return {"runs": runs, "pooled": {"n": st.n, "spearman_rho": st.spearman_rho, "lo": lo, "hi": hi,
                                     "rho_reason": st.rho_reason,
                                     "mean_gain_positive": st.mean_gain_positive,
                                     "mean_gain_nonpositive": st.mean_gain_nonpositive}}


FIGURES: dict[str, Callable[[Path], dict | None]] = {
    "replay_audit": replay_audit_figures, "op_collapse": op_collapse_figures, "ralign_vs_rollout": ralign_figures}


def analysis_figures(analysis_dir: Path) -> dict[str, dict]:
    """Every figure above that the grid's analyses provide (none when it has none)."""
    out = {name: fig(analysis_dir) for name, fig in FIGURES.items()} if analysis_dir.is_dir() else {}
    return {name: value for name, value in out.items() if value is not None}


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def figures_markdown(figures: dict[str, dict]) -> str:
    """The figures as Markdown lines for the grid's README."""
    lines = []
    if a := figures.get("replay_audit"):
        per = ", ".join(f"{k} {v['replay_success']}/{v['replayed']}" for k, v in a["runs"].items())
        lines.append(f"- Structured replay audit: {a['replay_success']}/{a['replayed']} matched turns replay to a win "
                     f"({per}).")
    if c := figures.get("op_collapse"):
        per = ", ".join(f"{k} {v['op'] or '-'} {_f(v['share'])} (n={v['proposals']:.0f})" for k, v in c["runs"].items())
        lines.append(f"- Top op over the last quarter of the steps (share of its proposals): {per}.")
    if r := figures.get("ralign_vs_rollout"):
        per = ", ".join(f"{k} {_f(v['spearman_rho'], '+.3f')} (n={v['n']})" for k, v in r["runs"].items())
        p = r["pooled"]
        lines.append(f"- R_align vs rollout gain, Spearman rho: pooled {_f(p['spearman_rho'], '+.3f')} "
                     f"[{_f(p['lo'], '+.3f')}, {_f(p['hi'], '+.3f')}] (n={p['n']}); "
                     f"per run {per}.")
    return ("\nAnalyses (`analysis/` beside this file):\n\n" + "\n".join(lines) + "\n") if lines else ""
