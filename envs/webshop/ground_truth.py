"""WebShop's ground-truth skills, for the testbed's skill and proposer SFT turns and the skill-gain
measurement (`deploy.testbed`, through `WebShopPlugin.ground_truth`).

Embedded WebShop: how the goal's options map to the instruction (the goal's option names, the
product words to search for, buy only after selecting every named option, the price limit). The
irrelevant skill is a goal's from another product category and never names the task's product query.
"""

from __future__ import annotations

import random

from envs.config import EnvConfig
from envs.types import TaskSpec


def listing(words: list[str]) -> str:
    """"a", "a or b", "a, b or c"."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def webshop_goal(env: EnvConfig, task: TaskSpec) -> dict:
    """The catalogue goal behind a WebShop task (its asin, query, category, options, price limit)."""
    from envs.webshop.catalogue import catalogue_for
    from envs.webshop.tasks import parse_task_id

    mode, index = parse_task_id(task.task_id)
    goals = catalogue_for(env, mode).goals
    if not 0 <= index < len(goals):
        raise ValueError(f"task {task.task_id!r}: goal index {index} is outside the catalogue's {len(goals)} goals")
    return goals[index]


def webshop_skill(goal: dict) -> str:
    """The ground-truth skill for a WebShop goal's product type: what to search, which options the
    instruction names, buy only after selecting them, the price limit."""
    query = " ".join(str(goal["query"]).split()).lower()
    options = goal.get("goal_options") or {}
    if isinstance(options, dict) and options:
        names = [str(k).lower() for k in options]
        pick = (f"the instruction names a value for {listing(names).replace(' or ', ' and ')}; on the item page "
                "click each of those values exactly as the instruction writes it")
    elif options:
        pick = ("on the item page click every option value the instruction asks for (colour, size, flavour "
                "and the like), exactly as it writes it")
    else:
        pick = "the item page needs no option choices"
    return (f"When shopping for {query}: search with the product words of the instruction (the part before "
            f"'with'), open a result whose title names that product, {pick}, and only then click buy now. "
            "Choose a product below the price limit the instruction gives.")


def webshop_irrelevant_skill(env: EnvConfig, task: TaskSpec, rng: random.Random) -> str:
    """The ground-truth skill of a goal from another product category (another product type)."""
    from envs.webshop.catalogue import catalogue_for
    from envs.webshop.tasks import task_type as goal_category

    goal = webshop_goal(env, task)
    query = str(goal["query"]).lower()
    others = [g for g in catalogue_for(env, task.task_id.split("/")[0]).goals  # type: ignore[arg-type]
              if goal_category(g) != task.task_type and str(g["query"]).lower() != query]
    if not others:
        raise ValueError(f"task {task.task_id!r}: the catalogue has no goal outside category {task.task_type!r}; "
                         "an irrelevant skill needs another product category (use more products)")
    return webshop_skill(rng.choice(others))


class WebShopGroundTruth:
    """The testbed's skills for a WebShop task (`envs.api.GroundTruthSkills`)."""

    def helpful(self, cfg: EnvConfig, task: TaskSpec) -> str:
        return webshop_skill(webshop_goal(cfg, task))

    def irrelevant(self, cfg: EnvConfig, task: TaskSpec, rng: random.Random) -> str:
        return webshop_irrelevant_skill(cfg, task, rng)

    def vague(self, cfg: EnvConfig, task: TaskSpec) -> str:
        query = " ".join(str(webshop_goal(cfg, task)["query"]).split()).lower()
        return f"When shopping for {query}, search for the product and buy it."
