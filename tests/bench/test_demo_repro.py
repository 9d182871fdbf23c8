"""bench/demo_repro.py's comparison on hand-made demo directories: identical runs compare as
bit-identical at every stage; a run whose step-2 rollout sampled other ids, or kept the ids with
other log-probs, is reported at step 2 with the right kind; a different SFT model is named."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("demo_repro", ROOT / "bench" / "demo_repro.py")
demo_repro = importlib.util.module_from_spec(spec)
spec.loader.exec_module(demo_repro)


def _eval(avg: float, per_task: dict) -> dict:
    return {"avg_at_k": avg, "per_task": per_task}


def _run(root: Path, name: str, *, step2_ids=(5, 6), step2_logp=(-0.5, -0.25), sft_bytes=b"sft") -> Path:
    run = root / name
    for model, data in (("base", b"base"), ("sft", sft_bytes)):
        (run / model).mkdir(parents=True)
        (run / model / "model.safetensors").write_bytes(data)
    (run / "eval").mkdir()
    (run / "eval" / "random_init.json").write_text(json.dumps(_eval(0.0, {"t1": 0.0, "t2": 0.0})))
    (run / "eval" / "after_sft.json").write_text(json.dumps(_eval(0.25, {"t1": 0.5, "t2": 0.0})))
    (run / "rl" / "eval").mkdir(parents=True)
    (run / "rl" / "eval" / "step_000002.json").write_text(json.dumps(_eval(0.5, {"t1": 1.0, "t2": 0.0})))
    (run / "rl" / "trajectories").mkdir()
    for step, (ids, logp) in ((1, ((1, 2), (-0.1, -0.2))), (2, (step2_ids, step2_logp))):
        traj = {"traj_id": f"t1@7#{name}/0", "turns": [{"response_ids": list(ids), "sampler_logprobs": list(logp)}]}
        (run / "rl" / "trajectories" / f"step_{step:06d}.jsonl").write_text(json.dumps(traj) + "\n")
    (run / "rl" / "metrics.jsonl").write_text("\n".join(json.dumps({"step": s, "success_rate": 0.5}) for s in (1, 2)))
    summary = {"random init": _eval(0.0, {}), "after SFT": _eval(0.25, {}), "after RL": _eval(0.5, {}),
               "rl_gain_paired": {"mean": 0.25, "se": 0.1}, "minutes": 16.0}
    (run / "demo_summary.json").write_text(json.dumps(summary))
    return run


def test_identical_runs_are_bit_identical_at_every_stage(tmp_path):
    result = demo_repro.compare([_run(tmp_path, "run0"), _run(tmp_path, "run1")])
    assert all(result["bit_identical_across_runs"].values())
    assert result["rl_rollouts_vs_first_run"]["run1"]["first_step"] is None
    assert result["distribution"]["rl_avg"]["median"] == 0.5


def test_first_divergence_is_found_and_classified(tmp_path):
    ref = _run(tmp_path, "run0")
    other_ids = _run(tmp_path, "run1", step2_ids=(5, 7))
    drift = _run(tmp_path, "run2", step2_logp=(-0.5, -0.2500001))
    result = demo_repro.compare([ref, other_ids, drift])
    assert result["rl_rollouts_vs_first_run"]["run1"]["first_step"] == 2
    assert result["rl_rollouts_vs_first_run"]["run1"]["kind"] == "different sampled ids"
    assert result["rl_rollouts_vs_first_run"]["run2"]["first_step"] == 2
    assert result["rl_rollouts_vs_first_run"]["run2"]["kind"] == "same ids, log-probs differ"
    assert result["rl_rollouts_vs_first_run"]["run2"]["max_abs_logprob_diff"] > 0


def test_a_different_sft_model_is_reported(tmp_path):
    result = demo_repro.compare([_run(tmp_path, "run0"), _run(tmp_path, "run1", sft_bytes=b"other")])
    assert result["bit_identical_across_runs"]["tiny model weights"]
    assert not result["bit_identical_across_runs"]["SFT weights"]
