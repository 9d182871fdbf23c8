"""The per-episode agent loop (`rollout.loop: async`).

Every episode is its own coroutine: reset its env, then per turn render its prompt, send ONE
request to the async engine (`engines.base.AsyncEngine.generate_one`), parse the response and step
its env; it sends its next turn as soon as its own env step returns, without waiting for the other
episodes' responses or env steps. The engine serves the concurrent requests together (continuous
batching on vLLM's AsyncLLM, dynamic batching on the HF engine).

What stays exactly as in the lockstep loop (rollout_workers/loop.py): the per-turn pieces are the
same functions (`turn_prompt`, `turn_choices`, `parse_response`, `record_step`, `apply_reset`,
`new_episodes`), so prompts, the prompt-length guard, constrained decoding, parsing, end reasons,
every Turn/Trajectory field and the order of the returned trajectories (grouped by task) are
identical. Request seeds: episode k of wave w at turn t is seeded with
`derive_seed(derive_seed(seed, w, t), k)`, lockstep's seed for row k of that turn's batch. The
lockstep row index counts only the episodes still acting at that turn, so the two agree exactly
while no earlier episode of the wave has ended; after one has, the async seed is the episode's own
(it cannot wait to learn which other episodes are still acting without waiting for them). With
greedy decoding, or while every episode is live, both loops return the same trajectories.

Env slots: an episode takes a free slot when it starts and returns it when it ends, so episodes of
a later wave start as soon as any slot frees (lockstep waits for the whole wave). Calls to one
EnvPool run one at a time on that pool's own thread, as in lockstep (one call per pool at a time);
different pools step in parallel, and env steps overlap generation.

Stats: `generate_s` is the wall time during which at least one request was in flight, `env_s`
the wall time during which at least one env call was; they overlap, unlike lockstep's.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from envs.types import EnvStep, TaskSpec
from rollout_workers.config import RolloutConfig
from rollout_workers.engines.base import AsyncEngine, derive_seed
from rollout_workers.loop import (
    EnvPoolClient,
    _LiveEpisode,
    _trajectory,
    apply_reset,
    new_episodes,
    parse_response,
    record_step,
    turn_choices,
    turn_prompt,
)
from rollout_workers.task_source import TaskSource
from rollout_workers.types import RolloutStats, Trajectory

T = TypeVar("T")


class _Busy:
    """Wall time during which at least one call was in flight (all updates on the loop thread)."""

    def __init__(self) -> None:
        self.inflight, self.since, self.total = 0, 0.0, 0.0

    def enter(self) -> None:
        if self.inflight == 0:
            self.since = time.perf_counter()
        self.inflight += 1

    def leave(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self.total += time.perf_counter() - self.since


class _Envs:
    """One thread per EnvPool: an episode's env call runs there, off the event loop."""

    def __init__(self, pools: Sequence[EnvPoolClient]) -> None:
        self._threads = {id(p): ThreadPoolExecutor(max_workers=1, thread_name_prefix="envpool") for p in pools}
        self.busy = _Busy()

    async def call(self, e: _LiveEpisode, method: str, payload) -> EnvStep:
        pool, slot = e.pool, e.slot
        self.busy.enter()
        try:
            steps = await asyncio.get_running_loop().run_in_executor(
                self._threads[id(pool)], lambda: getattr(pool, method)([slot], [payload])
            )
        finally:
            self.busy.leave()
        if len(steps) != 1:
            raise RuntimeError(f"EnvPool.{method} returned {len(steps)} steps for 1 slot")
        return steps[0]

    def close(self) -> None:
        for t in self._threads.values():
            t.shutdown(wait=True)


class _Player:
    """Plays episodes as coroutines on a shared set of env slots (one per env of `pools`)."""

    def __init__(self, engine: AsyncEngine, pools: Sequence[EnvPoolClient], *, group_size: int, cfg: RolloutConfig,
                 temperature: float, skill_texts: Mapping[str, str | None] | None) -> None:
        self.engine, self.cfg, self.temperature, self.skill_texts = engine, cfg, temperature, skill_texts
        self.slots = [(pool, s) for pool in pools for s in range(pool.num_envs())]
        self.groups_at_once = len(self.slots) // group_size
        self.free: asyncio.Queue = asyncio.Queue()
        for s in self.slots:
            self.free.put_nowait(s)
        self.envs, self.gen_busy = _Envs(pools), _Busy()
        self.tokens = {"prompt": 0, "generated": 0}

    async def play(self, e: _LiveEpisode, seed: int, wave: int, k: int) -> None:
        """Episode `e` from reset to its end; its turn-t request is seeded
        derive_seed(derive_seed(seed, wave, t), k)."""
        cfg, engine = self.cfg, self.engine
        e.pool, e.slot = await self.free.get()
        try:
            e.skill_text = (self.skill_texts or {}).get(e.task.task_id)
            apply_reset(e, await self.envs.call(e, "reset", e.task))
            for turn in range(cfg.max_turns):
                prompt = turn_prompt(engine, e, cfg) if e.live else None  # type: ignore[arg-type]
                if prompt is None:
                    break
                choices = (turn_choices(e) or None) if cfg.constrained_actions else None
                self.gen_busy.enter()
                try:
                    g = await engine.generate_one(prompt, temperature=self.temperature, top_p=cfg.top_p,
                                                  max_tokens=cfg.max_response_tokens,
                                                  seed=derive_seed(derive_seed(seed, wave, turn), k), choices=choices)
                finally:
                    self.gen_busy.leave()
                self.tokens["prompt"] += len(prompt)
                self.tokens["generated"] += len(g.token_ids)
                pa = parse_response(e, g, cfg)
                record_step(e, prompt, g, pa, await self.envs.call(e, "step", pa.env_action))
            if e.live:  # max_turns reached before the env's own step limit
                e.end_reason = "step_limit"
        finally:
            self.free.put_nowait((e.pool, e.slot))

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.envs.close)

    def stats(self, trajectories: Sequence[Trajectory], start: float) -> RolloutStats:
        return RolloutStats(
            num_episodes=len(trajectories),
            num_turns=sum(len(t.turns) for t in trajectories),
            num_generated_tokens=self.tokens["generated"],
            num_prompt_tokens=self.tokens["prompt"],
            generate_s=self.gen_busy.total,
            env_s=self.envs.busy.total,
            total_s=time.perf_counter() - start,
        )


