"""The public interface of an environment: everything a package outside this repository imports to
plug its own multi-turn text environment in (docs/environments.md, "Adding an environment").

An environment is an `EnvPlugin`: a factory of gymnasium environments plus what the trainer needs
to sample tasks, prompt the policy, score episodes and (optionally) track state for SMRC-SD and
vocabulary for UniSkill. It is selected by `env.name: <registered name>` (the built-in `alfworld`
and `webshop`, or a name an installed package declares in the `agentrl.envs` entry-point group)
or by `env.plugin: "package.module:Factory"`; `env.options: {...}` reaches the plugin as
`cfg.options`. The built-in environments register through this same interface
(`envs.alfworld.plugin`, `envs.webshop.plugin`).

The gymnasium environment (`EnvPlugin.make_env`):
- `reset(options={"task": TaskSpec})` -> `(observation_text, info)`;
- `step(action_text)` -> `(observation_text, reward, terminated, truncated, info)`;
- `info["admissible_commands"]`: the actions the agent may take now (a list of strings); leave it
  out (or empty) for a free-form environment (the prompt then says any command is allowed and
  constrained decoding is off for it);
- `info["won"]`: the success signal (a bool; the episode's success and the routing reference);
- `info["score"]` (optional): the task score in [0, 1] at the last step, reported as the metric
  named by `EnvPlugin.task_score_metric`;
- `reward`: the trainer's outcome reward (the built-ins pay `cfg.reward_scale` on a win);
- the episode ends when `terminated` or `truncated` (set `truncated` at `cfg.max_steps`).

Everything here is importable from this one module; nothing else in the core is needed.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from envs.config import EnvConfig
from envs.parity import GoldReplay, Mismatch, ReplayReport
from envs.prompt_pieces import (
    ACTION_ONLY_INSTRUCTIONS,
    FREE_FORM_ACTIONS,
    THINK_INSTRUCTIONS,
    PromptPieces,
    as_is,
    quoted_actions,
    standard_prompt,
)
from envs.types import SPLITS, Split, StateSignature, TaskSpec, TrackedEpisode

if TYPE_CHECKING:
    import gymnasium

__all__ = [
    "ACTION_ONLY_INSTRUCTIONS",
    "DEFAULT_INSTANCE_PATTERN",
    "FREE_FORM_ACTIONS",
    "INFO_ADMISSIBLE",
    "INFO_SCORE",
    "INFO_WON",
    "SPLITS",
    "THINK_INSTRUCTIONS",
    "EnvConfig",
    "EnvPlugin",
    "GoldReplay",
    "GroundTruthSkills",
    "Mismatch",
    "PromptPieces",
    "ReplayReport",
    "SkillVocabulary",
    "Split",
    "StateSignature",
    "StateTracker",
    "TaskSpec",
    "TrackedEpisode",
    "as_is",
    "quoted_actions",
    "standard_prompt",
]

INFO_ADMISSIBLE = "admissible_commands"
"""`info` key of the admissible actions (absent or empty: free-form)."""
INFO_WON = "won"
"""`info` key of the success signal."""
INFO_SCORE = "score"
"""`info` key of the optional task score in [0, 1]."""

DEFAULT_INSTANCE_PATTERN = r"\b[a-zA-Z]+ \d+\b|\b(?=[A-Z0-9]*\d)(?=[A-Z0-9]*[A-Z])[A-Z0-9]{10}\b"
"""Text naming one instance, which a reusable skill should not: an object instance ("cabinet 3")
or a product id (ASIN-like "B07XYZ1234")."""


class StateTracker(Protocol):
    """An environment's state tracker for SMRC-SD: it reads a recorded episode and stamps every
    observation with a state signature, so a student's turn can be routed to the position of a
    successful reference in the same state (`method.matcher: structured`)."""

    def signatures(self, episode: TrackedEpisode) -> list[StateSignature]:
        """One exact signature per observation of `episode` (the reset observation first)."""
        ...

    def state_summary(self, episode: TrackedEpisode, t: int, signatures: Sequence[StateSignature]) -> dict[str, str]:
        """The fields the teacher's state summary shows at turn t (e.g. the signature's own fields)."""
        ...

    def held(self, episode: TrackedEpisode) -> list[str | None]:
        """The object instance held at each observation where a signature names it by class only, so
        a matched reference's action can be bound to the student's instance; [] without instances."""
        ...


@dataclass(frozen=True)
class SkillVocabulary:
    """What UniSkill's proposer prompt and rule critic need to know of an environment."""

    setting: str
    """The proposer prompt's description of the environment, e.g. "a cooking task in a text game"."""
    instance_pattern: str = DEFAULT_INSTANCE_PATTERN
    """A regular expression matching text that names one instance (an object number, a product id):
    the rule critic refuses skill text containing it, since a skill must be reusable."""


