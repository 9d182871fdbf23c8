"""Replaying a finished step's routing on the driver: a method config's `TeacherRouter` (the one
`python -m deploy train` builds, `deploy.trainer.make_router`) applied to the trajectories an
end-to-end run archived. The method smoke tests train one step end to end for every distinct code
path (turn rule, loss form, skill teacher) and replay the archived step through the configs that
differ from a trained one only in what the teacher block shows (`method.context_parts`, or the
same rule with another context): the engine, learner and teacher pass they would run are the ones
the trained configs already ran."""

from __future__ import annotations

from pathlib import Path

from deploy.stages.smrc_sd import RULES, SKILL_METHODS, RoutingResult
from routing.skills import SKILL_HEADER

MARKERS = {"full_reference": "Reference step 1:", "state_summary": "Current state:",
           "candidate_action": "Suggested next action (from the matching step of the reference)"}
"""The line each context part adds to a teacher block (routing/teacher_context.py)."""


def replay_routing(config: Path, model: str | Path, trajectories: list[dict], *sets: str):
    """(config, RoutingResult) of the run's first step (empty success buffer) under `config`."""
    from deploy.config_loading import load_config
    from deploy.trainer import make_router
    from rollout_workers.types import Trajectory, split_infrastructure_failures

    cfg = load_config(config, [f"model.path={model}", *sets])
    played, _ = split_infrastructure_failures([Trajectory.model_validate(t) for t in trajectories])
    router = make_router(cfg)
    assert router is not None, f"{config.name} does not distil"
    return cfg, router(played, step=1)


def check_teacher_blocks(cfg, result: RoutingResult, tokenizer) -> None:
    """Every teacher prompt shows exactly the context parts the config selects: each selected part
    appears in some prompt (a candidate and a state summary on matched turns), no other part in any."""
    parts = set(cfg.method.context_parts) if cfg.method.context_parts is not None else set(RULES[cfg.method.name][1])
    texts = [tokenizer.decode(ids) for ids in result.teacher_prompts.values()]
    assert texts, "no turn was routed"
    skill = cfg.method.name in SKILL_METHODS  # Skill-SD / SDAR: a skill block, no reference parts
    assert all((SKILL_HEADER in text) == skill for text in texts)
    for part, marker in MARKERS.items():
        shown = [marker in text for text in texts]
        if part in parts:
            assert any(shown), f"{part} selected but in no teacher prompt"
        else:
            assert not any(shown), f"{part} not selected but shown"


def config_differences(cfg, trained) -> set[str]:
    """The top-level sections in which a replayed config differs from the trained one."""
    return {name for name in type(cfg).model_fields if getattr(cfg, name) != getattr(trained, name)}
