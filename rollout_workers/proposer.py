"""UniSkill's proposer role of the policy (docs/algorithms.md S3), pure: which trajectories become
proposer inputs, how the proposer prompt is written, and how its output is parsed.

The proposer is the same model as the actor. Its prompt shows the source trajectory, an
opposite-outcome trajectory of the same task (and the same retrieved skill: a group shares both),
and the retrieved skill. It answers with one operation token inside action tags, then the skill
text for ADD / UPDATE:

    <action>ADD_NEW_SKILL</action>
    When a receptacle is closed, open it before looking for objects inside.

The prompt ends with "<action>" (prefilled in the assistant turn, for every env), so the first
generated token is the operation decision: `op_position` is always 0 of the response, and the
support regulariser reads the logits there. UPDATE is legal only when a skill was retrieved.

Trajectories are rendered from their recorded env actions and observations (think text is never
shown: it is the model's own chatter, not evidence), within a character budget per trajectory
that drops the oldest steps first.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from rollout_workers.prompts import ChatTokenizer, quote_skill
from rollout_workers.types import Candidate

EditOp = Literal["no_edit", "add", "update"]
OPS: tuple[EditOp, EditOp, EditOp] = ("no_edit", "add", "update")
OP_TOKENS: tuple[str, str, str] = ("NO_SKILL", "ADD_NEW_SKILL", "UPDATE_SKILL")
"""Operation tokens in `OPS` order (the order of ProposalRow.op_token_ids / legal_ops)."""
PREFILL = "<action>"
ACTION_CLOSE = "</action>"
_CJK = re.compile(r"[\u4e00-\u9fff]")
_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL | re.IGNORECASE)
_SKILL_CLOSE = re.compile(re.escape("</skill>"), re.IGNORECASE)

ProposalInvalid = Literal[
    "missing_action_tags", "unknown_op", "illegal_update", "empty_skill", "skill_too_long"
]


def legal_ops(has_retrieved_skill: bool) -> tuple[bool, bool, bool]:
    """(NO_SKILL, ADD_NEW_SKILL, UPDATE_SKILL) legality: UPDATE needs a retrieved skill."""
    return True, True, has_retrieved_skill


# ---- trajectory rendering ---------------------------------------------------------------------


class TurnText(Protocol):
    """What rendering needs of a turn (`rollout_workers.types.Turn` has it)."""

    @property
    def observation(self) -> str: ...
    @property
    def env_action(self) -> str: ...
    @property
    def action_valid(self) -> bool: ...
    @property
    def next_observation(self) -> str: ...


def strip_think(text: str) -> str:
    """`text` without <think>...</think> blocks (an unclosed block runs to the end)."""
    return _THINK.sub("", text).strip()


def render_trajectory(turns: Sequence[TurnText], *, won: bool, max_chars: int) -> str:
    """Outcome line, then "Observation k" / "Action k" lines and the final observation.

    If the whole text is longer than `max_chars`, the oldest steps are replaced by one
    "(... k earlier steps omitted ...)" line; if even the last step does not fit, the text is cut
    at `max_chars` with a trailing "...". Invalid actions are marked "(invalid)"."""
    if max_chars < 1:
        raise ValueError(f"max_chars={max_chars} must be positive")
    outcome = f"Outcome: {'SUCCESS' if won else 'FAILURE'} after {len(turns)} step(s)."
    steps = [
        f"Observation {k}: {t.observation.strip()}\nAction {k}: "
        + (t.env_action if t.action_valid else f"{strip_think(t.env_action)} (invalid)")
        for k, t in enumerate(turns, start=1)
    ]
    final = f"Final observation: {turns[-1].next_observation.strip()}" if turns else "No steps were taken."
    kept, dropped = list(steps), 0
    while True:
        omitted = [f"(... {dropped} earlier step(s) omitted ...)"] if dropped else []
        text = "\n".join([outcome, *omitted, *kept, final])
        if len(text) <= max_chars or not kept:
            break
        kept.pop(0)
        dropped += 1
    if len(text) <= max_chars:
        return text
    return text[: max_chars - 3] + "..." if max_chars > 3 else text[:max_chars]


# ---- the prompt ---------------------------------------------------------------------------------

_OP_LINES = {
    "NO_SKILL": "NO_SKILL: the attempts reveal nothing reusable that is missing; change nothing.",
    "ADD_NEW_SKILL": "ADD_NEW_SKILL: they reveal reusable guidance that no skill gives yet; write it as a "
    "new skill.",
    "UPDATE_SKILL": "UPDATE_SKILL: the retrieved skill is wrong, incomplete or too vague for what the "
    "attempts show; write its corrected full text.",
}


def render_proposer_message(
    *,
    setting: str,
    task: str,
    source: str,
    source_won: bool,
    reference: str,
    skill_text: str | None,
    legal: tuple[bool, bool, bool],
) -> str:
    """The proposer's user message. `source` / `reference` are rendered trajectories
    (`render_trajectory`); `skill_text` is the retrieved skill (None: nothing was retrieved). The
    skill is quoted as data inside <skill> tags. Only the legal operations are offered."""
    opposite = "failed" if source_won else "succeeded"
    skill = (
        "The skill retrieved for this task (advice from past experience, shown to the agent):\n"
        + quote_skill(skill_text)
        if (skill_text or "").strip()
        else "No skill was retrieved for this task.\n"
    )
    ops = [tok for tok, ok in zip(OP_TOKENS, legal) if ok]
    return (
        f"You maintain a bank of reusable skills for an agent that solves {setting}. A skill is short, "
        "general advice (a few sentences) that helps with future tasks of the same kind.\n\n"
        f"Task: {task}\n\n"
        f"## Attempt A (the one to learn from)\n{source}\n\n"
        f"## Attempt B (same task, same skill, but it {opposite})\n{reference}\n\n"
        f"## Current skill\n{skill}\n"
        "Compare what the successful attempt did differently from the failed one and choose ONE edit "
        "of the skill bank:\n"
        + "".join(f"- {_OP_LINES[tok]}\n" for tok in ops)
        + "\nAnswer with the operation inside <action> </action> tags, then, for "
        + " or ".join(t for t in ops if t != "NO_SKILL")
        + ", the skill text in English on the following lines. Write general advice (object types and "
        "steps, not object numbers or this episode's details).\n"
        f"Example:\n<action>{ops[1]}</action>\nWhen the target object is not in sight, check closed "
        "receptacles one by one and open each before searching it.\n"
    )


def render_proposer_prompt_ids(tokenizer: ChatTokenizer, user_message: str) -> list[int]:
    """Chat-templated [user message] + assistant generation prompt + the prefilled "<action>"."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": user_message}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer.encode(text + PREFILL, add_special_tokens=False))


