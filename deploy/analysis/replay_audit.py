"""Replay audit of turn-level routing on a run's archived trajectories (docs/algorithms.md S2,
"Paper's audit figures" / "Replay audit").

For every archived step (RUN_DIR/trajectories/step_NNNNNN.jsonl, in step order) the trajectories
are grouped by group_id and references are picked exactly as training does (`select_references`
with a `SuccessBuffer` extended with each group's successes after the group is processed). Every
student turn of a trajectory with a reference is routed by each matcher; the audit reports

- coverage per matcher: matched turns / all turns (all archived turns, as training's
  `route/coverage_*` metric);
- cross-reproduction: the share of matcher A's matches that matcher B also matches (every ordered
  pair), and candidate agreement on the common matches (same candidate action);
- replay success per matcher: reset the env to the task, execute the student's actual action prefix
  env_actions[:t] (restoring the state), then the matched candidate reference.actions[k] and the
  rest of the reference's suffix reference.actions[k+1:], stopping when the episode ends;
  success = won. The suffix is bound to the student's held instance as the candidate is
  (`routing.matching.binding`: the signature keeps the held class, so a student holding soapbar 1
  may match a reference holding soapbar 2, whose suffix then moves soapbar 1). With `max_turns`,
  a deterministic sample of at most that many matched turns is replayed (every matcher that
  matched a sampled turn is replayed there).

Outputs OUT_DIR (default RUN_DIR/analysis)/replay_audit.json and replay_audit.png.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from deploy.stages.smrc_sd import with_references
from envs.config import EnvConfig
from envs.registry import make_env
from envs.types import TaskSpec
from rollout_workers.types import Trajectory
from routing.matching import MATCHERS, UNNAMED_CANDIDATE, CandidateRule, bind_action, binding, route
from routing.reference import SuccessBuffer
from routing.types import RouteDecision

AUDIT_MATCHERS: tuple[str, ...] = ("structured", "history", "observation")
SAMPLE_SEED = 0
REPLAY_MAX_STEPS = 1000


class MatcherAudit(BaseModel):
    model_config = ConfigDict(frozen=True)

    matcher: str
    matched_turns: int
    coverage: float
    """matched turns / all turns"""
    coverage_with_reference: float
    """matched turns / turns of trajectories that have a reference"""
    replayed: int
    replay_success: int
    replay_rate: float | None
    """replay_success / replayed; None when nothing was replayed"""


class PairAudit(BaseModel):
    model_config = ConfigDict(frozen=True)

    a: str
    b: str
    a_matches: int
    also_matched_by_b: int
    reproduction: float | None
    """share of A's matches that B also matches"""
    common_matches: int
    same_candidate: int
    candidate_agreement: float | None
    """share of common matches where A and B pick the same candidate action"""


class FailedReplay(BaseModel):
    """A matched turn whose candidate and reference suffix did not win from the student's state."""

    model_config = ConfigDict(frozen=True)

    step: int
    traj_id: str
    task_id: str
    t: int
    """The student's turn (its state is the one before action t)."""
    ref_position: int
    matchers: list[str]
    """The matchers that matched this turn to `ref_position`."""
    student_actions: list[str]
    """The student's last actions before turn t (at most FAILED_CONTEXT)."""
    reference_suffix: list[str]
    """The replayed reference actions from `ref_position` (at most FAILED_CONTEXT)."""


FAILED_CONTEXT = 6
MAX_FAILED_LISTED = 100


class ReplayAuditResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    run_dir: str
    steps: list[int]
    num_trajectories: int
    total_turns: int
    turns_with_reference: int
    matchers: dict[str, MatcherAudit]
    pairs: list[PairAudit]
    max_turns: int | None
    matched_turns_any: int
    """distinct turns matched by at least one matcher (the replay population)"""
    replayed_turns: int
    """distinct turns replayed (== matched_turns_any unless capped by max_turns)"""
    failed_replays: list[FailedReplay] = []
    """The failed replays in step order, each listed while one of its matchers has fewer than
    MAX_FAILED_LISTED listed, to see why a match did not replay."""
    json_path: str | None = None
    png_path: str | None = None


def load_env_config(run_dir: Path) -> EnvConfig:
    """The run's env section from RUN_DIR/config.resolved.json."""
    data = json.loads((Path(run_dir) / "config.resolved.json").read_text())
    return EnvConfig.model_validate(data["env"])


