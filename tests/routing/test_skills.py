"""The Skill-SD / SDAR teacher's skill block (routing/skills.py): condensing, mistakes, layout and budget."""

import pytest

from routing.skills import (
    AVOID_PREFIX,
    SKILL_FOOTER,
    SKILL_HEADER,
    build_skill_context,
    collect_mistakes,
    condense_workflow,
)


def test_workflow_drops_rejected_actions_and_collapses_repeats():
    steps = [("go to desk 1", True), ("take pen", False), ("look", True), ("look", True), ("look", True),
             ("take pen 1 from desk 1", True), ("  ", True), ("go to drawer 1", True)]
    assert condense_workflow(steps) == ["go to desk 1", "look (x3)", "take pen 1 from desk 1", "go to drawer 1"]
    # a repeat separated by a rejected action is still a repeat of the last kept one
    assert condense_workflow([("look", True), ("jump", False), ("look", True)]) == ["look (x2)"]


def test_mistakes_are_distinct_rejected_actions_in_order_and_capped():
    failed = [[("open fridge 1", False), ("go to fridge 1", True), ("open fridge 1", False)],
              [("heat mug", False), ("a", False), ("b", False), ("c", False), ("d", False)]]
    assert collect_mistakes(failed) == ["open fridge 1", "heat mug", "a", "b", "c"]
    assert collect_mistakes(failed, max_mistakes=1) == ["open fridge 1"]
    assert collect_mistakes([[("go to desk 1", True)]]) == []


def test_block_layout_exactly():
    block = build_skill_context(["go to desk 1", "look (x2)"], ["open desk 1"])
    assert block == (f"{SKILL_HEADER}\nWorkflow that succeeded (2 steps): 'go to desk 1' -> 'look (x2)'\n"
                     f"{AVOID_PREFIX}'open desk 1'\n{SKILL_FOOTER}\n")
    no_mistakes = build_skill_context(["a"], [])
    assert no_mistakes == f"{SKILL_HEADER}\nWorkflow that succeeded (1 steps): 'a'\n{SKILL_FOOTER}\n"
    assert build_skill_context([], ["x"]) == ""  # no success to condense: no skill, no teacher


def test_budget_drops_the_oldest_steps_and_keeps_the_last():
    workflow = [f"step number {i}" for i in range(50)]
    full = build_skill_context(workflow, ["m"])
    cut = build_skill_context(workflow, ["m"], max_chars=300)
    assert len(cut) <= 300 < len(full)
    assert "(50 steps): '...' -> " not in cut and "(50 steps): ... -> " in cut
    assert cut.count("step number") < 50 and "'step number 49'" in cut and "'step number 0'" not in cut
    assert build_skill_context(workflow, [], max_chars=0).count("step number") == 1  # never below one step
    with pytest.raises(ValueError, match="max_chars"):
        build_skill_context(workflow, [], max_chars=-1)
