"""bench/demo_final_record.py on a demo output directory laid out like `make demo`'s (real files,
real EvalResult / TrainerState serialisation): the final weights' sha256 and the per-task final
evaluation merged into repro.json, and the one-line errors for a directory that is not a finished
demo."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

from deploy.evaluation import EvalResult, TypeResult
from deploy.trainer import TrainerState

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("demo_final_record", ROOT / "bench" / "demo_final_record.py")
record = importlib.util.module_from_spec(spec)
spec.loader.exec_module(record)


def _demo_dir(tmp_path: Path, *, with_eval: bool = True) -> Path:
    run = tmp_path / "demo"
    ckpt = run / "rl" / "checkpoints" / "step_000002"
    (ckpt / "hf").mkdir(parents=True)
    (ckpt / "hf" / "model.safetensors").write_bytes(b"weights")
    TrainerState(step=2, policy_version=2).save(ckpt / "trainer_state.json")
    if with_eval:
        result = EvalResult(
            label="step_0002", split="valid_unseen", num_tasks=2, k=4, temperature=0.4, avg_at_k=0.375,
            avg_at_k_se=0.125, pass_at_k=0.5, num_episodes=8, end_reasons={"won": 3, "max_steps": 5},
            policy_version=2, per_task={"t1": 0.75, "t0": 0.0},
            per_task_type={"pick_and_place_simple": TypeResult(num_tasks=2, avg_at_k=0.375, pass_at_k=0.5)},
        )  # fmt: skip
        (run / "rl" / "eval").mkdir(parents=True)
        (run / "rl" / "eval" / "step_0002.json").write_text(result.model_dump_json())
    return run


def test_write_repro_merges_the_final_record(tmp_path, capsys):
    run = _demo_dir(tmp_path)
    out = tmp_path / "repro.json"
    out.write_text(json.dumps({"runs": [{"run": "run0"}]}))
    assert record.main(["--write-repro", str(run), "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["runs"] == [{"run": "run0"}]  # the other keys are kept
    final = got["final_rl"]
    expected_sha = hashlib.sha256(b"model.safetensors" + b"weights").hexdigest()
    assert final["step"] == 2 and final["rl_sha256"] == expected_sha
    assert final["eval"]["per_task"] == {"t0": 0.0, "t1": 0.75}
    assert final["eval"]["avg_at_k"] == 0.375 and final["eval"]["k"] == 4
    assert final["eval"]["per_task_type"] == {"pick_and_place_simple": 0.375}
    assert "final_rl step 2" in capsys.readouterr().out


def test_unfinished_or_wrong_directory_is_one_line_and_exit_2(tmp_path, capsys):
    out = tmp_path / "repro.json"
    assert record.main(["--write-repro", str(tmp_path / "nope"), "--out", str(out)]) == 2
    assert record.main(["--write-repro", str(_demo_dir(tmp_path, with_eval=False)), "--out", str(out)]) == 2
    assert record.main(["--write-repro", str(tmp_path), "--out", str(out)]) == 2  # no rl/ checkpoint
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("error: ") for line in err)
    assert "is not a directory" in err[0] and "final evaluation did not finish" in err[1]
    assert "no finished GRPO checkpoint" in err[2] and not out.exists()
