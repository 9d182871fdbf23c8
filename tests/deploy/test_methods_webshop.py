"""The routing stage on WebShop: a shopper's winning episode (embedded env, through the rollout
loop) is the reference of tiny-model episodes of the same task; signatures come from the WebShop
tracker and teacher prompts from the WebShop renderer. Then the WebShop smrc_sd and GiGPO method
smoke configs train one step end to end; every other WebShop method config samples that same step
(it differs only in the method block and the learner's loss): the other turn rules (fullpath_sd:
all, random_turn: random) replay its routing and its update (`routing_replay`: the driver's router
and the learner's `train_step` in this process, after the replay of smrc_sd itself reproduced the
trained step's metrics), the configs that differ only in the teacher block they route (context
parts, or a skill block for Skill-SD / SDAR) replay its routing."""

import json
from pathlib import Path

import pytest

from deploy.laptop.tiny_model import TinyModelConfig, build_tiny_model
from deploy.stages.smrc_sd import TeacherRouter
from envs.config import EnvConfig
from envs.pool import EnvPool
from envs.tasks import eval_tasks
from rollout_workers.config import EngineConfig, RolloutConfig
from rollout_workers.engines.hf_engine import HFEngine
from rollout_workers.episode import Episode
from rollout_workers.loop import run_episodes
from rollout_workers.types import Generation
from tests.deploy.shared_runs import WEBSHOP_GIGPO, WEBSHOP_SETS, webshop_run

TINY = TinyModelConfig(
    vocab_size=300,
    hidden_size=64,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=64,
    max_position_embeddings=2048,
)
ENV = EnvConfig(name="webshop", webshop_num_products=20)
ROLLOUT = RolloutConfig(
    use_think=False,
    constrained_actions=True,
    max_response_tokens=16,
    group_size=2,
    history_length=1,
    max_turns=3,
    max_prompt_tokens=100_000,
)


class ShopperEngine:
    """The env's scripted shopper as the policy (one live episode in slot 0)."""

    def __init__(self, tokenizer, pool):
        self.tokenizer, self.pool = tokenizer, pool

    def generate(self, prompts, *, temperature, top_p, max_tokens, seed, choices=None):
        text = f"<action>{self.pool.expert_actions([0])[0]}</action>"
        ids = tuple(self.tokenizer.encode(text, add_special_tokens=False)) + (self.tokenizer.eos_token_id,)
        return [Generation(token_ids=ids, logprobs=(-0.5,) * len(ids), text=text, finish_reason="stop")]


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny-model ops are latency-bound; a second thread only waits (2 shared cores)
    model = build_tiny_model(
        tmp_path_factory.mktemp("m") / "model", ["click[buy now]", "search[shirt]"] * 20, TINY
    )
    engine = HFEngine(str(model), EngineConfig(engine="hf", device="cpu"))
    task = eval_tasks(ENV, "valid_unseen", 1)
    pool = EnvPool(ENV, 3)
    run = {"policy_version": 0, "temperature": 1.0, "seed": 1}
    shopper = ShopperEngine(engine.tokenizer, pool)
    reference, _ = run_episodes(
        shopper, [pool], task, group_size=1, cfg=ROLLOUT.model_copy(update={"max_turns": 15}), **run
    )
    students, _ = run_episodes(engine, [pool], task, group_size=2, cfg=ROLLOUT, **run)
    torch.set_num_threads(threads)
    assert reference[0].success and not any(s.success for s in students)
    return reference, students, engine.tokenizer


def _router(tokenizer, method, parts=None):
    return TeacherRouter(
        method=method,
        matcher="structured",
        parts=parts,
        audit_matchers=("history", "observation"),
        rollout=ROLLOUT,
        tokenizer=tokenizer,
        max_chars=6000,
        seed=0,
    )


