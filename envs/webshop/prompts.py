"""verl-agent's WebShop prompt pieces: observation formatting, available actions, the two templates,
the task line and the constrained actions (instruction-derived search queries).

The template text is verl-agent's, character for character (the non-breaking hyphen U+2011 in
"e‑commerce", the trailing space after "environment. " in the first-step template only, the
space after "are: " and after "tags. "), because the published numbers were obtained with it.
What verl-agent's WebShop env manager does, reproduced here from the raw text-mode observation:

- task = the instruction text, `obs.split(" [SEP] ")[2]` when `[1] == "Instruction:"` (reset page);
- observation = the parts after the first part equal to the instruction, each single-quoted and
  re-joined with " [SEP] " (the search page becomes "'Search'"); the raw text when the
  instruction is not among the parts (the done page);
- available actions = the env's admissible strings ("search[<your query>]" first when the page
  has a search bar, then "click[...]"), one per line as "'click[...]',";
- history = verl-agent's memory lines "[Observation k: '<formatted obs before action k>', Action
  k: '<action k>']" for the last `history_length` steps (the ALFWorld format);
- the history template falls back to the first-step template when the rendered message exceeds
  13,000 characters (`MAX_HISTORY_PROMPT_CHARS`), as upstream.

The shared renderer (`rollout_workers.prompts.render_turn_message`) renders the pieces.

Departure (as for ALFWorld): `use_think=False` swaps the two closing instructions for one asking
only for the action tag (the tiny model).

Extensions (absent upstream; with none of them given the message is byte-identical to
verl-agent's):
- `skill_text` (UniSkill): the skill block placed right before the
  "Your admissible actions ..." line, after the task, history and current observation;
- `teacher_context` (SMRC-SD): inserted verbatim on its own line(s) right before the current
  observation line. The 13,000-character fallback is decided on the message WITHOUT the teacher
  block, so a teacher prompt is always the student's prompt plus the block.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from envs.prompt_pieces import PromptPieces

SEP = " [SEP] "
INSTRUCTION_MARKER = "Instruction:"
SEARCH_PLACEHOLDER = "search[<your query>]"
MAX_HISTORY_PROMPT_CHARS = 13_000

_THINK_INSTRUCTIONS = (
    "Now it's your turn to take one action for the current step.\n"
    "You should first reason step-by-step about the current situation, then think carefully which "
    "admissible action best advances the shopping goal. This reasoning process MUST be enclosed "
    "within <think> </think> tags. \n"
    "Once you've finished your reasoning, you should choose an admissible action for current step "
    "and present it within <action> </action> tags.\n"
)
_ACTION_ONLY_INSTRUCTIONS = (
    "Now it's your turn to take one action for the current step.\n"
    "You should choose an admissible action for current step and present it within "
    "<action> </action> tags.\n"
)

WEBSHOP_TEMPLATE_NO_HIS = (
    "\n"
    "You are an expert autonomous agent operating in the WebShop e\u2011commerce environment. \n"
    "Your task is to: {task_description}.\n"
    "Your current observation is: {current_observation}.\n"
    "Your admissible actions of the current situation are: \n"
    "[\n"
    "{admissible_actions}\n"
    "].\n"
    "\n" + _THINK_INSTRUCTIONS
)
WEBSHOP_TEMPLATE = (
    "\n"
    "You are an expert autonomous agent operating in the WebShop e\u2011commerce environment.\n"
    "Your task is to: {task_description}.\n"
    "Prior to this step, you have already taken {step_count} step(s). Below are the most recent "
    "{history_length} observations and the corresponding actions you took: {action_history}\n"
    "You are now at step {current_step} and your current observation is: {current_observation}.\n"
    "Your admissible actions of the current situation are: \n"
    "[\n"
    "{admissible_actions}\n"
    "].\n"
    "\n" + _THINK_INSTRUCTIONS
)

SKILL_SETTING = "a shopping task on the WebShop website (text-based)"
"""How the UniSkill proposer prompt describes the environment."""


def webshop_instruction(reset_observation: str) -> str:
    """The instruction text of a raw WebShop observation ("" when the page does not show it).

    Reset page: "WebShop [SEP] Instruction: [SEP] <instr> [SEP] Search"; other pages start with
    "Instruction: [SEP] <instr> [SEP] ...". The part after the first "Instruction:" part is it.
    """
    parts = reset_observation.split(SEP)
    for i, part in enumerate(parts[:-1]):
        if part == INSTRUCTION_MARKER:
            return parts[i + 1]
    return ""


def format_observation(observation: str, instruction: str) -> str:
    """verl-agent's view of a page: the parts after the instruction, quoted, joined by " [SEP] ".

    The raw observation comes back unchanged when `instruction` is not one of its parts.
    """
    parts = observation.split(SEP)
    try:
        index = parts.index(instruction)
    except ValueError:
        return observation
    return SEP.join(f"'{p}'" for p in parts[index + 1 :])


def format_available_actions(actions: Sequence[str]) -> str:
    """One action per line, each as "'<action>',"."""
    return "\n".join(f"'{a}'," for a in actions)


WEBSHOP_PROMPT = PromptPieces(
    first_template=WEBSHOP_TEMPLATE_NO_HIS, history_template=WEBSHOP_TEMPLATE, think_instructions=_THINK_INSTRUCTIONS,
    action_only_instructions=_ACTION_ONLY_INSTRUCTIONS, format_observation=format_observation,
    format_actions=format_available_actions, max_history_chars=MAX_HISTORY_PROMPT_CHARS)


# ---- constrained decoding ------------------------------------------------------------------------
_PRICE_CLAUSE = re.compile(r",?\s*and price lower than [\d.,]+ dollars\.?\s*$")
_OPTIONS_CLAUSE = re.compile(r"\s+with\s+[^,:]+:\s.*$")
_REQUEST_PREFIX = re.compile(
    r"^(?:i am looking for|i'm looking for|i am searching for|looking for|i would like|i'd like|"
    r"i need|i want|find me|get me|buy me|show me|search for)\s+"
)
_ARTICLES = frozenset({"a", "an", "the", "some"})


def webshop_search_queries(instruction: str) -> list[str]:
    """Search queries derived from a WebShop instruction, most specific last (deduplicated):

    1. keywords: the product phrase without the request prefix ("i need", "i am looking for", ...)
       and without articles;
    2. the product phrase: the instruction without its "with k: v, and k2: v2" options clause
       and its ", and price lower than P dollars" clause;
    3. the whole instruction.

    All lowercased (the projection lowercases actions anyway), brackets removed (they would end
    the `search[...]` argument), whitespace collapsed. [] for an empty instruction.
    """
    full = " ".join(instruction.lower().replace("[", " ").replace("]", " ").split())
    phrase = _OPTIONS_CLAUSE.sub("", _PRICE_CLAUSE.sub("", full)).strip(" ,.")
    words = [w for w in _REQUEST_PREFIX.sub("", phrase).split() if w not in _ARTICLES]
    return list(dict.fromkeys(q for q in (" ".join(words), phrase, full) if q))


def constrained_actions(admissible: Sequence[str], instruction: str) -> list[str]:
    """The actions constrained decoding allows: every `click[...]`; in place of the free-text
    "search[<your query>]" (offered when the page has a search bar), one `search[q]` per query of
    `webshop_search_queries(instruction)`. Free text cannot be constrained here because both
    engines constrain to a finite choice list (the HF engine's token trie; vLLM's `choice`
    structured output, whose allowed ids are replayed from the same trie), so WebShop searches
    are limited to those instruction-derived queries.
    """
    out: list[str] = []
    for a in admissible:
        if a == SEARCH_PLACEHOLDER:
            out += [f"search[{q}]" for q in webshop_search_queries(instruction)]
        else:
            out.append(a)
    return list(dict.fromkeys(out))
