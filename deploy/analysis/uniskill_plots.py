"""UniSkill edit-op distribution and skill-bank growth over training steps (docs/algorithms.md S8: "without
the support regulariser the op distribution collapses to Add"; "the bank grows fast early, then
slower as fewer Adds pass").

Input: the run's metrics.jsonl (uniskill/op_no_edit, op_add, op_update, parse_rate, proposals,
bank_version, added, updated, decision_<outcome>). `deploy.plots` turns the step records into a
`SkillSeries` and draws it (the trainer's automatic plots use the same functions); here
`growth_summary` reduces it to headline numbers and `run_skills_growth` writes
RUN/analysis/skills_growth.json and skills_ops.png + skills_bank.png.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from deploy.plots import OPS, SkillSeries, plot_bank, plot_ops, skill_series


def growth_summary(s: SkillSeries) -> dict[str, float | int | None]:
    """Headline numbers: totals, mean op shares, adds in the first vs second half of the steps, and
    the steps where one op took >= 95% of the parsed proposals (a collapse indicator)."""
    if s.empty:
        return {"steps": 0}
    half = len(s.steps) // 2
    collapsed = 0
    for i in range(len(s.steps)):
        parsed = sum(s.ops[op][i] for op in OPS)
        if parsed > 0 and max(s.ops[op][i] for op in OPS) >= 0.95 * parsed:
            collapsed += 1
    return {
        "steps": len(s.steps),
        "final_skills": s.skills[-1],
        "final_bank_version": s.bank_version[-1],
        "total_added": sum(s.added),
        "total_updated": sum(s.updated),
        "added_first_half": sum(s.added[:half]),
        "added_second_half": sum(s.added[half:]),
        **{f"op_{op}_mean": sum(v) / len(v) for op, v in s.ops.items()},
        "steps_one_op_ge_95pct": collapsed,
    }


@dataclass
class SkillsGrowthResult:
    run_dir: str
    summary: dict
    series: SkillSeries
    json_path: str | None = None
    png_path: str | None = None
    """The op-distribution plot."""
    bank_png_path: str | None = None


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: pass --run a training run directory")
    records = []
    for number, line in enumerate(path.read_text().split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not JSON ({err.msg})") from err
        if not isinstance(record, dict):
            raise TypeError(f"{path}:{number}: expected a JSON object (one step's metrics)")
        records.append(record)
    return records


def run_skills_growth(run_dir: Path, *, out_dir: Path | None = None) -> SkillsGrowthResult:
    """Series + summary of a run's metrics.jsonl; writes skills_growth.json, skills_ops.png and
    skills_bank.png under RUN/analysis (or out_dir). Raises ValueError for a run without UniSkill."""
    run_dir = Path(run_dir)
    series = skill_series(read_metrics(run_dir))
    if series.empty:
        raise ValueError(f"{run_dir}/metrics.jsonl has no uniskill/* metrics: train with uniskill.enabled=true")
    out = Path(out_dir) if out_dir is not None else run_dir / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    result = SkillsGrowthResult(run_dir=str(run_dir), summary=growth_summary(series), series=series)
    result.png_path = str(plot_ops(series, out / "skills_ops.png"))
    result.bank_png_path = str(plot_bank(series, out / "skills_bank.png"))
    result.json_path = str(out / "skills_growth.json")
    Path(result.json_path).write_text(json.dumps(asdict(result), indent=2))
    return result