def run_candidate_rule(run_dir: Path) -> CandidateRule:
    """The candidate rule RUN_DIR trained with (`method.candidate` in its config.resolved.json; a run
    from before that setting existed used the first visit)."""
    data = json.loads((Path(run_dir) / "config.resolved.json").read_text())
    return data.get("method", {}).get("candidate", UNNAMED_CANDIDATE)


def iter_steps(run_dir: Path) -> Iterator[tuple[int, list[Trajectory]]]:
    """(step, trajectories) for every archived step file, in step order."""
    files = sorted((Path(run_dir) / "trajectories").glob("step_*.jsonl"), key=lambda p: int(p.stem.split("_")[1]))
    for path in files:
        with path.open() as fh:
            trajs = [Trajectory.model_validate_json(line) for line in fh if line.strip()]
        yield int(path.stem.split("_")[1]), trajs


def replay_candidate(env, task: TaskSpec, prefix: Sequence[str], suffix: Sequence[str]) -> bool:
    """Reset to `task`, execute the student prefix, then the reference suffix; True iff won.

    Won is the env's `info["won"]`, not `terminated`: a WebShop episode terminates on any purchase,
    and only a purchase scoring at least env.webshop_success_score is a win (ALFWorld terminates
    on the win alone)."""
    env.reset(options={"task": task})
    for action in prefix:
        _, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:  # the state before turn t is not reachable anymore
            return bool(info["won"])
    for action in suffix:
        _, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return bool(info["won"])
    return False


def run_replay_audit(
    run_dir: Path, *, env_cfg: EnvConfig, out_dir: Path | None = None, max_turns: int | None = None,
    matchers: Sequence[str] = AUDIT_MATCHERS,
) -> ReplayAuditResult:
    run_dir = Path(run_dir)
    candidate = run_candidate_rule(run_dir)
    matchers = tuple(matchers)
    for m in matchers:
        if m not in MATCHERS:
            raise ValueError(f"unknown matcher {m!r}; expected one of {sorted(MATCHERS)}")
    buffer = SuccessBuffer()
    steps: list[int] = []
    n_traj = total_turns = with_ref = 0
    # (step, traj_id, t) -> {matcher: decision} for turns matched by at least one matcher
    matched: dict[tuple[int, str, int], dict[str, RouteDecision]] = {}
    # key -> (task, student env_actions, reference actions, {k: instance swap})
    context: dict[tuple[int, str, int], tuple[TaskSpec, list[str], list[str], dict[int, dict[str, str]]]] = {}
    for step, trajs in iter_steps(run_dir):
        steps.append(step)
        n_traj += len(trajs)
        for ep, ref in with_references(trajs, buffer):
            total_turns += len(ep.traj.turns)
            if ref is None:
                continue
            with_ref += len(ep.traj.turns)
            student, reference = ep.trace(), ref.trace()
            decisions = {m: route(m, student, reference, candidate) for m in matchers}
            for t in range(len(ep.traj.turns)):
                hits = {m: ds[t] for m, ds in decisions.items() if ds[t].matched}
                if hits:
                    key = (step, ep.traj_id, t)
                    matched[key] = hits
                    swaps = {d.ref_position: binding(student, t, reference, d.ref_position)
                             for d in hits.values() if d.ref_position is not None}
                    context[key] = (ep.traj.task, ep.actions, list(ref.actions), swaps)

    # figures from the routing decisions
    counts = {m: sum(m in hits for hits in matched.values()) for m in matchers}
    pairs: list[PairAudit] = []
    for a in matchers:
        for b in matchers:
            if a == b:
                continue
            common = [h for h in matched.values() if a in h and b in h]
            same = sum(h[a].candidate_action == h[b].candidate_action for h in common)
            pairs.append(PairAudit(
                a=a, b=b, a_matches=counts[a], also_matched_by_b=len(common),
                reproduction=len(common) / counts[a] if counts[a] else None, common_matches=len(common),
                same_candidate=same, candidate_agreement=same / len(common) if common else None))

    # replays
    keys = sorted(matched)
    if max_turns is not None and len(keys) > max_turns:
        keys = sorted(random.Random(SAMPLE_SEED).sample(keys, max_turns))
    # The audit asks whether the matched candidate and the reference's suffix win from the
    # restored state; the training horizon is not part of that question, so it is lifted.
    env = make_env(env_cfg.model_copy(update={"max_steps": REPLAY_MAX_STEPS}))
    cache: dict[tuple[tuple[int, str, int], int], bool] = {}
    replayed = {m: 0 for m in matchers}
    succeeded = {m: 0 for m in matchers}
    failed: dict[tuple[tuple[int, str, int], int], list[str]] = {}
    for key in keys:
        task, student_actions, ref_actions, swaps = context[key]
        t = key[2]
        for m, d in matched[key].items():
            k = d.ref_position
            assert k is not None
            if (key, k) not in cache:  # the suffix bound to the student's instance, as its candidate is
                suffix = [bind_action(a, swaps[k]) for a in ref_actions[k:]]
                cache[(key, k)] = replay_candidate(env, task, student_actions[:t], suffix)
            replayed[m] += 1
            succeeded[m] += cache[(key, k)]
            if not cache[(key, k)]:
                failed.setdefault((key, k), []).append(m)
    env.close()
    failed_replays, listed = [], dict.fromkeys(matchers, 0)
    for (key, k), ms in sorted(failed.items()):
        if all(listed[m] >= MAX_FAILED_LISTED for m in ms):
            continue
        for m in ms:
            listed[m] += 1
        failed_replays.append(FailedReplay(
            step=key[0], traj_id=key[1], task_id=context[key][0].task_id, t=key[2], ref_position=k, matchers=ms,
            student_actions=context[key][1][max(0, key[2] - FAILED_CONTEXT):key[2]],
            reference_suffix=[bind_action(a, context[key][3][k]) for a in context[key][2][k:k + FAILED_CONTEXT]]))

    n = max(total_turns, 1)
    audits = {
        m: MatcherAudit(
            matcher=m, matched_turns=counts[m], coverage=counts[m] / n,
            coverage_with_reference=counts[m] / with_ref if with_ref else 0.0,
            replayed=replayed[m], replay_success=succeeded[m],
            replay_rate=succeeded[m] / replayed[m] if replayed[m] else None)
        for m in matchers
    }
    result = ReplayAuditResult(
        run_dir=str(run_dir), steps=steps, num_trajectories=n_traj, total_turns=total_turns,
        turns_with_reference=with_ref, matchers=audits, pairs=pairs, max_turns=max_turns,
        matched_turns_any=len(matched), replayed_turns=len(keys), failed_replays=failed_replays)

    out = Path(out_dir) if out_dir is not None else run_dir / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / "replay_audit.json", out / "replay_audit.png"
    result = result.model_copy(update={"json_path": str(json_path), "png_path": str(png_path)})
    json_path.write_text(json.dumps({**result.model_dump(mode="json"), "summary": format_summary(result)}, indent=2))
    plot_replay_audit(result, png_path)
    return result


