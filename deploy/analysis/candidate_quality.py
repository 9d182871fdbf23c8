"""Candidate quality of SMRC-SD's routing on a run's archived trajectories (docs/algorithms.md S2,
"Candidate rules").

References are the policy's own wins, and they wander: a reference that visits a state twice took
a detour from its first visit. A detour candidate still replays to a win, so the replay audit
cannot tell it from the action that led on; the expert can. For every archived step (in step
order, references picked exactly as training picks them, `with_references`) every student turn of
a trajectory with a reference is routed by each matcher under each candidate rule
(`routing.matching.CANDIDATE_RULES`); for every matched turn the env is reset to the task, the
student's actual actions before the turn are executed, and the env's expert names its next action
from that state. A candidate is good when it equals that action (normalised text).

Reported per matcher and rule: matched turns and the share whose candidate equals the expert's
action; and per matcher, the same share over the turns the matcher matches under all three rules
(the common turns, so the rules are compared on the same states). The headline is the run's own
matcher (`method.matcher` of the run's config) on its common turns.

Needs an env with an expert (`expert_action()` on the unwrapped env: the embedded household and
WebShop have one). Outputs OUT_DIR (default RUN_DIR/analysis)/candidate_quality.json and
candidate_quality.png.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from deploy.analysis.replay_audit import REPLAY_MAX_STEPS, iter_steps, load_env_config
from deploy.stages.smrc_sd import with_references
from envs.config import EnvConfig
from envs.registry import make_env
from envs.types import TaskSpec
from routing.matching import CANDIDATE_RULES, MATCHERS, CandidateRule, normalize_text, route
from routing.reference import SuccessBuffer
from routing.types import RouteDecision

QUALITY_MATCHERS: tuple[str, ...] = ("structured", "history", "observation")
RULE_LABELS: dict[CandidateRule, str] = {"first_visit": "first-visit", "last_visit": "last-visit",
                                         "loop_erased": "loop-erased"}


class NoExpertError(ValueError):
    """The run's env has no expert to compare candidates with."""


class RuleQuality(BaseModel):
    model_config = ConfigDict(frozen=True)

    matched_turns: int
    expert_equal: int
    """matched turns whose candidate equals the expert's next action from the student's state"""
    rate: float | None
    """expert_equal / matched_turns; None when nothing matched"""


class MatcherQuality(BaseModel):
    model_config = ConfigDict(frozen=True)

    matcher: str
    rules: dict[str, RuleQuality]
    """each rule on every turn it matches"""
    common: dict[str, RuleQuality]
    """each rule on the turns this matcher matches under every rule (the same turns for all)"""


class CandidateQualityResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    run_dir: str
    steps: list[int]
    num_trajectories: int
    total_turns: int
    turns_with_reference: int
    headline_matcher: str
    """the run's `method.matcher`: the matcher of the summary's last line"""
    matchers: dict[str, MatcherQuality]
    json_path: str | None = None
    png_path: str | None = None


def _run_matcher(run_dir: Path) -> str:
    data = json.loads((run_dir / "config.resolved.json").read_text())
    return str(data.get("method", {}).get("matcher", "structured"))


def expert_actions(env, task: TaskSpec, actions: Sequence[str], turns: set[int]) -> dict[int, str]:
    """The expert's next action before each turn in `turns`, replaying the student's `actions`
    from a reset to `task`; a turn the replay cannot reach (the episode ended first) is left out."""
    out: dict[int, str] = {}
    env.reset(options={"task": task})
    for t in range(max(turns, default=-1) + 1):
        if t in turns:
            out[t] = env.unwrapped.expert_action()
        _, _, terminated, truncated, _ = env.step(actions[t])
        if terminated or truncated:
            break
    return out


def _tally(decisions: Sequence[RouteDecision], expert: dict[int, str], turns: Sequence[int]) -> tuple[int, int]:
    matched = [t for t in turns if decisions[t].matched and t in expert]
    equal = sum(normalize_text(decisions[t].candidate_action or "") == normalize_text(expert[t]) for t in matched)
    return len(matched), equal


def _quality(matched: int, equal: int) -> RuleQuality:
    return RuleQuality(matched_turns=matched, expert_equal=equal, rate=equal / matched if matched else None)


