"""Every distilling method's laptop config routes turns in a training step: with a policy that
wins about half of its episodes (the `warm_model` fixture on smoke_cpu_mixed.yaml's env), groups
hold successes, so failed and successful episodes get references, matched turns get teacher
prompts, the teacher pass scores them and the SD loss joins the update. The routing metrics are
checked against the references the archived trajectories imply, and the SD loss is shown to change
the update against the same step with learner.sd.coef=0 on the same seeds.

smoke_cpu_smrc_sd.yaml trains one step end to end on local Ray. Every other ALFWorld config here
samples that same step (it differs only in the method block and the learner's loss, so it plays
the same episodes from the same seeds): the configs with a turn rule, loss form or skill teacher of
their own (LEARNT) replay the step's routing and update (`routing_replay`: the driver's router and
the learner's `train_step` in this process), after the replay of smrc_sd itself has reproduced the
trained step's metrics; the configs that differ only in what the teacher block shows (REPLAYED)
replay its routing. GiGPO replays the grpo-only run's update the same way.

The runs use the HF engine and the torch learner (`shared_runs`): these tests are about routing,
losses and advantages on the sampled episodes, not the engine."""

import json
from collections import defaultdict
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.deploy.shared_runs import HF_ENGINE, TORCH_LEARNER, shared_run

ROOT = Path(__file__).resolve().parents[2]


def _distilling(config: Path) -> bool:
    from deploy.config_loading import load_config

    cfg = load_config(config)
    # UniSkill + SMRC-SD: test_uniskill_smoke; WebShop rows: test_methods_webshop (the warm model is ALFWorld's)
    return cfg.method.name != "grpo" and not cfg.uniskill.enabled and cfg.env.name == "alfworld"


# one per distilling method row + ablations (UniSkill and environment smoke configs have their own tests)
DISTILLING = [c for c in sorted((ROOT / "deploy" / "configs").glob("smoke_cpu_*.yaml")) if _distilling(c)]
REPLAYED = {"smoke_cpu_context_only", "smoke_cpu_routing_only", "smoke_cpu_smrc_sd_candidate_only",
            "smoke_cpu_smrc_sd_summary_only"}
"""Same sampling, rule family and learner path as a trained config; only the teacher block differs."""
SMRC_SD = ROOT / "deploy" / "configs" / "smoke_cpu_smrc_sd.yaml"
GIGPO = ROOT / "deploy" / "configs" / "smoke_cpu_gigpo.yaml"
CONFIGS = [c for c in DISTILLING if c.stem not in REPLAYED]
"""A turn rule, loss form or skill teacher of their own: smrc_sd trained, the others LEARNT (replayed
with their update)."""
PLAIN = ("method.name=grpo", "learner.sd.coef=0")
"""smrc_sd's step without distillation (test_sd_loss_changes_the_update)."""
RUN_SETS = ("run.total_steps=1", "eval.at_end=false")

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.ray]


class Run:
    """One finished 1-step training run: its metrics line, archived trajectories and weights."""

    def __init__(self, path: Path):
        self.path = path
        (self.step,) = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
        (archive,) = (path / "trajectories").glob("step_*.jsonl")
        self.trajectories = [json.loads(line) for line in archive.read_text().splitlines()]
        self.config = json.loads((path / "config.resolved.json").read_text())

    def weights(self) -> dict:
        return load_file(str(next((self.path / "checkpoints" / "step_000001" / "hf").glob("*.safetensors"))))

    def sampled_ids(self) -> list[list[list[int]]]:
        return [[turn["response_ids"] for turn in t["turns"]] for t in self.trajectories]


@pytest.fixture(scope="module")
def runs(warm_model, tmp_path_factory):
    """Runs one training step per (config, overrides) once per session; later requests reuse it."""

    def get(config: Path, *sets: str) -> Run:
        return Run(shared_run(tmp_path_factory, config, f"model.path={warm_model}", *RUN_SETS, *sets))

    return get


def _load(config: Path, model: Path, *sets: str):
    """`config` resolved as `runs` trains it (the same overrides)."""
    from deploy.config_loading import load_config

    return load_config(config, [HF_ENGINE, *TORCH_LEARNER, f"model.path={model}", *RUN_SETS, *sets])