class GroundTruthSkills(Protocol):
    """Skills written from an environment's ground truth (optional; the testbed's skill and proposer
    SFT turns and its skill-gain measurement need them, training does not)."""

    def helpful(self, cfg: EnvConfig, task: TaskSpec) -> str:
        """The task's ground-truth skill: general advice, no instance names (deterministic)."""
        ...

    def irrelevant(self, cfg: EnvConfig, task: TaskSpec, rng: random.Random) -> str:
        """A ground-truth skill about another kind of task, naming none of this task's own words."""
        ...

    def vague(self, cfg: EnvConfig, task: TaskSpec) -> str:
        """An incomplete skill for the task's kind (the retrieved skill a proposer should UPDATE)."""
        ...


class EnvPlugin(ABC):
    """One environment, as the trainer sees it. Subclass it, set the class attributes, implement
    `make_env` and either `task_list` or (`is_generated` and `generated_task`)."""

    name: ClassVar[str]
    """The registered name: `env.name` in a config and `TaskSpec.env` of every task."""
    prompt: ClassVar[PromptPieces]
    """How turns read in the policy's prompt (`standard_prompt(system)` builds one from a sentence)."""
    vocabulary: ClassVar[SkillVocabulary] = SkillVocabulary(setting="a task in a text-based environment")
    """UniSkill's view of the environment."""
    fallback_chars: ClassVar[int] = 30
    """How many trailing characters of an output without action tags the environment receives."""
    task_score_metric: ClassVar[str | None] = None
    """The rollout metric of `info["score"]` (e.g. "myenv_task_score"); None: no task score."""
    backends: ClassVar[tuple[str, ...]] = ("embedded",)
    """The `env.backend` values this environment runs on (the first is the default)."""
    default_max_steps: ClassVar[int | None] = None
    """`env.max_steps` when the config does not set it (None: the config's default, 50)."""

    @abstractmethod
    def make_env(self, cfg: EnvConfig) -> gymnasium.Env:
        """A fresh, not-yet-reset gymnasium environment for `cfg` (`cfg.options` holds the user's
        `env.options`)."""

    def check_config(self, cfg: EnvConfig) -> None:
        """Raise ValueError naming the problem and the fix when `cfg` cannot run (called while the
        config is validated, before any actor starts; e.g. unknown `cfg.options` keys)."""

    def is_generated(self, cfg: EnvConfig) -> bool:
        """True when tasks are an unbounded family indexed by seed (`generated_task`), False when
        each split is a finite list (`task_list`)."""
        return False

    def task_list(self, cfg: EnvConfig, split: Split) -> list[TaskSpec]:
        """Every task of `split` in a fixed order (TaskSpec.seed = index); evaluation takes the first
        N and training samples from it."""
        raise NotImplementedError(f"env {self.name!r} has no task list")

    def generated_task(self, cfg: EnvConfig, split: Split, seed: int) -> TaskSpec:
        """The task of (split, seed) of a generated family (`is_generated`)."""
        raise NotImplementedError(f"env {self.name!r} does not generate tasks by seed")

    def instruction(self, reset_observation: str) -> str:
        """The task line the prompt shows, read from the reset observation; "" (the default) uses
        the TaskSpec's `instruction`."""
        return ""

    def constrained_actions(self, admissible: Sequence[str], instruction: str) -> list[str]:
        """The actions constrained decoding may produce (the admissible ones by default; [] for a
        free-form turn turns constraint off for it)."""
        return list(admissible)

    def parity(self) -> Any:
        """The environment's parity tools (`envs.parity`: `record`/`replay` of step transcripts and/or
        `gold_replay`), run by `python -m deploy env replay --env NAME`; None (the default): none."""
        return None

    def ground_truth(self) -> GroundTruthSkills | None:
        """Ground-truth skills for the testbed (`deploy testbed build`), or None (the default)."""
        return None

    def tracker(self) -> StateTracker | None:
        """The environment's state tracker, or None: SMRC-SD then routes with the generic
        observation-text tracker (`method.matcher: history` or `observation`)."""
        return None
