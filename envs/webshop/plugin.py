"""The built-in WebShop environment, registered through the public interface (`envs.api`).

Backends: `embedded` (the pure-Python shop, `envs.webshop.env`, on a synthetic or upstream
catalogue) and `webshop` (upstream's WebAgentTextEnv when its package is importable). Prompt
pieces: verl-agent's WebShop templates and observation view (`envs.webshop.prompts`); state
tracker: `envs.webshop.tracker`; task score: the purchase score (`webshop_task_score`).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import gymnasium

from envs.api import EnvConfig, EnvPlugin, SkillVocabulary, Split, StateSignature, TaskSpec, TrackedEpisode
from envs.webshop import prompts
from envs.webshop.ground_truth import WebShopGroundTruth
from envs.webshop.tracker import ENV_NAME, WebShopTracker, signatures_for_episode

SUMMARY_FIELDS = ("stage", "page", "product", "options", "option_progress", "price_ok")
"""The tracker's progress fields the teacher's state summary shows (the exact signature holds no stage)."""


class WebShopStateTracker:
    """WebShop's state tracker: signatures from the observations, the actions and the admissible
    actions shown on each page (they tell option values from headers); no instances."""

    def signatures(self, ep: TrackedEpisode) -> list[StateSignature]:
        return signatures_for_episode(ep.task_id, ep.task_type, ep.instruction, ep.observations, ep.actions,
                                      admissible=ep.admissible)

    def state_summary(self, ep: TrackedEpisode, t: int, signatures: Sequence[StateSignature]) -> dict[str, str]:
        """The tracker's progress fields after observation t (replayed from the reset)."""
        tracker = WebShopTracker(ep.task_id, ep.instruction)
        for k in range(t + 1):
            shown = ep.admissible[k] if k < len(ep.admissible) else None
            tracker.observe(None if k == 0 else ep.actions[k - 1], ep.observations[k], shown)
        return {key: value for key, value in tracker.fields().items() if key in SUMMARY_FIELDS}

    def held(self, ep: TrackedEpisode) -> list[str | None]:
        return []


class WebShopPlugin(EnvPlugin):
    """WebShop: find and buy the product an instruction describes, with its options."""

    name = ENV_NAME
    prompt = prompts.WEBSHOP_PROMPT
    vocabulary = SkillVocabulary(setting=prompts.SKILL_SETTING)
    fallback_chars = 20
    task_score_metric = "webshop_task_score"
    backends = ("embedded", "webshop")
    default_max_steps = 15

    def make_env(self, cfg: EnvConfig) -> gymnasium.Env:
        if cfg.backend == "webshop":
            from envs.webshop.upstream import UpstreamWebShopEnv

            return UpstreamWebShopEnv(cfg)
        from envs.webshop.env import WebShopEnv

        return WebShopEnv(cfg)

    def task_list(self, cfg: EnvConfig, split: Split) -> list[TaskSpec]:
        from envs.webshop.tasks import list_tasks

        return list_tasks(cfg, split)

    def instruction(self, reset_observation: str) -> str:
        return prompts.webshop_instruction(reset_observation)

    def constrained_actions(self, admissible: Sequence[str], instruction: str) -> list[str]:
        return prompts.constrained_actions(admissible, instruction)

    def parity(self) -> ModuleType:
        from envs.webshop import parity

        return parity

    def ground_truth(self) -> WebShopGroundTruth:
        return WebShopGroundTruth()

    def tracker(self) -> WebShopStateTracker:
        return WebShopStateTracker()
