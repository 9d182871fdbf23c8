"""WebShop parity tools: replay recorded transcripts on a backend, record new ones, and check the
reward function on recorded upstream reward cases.

Transcript (JSONL, one episode a line; unknown keys ignored):
  {"goal_mode": "human"|"synthetic", "session": <goal index in the environment's goal order>,
   "steps": [{"action": null|str, "observation": str, "available_actions": {"has_search_bar": bool,
   "clickables": [...]}, "reward": <upstream raw score>, "done": bool,
   "search_ranking": [asins, only on executed searches]}, ...],
   "env_kwargs": {upstream WebAgentTextEnv options the episode ran under, e.g. "show_attrs": true;
   absent = upstream's defaults; known: envs.config.WEBSHOP_ENV_KWARGS}}
Step 0 is the reset (action null). Each episode is replayed on an env built with its env_kwargs. Observation, available actions, reward (raw score, not the
scaled env reward) and done are compared exactly. Search ranking may legitimately differ from
upstream's Lucene BM25: ranking differences go to the report's notes, and a results page is
rendered from the recorded ranking when one is given, so page-format differences stay separate.

Env meta (optional JSON): {"human"|"synthetic": {"product_prices": {asin: price}, "goals": [goal
dicts in environment order]}} pins upstream's unseeded range prices and goal order/limits. A pinned
goal without a product field upstream copies from its product (category, query, name,
product_category) is completed from the catalogue by asin; one that lacks a goal-only field (or
whose asin is unknown) is an error naming the goal and the field.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from envs.config import EnvConfig
from envs.parity import Mismatch, ReplayReport
from envs.webshop.catalogue import Catalogue, CatalogueError, build_catalogue, read_raw
from envs.webshop.env import WebShopEnv
from envs.webshop.reward import get_reward
from envs.webshop.session import parse_action

_REPLAY_MAX_STEPS = 1_000_000
REWARD_TOLERANCE = 1e-6


ACCEPTS_ENV_KWARGS = True
"""Whether `record` takes upstream options (`--env-kwargs`)."""

def _read_jsonl(path: Path, what: str) -> list[tuple[int, dict[str, Any]]]:
    rows = []
    try:
        text = Path(path).read_text()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err})") from err
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not JSON ({err.msg}); each line must be one {what}") from err
        except RecursionError as err:
            raise ValueError(f"{path}:{number}: JSON nested too deeply; each line must be one {what}") from err
        if not isinstance(row, dict):
            raise TypeError(f"{path}:{number}: expected a JSON object (one {what})")
        rows.append((number, row))
    return rows


def _config(
    backend: str, data_path: Path, goal_mode: str, max_steps: int, env_kwargs: dict[str, Any], where: str
) -> EnvConfig:
    if backend not in ("embedded", "webshop"):
        raise ValueError(f"--backend must be embedded or webshop for WebShop, got {backend!r}")
    cfg = EnvConfig(
        name="webshop",
        backend=backend,
        data_path=str(data_path),
        webshop_goal_mode=goal_mode,
        max_steps=max_steps,
    )  # type: ignore[arg-type]
    return cfg.with_webshop_env_kwargs(env_kwargs, where=where) if env_kwargs else cfg


class _Backends:
    """One env per (goal mode, env_kwargs), built lazily (embedded: from DIR, pinned by the env meta;
    one catalogue per goal mode, shared by that mode's envs)."""

    def __init__(self, backend: str, data_path: Path, meta: dict[str, Any], max_steps: int) -> None:
        self.backend, self.data_path, self.meta, self.max_steps = backend, data_path, meta, max_steps
        self._envs: dict[tuple[str, str], Any] = {}
        self._catalogues: dict[str, Catalogue] = {}
        self._raw: Any = None

    def catalogue(self, mode: str) -> Catalogue:
        if mode not in self._catalogues:
            if self._raw is None:
                self._raw = read_raw(self.data_path)
            catalogue = build_catalogue(self._raw, mode, seed=0)  # type: ignore[arg-type]
            self._catalogues[mode] = catalogue.pinned(self.meta[mode]) if mode in self.meta else catalogue
        return self._catalogues[mode]

    def env(self, mode: str, env_kwargs: dict[str, Any] | None = None, where: str = "env_kwargs") -> Any:
        if mode not in ("synthetic", "human"):
            raise ValueError(f"transcript goal_mode must be 'synthetic' or 'human', got {mode!r}")
        key = (mode, json.dumps(env_kwargs or {}, sort_keys=True))
        if key not in self._envs:
            cfg = _config(self.backend, self.data_path, mode, self.max_steps, env_kwargs or {}, where)
            if self.backend == "embedded":
                self._envs[key] = WebShopEnv(cfg, catalogues={mode: self.catalogue(mode)})
            else:
                from envs.webshop.upstream import UpstreamWebShopEnv

                self._envs[key] = UpstreamWebShopEnv(cfg)
        return self._envs[key]


def _compare(
    report: ReplayReport, episode: str, index: int, expected: dict[str, Any], got: dict[str, Any]
) -> None:
    report.total_steps += 1
    bad = []
    for key in ("observation", "available_actions", "reward", "done"):
        if key not in expected:
            continue
        want, have = expected[key], got[key]
        same = abs(float(want) - float(have)) <= REWARD_TOLERANCE if key == "reward" else want == have
        if not same:
            bad.append(Mismatch(episode, index, key, want, have))
    report.mismatches.extend(bad)
    if not bad:
        report.identical_steps += 1


def _check_transcript(row: dict[str, Any], where: str) -> None:
    """The shape replay relies on (see the module doc); a ValueError naming `where` otherwise."""
    for key in ("goal_mode", "session", "steps"):
        if key not in row:
            raise ValueError(f"{where}: transcript lacks {key!r}")
    if row["goal_mode"] not in ("synthetic", "human"):
        raise ValueError(f"{where}: goal_mode must be 'synthetic' or 'human', got {row['goal_mode']!r}")
    session = row["session"]
    if isinstance(session, bool) or not isinstance(session, int) or session < 0:
        raise ValueError(f"{where}: session must be a goal index (an integer >= 0), got {session!r}")
    steps = row["steps"]
    if not isinstance(steps, list) or not steps or not all(isinstance(step, dict) for step in steps):
        raise ValueError(f"{where}: steps must be a non-empty list of step objects")
    for index, step in enumerate(steps):
        if index and not isinstance(step.get("action"), str):
            raise ValueError(f"{where}: step {index} has no action string")
        reward = step.get("reward", 0.0)
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise TypeError(f"{where}: step {index} has a non-numeric reward {reward!r}")
        ranking = step.get("search_ranking", [])
        if not isinstance(ranking, list) or not all(isinstance(a, str) for a in ranking):
            raise ValueError(f"{where}: step {index} search_ranking must be a list of asins")
    if not isinstance(row.get("env_kwargs", {}), dict):
        raise TypeError(f"{where}: env_kwargs must be an object of WebShop options, got {row['env_kwargs']!r}")


def replay(*, backend: str, data_path: Path, transcripts: Path, env_meta: Path | None = None) -> ReplayReport:
    """Replay every transcript on `backend` and compare each step (see module doc)."""
    meta = json.loads(Path(env_meta).read_text()) if env_meta is not None else {}
    backends = _Backends(backend, Path(data_path), meta, _REPLAY_MAX_STEPS)
    report = ReplayReport()
    for number, row in _read_jsonl(transcripts, "transcript"):
        where = f"{transcripts}:{number}"
        _check_transcript(row, where)
        mode, session, steps = row["goal_mode"], row["session"], row["steps"]
        episode = f"{mode}/{session}"
        try:
            env = backends.env(mode, row.get("env_kwargs"), f"{where}: env_kwargs")
        except CatalogueError as err:  # a pinned goal the engine cannot use
            raise ValueError(f"{env_meta}: {err}") from err
        try:
            obs, _ = env.reset(options={"session": session, "goal_mode": mode})
        except ValueError as err:  # a goal index the catalogue does not have
            raise ValueError(f"{transcripts}:{number}: {err}") from err
        _compare(
            report,
            episode,
            0,
            steps[0],
            {"observation": obs, "available_actions": env.available_actions(), "reward": 0.0, "done": False},
        )
        for index, step in enumerate(steps[1:], start=1):
            action = step["action"]
            recorded = step.get("search_ranking")
            if backend == "embedded":
                name, arg = parse_action(action)
                if name == "search" and arg and recorded is not None:
                    keywords = arg.lower().split(" ")
                    ours = env.catalogue(mode).search.search(keywords)
                    if ours != list(recorded):
                        report.notes.append(
                            f"{episode}\tstep {index}\tsearch ranking differs for {arg.lower()!r}: "
                            f"recorded top {list(recorded)[:5]} ours top {ours[:5]}"
                        )
                    env.session.next_ranker = lambda _kw, r=list(recorded): r
            obs, _reward, terminated, truncated, info = env.step(action)
            _compare(
                report,
                episode,
                index,
                step,
                {
                    "observation": obs,
                    "available_actions": env.available_actions(),
                    "reward": info["score"] if terminated else 0.0,
                    "done": bool(terminated),
                },
            )
            if terminated or truncated:
                for extra in range(index + 1, len(steps)):
                    report.total_steps += 1
                    report.mismatches.append(
                        Mismatch(episode, extra, "episode", "a step", "episode already ended")
                    )
                break
    return report


def _mixed_action(env: Any, rng: random.Random, goal: dict[str, Any] | None) -> str:
    """Mostly the scripted shopper's action, mixed with random clicks, searches and invalid actions."""
    roll = rng.random()
    clickables = env.available_actions()["clickables"]
    if roll < 0.6 and hasattr(env, "expert_action"):
        return env.expert_action()
    if roll < 0.8 and clickables:
        return f"click[{rng.choice(clickables)}]"
    if roll < 0.9:
        words = (goal or {}).get("instruction_text", "red shoes").split()
        return f"search[{' '.join(rng.sample(words, k=min(3, len(words))))}]"
    return rng.choice(["click[nothing]", "buy it", "search[]", "Click[buy now]", "click[search]"])


def record(
    *, backend: str, data_path: Path, out: Path, episodes: int, seed: int, max_steps: int | None,
    env_kwargs: dict[str, Any] | None = None,
) -> int:
    """Record `episodes` transcripts (goal_mode from each line: synthetic) plus `<out>.meta.json`;
    `env_kwargs` (upstream options) are applied and written on every line."""
    mode = "synthetic"
    limit = max_steps or 15
    backends = _Backends(backend, Path(data_path), {}, limit)
    env = backends.env(mode, env_kwargs, "--env-kwargs")
    rng = random.Random(seed)
    if backend == "embedded":
        catalogue = env.catalogue(mode)
        goals, prices = catalogue.goals, catalogue.prices
    else:
        server = env._env.server
        goals, prices = server.goals, server.product_prices
    lines = []
    for _ in range(episodes):
        session = rng.randrange(len(goals))
        obs, _ = env.reset(options={"session": session, "goal_mode": mode})
        steps = [
            {
                "action": None,
                "observation": obs,
                "available_actions": env.available_actions(),
                "reward": 0.0,
                "done": False,
            }
        ]
        for _ in range(limit):
            action = _mixed_action(env, rng, goals[session])
            obs, _reward, terminated, truncated, info = env.step(action)
            step: dict[str, Any] = {
                "action": action,
                "observation": obs,
                "available_actions": env.available_actions(),
                "reward": info["score"] if terminated else 0.0,
                "done": bool(terminated),
            }
            last = getattr(env, "last_step", None)
            if last is not None and last.searched is not None:
                step["search_ranking"] = last.searched
            steps.append(step)
            if terminated or truncated:
                break
        line = {"goal_mode": mode, "session": session, "steps": steps}
        lines.append(json.dumps({**line, "env_kwargs": env_kwargs} if env_kwargs else line))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    meta = {mode: {"product_prices": dict(prices), "goals": [dict(g) for g in goals]}}
    out.with_suffix(".meta.json").write_text(json.dumps(meta))
    return len(lines)


_CASE_KEYS = ("goal", "purchased_product", "selected_options", "price", "result")


def check_rewards(cases: Path) -> tuple[int, int, list[str]]:
    """Score each recorded case with our get_reward; (matched, total, mismatch lines)."""
    matched, lines = 0, []
    rows = _read_jsonl(cases, "reward case")
    for number, case in rows:
        missing = [k for k in _CASE_KEYS if k not in case]
        if missing:
            raise ValueError(f"{cases}:{number}: reward case lacks {missing} (needs {', '.join(_CASE_KEYS)})")
        try:
            expected = float(case["result"]["total"])
            info = get_reward(
                case["purchased_product"], case["goal"], float(case["price"]), case["selected_options"]
            )
        except (KeyError, TypeError, AttributeError, IndexError, ValueError) as err:
            raise ValueError(f"{cases}:{number}: malformed reward case ({type(err).__name__}: {err})") from err
        if abs(info.total - expected) <= REWARD_TOLERANCE:
            matched += 1
            continue
        lines.append(
            f"line {number}\tasin {case['goal'].get('asin')}\texpected={expected!r}\tgot={info.total!r}\t"
            f"r_type={info.r_type} title_score={info.title_score:.3f} attributes={info.attribute_hits}/"
            f"{info.num_attributes} options={info.option_hits}/{info.num_options} price_ok={info.price_ok}"
        )
    return matched, len(rows), lines