def op_first_token_ids(tokenizer: ChatTokenizer) -> tuple[int, int, int]:
    """The first token id of each operation token (OPS order): the ids the support regulariser
    gathers at the op position, i.e. what the model emits right after the prompt's final "<action>"
    tokens. Taken from the op tokenised on its own: tokenisers whose pre-tokeniser glues a
    punctuation mark to the following letters (Qwen2's ">NO") would otherwise give a merged id the
    model can never emit after a prompt that already ends with ">". They must be distinct."""
    firsts = []
    for tok in OP_TOKENS:
        ids = list(tokenizer.encode(tok, add_special_tokens=False))
        if not ids:
            raise ValueError(f"the tokenizer encodes op token {tok!r} to no ids")
        firsts.append(int(ids[0]))
    if len(set(firsts)) != 3:
        raise ValueError(
            f"op tokens {OP_TOKENS} share first token ids {firsts}; the support regulariser "
            "needs distinct ids (rename the op tokens)"
        )
    return firsts[0], firsts[1], firsts[2]


# ---- parsing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedProposal:
    """`ok` = the output parses (r_fmt = +eta). `op` is None when no op token was recognised;
    `skill_text` is "" for NO_SKILL and for failures; `has_chinese` flags CJK in the skill text
    (r_skill = -eta, S3); `reason` is None exactly when `ok`."""

    op: EditOp | None
    skill_text: str
    ok: bool
    reason: ProposalInvalid | None
    has_chinese: bool


