"""WebShopTracker on scripted episodes built from the exact text-mode pages (docs/environments.md 2.4)."""

from __future__ import annotations

import pytest

from envs.webshop.tracker import (
    WebShopTracker,
    goal_options,
    goal_price_limit,
    read_page,
    signatures_for_episode,
)
from routing.matching import RouteTrace, route

INSTR = (
    "i need a slim fit men's dress shirt that is machine washable with color: navy blue, and size: large, "
    "and price lower than 50.00 dollars"
)
HUMAN = "i am looking for a queen sized bed that is black, and price lower than 140.00 dollars"
HEAD = f"Instruction: [SEP] {INSTR} [SEP] Back to Search"
SEARCH = f"WebShop [SEP] Instruction: [SEP] {INSTR} [SEP] Search"


def results(page: int = 1, asins: tuple[str, ...] = ("B000000001", "B000000002")) -> str:
    items = " [SEP] ".join(f"{a} [SEP] Shirt {a[-1]} [SEP] $24.99" for a in asins)
    prev = " [SEP] < Prev" if page > 1 else ""
    return f"{HEAD}{prev} [SEP] Page {page} (Total results: {len(asins)}) [SEP] Next > [SEP] {items}"


def item(price: str = "$24.99") -> str:
    return (
        f"{HEAD} [SEP] < Prev [SEP] color [SEP] navy blue [SEP] white [SEP] size [SEP] medium [SEP] large [SEP] "
        f"Men's Slim Fit Cotton Dress Shirt [SEP] Price: {price} [SEP] Rating: N.A. [SEP] Description [SEP] "
        "Features [SEP] Reviews [SEP] Buy Now"
    )


ITEM_ACTIONS = (
    "click[back to search]", "click[< prev]", "click[description]", "click[features]", "click[reviews]",
    "click[buy now]", "click[navy blue]", "click[white]", "click[medium]", "click[large]",
)  # fmt: skip
SEARCH_ACTIONS = ("search[<your query>]", "click[search]")
RESULTS_ACTIONS = ("click[back to search]", "click[next >]", "click[b000000001]", "click[b000000002]")
DESCRIPTION = f"{HEAD} [SEP] < Prev [SEP] A soft cotton shirt."
DONE = "Thank you for shopping with us! [SEP] Your code: [SEP] None [SEP] Your score (min 0.0, max 1.0) [SEP] 1.0"

# (action, resulting observation, admissible actions shown with it)
WINNING = [
    ("search[slim fit dress shirt]", results(), RESULTS_ACTIONS),
    ("click[b000000001]", item(), ITEM_ACTIONS),
    ("click[navy blue]", item(), ITEM_ACTIONS),
    ("click[description]", DESCRIPTION, ("click[back to search]", "click[< prev]")),
    ("click[< prev]", item(), ITEM_ACTIONS),
    ("click[large]", item(), ITEM_ACTIONS),
    ("click[buy now]", DONE, ()),
]


def play(steps, instruction: str = "") -> tuple[WebShopTracker, list[dict[str, str]]]:
    tr = WebShopTracker("synthetic/00001", instruction)
    tr.observe(None, SEARCH, SEARCH_ACTIONS)
    out = [tr.fields()]
    for action, obs, admissible in steps:
        tr.observe(action, obs, admissible)
        out.append(tr.fields())
    return tr, out


def test_goal_parsing():
    assert goal_options(INSTR) == {"color": "navy blue", "size": "large"}
    assert goal_options(HUMAN) == {}
    assert goal_price_limit(INSTR) == 50.0 and goal_price_limit("a red hat") is None


def test_page_classification():
    assert read_page(SEARCH).kind == "search"
    assert read_page(results(2)).kind == "results" and read_page(results(2)).results_page == 2
    page = read_page(item(), frozenset(a[6:-1] for a in ITEM_ACTIONS))
    assert page.kind == "item" and page.price == 24.99
    assert page.option_groups == (("color", ("navy blue", "white")), ("size", ("medium", "large")))
    assert read_page(DESCRIPTION).kind == "item_sub" and read_page(DONE).kind == "done"