@pytest.fixture(scope="module")
def replayed_step(runs, warm_model):
    """(metrics, config) of `config`'s replay of the trained smrc_sd step: the router's metrics and
    the learner's; the replay of smrc_sd itself must first give the trained step's metrics."""
    from tests.deploy.routing_replay import step_replayer

    trained = runs(SMRC_SD)
    replay = step_replayer(SMRC_SD, warm_model, trained.trajectories, trained.step, HF_ENGINE, *TORCH_LEARNER,
                           *RUN_SETS)

    def get(config: Path) -> tuple[dict, dict]:
        metrics, cfg = replay(config)
        return metrics, cfg.model_dump(mode="json")

    return get


def _with_reference(trajectories: list[dict]) -> list[dict]:
    """The trajectories that have a reference on a run's first step (empty success buffer): those
    with another successful trajectory in their group."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for t in trajectories:
        groups[t["group_id"]].append(t)
    return [t for members in groups.values() for t in members
            if any(o["success"] and o["traj_id"] != t["traj_id"] for o in members)]


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_method_config_routes_turns(config, runs, replayed_step):
    """smrc_sd's trained step, or the replay of that step under `config` (LEARNT)."""
    from deploy.config_loading import load_config
    from deploy.config_sections import SKILL_METHOD_SD_FORM
    from deploy.stages.smrc_sd import RULES

    expected = load_config(config).method
    trajs = runs(SMRC_SD).trajectories
    step, saved_config = (runs(config).step, runs(config).config) if config == SMRC_SD else replayed_step(config)
    routed, referenced, total = _check_routing(step, trajs, RULES[expected.name][0])
    if RULES[expected.name][0] == "all":
        routed_tokens = sum(len(turn["response_ids"]) for t in referenced for turn in t["turns"])
        assert step["sd/teacher_tokens"] == routed_tokens
    else:
        assert step["sd/teacher_tokens"] >= routed  # at least one response token per routed row

    # the learner scored every routed row under its teacher prompt and added a nonzero SD loss
    assert step["sd/match_rate"] == pytest.approx(routed / total, rel=1e-5)
    form = SKILL_METHOD_SD_FORM.get(expected.name, "rkl")  # Skill-SD / SDAR select their loss form
    assert saved_config["learner"]["sd"]["form"] == form
    assert step["loss/sd"] > 0 if form == "rkl" else step["loss/sd"] != 0  # the gated form has either sign
    kl_coef = saved_config["learner"]["kl_coef"]
    assert saved_config["learner"]["entropy_coeff"] == 0.0
    assert step["loss/total"] == pytest.approx(step["loss/pg"] + kl_coef * step["loss/kl"] + step["loss/sd"], rel=1e-5)

    saved = saved_config["method"]
    assert saved["name"] == expected.name and tuple(saved["context_parts"] or ()) == tuple(expected.context_parts or ())


def _check_routing(metrics: dict, trajs: list[dict], rule: str) -> tuple[int, list[dict], int]:
    """Routing metrics are shares of the step's turns and the references are the ones the archive
    implies; returns (routed turns, trajectories with a reference, total turns)."""
    total = sum(len(t["turns"]) for t in trajs)
    referenced = _with_reference(trajs)
    with_reference = sum(len(t["turns"]) for t in referenced)
    assert referenced, f"no group of the step holds a success: {[(t['group_id'], t['success']) for t in trajs]}"
    routed = round(metrics["route/teacher_rows"] * total)
    matched = round(metrics["route/coverage_structured"] * total)
    assert metrics["route/turns_with_reference"] == pytest.approx(with_reference / total)
    assert matched >= len(referenced)  # at least turn 0: the reference started in the same state
    if rule == "all":  # fullpath_sd, context_only, skill_sd, sdar: every turn of a trajectory with a reference
        assert routed == with_reference
    else:  # the matched turns, or as many turns as matched drawn at random
        assert routed == matched and 0 < routed <= with_reference
    return routed, referenced, total


REPLAY = [c for c in DISTILLING if c.stem in REPLAYED]


