"""`RolloutWorker`: one engine plus a share of the EnvPools; a plain class (deploy wraps it with
`ray.remote`, tests construct it directly).

Ordering guarantee: a weight update (`reload_weights`, `load_weight_files`, `receive_weights`)
never overlaps a generating call (`collect`, `generate_proposals`, `probe`) already running on
the worker. As a plain Ray actor (max_concurrency 1) calls already run one at a time in submission
order; the worker also enforces it itself (`EngineGuard`), so it holds when the actor is
threaded (max_concurrency > 1) and with the async agent loop, whose requests run on the worker's
event-loop thread: an update waits until every running generating call has returned, and a
generating call that arrives while an update runs or waits starts after it. Every trajectory is
stamped with the version the engine held for the whole collect (`self._version`), which an update
cannot change mid-collect. Two collects never overlap either (they use every env slot).
`call_timeline()` records when each guarded call ran (tests check the guarantee from it).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from envs.types import TaskSpec
from rollout_workers.config import EngineConfig, RolloutConfig
from rollout_workers.engines.base import derive_seed
from rollout_workers.engines.registry import make_async_engine, make_engine
from rollout_workers.loop import EnvPoolClient, run_episodes
from rollout_workers.summaries import summarize, summary
from rollout_workers.task_source import TaskSource
from rollout_workers.types import Generation, RolloutStats, TokenPack, Trajectory, TrajectorySummary
from weightsync.adapter import AdapterSpec, is_adapter_files
from weightsync.group import GroupSpec

log = logging.getLogger(__name__)


class RolloutWorker:
    """Collects trajectories with its engine; weights change only through the reload methods."""

    def __init__(
        self,
        engine_cfg: EngineConfig,
        rollout_cfg: RolloutConfig,
        model_path: str,
        env_pools: list[EnvPoolClient],
    ):
        if not env_pools:
            raise ValueError("a RolloutWorker needs at least one EnvPool")
        longest = rollout_cfg.max_prompt_tokens + rollout_cfg.max_response_tokens
        if engine_cfg.max_model_len is not None and engine_cfg.max_model_len < longest:
            raise ValueError(
                f"engine.max_model_len={engine_cfg.max_model_len} cannot hold rollout.max_prompt_tokens + "
                f"rollout.max_response_tokens = {longest}; raise the former or lower the latter"
            )
        self._cfg = rollout_cfg
        self._max_model_len = engine_cfg.max_model_len
        self._pools = list(env_pools)
        self._loop = None
        if rollout_cfg.loop == "async":
            from rollout_workers.agent_loop import EventLoopThread, SyncEngine

            self._loop = EventLoopThread()
            self._engine = SyncEngine(self._loop.run(_make_async(engine_cfg, model_path, rollout_cfg.seed)),
                                      self._loop.run)
        else:
            self._engine = make_engine(engine_cfg, model_path, seed=rollout_cfg.seed)
        # Async: generating calls may share the engine (it serves concurrent requests); lockstep
        # engines serve one call at a time.
        self._guard = EngineGuard(shared_generation=self._loop is not None)
        self._pools_lock = threading.Lock()  # collects use every env slot: one collect at a time
        self._timeline: deque[dict] = deque(maxlen=256)
        self._version = 0
        self._calls = 0
        self._digest: str | None = None

    @property
    def engine(self):
        return self._engine

    def collect(
        self,
        tasks: list[TaskSpec],
        *,
        group_size: int,
        policy_version: int,
        temperature: float | None = None,
        skill_texts: Mapping[str, str | None] | None = None,
    ) -> tuple[list[Trajectory], RolloutStats]:
        """`group_size` episodes per task; temperature defaults to the training temperature (pass
        `eval_temperature` for evaluation). `skill_texts`: UniSkill's retrieved skill per task_id for
        the actor prompt's skill slot.

        Every trajectory is stamped with the version the engine actually holds (it cannot change
        during the call, see the module docstring); `policy_version` is the version the caller
        expects, logged when it differs (normal with the asynchronous pipeline). Seeds derive from
        (rollout.seed, held version, call index since that version was loaded): when the two agree
        (the synchronous loop) seeds and trajectories are those the caller's version gave before."""
        with self._pools_lock, self._guarded("collect"):
            version = self._version
            if policy_version != version:
                log.info("collect for policy_version=%d runs on the engine's version %d and is stamped %d",
                         policy_version, version, version)
            seed = derive_seed(self._cfg.seed, version, self._calls)
            self._calls += 1
            temperature = self._cfg.temperature if temperature is None else temperature
            if self._loop is not None:
                from rollout_workers.agent_loop import run_episodes_async

                return self._loop.run(run_episodes_async(
                    self._engine.async_engine, self._pools, tasks, group_size=group_size, policy_version=version,
                    cfg=self._cfg, temperature=temperature, seed=seed, skill_texts=skill_texts))
            return run_episodes(self._engine, self._pools, tasks, group_size=group_size, policy_version=version,
                                cfg=self._cfg, temperature=temperature, seed=seed, skill_texts=skill_texts)

    def collect_units(
        self,
        source: TaskSource,
        *,
        group_size: int,
        policy_version: int,
        temperature: float | None = None,
        skill_texts: Mapping[str, str | None] | None = None,
    ) -> tuple[dict[int, list[Trajectory]], RolloutStats]:
        """`rollout.assignment: dynamic`: play task groups taken from `source` until it has none
        left, as many at once as the env slots hold (`agent_loop.run_units_async`), reporting each
        through `source.finish`. Returns the played groups by unit index, and the stats. Each unit
        carries its seed, so its episodes are the same on any worker (at the same policy version)."""
        if self._loop is None:
            raise ValueError("dynamic episode assignment plays episodes as coroutines: set rollout.loop=async")
        with self._pools_lock, self._guarded("collect"):
            version = self._version
            if policy_version != version:
                log.info("collect for policy_version=%d runs on the engine's version %d and is stamped %d",
                         policy_version, version, version)
            from rollout_workers.agent_loop import run_units_async

            return self._loop.run(run_units_async(
                self._engine.async_engine, self._pools, source, group_size=group_size, policy_version=version,
                cfg=self._cfg, temperature=self._cfg.temperature if temperature is None else temperature,
                skill_texts=skill_texts))

    def collect_apart(self, tasks: list[TaskSpec], **kwargs: Any) -> tuple[tuple[list[TrajectorySummary], RolloutStats],
                                                                          TokenPack]:
        """`collect` for a training step, its result as two objects (call it with
        `.options(num_returns=2)`): the summaries and stats the driver decides on, and the token
        arrays that only the learners fetch (`rollout_workers.summaries.summarize`)."""
        trajectories, stats = self.collect(tasks, **kwargs)
        summaries, pack = summarize(trajectories)
        return (summaries, stats), pack

    def collect_units_apart(self, source: TaskSource, **kwargs: Any) -> tuple[
            tuple[dict[int, list[TrajectorySummary]], RolloutStats], TokenPack]:
        """`collect_units` with its result as two objects, as `collect_apart`."""
        groups, stats = self.collect_units(source, **kwargs)
        pack = TokenPack.of([t for g in groups.values() for t in g])
        return ({i: [summary(t) for t in g] for i, g in groups.items()}, stats), pack

    def generate_proposals(
        self,
        prompt_ids_batch: list[list[int]],
        *,
        max_tokens: int,
        temperature: float,
        seed: int,
        op_choices: list[list[str]] | None = None,
    ) -> list[Generation]:
        """UniSkill proposer outputs with the current weights: one batched, unconstrained call.
        Each prompt is a rendered proposer prompt that already ends with the prefilled "<action>"
        (rollout_workers.proposer). Raises when a prompt cannot fit with `max_tokens` generated.

        `op_choices[i]` (uniskill.proposer.constrain_op): the op is first decoded constrained to
        these strings (e.g. "ADD_NEW_SKILL</action>"); outputs that chose an edit op then continue
        unconstrained from prompt + op tokens. The returned ids are the concatenated samples."""
        if self._max_model_len is not None:
            for i, p in enumerate(prompt_ids_batch):
                if len(p) + max_tokens > self._max_model_len:
                    raise ValueError(
                        f"proposer prompt {i} has {len(p)} tokens; with max_tokens={max_tokens} it exceeds "
                        f"engine.max_model_len={self._max_model_len}: lower uniskill.proposer.max_prompt_tokens "
                        "or max_tokens"
                    )
        with self._guarded("generate_proposals"):
            if op_choices is not None:
                return self._two_stage_proposals(prompt_ids_batch, op_choices, max_tokens, temperature, seed)
            return self._engine.generate(
                [list(p) for p in prompt_ids_batch],
                temperature=temperature,
                top_p=1.0,
                max_tokens=max_tokens,
                seed=seed,
                choices=None,
            )

    def _two_stage_proposals(
        self, prompts: list[list[int]], op_choices: list[list[str]], max_tokens: int, temperature: float, seed: int
    ) -> list[Generation]:
        if len(op_choices) != len(prompts):
            raise ValueError(f"{len(op_choices)} op choice lists for {len(prompts)} prompts")
        ops = self._engine.generate([list(p) for p in prompts], temperature=temperature, top_p=1.0,
                                    max_tokens=max_tokens, seed=seed, choices=op_choices)
        stop = set(getattr(self._engine, "stop_ids", ()))
        out = list(ops)
        cont_idx = [i for i, g in enumerate(ops) if not g.text.strip().startswith("NO_SKILL")]
        if cont_idx:
            heads = [[t for t in ops[i].token_ids if t not in stop] for i in cont_idx]
            rest = self._engine.generate([list(prompts[i]) + h for i, h in zip(cont_idx, heads)],
                                         temperature=temperature, top_p=1.0, seed=derive_seed(seed, 1),
                                         max_tokens=max(1, max_tokens - max(map(len, heads))), choices=None)
            for i, h, tail in zip(cont_idx, heads, rest):
                n = len(h)
                out[i] = Generation(token_ids=(*h, *tail.token_ids), logprobs=(*ops[i].logprobs[:n], *tail.logprobs),
                                    text=ops[i].text + tail.text, finish_reason=tail.finish_reason)
        return out

    def reload_weights(self, path: str, version: int) -> None:
        """Load the HF safetensors directory at `path` (on this node) as policy `version`."""
        with self._guarded("reload_weights", update=True):
            self._reload(path, version)

    def _reload(self, path: str, version: int) -> None:
        self._engine.reload_weights(path)
        if version != self._version:
            self._calls = 0  # seeds derive from (seed, version, call): a resumed run replays them
        self._version = version

    def load_adapter(self, path: str, version: int) -> None:
        """Apply the peft adapter directory at `path` (on this node) on the base as policy `version`."""
        with self._guarded("load_adapter", update=True):
            self._load_adapter(path, version)

    def _load_adapter(self, path: str, version: int) -> None:
        load = getattr(self._engine, "load_adapter", None)
        if load is None:
            raise ValueError(f"engine {type(self._engine).__name__} cannot apply LoRA adapters; "
                             "set learner.lora.merge_on_sync=true")
        load(path)
        if version != self._version:
            self._calls = 0
        self._version = version

    def weight_group_ranks(self) -> int:
        """Members this worker's engine contributes to the weight-sync group."""
        return int(getattr(self._engine, "weight_group_ranks", 1))

    def join_weight_group(self, spec: GroupSpec, base_rank: int) -> None:
        """Join the weight-sync group (`sync.method: broadcast`) as ranks base_rank...; blocks until
        every member joined (at most spec.timeout_s)."""
        join = getattr(self._engine, "join_weight_group", None)
        if join is None:
            raise ValueError(f"engine {type(self._engine).__name__} cannot receive broadcast weights; "
                             "set sync.method=object_store")
        join(spec, base_rank)

    def receive_weights(self, version: int, adapter: AdapterSpec | None = None) -> int:
        """Weight sync without files: load the tensors learner rank 0 broadcasts now (collective with
        it) as policy `version`; returns the number of tensors. With `adapter` they are a LoRA
        adapter of that shape, applied on the base the engine holds (`load_adapter` of the
        engines). No digest is computed (hashing every weight each step is what this path avoids).
        A failed receive raises and keeps the old version: the engine is finalised, or its process
        ends (engines/vllm_sync.py), and the driver reloads it through the object store."""
        with self._guarded("receive_weights", update=True):
            count = self._engine.receive_weights() if adapter is None else self._engine.receive_adapter(adapter)
            if version != self._version:
                self._calls = 0
            self._version, self._digest = version, None
            return count

    def leave_weight_group(self) -> None:
        leave = getattr(self._engine, "leave_weight_group", None)
        if leave is not None:
            leave()

    def probe(self, text: str, *, max_tokens: int, temperature: float, seed: int) -> tuple[list[int], Generation]:
        """(prompt ids, sample): `text` tokenized and continued with the current weights at
        `temperature`, top_p 1; the learner re-scores the sample to verify a weight sync."""
        prompt = list(self._engine.tokenizer(text, add_special_tokens=False)["input_ids"])
        with self._guarded("probe"):
            [gen] = self._engine.generate([prompt], temperature=temperature, top_p=1.0, max_tokens=max_tokens,
                                          seed=seed, choices=None)
        return prompt, gen

    def load_weight_files(self, files: dict[str, bytes], version: int) -> str:
        """Weight sync without a shared filesystem: write the exported files (shipped through the
        Ray object store) to a local temp dir, reload from it, delete it. Files of a peft adapter
        directory (LoRA) are applied as an adapter on the base the engine holds (a restarted
        worker's engine starts from the run's base model, so it then holds base + the current
        adapter). Returns the digest of the files (`weights_digest`)."""
        with self._guarded("load_weight_files", update=True):
            tmp = Path(tempfile.mkdtemp(prefix="agentrl-weights-"))
            try:
                for name, data in files.items():
                    if Path(name).name != name:
                        raise ValueError(f"weight file name {name!r} must be a bare file name")
                    (tmp / name).write_bytes(data)
                if is_adapter_files(files):
                    self._load_adapter(str(tmp), version)
                else:
                    self._reload(str(tmp), version)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            self._digest = files_digest(files)
            return self._digest

    def policy_version(self) -> int:
        return self._version

    def call_timeline(self) -> list[dict]:
        """The last 256 guarded calls, oldest first: {"call", "arrive" (entered the worker), "start"
        (got the engine), "end" (all time.time()), "version" (the engine's version at the end)}."""
        return list(self._timeline)

    @contextmanager
    def _guarded(self, call: str, *, update: bool = False) -> Iterator[None]:
        arrive = time.time()
        with self._guard.updating() if update else self._guard.generating():
            start = time.time()
            try:
                yield
            finally:
                self._timeline.append({"call": call, "arrive": arrive, "start": start, "end": time.time(),
                                       "version": self._version})

    def shutdown(self) -> None:
        """Stop the engine (and the async loop's event loop thread); idempotent. Called before the
        actor is killed, so vLLM's engine core and rendezvous files go with it."""
        if self._loop is not None:
            close = getattr(self._engine.async_engine, "close", None)
            if close is not None:
                self._loop.run(_on_loop(close))  # the engine's tasks belong to the loop thread
            self._loop.close()
            self._loop = None
        else:
            close = getattr(self._engine, "close", None)
            if close is not None:
                close()

    def weights_digest(self) -> str | None:
        """sha256 over the weight files last loaded by `load_weight_files` (None while the engine
        holds the weights it was constructed with): equal digests mean equal weights."""
        return self._digest