def test_teacher_prompt_without_context_is_the_student_prompt(episodes):
    reference, students, tok = episodes
    router = _router(tok, "fullpath_sd", parts=frozenset())
    assert router(reference, step=0).teacher_prompts == {}  # no other success yet; it joins the buffer
    result = router(students, step=1)
    assert len(result.teacher_prompts) == sum(len(s.turns) for s in students)
    by_id = {s.traj_id: s for s in students}
    for (traj_id, t), ids in result.teacher_prompts.items():
        assert ids == list(by_id[traj_id].turns[t].prompt_ids)


def test_smrc_routes_matched_turns_with_webshop_context(episodes):
    reference, students, tok = episodes
    router = _router(tok, "smrc_sd")
    router(reference, step=0)
    result = router(students, step=1)
    assert (students[0].traj_id, 0) in result.teacher_prompts  # every episode starts on the search page
    assert (
        result.metrics["route/coverage_structured"] > 0
        and result.metrics["route/turns_with_reference"] == 1.0
    )
    text = tok.decode(result.teacher_prompts[(students[0].traj_id, 0)])
    ref = Episode(reference[0])
    assert "[Training-only guidance: a successful attempt at this same task]" in text
    assert f"Reference step 1: observation ''Search'', action '{ref.actions[0]}'" in text
    assert "Current state: stage=start" in text and "page=search" in text
    assert f"Suggested next action (from the matching step of the reference): '{ref.actions[0]}'" in text
    sigs = ref.trace().signatures
    assert sigs[0].env == "webshop" and dict(sigs[-1].fields)["page"] == "done"


# --- every WebShop method smoke config routes and trains -------------------------
# One training step of smrc_sd on local Ray (HF engine, torch learner, env actors) with the
# untrained tiny model; the HF engine because these tests are about WebShop routing and the losses, not
# the engine (`shared_runs`), with the test-only overrides of `shared_runs.WEBSHOP_SETS`. The other
# turn rules replay that step's routing and update.

E2E = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.ray]
ROOT = Path(__file__).resolve().parents[2]
WEBSHOP_ALL_SD = sorted(c for c in (ROOT / "deploy" / "configs").glob("smoke_cpu_webshop_*.yaml") if "gigpo" not in c.stem)
TURN_RULES = {"smoke_cpu_webshop_smrc_sd", "smoke_cpu_webshop_fullpath_sd", "smoke_cpu_webshop_random_turn"}
"""One config per turn rule (matched, all, random): smrc_sd trained, the others replayed with their update."""
WEBSHOP_SD = [c for c in WEBSHOP_ALL_SD if c.stem in TURN_RULES]
WEBSHOP_REPLAYED = [c for c in WEBSHOP_ALL_SD if c.stem not in TURN_RULES]
WEBSHOP_SMRC_SD = ROOT / "deploy" / "configs" / "smoke_cpu_webshop_smrc_sd.yaml"