@pytest.mark.parametrize("config", REPLAY, ids=[c.stem for c in REPLAY])
def test_ablation_config_routes_the_trained_step(config, runs, warm_model):
    """The replay of the smrc_sd run's step reproduces its routing metrics; `config` differs from
    smrc_sd only in its method block (so the trained run's sampling and learner are its own: the SD
    loss form and coefficient included), its rule routes the step and its teacher blocks show its parts."""
    from transformers import AutoTokenizer

    from deploy.config_sections import SKILL_METHOD_SD_FORM
    from deploy.stages.smrc_sd import RULES
    from tests.deploy.routing_replay import check_teacher_blocks, config_differences, replay_routing

    trained = runs(SMRC_SD)
    trained_cfg, again = replay_routing(SMRC_SD, warm_model, trained.trajectories)
    assert {k: v for k, v in again.metrics.items() if k.startswith("route/")} == pytest.approx(
        {k: v for k, v in trained.step.items() if k.startswith("route/")})  # the replay is the driver's routing
    cfg, result = replay_routing(config, warm_model, trained.trajectories)
    assert config_differences(cfg, trained_cfg) <= {"run", "method"}
    assert cfg.learner.sd.form == SKILL_METHOD_SD_FORM.get(cfg.method.name, "rkl") == trained.config["learner"]["sd"]["form"]
    _check_routing(result.metrics, trained.trajectories, RULES[cfg.method.name][0])
    check_teacher_blocks(cfg, result, AutoTokenizer.from_pretrained(str(warm_model)))


def test_sd_loss_changes_the_update(runs):
    """The same step with learner.sd.coef=0 (method grpo, same seeds) samples the same tokens and
    has the same policy-gradient loss; with SMRC-SD the loss differs by exactly the SD term and
    the update moves the weights elsewhere."""
    sd = runs(SMRC_SD)
    plain = runs(SMRC_SD, *PLAIN)
    assert plain.config["method"]["name"] == "grpo" and plain.config["learner"]["sd"]["coef"] == 0.0
    assert "loss/sd" not in plain.step and sd.step["loss/sd"] > 0
    assert sd.sampled_ids() == plain.sampled_ids()  # same seeds, same weights: the same rollouts
    assert sd.step["loss/pg"] == pytest.approx(plain.step["loss/pg"], rel=1e-6)
    assert sd.step["loss/total"] - plain.step["loss/total"] == pytest.approx(sd.step["loss/sd"], rel=1e-3)
    assert sd.step["grad_norm"] != pytest.approx(plain.step["grad_norm"], rel=1e-6)
    with_sd, without = sd.weights(), plain.weights()
    assert with_sd.keys() == without.keys()
    assert any(not (with_sd[k] == without[k]).all() for k in with_sd), "the SD loss did not change the update"


def test_gigpo_config_trains_with_gigpo_advantages(runs, warm_model):
    """smoke_cpu_gigpo.yaml samples the same step as plain GRPO (smrc_sd without distillation: same
    seeds and env); the replay of that step's update under it (after the replay under the grpo run's
    own config reproduced its metrics) logs the mean |advantage| GiGPO gives those episodes (anchor
    states: the observations the turns acted on)."""
    from tests.deploy.routing_replay import check_learner_replay, replay_learning, samples_the_same_step

    plain = runs(SMRC_SD, *PLAIN)
    plain_cfg, cfg = _load(SMRC_SD, warm_model, *PLAIN), _load(GIGPO, warm_model)
    check_learner_replay(replay_learning(plain_cfg, warm_model, plain.trajectories), plain.step)
    samples_the_same_step(cfg, plain_cfg)
    gigpo = replay_learning(cfg, warm_model, plain.trajectories)
    assert cfg.learner.adv_estimator == "gigpo"
    want, grpo = expected_advantages(plain.trajectories, cfg.learner.model_dump(mode="json"))
    assert gigpo["advantage_abs_mean"] == pytest.approx(float(want.abs().mean()), rel=1e-5)
    assert plain.step["advantage_abs_mean"] == pytest.approx(float(grpo.abs().mean()), rel=1e-5)
    assert gigpo["advantage_abs_mean"] != pytest.approx(plain.step["advantage_abs_mean"], rel=1e-3)


def expected_advantages(trajectories: list[dict], learner: dict):
    """(GiGPO, GRPO) advantages of an archived step's rows, from the archive alone."""
    from learner.actor import row_advantages
    from learner.batch import collate_rows, rows_from_trajectories
    from learner.config import LearnerConfig
    from rollout_workers.types import Trajectory

    played = [t for t in (Trajectory.model_validate(x) for x in trajectories) if not t.infrastructure_failure]
    cfg = LearnerConfig.model_validate(learner)
    batch = collate_rows(rows_from_trajectories(played, gamma=cfg.gigpo_gamma), pad_token_id=0)
    return row_advantages(cfg, batch), row_advantages(cfg.model_copy(update={"adv_estimator": "grpo"}), batch)
