"""`python -m deploy testbed build|abilities` end to end on a tiny model (seconds of SFT, the HF engine: this
is about the commands, not the engine; embedded household): the build's outputs and the abilities
command's exact three lines."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ["sft.tiny_model.hidden_size=64", "sft.tiny_model.num_heads=1", "sft.tiny_model.intermediate_size=64",
        "sft.tiny_model.num_layers=1", "sft.tiny_model.vocab_size=400", "sft.tiny_model.max_position_embeddings=8192",
        "engine.engine=hf", "engine.max_model_len=8192", "env.max_steps=14", "eval.k=1", "sft.num_tasks=4",
        "sft.epochs=1", "sft.max_steps=3"]
SIGNED = r"[+-]\d+\.\d{3}"
LINES = [
    rf"teacher context gain matched - mismatched: {SIGNED} \[{SIGNED}, {SIGNED}\]",
    rf"skill gain helpful - irrelevant: {SIGNED} \[{SIGNED}, {SIGNED}\]",
    r"proposer valid skills: \d+\.\d%",
]


def _reject(token: str):
    raise ValueError(f"abilities.json holds {token}, which is not JSON")


def _deploy(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deploy", "testbed", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("testbed") / "tb"
    sets = [a for s in TINY for a in ("--set", s)]
    res = _deploy("build", "--out", str(out), "--corpus-episodes", "4", *sets)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def test_build_writes_model_config_and_record(built):
    record = json.loads((built / "build.json").read_text())
    assert (built / "model" / "config.json").exists() and (built / "config.resolved.json").exists()
    assert record["env"] == "alfworld" and record["fractions"]["teacher_fraction"] == 0.2
    kinds = record["rows_by_kind"]
    assert kinds["plain"] > 0 and kinds["teacher_matched"] > 0, kinds
    assert record["corpus_extra_turns"] > 0 and record["seconds"]["total"] > 0
    assert record["config"]["sft"]["teacher_fraction"] == 0.2


def test_abilities_prints_exactly_the_three_lines(built):
    res = _deploy("abilities", "--model", str(built), "--tasks", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 3, res.stdout
    for line, pattern in zip(lines, LINES, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)
    record = json.loads((built / "abilities.json").read_text(), parse_constant=_reject)  # strict JSON: no NaN
    teacher = record["teacher_context_gain"]
    assert teacher["delta_matched"]["n"] + teacher["delta_mismatched"]["n"] == teacher["n"] > 0
    assert f"{teacher['mean']:+.3f}" in lines[0] and record["split"] == "valid_unseen"
    assert teacher["student_logp_matched"]["n"] == teacher["delta_matched"]["n"]
    assert "copy_gain_followed_states" in teacher
    assert teacher["student_logp_mismatched"]["n"] == teacher["delta_mismatched"]["n"]
    assert all(v["mean"] <= 0 for k, v in teacher.items() if k.startswith("student_logp") and v["n"])
    proposer = record["proposer_valid"]
    assert len(proposer["samples"]) == proposer["n"] == len(proposer["per_item"])


def test_abilities_names_a_missing_model(tmp_path):
    res = _deploy("abilities", "--model", str(tmp_path / "nope"), timeout=120)
    assert res.returncode == 2 and "config.json" in res.stderr, res.stderr[-2000:]
