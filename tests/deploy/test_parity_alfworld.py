"""ALFWorld parity between the real engine and the embedded simulator on generated game files.

Transcripts recorded on one backend (expert, random admissible and invalid actions; wins and
step-limit endings) must replay with 100% identical steps on the other: observation text,
admissible commands (sorted, with help), done and won. Runs the real alfworld/TextWorld engine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from deploy.cli import app
from envs.alfworld.parity import game_folders, record, replay
from envs.household.difficulty import TASK_TYPES

pytestmark = pytest.mark.slow


def _episodes(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _check_coverage(episodes: list[dict]) -> None:
    types = {e["game"].split("/")[2].split("-")[0] for e in episodes}
    assert types == set(TASK_TYPES)
    assert any(e["steps"][-1]["won"] for e in episodes), "no episode was won"
    assert any(not e["steps"][-1]["won"] and len(e["steps"]) - 1 == e["max_steps"] for e in episodes)
    observations = [s["observation"] for e in episodes for s in e["steps"][1:]]
    assert "Nothing happens." in observations
    assert all(e["steps"][-1]["done"] for e in episodes)


def test_game_folders_interleave_task_types(alfworld_data_dir: Path) -> None:
    first = game_folders(alfworld_data_dir)[: len(TASK_TYPES)]
    assert {f.parent.name.split("-")[0] for f in first} == set(TASK_TYPES)


def test_real_engine_transcripts_replay_identically_on_embedded(
    alfworld_data_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "real.jsonl"
    assert (
        record(backend="alfworld", data_path=alfworld_data_dir, out=out, episodes=7, seed=0, max_steps=None)
        == 7
    )
    episodes = _episodes(out)
    _check_coverage(episodes)
    report = replay(backend="embedded", data_path=alfworld_data_dir, transcripts=out)
    assert report.total_steps == sum(len(e["steps"]) for e in episodes)
    assert report.identical_steps == report.total_steps, "\n".join(report.lines()[:10])


def test_embedded_transcripts_replay_identically_on_real_engine(
    alfworld_data_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "embedded.jsonl"
    record(backend="embedded", data_path=alfworld_data_dir, out=out, episodes=12, seed=1, max_steps=None)
    episodes = _episodes(out)
    _check_coverage(episodes)
    won_types = {e["game"].split("/")[2].split("-")[0] for e in episodes if e["steps"][-1]["won"]}
    assert won_types == set(TASK_TYPES), "the embedded expert should win every task type at least once"
    report = replay(backend="alfworld", data_path=alfworld_data_dir, transcripts=out)
    assert report.identical_steps == report.total_steps > 0, "\n".join(report.lines()[:10])


def test_replay_cli_reports_each_differing_step(alfworld_data_dir: Path, tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    record(backend="embedded", data_path=alfworld_data_dir, out=good, episodes=2, seed=3, max_steps=None)
    episodes = _episodes(good)
    total = sum(len(e["steps"]) for e in episodes)
    result = CliRunner().invoke(
        app,
        [
            "env",
            "replay",
            "--env",
            "alfworld",
            "--backend",
            "embedded",
            "--data-path",
            str(alfworld_data_dir),
            "--transcripts",
            str(good),
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == f"identical steps: {total}/{total}"

    episodes[0]["steps"][1]["observation"] = "You teleport."
    episodes[0]["steps"][1]["admissible_commands"] = ["help"]
    episodes[1]["max_steps"] = len(episodes[1]["steps"]) - 2  # the replay now ends one step early
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(e) + "\n" for e in episodes))
    result = CliRunner().invoke(
        app,
        [
            "env",
            "replay",
            "--env",
            "alfworld",
            "--backend",
            "embedded",
            "--data-path",
            str(alfworld_data_dir),
            "--transcripts",
            str(bad),
        ],
    )
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    game0 = episodes[0]["game"]
    assert any(line.startswith(f"{game0}\tstep 1\tobservation\texpected='You teleport.'") for line in lines)
    assert any(line.startswith(f"{game0}\tstep 1\tadmissible_commands\texpected=['help']") for line in lines)
    assert any(f"step {len(episodes[1]['steps']) - 1}\tdone" in line for line in lines)
    assert lines[-1].startswith("identical steps: ") and lines[-1] != f"identical steps: {total}/{total}"


def test_replay_rejects_malformed_transcripts(alfworld_data_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text('{"env": "alfworld", "game": "x", "steps": [{"action": null}]}\nnot json\n')
    with pytest.raises(ValueError, match=r"broken.jsonl:2: not JSON"):
        replay(backend="embedded", data_path=alfworld_data_dir, transcripts=path)