def plot_replay_audit(result: ReplayAuditResult, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result.matchers)
    cov = [result.matchers[m].coverage for m in names]
    rep = [result.matchers[m].replay_rate or 0.0 for m in names]
    xs = range(len(names))
    fig, ax = plt.subplots(figsize=(6, 4))
    w = 0.38
    b1 = ax.bar([x - w / 2 for x in xs], cov, w, label="coverage (matched / all turns)")
    b2 = ax.bar([x + w / 2 for x in xs], rep, w, label="replay success")
    for bar, m in zip(b2, names):
        a = result.matchers[m]
        ax.annotate(f"{a.replay_success}/{a.replayed}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    for bar in b1:
        ax.annotate(f"{bar.get_height():.1%}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), names)
    ax.set_ylim(0, 1.3)
    ax.set_ylabel("fraction")
    ax.set_title(f"Replay audit ({result.total_turns} turns, {len(result.steps)} steps)")
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def format_summary(result: ReplayAuditResult) -> list[str]:
    """Human-readable lines; the LAST line is exactly `structured replay success: X/Y`."""
    lines = [
        (f"replay audit: {result.total_turns} turns in {result.num_trajectories} trajectories over "
         f"{len(result.steps)} steps; {result.turns_with_reference} turns with a reference"),
    ]
    for m, a in result.matchers.items():
        lines.append(f"{m}: coverage {_pct(a.coverage)} ({a.matched_turns}/{result.total_turns}), "
                     f"replay {a.replay_success}/{a.replayed} ({_pct(a.replay_rate)})")
    for p in result.pairs:
        lines.append(f"{p.b} reproduces {_pct(p.reproduction)} of {p.a} matches "
                     f"({p.also_matched_by_b}/{p.a_matches}); same candidate {_pct(p.candidate_agreement)} "
                     f"({p.same_candidate}/{p.common_matches})")
    if result.replayed_turns < result.matched_turns_any:
        lines.append(f"replayed a sample of {result.replayed_turns}/{result.matched_turns_any} matched turns")
    s = result.matchers.get("structured")
    lines.append(f"structured replay success: {s.replay_success if s else 0}/{s.replayed if s else 0}")
    return lines