async def _gather_all(runs: list[asyncio.Future]) -> None:
    try:
        await asyncio.gather(*runs)
    except BaseException:
        for r in runs:
            r.cancel()
        raise


async def run_episodes_async(
    engine: AsyncEngine,
    pools: Sequence[EnvPoolClient],
    tasks: Sequence[TaskSpec],
    *,
    group_size: int,
    policy_version: int,
    cfg: RolloutConfig,
    temperature: float,
    seed: int,
    skill_texts: Mapping[str, str | None] | None = None,
) -> tuple[list[Trajectory], RolloutStats]:
    """`loop.run_episodes` with one coroutine per episode; same arguments, same results (see the
    module docstring for the seeds)."""
    start = time.perf_counter()
    player = _Player(engine, pools, group_size=group_size, cfg=cfg, temperature=temperature, skill_texts=skill_texts)
    if tasks and player.groups_at_once == 0:
        raise ValueError(f"the EnvPools hold {len(player.slots)} envs; one group needs group_size={group_size}")
    wave_size = max(player.groups_at_once, 1) * group_size
    episodes = new_episodes(tasks, group_size, [(None, -1)] * (len(tasks) * group_size))
    runs = []
    for j, e in enumerate(episodes):
        wave, k = divmod(j, wave_size)
        runs.append(asyncio.ensure_future(player.play(e, seed, wave, k)))
    try:
        await _gather_all(runs)
    finally:
        await player.close()
    trajectories = [_trajectory(e, policy_version) for e in episodes]
    return trajectories, player.stats(trajectories, start)


async def run_units_async(
    engine: AsyncEngine,
    pools: Sequence[EnvPoolClient],
    source: TaskSource,
    *,
    group_size: int,
    policy_version: int,
    cfg: RolloutConfig,
    temperature: float,
    skill_texts: Mapping[str, str | None] | None = None,
) -> tuple[dict[int, list[Trajectory]], RolloutStats]:
    """Play task groups taken from `source` as env slots free up (`rollout_workers.task_source`):
    as many groups at once as the pools hold, the next one taken when one finishes (and reported
    through `source.finish`). Returns the played groups by unit index, and the stats."""
    start = time.perf_counter()
    player = _Player(engine, pools, group_size=group_size, cfg=cfg, temperature=temperature, skill_texts=skill_texts)
    if player.groups_at_once == 0:
        raise ValueError(f"the EnvPools hold {len(player.slots)} envs; one group needs group_size={group_size}")
    loop = asyncio.get_running_loop()
    played: dict[int, list[Trajectory]] = {}

    async def lane() -> None:
        while (unit := await loop.run_in_executor(None, source.take)) is not None:
            episodes = new_episodes([unit.task], group_size, [(None, -1)] * group_size)
            await _gather_all([asyncio.ensure_future(player.play(e, unit.seed, 0, k)) for k, e in enumerate(episodes)])
            played[unit.index] = [_trajectory(e, policy_version) for e in episodes]
            await loop.run_in_executor(None, source.finish, unit)

    try:
        await _gather_all([asyncio.ensure_future(lane()) for _ in range(player.groups_at_once)])
    finally:
        await player.close()
    return played, player.stats([t for group in played.values() for t in group], start)


class EventLoopThread:
    """An asyncio event loop on its own daemon thread; `run` executes a coroutine there and blocks
    the calling thread until it returns (the worker's sync methods call into the async engine)."""

    def __init__(self, name: str = "agent-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()  # type: ignore[arg-type]

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


class SyncEngine:
    """The `Engine` (sync) face of an `AsyncEngine` served on an `EventLoopThread`: `generate` is
    `generate_batch` (one call, request i seeded with derive_seed(seed, i)); other methods pass
    through, coroutine methods run on the loop. Proposals, probes and deploy code use it."""

    def __init__(self, engine: AsyncEngine, runner: Callable[[Awaitable], object]) -> None:
        self.async_engine = engine
        self._run = runner

    def generate(self, prompts, *, temperature, top_p, max_tokens, seed, choices=None):
        return self._run(self.async_engine.generate_batch(prompts, temperature=temperature, top_p=top_p,
                                                          max_tokens=max_tokens, seed=seed, choices=choices))

    def __getattr__(self, name: str):
        value = getattr(self.async_engine, name)
        if inspect.iscoroutinefunction(value):
            return lambda *args, **kw: self._run(value(*args, **kw))
        return value