@pytest.fixture(scope="module")
def webshop_runs(model, tmp_path_factory):
    """Trains `config` one step once per session (shared by the tests that read the same run)."""

    def get(config: Path) -> dict:
        out = webshop_run(tmp_path_factory, config, model)
        (step,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        (archive,) = (out / "trajectories").glob("step_*.jsonl")
        return {"step": step, "config": json.loads((out / "config.resolved.json").read_text()),
                "trajectories": [json.loads(line) for line in archive.read_text().splitlines()]}

    return get


@pytest.fixture(scope="module")
def webshop_replayed(webshop_runs, model):
    """(step metrics, resolved config) of the trained smrc_sd step replayed under `config`
    (routing and update); the replay under smrc_sd itself must first give the trained step's metrics."""
    from tests.deploy.routing_replay import step_replayer
    from tests.deploy.shared_runs import HF_ENGINE, TORCH_LEARNER

    trained = webshop_runs(WEBSHOP_SMRC_SD)
    replay = step_replayer(WEBSHOP_SMRC_SD, model, trained["trajectories"], trained["step"], HF_ENGINE,
                           *TORCH_LEARNER, *WEBSHOP_SETS)

    def get(config: Path) -> dict:
        metrics, cfg = replay(config)
        return {"step": metrics, "config": cfg.model_dump(mode="json"), "trajectories": trained["trajectories"]}

    return get


@pytest.mark.parametrize("config", WEBSHOP_SD, ids=[c.stem for c in WEBSHOP_SD])
@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.ray
def test_webshop_method_config_trains_and_routes(config, webshop_runs, webshop_replayed):
    """Routing metrics are the archive's (references = another success of the group), matched or all
    turns are distilled per the method's rule, and the SD loss joins the update: smrc_sd's trained
    step, the other turn rules' replays of it."""
    from deploy.config_loading import load_config
    from deploy.config_sections import SKILL_METHOD_SD_FORM
    from deploy.stages.smrc_sd import RULES

    expected = load_config(config).method
    run = webshop_runs(config) if config == WEBSHOP_SMRC_SD else webshop_replayed(config)
    step, trajs = run["step"], run["trajectories"]
    assert run["config"]["env"]["name"] == "webshop" and run["config"]["method"]["name"] == expected.name
    assert tuple(run["config"]["method"]["context_parts"] or ()) == tuple(expected.context_parts or ())
    total = sum(len(t["turns"]) for t in trajs)
    groups: dict[str, list[dict]] = {}
    for t in trajs:
        groups.setdefault(t["group_id"], []).append(t)
    referenced = [t for g in groups.values() for t in g if any(o["success"] and o is not t for o in g)]
    assert referenced, f"no group holds a success: {[(t['group_id'], t['task_score']) for t in trajs]}"
    with_reference = sum(len(t["turns"]) for t in referenced)
    assert step["route/turns_with_reference"] == pytest.approx(with_reference / total)
    routed = round(step["route/teacher_rows"] * total)
    matched = round(step["route/coverage_structured"] * total)
    assert matched >= len(referenced)  # turn 0: every episode starts on the same search page
    if RULES[expected.name][0] == "all":
        assert routed == with_reference
    else:
        assert routed == matched and 0 < routed <= with_reference
    assert step["sd/match_rate"] == pytest.approx(routed / total, rel=1e-5)
    form = SKILL_METHOD_SD_FORM.get(expected.name, "rkl")  # a Skill-SD / SDAR config selects its loss form
    assert run["config"]["learner"]["sd"]["form"] == form
    assert step["loss/sd"] > 0 if form == "rkl" else step["loss/sd"] != 0  # the gated form has either sign
    kl_coef, ent = run["config"]["learner"]["kl_coef"], run["config"]["learner"]["entropy_coeff"]
    assert step["loss/total"] == pytest.approx(
        step["loss/pg"] + kl_coef * step["loss/kl"] - ent * step["loss/entropy"] + step["loss/sd"], rel=1e-4)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.ray
def test_webshop_gigpo_config_trains_with_gigpo_advantages(webshop_runs):
    """The step's mean |advantage| is GiGPO's on the archived episodes (anchor keys = the pages the
    turns acted on, discounted env rewards), not GRPO's."""
    run = webshop_runs(WEBSHOP_GIGPO)
    assert run["config"]["learner"]["adv_estimator"] == "gigpo"
    gigpo, grpo = expected_advantages(run["trajectories"], run["config"]["learner"])
    assert run["step"]["advantage_abs_mean"] == pytest.approx(float(gigpo.abs().mean()), rel=1e-5)
    assert float(gigpo.abs().mean()) != pytest.approx(float(grpo.abs().mean()), rel=1e-3)


def expected_advantages(trajectories: list[dict], learner: dict):
    """(GiGPO, GRPO) advantages of an archived step's rows, from the archive alone."""
    from learner.actor import row_advantages
    from learner.batch import collate_rows, rows_from_trajectories
    from learner.config import LearnerConfig
    from rollout_workers.types import Trajectory

    played = [t for t in (Trajectory.model_validate(x) for x in trajectories) if not t.infrastructure_failure]
    cfg = LearnerConfig.model_validate(learner)
    batch = collate_rows(rows_from_trajectories(played, gamma=cfg.gigpo_gamma), pad_token_id=0)
    grpo = cfg.model_copy(update={"adv_estimator": "grpo"})
    return row_advantages(cfg, batch), row_advantages(grpo, batch)


def test_replay_audit_counts_webshop_wins_not_purchases():
    """`replay_candidate` (the replay audit) on WebShop: a purchase ends the episode whatever it
    scores; only one scoring at least webshop_success_score is a replayed success."""
    from deploy.analysis.replay_audit import replay_candidate
    from envs.webshop.env import WebShopEnv

    env = WebShopEnv(ENV)
    task = eval_tasks(ENV, "valid_unseen", 1)[0]
    env.reset(options={"task": task})
    expert = []
    while not expert or not expert[-1].startswith("click[buy now]"):
        expert.append(env.expert_action())
        env.step(expert[-1])
    assert replay_candidate(env, task, expert[:1], expert[1:])  # the shopper's purchase scores 1
    goal_asin = env.session.goal["asin"].lower()
    env.reset(options={"task": task})
    env.step(expert[0])  # the shopper's search: a results page with the goal and other products
    other = next(c for c in env.available_actions()["clickables"] if len(c) == 10 and c != goal_asin)
    wrong = [expert[0], f"click[{other}]", "click[buy now]"]
    for action in wrong[1:]:
        _, _, terminated, _, info = env.step(action)
    assert terminated and info["score"] < ENV.webshop_success_score and not info["won"]
    assert not replay_candidate(env, task, wrong[:1], wrong[1:])  # a purchase, not a win


@pytest.mark.parametrize("config", WEBSHOP_REPLAYED, ids=[c.stem for c in WEBSHOP_REPLAYED])
@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.ray
def test_webshop_method_config_routes_the_trained_step(config, webshop_runs, model):
    """The replay of the smrc_sd run's step reproduces its routing metrics; under `config` the
    references are the same, the method's rule picks the turns and the teacher blocks show the
    config's parts (or its skill block); the config selects the method's loss form."""
    from transformers import AutoTokenizer

    from deploy.config_sections import SKILL_METHOD_SD_FORM
    from deploy.stages.smrc_sd import RULES
    from tests.deploy.routing_replay import check_teacher_blocks, config_differences, replay_routing

    trained = webshop_runs(WEBSHOP_SMRC_SD)
    trajs = trained["trajectories"]
    trained_cfg, again = replay_routing(WEBSHOP_SMRC_SD, model, trajs, *WEBSHOP_SETS)
    assert {k: v for k, v in again.metrics.items() if k.startswith("route/")} == pytest.approx(
        {k: v for k, v in trained["step"].items() if k.startswith("route/")})
    cfg, result = replay_routing(config, model, trajs, *WEBSHOP_SETS)
    # the same sampling as the trained run: only the method block (and a skill method's loss form) differ
    assert config_differences(cfg, trained_cfg) <= {"run", "method", "learner"}
    assert cfg.learner.model_copy(update={"sd": trained_cfg.learner.sd}) == trained_cfg.learner
    total = sum(len(t["turns"]) for t in trajs)
    groups: dict[str, list[dict]] = {}
    for t in trajs:
        groups.setdefault(t["group_id"], []).append(t)
    referenced = [t for g in groups.values() for t in g if any(o["success"] and o is not t for o in g)]
    with_reference = sum(len(t["turns"]) for t in referenced)
    assert result.metrics["route/turns_with_reference"] == pytest.approx(with_reference / total)
    routed, matched = len(result.teacher_prompts), round(result.metrics["route/coverage_structured"] * total)
    assert result.metrics["route/teacher_rows"] == pytest.approx(routed / total)
    assert routed == (with_reference if RULES[cfg.method.name][0] == "all" else matched) and routed > 0
    check_teacher_blocks(cfg, result, AutoTokenizer.from_pretrained(str(model)))
    assert cfg.learner.sd.form == SKILL_METHOD_SD_FORM.get(cfg.method.name, "rkl")
