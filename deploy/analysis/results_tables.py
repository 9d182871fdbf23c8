"""Committed results (results/*.json) and the papers' table layouts.

A results file holds rows of final metrics (one row = one method on one environment and split) plus
where they came from: the exact command, the commit, and a provenance line (measured by the command
at that commit, or transcribed from a document when the run directory is gone). `compare-runs`
renders rows from results files and from run directories alike in three layouts:

- `runs`: one line per row with Avg@k +- s.e., Pass@k, per-task-type Avg@k and the health columns;
- `smrc_sd`: the SMRC-SD paper's main table: the rows GRPO, FullPath-SD, Skill-SD, SDAR, SMRC-SD
  (all five for the first model, those present for further models, then any other method), columns ALFWorld Avg@4 and Pass@4, ALFWorld success per task
  type, WebShop score (0-1, as the paper prints it) and accuracy, response length (tokens per turn)
  and repeated 4-gram ratio (%);
- `uniskill`: UniSkill's table: ALFWorld success per task type and overall, WebShop score and
  success, all in percent, with the evaluation's retrieval setting.

A missing value prints "-" (for instance a paper row nobody has run yet)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict


class ResultRow(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """What the row is (a run name, or the label the source table used)."""
    method: str
    """method.name (grpo, fullpath_sd, skill_sd, sdar, smrc_sd, ...) or the UniSkill variant (uniskill,
    actor_only, proposer_only, no_r_align, no_support_reg)."""
    model: str | None = None
    """Backbone (model.path or the paper's name for it)."""
    env: str = "alfworld"
    """The environment's registered name (the paper tables show `PAPER_BENCHMARKS`; `runs_table` any)."""
    split: str | None = None
    k: int | None = None
    avg_at_k: float | None = None
    """Success rate, mean over all k x N episodes (WebShop: accuracy / success)."""
    avg_at_k_se: float | None = None
    pass_at_k: float | None = None
    score: float | None = None
    """WebShop score, 100 x mean raw purchase score (None for ALFWorld)."""
    per_task_type: dict[str, float] = {}
    """Task type -> success (Avg@k) of that type."""
    response_len_mean: float | None = None
    """Mean response tokens per turn."""
    rep4gram_ratio: float | None = None
    """Mean repeated-4-gram ratio per turn, a fraction (docs/algorithms.md S8)."""
    steps: int | None = None
    retrieval: bool | None = None
    """UniSkill: whether the evaluated actor saw retrieved skills (None: not a UniSkill run)."""
    note: str | None = None


class ResultsFile(BaseModel):
    """One committed results file (results/*.json)."""

    model_config = ConfigDict(extra="forbid")

    title: str
    provenance: str
    """'measured by `command` at `commit`' or where the numbers were transcribed from and why."""
    command: str
    """The exact command(s) that produce(d) the numbers."""
    commit: str | None
    """The commit that produced them; None when not recorded (see `provenance`)."""
    documented_in: str | None = None
    """The commit whose docs first stated the numbers (for transcribed results)."""
    setup: str = ""
    rows: list[ResultRow] = []
    extra: dict[str, Any] = {}
    """Further figures of the same source that are not table rows (paired gains, audits, timings)."""


def read_results(path: str | Path) -> ResultsFile:
    return ResultsFile.model_validate_json(Path(path).read_text())


PAPER_BENCHMARKS = ("alfworld", "webshop")
"""The papers' two column groups, in print order: the household benchmark (success per task type) and
the shopping benchmark (score and success). A row of another environment appears in `runs_table`."""
ALFWORLD_TYPES = (("pick_and_place_simple", "Pick"), ("look_at_obj_in_light", "Look"),
                  ("pick_clean_then_place_in_recep", "Clean"), ("pick_heat_then_place_in_recep", "Heat"),
                  ("pick_cool_then_place_in_recep", "Cool"), ("pick_two_obj_and_place", "Pick2"))
METHOD_NAMES = {"grpo": "GRPO", "fullpath_sd": "FullPath-SD", "skill_sd": "Skill-SD", "sdar": "SDAR",
                "smrc_sd": "SMRC-SD", "routing_only": "FullPath-SD + routing only",
                "context_only": "FullPath-SD + context only", "random_turn": "random turns (same count)",
                "gigpo": "GiGPO", "uniskill": "UniSkill", "actor_only": "Actor Only",
                "proposer_only": "Skill Proposer Only", "no_r_align": "w/o R_align",
                "no_support_reg": "w/o support regulariser"}
SMRC_SD_ROWS = ("grpo", "fullpath_sd", "skill_sd", "sdar", "smrc_sd")
UNISKILL_ROWS = ("grpo", "gigpo", "uniskill")


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _lines(rows: Sequence[ResultRow], paper_rows: Sequence[str]) -> list[tuple]:
    """The lines of a paper layout as (group key, label, ALFWorld row, WebShop row). Rows group by (model, method,
    retrieval); within a group the i-th ALFWorld row shares a line with the i-th WebShop row, so one run
    per benchmark gives one line and repeated runs (e.g. a re-run) each get their own, labelled with
    the row's name. Order: per model present, the paper's rows (for the first model a placeholder line
    when nothing matches, so every main row shows), then every other group in input order."""
    household, shop = PAPER_BENCHMARKS
    groups: dict[tuple, dict[str, list[ResultRow]]] = {}
    for r in rows:
        if r.env in PAPER_BENCHMARKS:
            groups.setdefault((r.model, r.method, r.retrieval), {b: [] for b in PAPER_BENCHMARKS})[r.env].append(r)
    keys: list[tuple] = []
    for i, model in enumerate(dict.fromkeys(k[0] for k in groups) if groups else [None]):
        for method in paper_rows:
            found = [k for k in groups if k[:2] == (model, method)]
            keys.extend(found or ([(model, method, None)] if i == 0 else []))
    keys += [k for k in groups if k not in keys]
    out = []
    for key in keys:
        by_env = groups.get(key, {b: [] for b in PAPER_BENCHMARKS})
        n = max(len(by_env[household]), len(by_env[shop]), 1)
        for j in range(n):
            alf = by_env[household][j] if j < len(by_env[household]) else None
            web = by_env[shop][j] if j < len(by_env[shop]) else None
            label = METHOD_NAMES.get(key[1], key[1])
            if n > 1:
                label += f": {(alf or web).name}"
            out.append((key, label, alf, web))
    return out


def smrc_sd_table(rows: Sequence[ResultRow]) -> str:
    head = ["model", "method", "ALFWorld Avg@4", "ALFWorld Pass@4", *[short for _, short in ALFWORLD_TYPES],
            "WebShop Score", "WebShop Acc", "resp. len (tokens)", "rep. 4-gram (%)"]
    out = []
    for key, label, alf, web in _lines(rows, SMRC_SD_ROWS):
        health = alf if alf is not None and alf.response_len_mean is not None else web
        types = [_f((alf.per_task_type if alf else {}).get(t), ".3f") for t, _ in ALFWORLD_TYPES]
        out.append([key[0] or "-", label, _f(alf and alf.avg_at_k, ".3f"),
                    _f(alf and alf.pass_at_k, ".3f"), *types,
                    _f(web.score / 100 if web and web.score is not None else None, ".3f"),
                    _f(web and web.avg_at_k, ".3f"), _f(health and health.response_len_mean, ".1f"),
                    _f(health.rep4gram_ratio * 100 if health and health.rep4gram_ratio is not None else None, ".1f")])
    return _table(head, out)


def uniskill_table(rows: Sequence[ResultRow]) -> str:
    head = ["model", "method", "retrieval at eval", *[short for _, short in ALFWORLD_TYPES], "ALFWorld All",
            "WebShop Score", "WebShop Succ."]
    out = []
    for key, label, alf, web in _lines(rows, UNISKILL_ROWS):

        def pct(x: float | None) -> str:
            return _f(None if x is None else 100 * x, ".1f")

        types = [pct((alf.per_task_type if alf else {}).get(t)) for t, _ in ALFWORLD_TYPES]
        retrieval = "-" if key[2] is None else ("on" if key[2] else "off")
        out.append([key[0] or "-", label, retrieval, *types, pct(alf and alf.avg_at_k),
                    _f(web and web.score, ".1f"), pct(web and web.avg_at_k)])
    return _table(head, out)


def runs_table(rows: Sequence[ResultRow]) -> str:
    types = sorted({t for r in rows for t in r.per_task_type})
    head = ["run", "method", "env", "eval", "Avg@k ± s.e.", "Pass@k", *[f"{t} Avg@k" for t in types],
            "resp len", "rep4gram", "steps"]
    out = []
    for r in rows:
        ev = f"{r.split}, k={r.k}" if r.split else "-"
        avg = f"{_f(r.avg_at_k, '.3f')} ± {_f(r.avg_at_k_se, '.3f')}" if r.avg_at_k is not None else "-"
        out.append([r.name, r.method, r.env, ev, avg, _f(r.pass_at_k, ".3f"),
                    *[_f(r.per_task_type.get(t), ".3f") for t in types], _f(r.response_len_mean, ".1f"),
                    _f(r.rep4gram_ratio, ".3f"), "-" if r.steps is None else str(r.steps)])
    return _table(head, out)


LAYOUTS = {"runs": runs_table, "smrc_sd": smrc_sd_table, "uniskill": uniskill_table}