def test_stages_pages_and_options_on_a_winning_episode():
    tr, fields = play(WINNING)  # instruction read from the reset page
    assert tr.instruction == INSTR
    assert [f["stage"] for f in fields] == [
        "start", "searched", "viewing_item", "viewing_item", "viewing_item", "viewing_item", "options_set", "bought",
    ]  # fmt: skip
    assert [f["page"] for f in fields] == [
        "search", "results", "item", "item", "item_sub:description", "item", "item", "done",
    ]  # fmt: skip
    assert [f["options"] for f in fields][2:7] == ["", "color=navy blue", "color=navy blue", "color=navy blue",
                                                   "color=navy blue,size=large"]  # fmt: skip
    assert [f["option_progress"] for f in fields][1:7] == ["0/2", "0/2", "1/2", "1/2", "1/2", "2/2"]
    assert fields[2]["product"] == "b000000001" and fields[2]["price_ok"] == "true"
    assert fields[1]["n_searches"] == "1" and fields[0]["price_ok"] == "unknown"
    exact = tr.signature()
    assert exact.env == "webshop" and exact.task_id == "synthetic/00001"


def test_back_to_search_and_product_change_reset_the_selection():
    steps = [
        *WINNING[:3],  # search, product 1, navy blue
        ("click[back to search]", SEARCH, SEARCH_ACTIONS),
        ("search[dress shirt]", results(), RESULTS_ACTIONS),
        ("click[b000000002]", item(), ITEM_ACTIONS),
    ]
    _, fields = play(steps, INSTR)
    assert fields[3]["options"] == "color=navy blue"
    assert (fields[4]["page"], fields[4]["product"], fields[4]["options"], fields[4]["stage"]) == (
        "search", "none", "", "searched",
    )  # fmt: skip
    assert (
        fields[5]["n_searches"] == "2+"
        and fields[6]["product"] == "b000000002"
        and fields[6]["options"] == ""
    )
    # back to the results and into the same product again: a fresh selection (upstream resets it)
    again = [
        *WINNING[:3],
        ("click[< prev]", results(), RESULTS_ACTIONS),
        ("click[b000000001]", item(), ITEM_ACTIONS),
    ]
    _, fields = play(again, INSTR)
    assert (
        fields[4]["product"] == "none" and fields[5]["options"] == "" and fields[5]["product"] == "b000000001"
    )


def test_option_change_within_a_group_and_invalid_clicks():
    steps = [
        *WINNING[:3],  # navy blue
        ("click[white]", item(), ITEM_ACTIONS),  # same group: replaces
        ("click[purple]", item(), ITEM_ACTIONS),  # not a value: nothing changes
        ("click[large]", item(), ITEM_ACTIONS),
        ("search[other]", results(), RESULTS_ACTIONS),  # upstream executes a search from any page
    ]
    _, fields = play(steps, INSTR)
    assert [f["options"] for f in fields[4:7]] == ["color=white", "color=white", "color=white,size=large"]
    assert (
        fields[6]["option_progress"] == "1/2" and fields[6]["stage"] == "viewing_item"
    )  # white is not the goal
    assert fields[7]["n_searches"] == "2+" and fields[7]["product"] == "none" and fields[7]["options"] == ""


def test_price_over_the_limit_and_human_goal_progress():
    _, fields = play([WINNING[0], ("click[b000000001]", item("$55.00"), ITEM_ACTIONS)], INSTR)
    assert fields[-1]["price_ok"] == "false"
    # human goals state no options: K = option groups on the page, k = groups chosen
    human_search = SEARCH.replace(INSTR, HUMAN)
    tr = WebShopTracker("human/1")
    tr.observe(None, human_search, SEARCH_ACTIONS)
    for action, obs, adm in WINNING[:3]:
        tr.observe(action, obs.replace(INSTR, HUMAN), adm)
    assert tr.instruction == HUMAN and tr.option_progress() == (1, 2) and tr.stage() == "viewing_item"


def test_results_paging_and_abstract_signature():
    steps = [
        WINNING[0],
        ("click[next >]", results(2), RESULTS_ACTIONS),
        ("click[next >]", results(3, ()), ()),
    ]
    tr, fields = play(steps, INSTR)
    assert [f["results_page"] for f in fields] == ["0", "1", "2", "3"]
    abstract = dict(tr.abstract_signature().fields)
    assert tr.abstract_signature().task_id == "*"
    assert abstract == {
        "page": "results", "stage": "searched", "option_progress": "0", "price_ok": "unknown", "results_page": "3+",
    }  # fmt: skip