def parse_proposal(
    text: str,
    *,
    legal: tuple[bool, bool, bool] = (True, True, True),
    prefilled: bool = True,
    max_skill_chars: int | None = None,
) -> ParsedProposal:
    """Parse one proposer output (never raises).

    `prefilled`: `text` is the generation after the prompt's "<action>" (the usual case), so it
    starts with the op token. The op is the text up to the first "</action>", stripped, matched
    exactly against OP_TOKENS. The skill text is everything after "</action>", stripped, with an
    optional <skill>...</skill> wrapper removed. NO_SKILL ignores trailing text; ADD/UPDATE need a
    non-empty skill of at most `max_skill_chars`; UPDATE needs `legal[2]`."""
    full = (PREFILL + text) if prefilled else text
    start = full.find(PREFILL)
    end = full.find(ACTION_CLOSE, start + len(PREFILL)) if start != -1 else -1
    if start == -1 or end == -1:
        return ParsedProposal(None, "", False, "missing_action_tags", False)
    token = full[start + len(PREFILL) : end].strip()
    if token not in OP_TOKENS:
        return ParsedProposal(None, "", False, "unknown_op", False)
    idx = OP_TOKENS.index(token)
    op = OPS[idx]
    if not legal[idx]:
        return ParsedProposal(op, "", False, "illegal_update", False)
    if op == "no_edit":
        return ParsedProposal(op, "", True, None, False)
    skill = _unwrap_skill(full[end + len(ACTION_CLOSE) :])
    has_chinese = bool(_CJK.search(skill))
    if not skill:
        return ParsedProposal(op, "", False, "empty_skill", has_chinese)
    if max_skill_chars is not None and len(skill) > max_skill_chars:
        return ParsedProposal(op, skill, False, "skill_too_long", has_chinese)
    return ParsedProposal(op, skill, True, None, has_chinese)


def _unwrap_skill(rest: str) -> str:
    text = rest.strip()
    lowered = text.lower()
    if lowered.startswith("<skill>"):
        text = text[len("<skill>") :]
        closes = list(_SKILL_CLOSE.finditer(text))  # in the text itself: lower() can lengthen it
        text = text[: closes[-1].start()] if closes else text
    return text.strip()


# ---- candidate selection --------------------------------------------------------------------------


class GroupMember(Protocol):
    """What selection needs of a trajectory (deploy adapts `Trajectory` to this)."""

    @property
    def traj_id(self) -> str: ...
    @property
    def group_id(self) -> str: ...
    @property
    def task_id(self) -> str: ...
    @property
    def won(self) -> bool: ...


def group_members(members: Iterable[GroupMember]) -> list[list[GroupMember]]:
    """Members grouped by `group_id`, groups and members in order of first appearance."""
    groups: dict[str, list[GroupMember]] = {}
    for m in members:
        groups.setdefault(m.group_id, []).append(m)
    return list(groups.values())


def eligible(group: Sequence[GroupMember]) -> bool:
    """A group yields candidates only with at least 2 successes and at least 2 failures."""
    wins = sum(m.won for m in group)
    return wins >= 2 and len(group) - wins >= 2


def select_candidates(
    groups: Iterable[Sequence[GroupMember]], rng: random.Random, *, max_candidates: int | None = None
) -> list[Candidate]:
    """Every member of every eligible group as a source, with an opposite-outcome reference and
    held-out anchors tau+ / tau- drawn uniformly from the rest of its group (all four distinct);
    at most `max_candidates` of them (a uniform sample, kept in order). Deterministic given `rng`.

    Raises ValueError for a group that mixes tasks or repeats a trajectory id (a caller bug)."""
    out: list[Candidate] = []
    for group in groups:
        _check_group(group)
        if not eligible(group):
            continue
        wins = [m for m in group if m.won]
        losses = [m for m in group if not m.won]
        for src in group:
            ref = rng.choice(losses if src.won else wins)
            plus = rng.choice([m for m in wins if m is not src and m is not ref])
            minus = rng.choice([m for m in losses if m is not src and m is not ref])
            out.append(
                Candidate(
                    candidate_id=f"cand:{src.traj_id}",
                    group_id=src.group_id,
                    task_id=src.task_id,
                    source_id=src.traj_id,
                    reference_id=ref.traj_id,
                    plus_id=plus.traj_id,
                    minus_id=minus.traj_id,
                    source_won=src.won,
                )
            )
    if max_candidates is not None and len(out) > max_candidates:
        keep = sorted(rng.sample(range(len(out)), max_candidates))
        out = [out[i] for i in keep]
    return out


def _check_group(group: Sequence[GroupMember]) -> None:
    if len({m.task_id for m in group}) > 1:
        raise ValueError(f"group {group[0].group_id} mixes tasks {sorted({m.task_id for m in group})}")
    if len({m.traj_id for m in group}) != len(group):
        raise ValueError(f"group {group[0].group_id} repeats a trajectory id")
