"""The built-in ALFWorld environment, registered through the public interface (`envs.api`).

Backends: `embedded` (the pure-Python household simulator, `envs.household`: generated rooms by
seed, or game files under `env.data_path`) and `alfworld` (the real alfworld/TextWorld engine on
game files, `envs.alfworld_real`; its packages are imported only when it is used). Prompt pieces:
verl-agent's ALFWorld templates (`envs.alfworld.prompts`); state tracker: `envs.alfworld.tracker`.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import gymnasium

from envs.alfworld import prompts
from envs.alfworld.ground_truth import AlfworldGroundTruth
from envs.alfworld.tracker import ENV_NAME, held_for_episode, signatures_for_episode
from envs.api import EnvConfig, EnvPlugin, SkillVocabulary, Split, StateSignature, TaskSpec, TrackedEpisode


class AlfworldTracker:
    """ALFWorld's state tracker: signatures from the observation stream; the teacher's summary is
    the exact signature's fields; the held instance at each observation."""

    def signatures(self, ep: TrackedEpisode) -> list[StateSignature]:
        return signatures_for_episode(ep.task_id, ep.task_type, ep.instruction, ep.observations, ep.actions)

    def state_summary(self, ep: TrackedEpisode, t: int, signatures: Sequence[StateSignature]) -> dict[str, str]:
        return dict(signatures[t].fields)

    def held(self, ep: TrackedEpisode) -> list[str | None]:
        return held_for_episode(ep.task_id, ep.task_type, ep.instruction, ep.observations, ep.actions)


class AlfworldPlugin(EnvPlugin):
    """ALFWorld: household tasks (pick, clean, heat, cool, look, pick two) in text."""

    name = ENV_NAME
    prompt = prompts.ALFWORLD_PROMPT
    vocabulary = SkillVocabulary(setting=prompts.SKILL_SETTING)
    fallback_chars = 30
    backends = ("embedded", "alfworld")

    def make_env(self, cfg: EnvConfig) -> gymnasium.Env:
        if cfg.backend == "alfworld":
            from envs.alfworld_real.env import RealAlfworldEnv

            return RealAlfworldEnv(cfg)
        if cfg.data_path is not None:
            from envs.household.gamefile_env import GameFileHouseholdEnv

            return GameFileHouseholdEnv(cfg)
        from envs.household.env import HouseholdEnv

        return HouseholdEnv(cfg.difficulty(), max_steps=cfg.max_steps, reward_scale=cfg.reward_scale)

    def is_generated(self, cfg: EnvConfig) -> bool:
        return cfg.backend == "embedded" and cfg.data_path is None

    def task_list(self, cfg: EnvConfig, split: Split) -> list[TaskSpec]:
        from envs.alfworld_real.games import list_tasks

        return list_tasks(cfg, split)

    def generated_task(self, cfg: EnvConfig, split: Split, seed: int) -> TaskSpec:
        from envs.household.generator import generate_game, task_type_for_seed

        difficulty = cfg.difficulty()
        game = generate_game(split, seed, difficulty)
        return TaskSpec(env=self.name, task_id=game.game_id, task_type=task_type_for_seed(seed, difficulty),
                        split=split, instruction=game.goal_text, seed=seed)

    def instruction(self, reset_observation: str) -> str:
        return prompts.task_description(reset_observation)

    def constrained_actions(self, admissible: Sequence[str], instruction: str) -> list[str]:
        return prompts.constrained_actions(admissible, instruction)

    def parity(self) -> ModuleType:
        from envs.alfworld import parity

        return parity

    def ground_truth(self) -> AlfworldGroundTruth:
        return AlfworldGroundTruth()

    def tracker(self) -> AlfworldTracker:
        return AlfworldTracker()
