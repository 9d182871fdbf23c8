"""Fixed-state teacher-intervention analysis (docs/algorithms.md e and S8).

Hold the state, the prompt and the response fixed and vary only the teacher context: for each
state s_i with correct action a*_i,

    Delta_i(variant) = l(a* | teacher prompt of the variant) - l(a* | student prompt),

where l is the token-mean log-prob of the response "<action>{a*}</action>" + EOS. States are the
turns of archived trajectories (RUN_DIR/trajectories/step_*.jsonl) that have a reference (another
success of the same task in the group, else the per-task success buffer, exactly as the trainer's
router picks it). "matched" = the structured matcher matched the turn to a reference position
(a* = the reference's candidate action); "mismatched" = it did not (a* = the embedded env's expert
action after replaying the student's env actions up to the turn).

Variants: "none" (the student prompt: Delta = 0 by construction), "full_path" (full reference
only, FullPath-SD), "state_matched" (full reference + state summary + candidate action where
matched, SMRC-SD). Teacher prompts come from `deploy.stages.smrc_sd.TeacherRouter._teacher_prompt`, i.e.
byte-identical to training. CIs: percentile bootstrap over states (B = 10,000); the matched minus
mismatched difference compares different states (unpaired bootstrap); variant-vs-variant
differences are on the same states (paired bootstrap).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

from deploy.analysis.replay_audit import run_candidate_rule
from deploy.analysis.stats import bootstrap_ci, paired_bootstrap_ci, unpaired_bootstrap_ci
from deploy.config import TrainConfig
from deploy.config_loading import load_config
from deploy.stages.smrc_sd import TeacherRouter, with_references
from envs.registry import make_env
from rollout_workers.episode import Episode
from rollout_workers.parsing import action_choice
from rollout_workers.types import Trajectory
from routing.matching import UNNAMED_CANDIDATE, CandidateRule, RouteTrace, route
from routing.reference import SuccessBuffer
from routing.types import RouteDecision

VARIANTS: dict[str, frozenset[str] | None] = {
    "none": None,
    "full_path": frozenset({"full_reference"}),
    "state_matched": frozenset({"full_reference", "state_summary", "candidate_action"}),
}
GROUPS = ("matched", "mismatched")


@dataclass
class _State:
    ep: Episode
    t: int
    ref: Episode
    decision: RouteDecision
    trace: RouteTrace
    step_file: str

    @property
    def matched(self) -> bool:
        return self.decision.matched


@dataclass
class StateScore:
    traj_id: str
    task_id: str
    turn: int
    step_file: str
    matched: bool
    success: bool
    correct_action: str
    action_source: str  # "candidate" | "expert"
    student_logprob: float
    logprob: dict[str, float] = field(default_factory=dict)
    delta: dict[str, float] = field(default_factory=dict)


@dataclass
class InterventionResult:
    run_dir: str
    model_path: str
    num_states: dict[str, int]
    summary: dict[str, dict[str, dict[str, float]]]
    """variant -> group ("matched", "mismatched", "all") -> {mean, lo, hi, n} of Delta."""
    differences: dict[str, dict[str, float]]
    """'<variant>:matched-mismatched' (unpaired) and '<a>-<b>:<group>' (paired) -> {mean, lo, hi}."""
    states: list[StateScore]
    json_path: str | None = None
    png_path: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


def load_trajectories(run_dir: Path) -> list[tuple[str, list[Trajectory]]]:
    """(file name, trajectories) per archived step, in step order."""
    files = sorted((run_dir / "trajectories").glob("step_*.jsonl"),
                   key=lambda p: (int(p.stem.split("_")[-1]) if p.stem.split("_")[-1].isdigit() else 0, p.name))
    out = []
    for path in files:
        # split on "\n" only: str.splitlines() also breaks at U+2028 / U+0085, which JSON leaves unescaped
        trajs = [Trajectory.model_validate_json(line) for line in path.read_text().split("\n") if line.strip()]
        out.append((path.name, trajs))
    return out


def collect_states(steps: list[tuple[str, list[Trajectory]]], matcher: str = "structured",
                   candidate: CandidateRule = UNNAMED_CANDIDATE) -> list[_State]:
    """Every turn with a reference, references chosen and matched as the trainer's router does
    under the candidate rule `candidate`."""
    buffer, states = SuccessBuffer(), []
    for name, trajs in steps:
        for ep, ref in with_references(trajs, buffer):
            if ref is None:
                continue
            student = ep.trace()
            for t, d in enumerate(route(matcher, student, ref.trace(), candidate)):
                states.append(_State(ep, t, ref, d, student, name))
    return states


def sample_states(states: list[_State], max_states: int, seed: int) -> list[_State]:
    """Up to max_states, half matched and half mismatched where both have enough (the rest filled
    from the other group), each chosen uniformly at random."""
    rng = random.Random(seed)
    by = {g: [s for s in states if s.matched == (g == "matched")] for g in GROUPS}
    for g in GROUPS:
        rng.shuffle(by[g])
    half = max_states // 2
    take = {g: min(len(by[g]), half) for g in GROUPS}
    spare = max_states - sum(take.values())
    for g in GROUPS:
        extra = min(spare, len(by[g]) - take[g])
        take[g] += extra
        spare -= extra
    return [s for g in GROUPS for s in by[g][:take[g]]]


def expert_action(cfg: TrainConfig, traj: Trajectory, t: int) -> str:
    """The embedded env's expert command after replaying the student's first t env actions."""
    env = make_env(cfg.env)
    try:
        env.reset(options={"task": traj.task})
        for turn in traj.turns[:t]:
            env.step(turn.env_action)
        return env.unwrapped.expert_action()  # type: ignore[attr-defined]
    finally:
        env.close()


class _Scorer:
    """Token-mean log-prob of a response after a prompt (CPU, no grad, left-padded batches,
    memoised on the exact ids so identical sequences get identical numbers)."""

    def __init__(self, model_path: str, batch_size: int = 8):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32).eval()
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.tokenizer.eos_token_id
        self.batch_size = batch_size
        self.cache: dict[tuple[tuple[int, ...], tuple[int, ...]], float] = {}

    def response_ids(self, action: str) -> tuple[int, ...]:
        ids = self.tokenizer.encode(action_choice(action), add_special_tokens=False)
        return (*ids, self.tokenizer.eos_token_id)

    def score(self, pairs: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> list[float]:
        todo = sorted({p for p in pairs if p not in self.cache}, key=lambda p: len(p[0]) + len(p[1]))
        torch = self.torch
        for i in range(0, len(todo), self.batch_size):
            chunk = todo[i:i + self.batch_size]
            width = max(len(p) + len(r) for p, r in chunk)
            ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for j, (p, r) in enumerate(chunk):
                seq = list(p) + list(r)
                ids[j, width - len(seq):] = torch.tensor(seq)
                mask[j, width - len(seq):] = 1
            pos = (mask.cumsum(1) - 1).clamp(min=0)
            with torch.no_grad():
                logits = self.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
            logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
            for j, (_, r) in enumerate(chunk):
                self.cache[chunk[j]] = float(logp[j, width - 1 - len(r):].mean())
        return [self.cache[p] for p in pairs]


def _ci(values: list[float], seed: int) -> dict[str, float]:
    mean, lo, hi = bootstrap_ci(values, seed=seed)
    return {"mean": mean, "lo": lo, "hi": hi, "n": len(values)}


def summarize(scores: list[StateScore], seed: int = 0) -> tuple[dict, dict]:
    summary: dict[str, dict[str, dict[str, float]]] = {}
    diffs: dict[str, dict[str, float]] = {}
    sel = {"matched": [s for s in scores if s.matched], "mismatched": [s for s in scores if not s.matched],
           "all": scores}
    for v in VARIANTS:
        summary[v] = {g: _ci([s.delta[v] for s in ss], seed) for g, ss in sel.items()}
        m, lo, hi = unpaired_bootstrap_ci([s.delta[v] for s in sel["matched"]],
                                          [s.delta[v] for s in sel["mismatched"]], seed=seed)
        diffs[f"{v}:matched-mismatched"] = {"mean": m, "lo": lo, "hi": hi}
    for a, b in (("state_matched", "full_path"),):
        for g, ss in sel.items():
            m, lo, hi = paired_bootstrap_ci([s.delta[a] for s in ss], [s.delta[b] for s in ss], seed=seed)
            diffs[f"{a}-{b}:{g}"] = {"mean": m, "lo": lo, "hi": hi, "n": len(ss)}
    summary["student_logprob"] = {g: _ci([s.student_logprob for s in ss], seed) for g, ss in sel.items()}
    return summary, diffs


def plot(result: InterventionResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    variants = [v for v in VARIANTS if v != "none"]
    x = np.arange(len(variants))
    fig, ax = plt.subplots(figsize=(6, 4))
    for k, g in enumerate(GROUPS):
        stats = [result.summary[v][g] for v in variants]
        means = np.array([s["mean"] for s in stats], dtype=float)
        err = np.array([[s["mean"] - s["lo"] for s in stats], [s["hi"] - s["mean"] for s in stats]], dtype=float)
        ax.bar(x + (k - 0.5) * 0.38, np.nan_to_num(means), 0.38, yerr=np.nan_to_num(err), capsize=4,
               label=f"{g} (n={result.num_states[g]})")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(x, variants)
    ax.set_ylabel("Δ token-mean log p(a*)  (teacher − student)")
    ax.set_title("Fixed-state teacher intervention (95% bootstrap CI)")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run_teacher_intervention(run_dir: Path, *, model_path: str, max_states: int = 200, seed: int = 0,
                             out_dir: Path | None = None, batch_size: int = 8) -> InterventionResult:
    run_dir = Path(run_dir)
    cfg = load_config(run_dir / "config.resolved.json")
    states = sample_states(collect_states(load_trajectories(run_dir), candidate=run_candidate_rule(run_dir)),
                           max_states, seed)
    if not states:
        raise ValueError(f"{run_dir}: no archived turn has a reference (need trajectories/step_*.jsonl with "
                         "successes of the same task)")
    scorer = _Scorer(model_path, batch_size=batch_size)
    routers = {v: TeacherRouter(method="fullpath_sd", matcher="structured", parts=parts, audit_matchers=(),
                                rollout=cfg.rollout, tokenizer=scorer.tokenizer,
                                max_chars=cfg.method.teacher_max_chars, seed=seed)
               for v, parts in VARIANTS.items() if parts is not None}

    scores: list[StateScore] = []
    pairs: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    for s in states:
        turn = s.ep.traj.turns[s.t]
        if s.matched and s.decision.candidate_action:
            action, source = s.decision.candidate_action, "candidate"
        else:
            action, source = expert_action(cfg, s.ep.traj, s.t), "expert"
        resp = scorer.response_ids(action)
        prompts = {"none": tuple(turn.prompt_ids)}
        for v, router in routers.items():
            prompts[v] = tuple(router._teacher_prompt(s.ep, s.t, s.ref, s.decision, s.trace))
        pairs.extend((prompts[v], resp) for v in VARIANTS)
        scores.append(StateScore(traj_id=s.ep.traj_id, task_id=s.ep.task_id, turn=s.t, step_file=s.step_file,
                                 matched=s.matched, success=s.ep.success, correct_action=action,
                                 action_source=source, student_logprob=0.0))
    values = scorer.score(pairs)
    for i, sc in enumerate(scores):
        lp = dict(zip(VARIANTS, values[i * len(VARIANTS):(i + 1) * len(VARIANTS)], strict=True))
        sc.student_logprob = lp["none"]
        sc.logprob = lp
        sc.delta = {v: lp[v] - lp["none"] for v in VARIANTS}

    summary, diffs = summarize(scores, seed)
    result = InterventionResult(run_dir=str(run_dir), model_path=str(model_path),
                                num_states={g: sum(s.matched == (g == "matched") for s in scores) for g in GROUPS},
                                summary=summary, differences=diffs, states=scores)
    out = Path(out_dir) if out_dir is not None else run_dir / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    result.png_path = str(plot(result, out / "teacher_intervention.png"))
    result.json_path = str(out / "teacher_intervention.json")
    Path(result.json_path).write_text(json.dumps(result.to_json(), indent=2))
    return result