def run_candidate_quality(run_dir: Path, *, env_cfg: EnvConfig | None = None, out_dir: Path | None = None,
                          matchers: Sequence[str] = QUALITY_MATCHERS) -> CandidateQualityResult:
    run_dir = Path(run_dir)
    for m in matchers:
        if m not in MATCHERS:
            raise ValueError(f"unknown matcher {m!r}; expected one of {sorted(MATCHERS)}")
    env_cfg = env_cfg or load_env_config(run_dir)
    env = make_env(env_cfg.model_copy(update={"max_steps": REPLAY_MAX_STEPS}))
    if not hasattr(env.unwrapped, "expert_action"):
        raise NoExpertError(f"env {env_cfg.name!r} (backend {env_cfg.backend!r}) has no expert to compare candidates "
                            "with; run candidate-quality on a run of an env with one (the embedded household)")
    counts = {(m, r, scope): [0, 0] for m in matchers for r in CANDIDATE_RULES for scope in ("all", "common")}
    buffer, steps = SuccessBuffer(), []
    n_traj = total_turns = with_ref = 0
    for step, trajs in iter_steps(run_dir):
        steps.append(step)
        n_traj += len(trajs)
        for ep, ref in with_references(trajs, buffer):
            total_turns += len(ep.traj.turns)
            if ref is None:
                continue
            with_ref += len(ep.traj.turns)
            student, reference = ep.trace(), ref.trace()
            decisions = {(m, r): route(m, student, reference, r) for m in matchers for r in CANDIDATE_RULES}  # type: ignore[arg-type]
            needed = {t for ds in decisions.values() for t, d in enumerate(ds) if d.matched}
            if not needed:
                continue
            expert = expert_actions(env, ep.traj.task, ep.actions, needed)
            turns = range(len(ep.traj.turns))
            for m in matchers:
                common = [t for t in turns if all(decisions[(m, r)][t].matched for r in CANDIDATE_RULES)]
                for r in CANDIDATE_RULES:
                    for scope, scope_turns in (("all", turns), ("common", common)):
                        matched, equal = _tally(decisions[(m, r)], expert, scope_turns)
                        counts[(m, r, scope)][0] += matched
                        counts[(m, r, scope)][1] += equal
    env.close()
    qualities = {
        m: MatcherQuality(matcher=m, rules={r: _quality(*counts[(m, r, "all")]) for r in CANDIDATE_RULES},
                          common={r: _quality(*counts[(m, r, "common")]) for r in CANDIDATE_RULES})
        for m in matchers
    }
    headline = _run_matcher(run_dir)
    result = CandidateQualityResult(
        run_dir=str(run_dir), steps=steps, num_trajectories=n_traj, total_turns=total_turns,
        turns_with_reference=with_ref, headline_matcher=headline if headline in qualities else matchers[0],
        matchers=qualities)
    out = Path(out_dir) if out_dir is not None else run_dir / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / "candidate_quality.json", out / "candidate_quality.png"
    result = result.model_copy(update={"json_path": str(json_path), "png_path": str(png_path)})
    json_path.write_text(json.dumps({**result.model_dump(mode="json"), "summary": format_summary(result)}, indent=2))
    plot_candidate_quality(result, png_path)
    return result


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def format_summary(result: CandidateQualityResult) -> list[str]:
    """Human-readable lines; the LAST line is exactly
    `candidate = expert action: first-visit X%, last-visit Y%, loop-erased Z%` (the run's matcher,
    on the turns it matches under all three rules)."""
    lines = [(f"candidate quality: {result.total_turns} turns in {result.num_trajectories} trajectories over "
              f"{len(result.steps)} steps; {result.turns_with_reference} turns with a reference")]
    for m, q in result.matchers.items():
        per_rule = ", ".join(f"{RULE_LABELS[r]} {_pct(s.rate)} ({s.expert_equal}/{s.matched_turns})"  # type: ignore[index]
                             for r, s in q.rules.items())
        common = ", ".join(f"{RULE_LABELS[r]} {_pct(s.rate)} ({s.expert_equal})"  # type: ignore[index]
                           for r, s in q.common.items())
        n_common = next(iter(q.common.values())).matched_turns
        lines.append(f"{m}: matched turns {per_rule}; on the {n_common} turns matched under every rule: {common}")
    head = result.matchers[result.headline_matcher].common
    lines.append(f"{result.headline_matcher} matcher, {next(iter(head.values())).matched_turns} turns matched "
                 "under every rule:")
    lines.append("candidate = expert action: "
                 + ", ".join(f"{RULE_LABELS[r]} {_pct(head[r].rate)}" for r in CANDIDATE_RULES))
    return lines


def plot_candidate_quality(result: CandidateQualityResult, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result.matchers)
    width = 0.8 / len(CANDIDATE_RULES)
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, rule in enumerate(CANDIDATE_RULES):
        stats = [result.matchers[m].common[rule] for m in names]
        xs = [x + (i - (len(CANDIDATE_RULES) - 1) / 2) * width for x in range(len(names))]
        bars = ax.bar(xs, [s.rate or 0.0 for s in stats], width, label=RULE_LABELS[rule])
        for bar, s in zip(bars, stats):
            ax.annotate(f"{s.expert_equal}/{s.matched_turns}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(range(len(names))), names)
    ax.set_ylim(0, 1.2)
    ax.set_ylabel("candidate = expert action")
    ax.set_title(f"Candidate quality on the turns matched under every rule ({len(result.steps)} steps)")
    ax.legend(fontsize=8, loc="upper center", ncol=len(CANDIDATE_RULES))
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