def test_without_admissible_actions_options_fall_in_the_first_group():
    tr = WebShopTracker("t", INSTR)
    tr.observe(None, SEARCH)
    for action, obs, _ in WINNING[:3]:
        tr.observe(action, obs)
    assert tr.options_text() == "color=navy blue"


def test_signatures_for_episode_and_structured_matching():
    observations = [SEARCH] + [obs for _, obs, _ in WINNING]
    actions = [a for a, _, _ in WINNING]
    admissible = [SEARCH_ACTIONS] + [adm for _, _, adm in WINNING]
    sigs = signatures_for_episode("t", "apparel", INSTR, observations, actions, admissible=admissible)
    assert len(sigs) == len(observations) and sigs[0] != sigs[1]
    assert sigs[2] != sigs[3]  # an option click changes the exact signature though the page text does not
    abstract = signatures_for_episode(
        "t", "", INSTR, observations, actions, admissible=admissible, abstract=True
    )
    assert all(s.task_id == "*" for s in abstract)
    with pytest.raises(ValueError, match="observations for"):
        signatures_for_episode("t", "", INSTR, observations[:2], actions)
    with pytest.raises(ValueError, match="admissible-action lists"):
        signatures_for_episode("t", "", INSTR, observations, actions, admissible=admissible[:3])

    # a student that detours through another product meets the reference again at the same states
    reference = RouteTrace(actions=actions, observations=observations, signatures=sigs)
    detour = [*WINNING[:2], ("click[< prev]", results(), RESULTS_ACTIONS), *WINNING[1:]]
    s_obs = [SEARCH] + [o for _, o, _ in detour]
    s_act = [a for a, _, _ in detour]
    s_adm = [SEARCH_ACTIONS] + [adm for _, _, adm in detour]
    student = RouteTrace(
        actions=s_act,
        observations=s_obs,
        signatures=signatures_for_episode("t", "", INSTR, s_obs, s_act, admissible=s_adm),
    )
    decisions = route("structured", student, reference, "first_visit")
    assert [d.ref_position for d in decisions] == [0, 1, 2, 1, 2, 3, 4, 5, 6]
    assert [d.candidate_action for d in decisions][:4] == [actions[0], actions[1], actions[2], actions[1]]
    # the reference's description page is a loop (item -> description -> the same item state): the
    # last visit skips it, and loop erasure leaves the description state unmatched
    last = route("structured", student, reference, "last_visit")
    assert [d.ref_position for d in last] == [0, 1, 2, 1, 2, 5, 4, 5, 6]
    assert last[5].candidate_action == "click[large]"
    erased = route("structured", student, reference, "loop_erased")
    assert [d.ref_position for d in erased] == [0, 1, 2, 1, 2, 5, None, 5, 6]
    history = route("history", student, reference)
    assert [d.matched for d in history] == [True, True, True, False, False, False, False, False, False]
    # observation matching cannot see the selected options (text mode does not echo them)
    observation = route("observation", student, reference)
    assert all(d.matched for d in observation)


@pytest.mark.parametrize("index", [0, 1, 2])
def test_expert_episodes_on_the_embedded_env(index):
    """The scripted shopper on the embedded WebShop: the tracker follows it to 'bought' with the
    goal's options selected, the stages in order."""
    from envs.config import EnvConfig
    from envs.pool import EnvPool
    from envs.tasks import eval_tasks

    cfg = EnvConfig(name="webshop", webshop_num_products=20)
    task = eval_tasks(cfg, "valid_unseen", 3)[index]
    pool = EnvPool(cfg, 1)
    step = pool.reset([0], [task])[0]
    tr = WebShopTracker(task.task_id)
    tr.observe(None, step.observation, step.admissible_actions)
    stages, before_buy = [tr.stage()], {}
    while not step.done:
        action = pool.expert_actions([0])[0]
        if action == "click[buy now]":
            before_buy = tr.fields()
        step = pool.step([0], [action])[0]
        tr.observe(action, step.observation, step.admissible_actions)
        stages.append(tr.stage())
    order = ["start", "searched", "viewing_item", "options_set", "bought"]
    assert step.won and stages[-1] == "bought" and tr.instruction == task.instruction
    assert [order.index(s) for s in stages] == sorted(order.index(s) for s in stages)
    goal = goal_options(task.instruction)
    assert before_buy["options"] == ",".join(f"{k}={v}" for k, v in sorted(goal.items()))
    assert before_buy["option_progress"] == f"{len(goal)}/{len(goal)}" and before_buy["price_ok"] == "true"
