"""End to end: `train` with smoke_cpu_mixed.yaml (smoke_cpu.yaml on an env where the SFT-warmed tiny
model wins about half of its episodes) on local Ray (engine, learner and env actors) writes metrics
for 2 steps and changes the policy through the policy-gradient loss alone (no
entropy bonus): a group with mixed outcomes gives a nonzero advantage. (`--resume` continuing a
finished run: README's first run, tests/test_readme_commands.py; from a mid-run checkpoint:
test_pipeline_e2e.py; after a killed driver: test_faults.py.) The run is a `shared_run`: the HF
engine and the torch learner on the test process's shared Ray cluster, since this test is about the
training loop; vLLM and DeepSpeed end to end are README's first run, on the same loop."""

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.deploy.shared_runs import shared_run

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "deploy" / "configs" / "smoke_cpu_mixed.yaml"

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.ray]


def _weights(hf_dir: Path) -> dict:
    return load_file(str(next(hf_dir.glob("*.safetensors"))))


def _mixed(groups: list[list[dict]]) -> bool:
    """Some group's rows carry different scores (outcome, less the invalid-action penalty)."""
    return any(len({(t["score"], turn["action_valid"]) for t in g for turn in t["turns"]}) > 1 for g in groups)


def _groups(archive: Path) -> list[list[dict]]:
    groups: dict[str, list[dict]] = {}
    for line in archive.read_text().splitlines():
        t = json.loads(line)
        groups.setdefault(t["group_id"], []).append(t)
    return list(groups.values())


def test_smoke_train(warm_model, tmp_path_factory):
    model = warm_model
    run = shared_run(tmp_path_factory, SMOKE, f"model.path={model}")

    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    for key in ("policy_version", "success_rate", "reward_mean", "loss/total", "kl", "pg_clipfrac",
                "response_len_mean", "rep4gram_ratio", "tokens_generated", "time/rollout_s", "time/learn_s",
                "mismatch/logp_abs_diff_mean", "mismatch/logp_abs_diff_max", "mismatch/kl_k3"):
        assert key in steps[-1], key
    assert steps[-1]["policy_version"] == 2
    assert (run / "config.resolved.json").is_file()
    assert list((run / "tb").glob("events.*"))
    assert (run / "plots" / "success.png").stat().st_size > 0
    assert (run / "plots" / "loss.png").stat().st_size > 0
    assert list((run / "eval").glob("step_*.json"))
    archives = sorted((run / "trajectories").glob("step_*.jsonl"))
    assert len(archives) == 2

    # no entropy bonus: only a group whose rows score differently has a nonzero advantage
    resolved = json.loads((run / "config.resolved.json").read_text())
    learner, rollout = resolved["learner"], resolved["rollout"]
    assert learner["entropy_coeff"] == 0.0 and learner["invalid_action_penalty"] > 0
    groups = [_groups(a) for a in archives]
    assert _mixed(groups[0]), f"no group of step 1 has mixed outcomes: {[[t['success'] for t in g] for g in groups[0]]}"
    for step, step_groups in zip(steps, groups):
        assert [len(g) for g in step_groups] == [rollout["group_size"]] * rollout["tasks_per_step"]
        assert step["episodes"] == rollout["group_size"] * rollout["tasks_per_step"]
        assert (step["advantage_abs_mean"] > 0) == _mixed(step_groups), step
        assert step["success_rate"] == pytest.approx(sum(t["success"] for g in step_groups for t in g) / step["episodes"])

    ckpt = run / "checkpoints" / "step_000002"
    before, after = _weights(model), _weights(ckpt / "hf")
    changed = [k for k in after if not (after[k] == before[k]).all()]
    assert changed, "training did not change the policy"