def files_digest(files: Mapping[str, bytes]) -> str:
    """sha256 over (name, bytes) in name order."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + len(files[name]).to_bytes(8, "little") + files[name])
    return h.hexdigest()


async def _on_loop(fn) -> None:
    fn()


async def _make_async(engine_cfg: EngineConfig, model_path: str, seed: int):
    """Built on the worker's event loop, which the engine then serves from."""
    return make_async_engine(engine_cfg, model_path, seed=seed)


class EngineGuard:
    """Weight updates exclude generating calls. `updating()` waits until no generating call runs,
    then holds the engine alone; `generating()` waits while an update runs or waits (so calls keep
    their arrival order around an update). With shared_generation=False generating calls also
    exclude each other (an engine that serves one call at a time)."""

    def __init__(self, *, shared_generation: bool) -> None:
        self._shared = shared_generation
        self._cond = threading.Condition()
        self._generating = 0
        self._updating = False
        self._updates_waiting = 0

    @contextmanager
    def generating(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._updating and self._updates_waiting == 0
                                and (self._shared or self._generating == 0))
            self._generating += 1
        try:
            yield
        finally:
            with self._cond:
                self._generating -= 1
                self._cond.notify_all()

    @contextmanager
    def updating(self) -> Iterator[None]:
        with self._cond:
            self._updates_waiting += 1
            self._cond.wait_for(lambda: not self._updating and self._generating == 0)
            self._updates_waiting -= 1
            self._updating = True
        try:
            yield
        finally:
            with self._cond:
                self._updating = False
                self._cond.notify_all()
