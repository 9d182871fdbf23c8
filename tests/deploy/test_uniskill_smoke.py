"""UniSkill end to end on local Ray: every variant's laptop config runs a training step, and the
full method's run exercises the whole path (retrieve, propose, critic, R_align in the learner's
no-grad pass, acceptance rule, bank commit after the update) and logs it, while a second driver
inspects the live skill bank through `python -m deploy skills`. The policy is the SFT-warmed tiny
model (`warm_model`), which wins about half of its episodes on the configs' env, so groups of 8
hold both outcomes and every step has candidates; their count is checked against the archived
groups.

The runs use the HF engine (`shared_runs_a`): these tests are about the UniSkill path, its variants
and the bank, not the engine. The whole-path run is shared with test_security."""

import json
from pathlib import Path

import pytest

from tests.deploy.shared_runs import CONFIGS, shared_run, uniskill_live_run

VARIANTS = ["actor_only", "proposer_only", "no_r_align", "no_support_reg", "uniskill_smrc_sd"]

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.ray, pytest.mark.redis]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _expected_candidates(archive: Path, cap: int) -> int:
    """Candidates the archived step implies: every member of a group with >= 2 successes and >= 2
    failures (trajectories without turns, or ended by an env error or an over-long prompt, take no
    part), at most `cap`."""
    groups: dict[str, list[dict]] = {}
    for line in archive.read_text().splitlines():
        t = json.loads(line)
        if t["turns"] and t["end_reason"] not in ("env_error", "prompt_too_long"):
            groups.setdefault(t["group_id"], []).append(t)
    eligible = [g for g in groups.values() if 2 <= sum(t["success"] for t in g) <= len(g) - 2]
    return min(cap, sum(len(g) for g in eligible))


def test_uniskill_whole_path_with_live_inspection(warm_model, tmp_path_factory):
    live = uniskill_live_run(tmp_path_factory, warm_model)  # shared with test_security
    assert live.live_stats is not None, "the skill bank was never readable from a second driver during training"
    assert "version" in live.live_stats.stdout
    assert live.returncode == 0, live.log[-4000:]
    run = live.path
    steps = _metrics(run)
    assert [s["step"] for s in steps] == [1, 2]
    cap = json.loads((run / "config.resolved.json").read_text())["uniskill"]["max_candidates_per_step"]
    for s in steps:  # the whole path ran on every step and was logged
        archive = run / "trajectories" / f"step_{s['step']:06d}.jsonl"
        assert s["uniskill/candidates"] == _expected_candidates(archive, cap) > 0
        assert s["uniskill/proposals"] == s["uniskill/candidates"]  # no proposer prompt over budget
        parsed = s["uniskill/op_no_edit"] + s["uniskill/op_add"] + s["uniskill/op_update"]
        assert s["uniskill/parse_rate"] == pytest.approx(parsed)
        assert s["uniskill/prop_op_parse_fail"] == pytest.approx(1 - parsed)  # the learner saw the same proposals
        assert "uniskill/critic_pass_rate" in s and s["uniskill/prop_rows"] == s["uniskill/proposals"]
        decided = sum(v for k, v in s.items() if k.startswith("uniskill/decision_"))
        assert decided == s["uniskill/proposals"]  # every proposal got a recorded decision
        assert s["uniskill/added"] + s["uniskill/updated"] == s.get("uniskill/decision_accepted", 0)


@pytest.fixture(scope="module")
def variant_runs(warm_model, tmp_path_factory):
    """One training step per variant config, run once per session; later requests reuse it."""

    def get(variant: str) -> Path:
        return shared_run(tmp_path_factory, CONFIGS / f"smoke_cpu_{variant}.yaml", f"model.path={warm_model}",
                          "run.total_steps=1", "eval.at_end=false")

    return get


@pytest.mark.parametrize("variant", VARIANTS)
def test_uniskill_variant_runs_a_step(variant, variant_runs):
    from deploy.config_loading import load_config
    from deploy.config_uniskill import VARIANT_SWITCHES

    cfg = load_config(CONFIGS / f"smoke_cpu_{variant}.yaml")
    switches = VARIANT_SWITCHES[cfg.uniskill.variant]
    run = variant_runs(variant)
    (step,) = _metrics(run)
    (archive,) = (run / "trajectories").glob("step_*.jsonl")
    assert step["uniskill/candidates"] == _expected_candidates(archive, cfg.uniskill.max_candidates_per_step) > 0
    assert step["uniskill/proposals"] == step["uniskill/candidates"] == step["uniskill/prop_rows"]
    saved = json.loads((run / "config.resolved.json").read_text())
    assert saved["uniskill"]["variant"] == ("uniskill" if variant == "uniskill_smrc_sd" else variant)
    assert saved["learner"]["proposer"]["train_proposer"] == switches.train_proposer
    assert saved["learner"]["proposer"]["train_actor"] == switches.train_actor
    # the support regulariser covers proposals with a decision between >= 2 legal ops, unless switched off
    assert (step["uniskill/prop_support_rows"] > 0) == switches.support_regularizer
    assert step["uniskill/prop_sup_loss"] == 0.0 or step["uniskill/prop_support_rows"] > 0
    # UniSkill + SMRC-SD: routed turns and their SD loss in the same step; no routing otherwise
    routed = cfg.method.name == "smrc_sd"
    assert (step.get("route/teacher_rows", 0.0) > 0) == routed and (step.get("loss/sd", 0.0) > 0) == routed
    assert step.get("sd/match_rate", 0.0) == pytest.approx(step.get("route/teacher_rows", 0.0), rel=1e-5)


def test_proposer_loss_changes_the_update(variant_runs):
    """actor_only (proposer not trained) and no_support_reg (lambda_prop 0.5, c_sup 0) play the same step
    from the same seeds: the same rollouts and actor loss, differently scored proposals, so
    the proposer's policy gradient alone separates their updates."""
    from safetensors.torch import load_file

    actor_only, trained = variant_runs("actor_only"), variant_runs("no_support_reg")
    (a,), (b,) = _metrics(actor_only), _metrics(trained)

    def sampled(run: Path) -> list:
        (archive,) = (run / "trajectories").glob("step_*.jsonl")
        return [[turn["response_ids"] for turn in json.loads(line)["turns"]] for line in archive.read_text().splitlines()]

    def weights(run: Path) -> dict:
        return load_file(str(next((run / "checkpoints" / "step_000001" / "hf").glob("*.safetensors"))))

    assert sampled(actor_only) == sampled(trained)
    assert a["loss/pg"] == pytest.approx(b["loss/pg"], rel=1e-6)
    assert b["uniskill/prop_valid_rows"] > 0 and b["uniskill/prop_advantage_abs_mean"] > 0, b  # a proposer gradient
    assert a["grad_norm"] != pytest.approx(b["grad_norm"], rel=1e-6)
    wa, wb = weights(actor_only), weights(trained)
    assert any(not (wa[k] == wb[k]).all() for k in wa), "the proposer loss did not change the update"
