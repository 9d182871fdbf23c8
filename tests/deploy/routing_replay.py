"""Replaying a finished step: its routing on the driver (a method config's `TeacherRouter`, the one
`python -m deploy train` builds, `deploy.trainer.make_router`) and its update on a learner (the
`LearnerWorker` a train run's learner actor is, in this process), applied to the trajectories an
end-to-end run archived.

The method smoke tests train one step end to end per environment (smrc_sd) and replay its archived
step through every config that samples the same step: the configs that differ from it only in the
method block and the learner's loss (turn rule, loss form, skill teacher, advantage estimator) play
the same episodes from the same seeds, so training each of them end to end again would repeat the
same rollouts. The replay of the trained config itself must first reproduce the trained step's
metrics (`check_learner_replay`)."""

from __future__ import annotations

from pathlib import Path

import pytest

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


def replay_learning(cfg, model: str | Path, trajectories: list[dict], teacher_prompts=None) -> dict[str, float]:
    """metrics.jsonl's learner keys of one update of `model` on the archived step under `cfg` (its
    learner block: loss form, SD coefficient, advantage estimator) with `teacher_prompts` (a
    routing replay's), on the rows a train run's learner builds (`deploy.step_rows.StepRows.rows`)."""
    from deploy.trainer import learner_log_dict
    from learner.batch import rows_from_trajectories
    from learner.worker import LearnerWorker
    from rollout_workers.types import Trajectory, split_infrastructure_failures

    assert not cfg.learner.use_deepspeed, "replay on the torch learner (the shared runs' TORCH_LEARNER)"
    played, _ = split_infrastructure_failures([Trajectory.model_validate(t) for t in trajectories])
    rows = rows_from_trajectories(played, teacher_prompts or None, gamma=cfg.learner.gigpo_gamma)
    return learner_log_dict(LearnerWorker(cfg.learner, str(model)).train_step(rows))


def replay_step(config: Path, model: str | Path, trajectories: list[dict], *sets: str):
    """(metrics, config): the archived first step's routing and update replayed under `config`
    (`replay_routing`, then `replay_learning` with its teacher prompts), the router's metrics and
    the learner's merged as metrics.jsonl merges them."""
    cfg, routed = replay_routing(config, model, trajectories, *sets)
    return {**routed.metrics, **replay_learning(cfg, model, trajectories, routed.teacher_prompts)}, cfg


def samples_the_same_step(cfg, trained) -> None:
    """`cfg` plays the episodes `trained` played (same seeds): it differs only in the method block
    and the learner's loss (SD form and coefficient, advantage estimator)."""
    assert config_differences(cfg, trained) <= {"run", "method", "learner"}
    loss = {"sd", "adv_estimator"}
    assert cfg.learner.model_dump(exclude=loss) == trained.learner.model_dump(exclude=loss)


def step_replayer(trained_config: Path, model: str | Path, trajectories: list[dict], trained_metrics: dict,
                  *sets: str):
    """`replay(config) -> (metrics, config)` for the configs that sample the step `trained_config`
    trained (`trajectories`, `trained_metrics`): the replay of `trained_config` itself must first give
    the trained step's learner metrics, and every replayed config must sample the same step."""
    again, trained_cfg = replay_step(trained_config, model, trajectories, *sets)
    check_learner_replay(again, trained_metrics)

    def replay(config: Path):
        metrics, cfg = replay_step(config, model, trajectories, *sets)
        samples_the_same_step(cfg, trained_cfg)
        return metrics, cfg

    return replay


REPLAYED_KEYS = ("loss/total", "loss/pg", "loss/kl", "loss/entropy", "loss/sd", "grad_norm", "advantage_abs_mean", "num_rows",
                 "num_tokens", "sd/match_rate", "sd/teacher_tokens")
"""The learner metrics a replay must reproduce (timings and sampling statistics aside)."""


def check_learner_replay(replayed: dict[str, float], trained: dict[str, float]) -> None:
    """The replay of a trained step gives its learner metrics (to float noise: the learner actor
    ran with its own thread count)."""
    keys = [k for k in REPLAYED_KEYS if k in trained or k in replayed]
    assert {k: replayed.get(k) for k in keys} == pytest.approx({k: trained.get(k) for k in keys}, rel=1e-4, abs=1e-7)


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
