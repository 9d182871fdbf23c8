"""Matplotlib figures written next to a run's metrics (Agg backend, no screen needed)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from deploy.evaluation import EvalResult

LOSS_KEYS = ("loss/total", "loss/pg", "loss/kl", "kl", "pg_clipfrac", "grad_norm")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, out: Path, *, dpi: int = 110) -> Path:
    """Lay the figure out, write it to `out` (creating its folder) and release it."""
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    _pyplot().close(fig)
    return out


def plot_success(steps: Sequence[dict], evals: Sequence[EvalResult], out: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    if steps:
        xs, ys = [s["step"] for s in steps], [s.get("success_rate", 0.0) for s in steps]
        ax.plot(xs, ys, label="on-policy train success", alpha=0.35)
        window = min(5, len(ys))
        smooth = [sum(ys[max(0, i - window + 1) : i + 1]) / len(ys[max(0, i - window + 1) : i + 1]) for i in range(len(ys))]
        ax.plot(xs, smooth, label=f"on-policy, mean of last {window}", color="C0")
    for i, split in enumerate(dict.fromkeys(e.split for e in evals)):  # one line per split
        pts = sorted((e.policy_version, e.avg_at_k, e.avg_at_k_se, e.label) for e in evals if e.split == split)
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts],
                    fmt="o-", capsize=3, color=f"C{i + 1}", label=f"eval Avg@k ({split})")
        for x, y, _, label in pts:
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("step (policy version)")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    return save_figure(fig, out)


def plot_losses(steps: Sequence[dict], out: Path) -> Path:
    plt = _pyplot()
    keys = [k for k in LOSS_KEYS if any(k in s for s in steps)]
    fig, axes = plt.subplots(max(len(keys), 1), 1, figsize=(7, 1.8 * max(len(keys), 1)), sharex=True)
    axes = axes if hasattr(axes, "__len__") else [axes]
    for ax, key in zip(axes, keys):
        pts = [(s["step"], s[key]) for s in steps if key in s]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], ".-")
        ax.set_ylabel(key, fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    return save_figure(fig, out)


def plot_skills(steps: Sequence[dict], plots_dir: Path) -> list[Path]:
    """UniSkill runs: plots/skills_ops.png (edit-op distribution) and plots/skills_bank.png (bank
    growth); nothing for runs without uniskill/* metrics."""
    series = skill_series(list(steps))
    if series.empty:
        return []
    return [plot_ops(series, plots_dir / "skills_ops.png"), plot_bank(series, plots_dir / "skills_bank.png")]


# --- UniSkill: edit-op distribution and skill-bank growth -------------------------------------

OPS = ("no_edit", "add", "update")


@dataclass
class SkillSeries:
    """Per-step UniSkill series (one entry per step that logged any uniskill/ key)."""

    steps: list[int] = field(default_factory=list)
    ops: dict[str, list[float]] = field(default_factory=dict)
    """no_edit / add / update / unparsed -> share of the step's proposals (stacked they sum to 1;
    0 everywhere on a step without proposals)."""
    proposals: list[float] = field(default_factory=list)
    bank_version: list[float] = field(default_factory=list)
    """Forward-filled (0 before the first commit: warm-up steps write nothing)."""
    added: list[float] = field(default_factory=list)
    updated: list[float] = field(default_factory=list)
    skills: list[float] = field(default_factory=list)
    """Bank size = cumulative adds (an UPDATE rewrites a skill in place)."""
    decisions: dict[str, list[float]] = field(default_factory=dict)
    """outcome -> count per step (accepted, rejected, superseded, duplicate, ...)."""

    @property
    def empty(self) -> bool:
        return not self.steps


def _num(record: dict, key: str) -> float | None:
    v = record.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def skill_series(records: list[dict]) -> SkillSeries:
    """Pure: the step records of metrics.jsonl (any order, repeated steps keep the last) -> series."""
    by_step: dict[int, dict] = {}
    for r in records:
        if not isinstance(r, dict):
            raise TypeError(f"metrics record {str(r)[:80]!r} is not an object")
        if "step" in r and any(isinstance(k, str) and k.startswith("uniskill/") for k in r):
            step = r["step"]
            if isinstance(step, bool) or not isinstance(step, int | float) or not float(step).is_integer():
                raise ValueError(f"metrics record with step={step!r}: not an integer step")
            by_step[int(step)] = r
    out = SkillSeries(ops={op: [] for op in (*OPS, "unparsed")})
    outcomes = sorted({k.removeprefix("uniskill/decision_") for r in by_step.values() for k in r
                       if k.startswith("uniskill/decision_")})
    out.decisions = {o: [] for o in outcomes}
    version, skills = 0.0, 0.0
    for step in sorted(by_step):
        r = by_step[step]
        out.steps.append(step)
        shares = {op: _num(r, f"uniskill/op_{op}") or 0.0 for op in OPS}
        parse = _num(r, "uniskill/parse_rate")
        n = _num(r, "uniskill/proposals")
        has_props = parse is not None or any(shares.values())
        unparsed = (1.0 - parse) if parse is not None else (1.0 - sum(shares.values()) if has_props else 0.0)
        for op in OPS:
            out.ops[op].append(shares[op])
        out.ops["unparsed"].append(max(0.0, unparsed))
        out.proposals.append(n or 0.0)
        bv = _num(r, "uniskill/bank_version")
        version = bv if bv is not None else version
        out.bank_version.append(version)
        added, updated = _num(r, "uniskill/added") or 0.0, _num(r, "uniskill/updated") or 0.0
        skills += added
        out.added.append(added)
        out.updated.append(updated)
        out.skills.append(skills)
        for o in outcomes:
            out.decisions[o].append(_num(r, f"uniskill/decision_{o}") or 0.0)
    return out


def plot_ops(s: SkillSeries, out: Path) -> Path:
    """Stacked shares of NO_SKILL / ADD / UPDATE / unparsed proposals per step."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.6))
    labels = {"no_edit": "NO_SKILL", "add": "ADD", "update": "UPDATE", "unparsed": "unparsed"}
    bottom = [0.0] * len(s.steps)
    for (key, label), color in zip(labels.items(), ("C7", "C2", "C1", "C3"), strict=True):
        ax.bar(s.steps, s.ops[key], 0.9, bottom=bottom, label=label, color=color, alpha=0.85, linewidth=0)
        bottom = [b + v for b, v in zip(bottom, s.ops[key], strict=True)]
    ax.set_xlabel("step")
    ax.set_ylabel("share of proposals")
    ax.set_ylim(0, 1.02)
    ax.set_title("UniSkill edit-op distribution")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return save_figure(fig, out)


def plot_bank(s: SkillSeries, out: Path) -> Path:
    """Top: bank version and skill count over steps; bottom: adds and updates per step."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    if not s.empty:
        top.step(s.steps, s.skills, where="post", label="skills (cumulative adds)", color="C2")
        top.step(s.steps, s.bank_version, where="post", label="bank version", color="C0", ls="--")
        width = 0.4
        bottom.bar([x - width / 2 for x in s.steps], s.added, width, label="adds", color="C2")
        bottom.bar([x + width / 2 for x in s.steps], s.updated, width, label="updates", color="C1")
    top.set_ylim(bottom=0, top=max([1.0, *s.skills, *s.bank_version]) * 1.1)
    bottom.set_ylim(bottom=0, top=max([1.0, *s.added, *s.updated]) * 1.1)
    top.set_ylabel("count")
    top.set_title("Skill-bank growth")
    top.grid(alpha=0.3)
    top.legend(loc="upper left", fontsize=8)
    bottom.set_ylabel("edits per step")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    bottom.legend(loc="upper right", fontsize=8)
    return save_figure(fig, out)
