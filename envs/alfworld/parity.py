"""ALFWorld parity tool: record transcripts on one backend and replay them on another, comparing
every step (`python -m deploy env replay --env alfworld ...`).

Transcript format (JSONL, one episode per line; unknown keys are ignored):
    {"env": "alfworld", "game": "<game folder relative to DATA_PATH>", "max_steps": 50,
     "steps": [{"action": null, "observation": "...", "admissible_commands": [...], "done": false,
                "won": false}, {"action": "go to desk 1", ...}, ...]}
The first step is the reset (action null). A replay compares, per step, the observation text and
the admissible commands exactly (sorted, `help` included, as the engine returns them) and done/won.
A step is identical when none of those differ; steps a backend could not play (its episode ended
early, or the game would not load) count as differing.

Recording mixes the backend's own expert with random admissible commands and invalid ones
(malformed, wrong case, unknown objects), and runs every fourth episode under a short step limit,
so that step-limit endings are covered as well as wins.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium

from envs.config import EnvConfig
from envs.parity import Mismatch, ReplayReport
from envs.registry import make_env

COMPARED = ("observation", "admissible_commands", "done", "won")
_GAME_FILE = "game.tw-pddl"


ACCEPTS_ENV_KWARGS = False
"""Whether `record` takes upstream options (`--env-kwargs`)."""

def _open(backend: str, data_path: Path, max_steps: int) -> gymnasium.Env:
    if backend not in ("embedded", "alfworld"):
        raise ValueError(f"--backend must be embedded or alfworld for ALFWorld, got {backend!r}")
    cfg = EnvConfig(name="alfworld", backend=backend, data_path=str(data_path), max_steps=max_steps)  # type: ignore[arg-type]
    return make_env(cfg)


def _reset(env: gymnasium.Env, folder: Path) -> tuple[str, dict[str, Any]]:
    # "game_dir" is the embedded env's option, "gamefile" the real env's; each ignores the other.
    return env.reset(options={"game_dir": folder, "gamefile": folder})


def _step_record(action: str | None, obs: str, info: dict[str, Any], done: bool) -> dict[str, Any]:
    return {
        "action": action,
        "observation": obs,
        "admissible_commands": list(info["admissible_commands"]),
        "done": bool(done),
        "won": bool(info["won"]),
    }


# ---------------------------------------------------------------- replay


def read_transcripts(path: Path) -> Iterator[dict[str, Any]]:
    """Episodes of a JSONL file; a malformed line raises ValueError (TypeError for a value of the
    wrong type) naming the file and line.

    Checked here, so that a replay only meets well-shaped episodes: each line is an object with a
    string `game`, a positive integer `max_steps` when given, and a non-empty list of step objects
    whose first action is null and every later action a string."""
    with Path(path).open(errors="surrogateescape") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                episode = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as exc:
                raise ValueError(f"{where}: not JSON ({exc})") from exc
            if not isinstance(episode, dict):
                raise TypeError(f"{where}: expected an episode object, got a JSON {type(episode).__name__}")
            for key in ("game", "steps"):
                if key not in episode:
                    raise ValueError(f"{where}: episode has no {key!r} key")
            if episode.get("env", "alfworld") != "alfworld":
                raise ValueError(f"{where}: env {episode['env']!r} is not alfworld")
            if not isinstance(episode["game"], str):
                raise TypeError(f"{where}: 'game' must be the game folder (a string)")
            max_steps = episode.get("max_steps", 50)
            if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
                raise ValueError(f"{where}: 'max_steps' must be a positive integer, got {max_steps!r}")
            steps = episode["steps"]
            if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
                raise ValueError(f"{where}: 'steps' must be a list of step objects")
            if not steps or steps[0].get("action") is not None:
                raise ValueError(f"{where}: the first step must be the reset (action null)")
            bad = next((i for i, s in enumerate(steps[1:], 1) if not isinstance(s.get("action"), str)), None)
            if bad is not None:
                raise ValueError(f"{where}: step {bad} has no action string")
            yield episode


def replay(
    *, backend: str, data_path: Path, transcripts: Path | None, env_meta: Path | None = None
) -> ReplayReport:
    """Replay every episode of `transcripts` on `backend` and compare each step."""
    del env_meta  # WebShop only
    if transcripts is None:
        raise ValueError("replay needs --transcripts FILE")
    report = ReplayReport()
    envs: dict[int, gymnasium.Env] = {}
    try:
        for episode in read_transcripts(transcripts):
            max_steps = int(episode.get("max_steps", 50))
            if max_steps not in envs:
                envs[max_steps] = _open(backend, Path(data_path), max_steps)
            _replay_episode(envs[max_steps], Path(data_path), episode, report)
    finally:
        for env in envs.values():
            env.close()
    return report


def _replay_episode(
    env: gymnasium.Env, data_path: Path, episode: dict[str, Any], report: ReplayReport
) -> None:
    game, steps = str(episode["game"]), episode["steps"]
    report.total_steps += len(steps)
    try:
        obs, info = _reset(env, data_path / game)
    except Exception as exc:  # noqa: BLE001 - any load failure is this episode's mismatch
        report.mismatches.append(Mismatch(game, 0, "load", "a playable game", f"{type(exc).__name__}: {exc}"))
        return
    got = _step_record(None, obs, info, False)
    ended = False
    for index, expected in enumerate(steps):
        if index > 0:
            if ended:
                report.mismatches.append(Mismatch(game, index, "done", "episode continues", "episode ended"))
                continue
            obs, _reward, terminated, truncated, info = env.step(expected["action"])
            ended = terminated or truncated
            got = _step_record(expected["action"], obs, info, ended)
        differing = [f for f in COMPARED if expected.get(f) != got[f]]
        for f in differing:
            report.mismatches.append(Mismatch(game, index, f, expected.get(f), got[f]))
        if not differing:
            report.identical_steps += 1


# ---------------------------------------------------------------- record

_INVALID = (
    "Look",
    "go to the moon",
    "take everything",
    "",
    "move it to there",
    "<action>look</action>",
    "inventory please",
)


def game_folders(data_path: Path) -> list[Path]:
    """Trial folders (with game.tw-pddl and traj_data.json) under the data root, interleaved by
    task type (the task folder's name before the first '-'), each type's games in sorted order, so
    that the first N episodes of a recording cover min(N, 6) task types."""
    folders = sorted(
        p.parent for p in Path(data_path).rglob(_GAME_FILE) if (p.parent / "traj_data.json").is_file()
    )
    if not folders:
        raise FileNotFoundError(f"no ALFWorld games (*/{_GAME_FILE}) under {data_path}")
    by_type: dict[str, list[Path]] = {}
    for folder in folders:
        by_type.setdefault(folder.parent.name.split("-")[0], []).append(folder)
    groups = [by_type[t] for t in sorted(by_type)]
    return [g[i] for i in range(max(map(len, groups))) for g in groups if i < len(g)]


def _invalid_action(rng: random.Random, admissible: list[str]) -> str:
    """An action the engine should refuse: junk, wrong case, or an admissible one with a bad number."""
    kind = rng.random()
    if kind < 0.4:
        return rng.choice(_INVALID)
    command = rng.choice(admissible)
    if kind < 0.7:
        return command.upper() if command.islower() else command.lower()
    words = command.split()
    digits = [i for i, w in enumerate(words) if w.isdigit()]
    if not digits:
        return command + " now"
    words[rng.choice(digits)] = str(rng.randint(7, 99))
    return " ".join(words)


def _choose(rng: random.Random, env: Any, admissible: list[str], expert_share: float) -> str:
    u = rng.random()
    if u < expert_share:
        return str(env.expert_action())
    if u < expert_share + (1 - expert_share) * 0.6:
        return rng.choice(admissible)
    return _invalid_action(rng, admissible)


def record(
    *, backend: str, data_path: Path, out: Path, episodes: int, seed: int, max_steps: int | None
) -> int:
    """Play `episodes` episodes over the games under `data_path` (cycling through `game_folders`)
    on `backend` and write their transcripts to `out`. Returns the number written."""
    data_path = Path(data_path)
    folders = game_folders(data_path)
    limit = max_steps or EnvConfig(name="alfworld").max_steps
    envs: dict[int, gymnasium.Env] = {}
    written = 0
    try:
        with Path(out).open("w") as fh:
            for i in range(episodes):
                rng = random.Random(f"{seed}:{i}")
                episode_limit = rng.randint(3, 10) if i % 4 == 3 else limit
                if episode_limit not in envs:
                    envs[episode_limit] = _open(backend, data_path, episode_limit)
                env = envs[episode_limit]
                folder = folders[i % len(folders)]
                expert_share = (0.9, 0.6, 0.3)[i % 3]
                obs, info = _reset(env, folder)
                steps = [_step_record(None, obs, info, False)]
                done = False
                while not done:
                    action = _choose(rng, env, list(info["admissible_commands"]), expert_share)
                    obs, _reward, terminated, truncated, info = env.step(action)
                    done = terminated or truncated
                    steps.append(_step_record(action, obs, info, done))
                line = {
                    "env": "alfworld",
                    "game": folder.relative_to(data_path).as_posix(),
                    "max_steps": episode_limit,
                    "backend": backend,
                    "steps": steps,
                }
                fh.write(json.dumps(line) + "\n")
                written += 1
    finally:
        for env in envs.values():
            env.close()
    return written
