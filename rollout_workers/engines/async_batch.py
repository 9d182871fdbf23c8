"""`BatchingAsyncEngine`: the `AsyncEngine` interface over a synchronous batched engine (the HF
engine), so that `rollout.loop: async` runs without vLLM.

Requests arriving while a batch runs queue up and go together into the next batch, each with its
own seed (`HFEngine.generate_seeded`); requests with different sampling settings go into separate
batches. This is dynamic batching, not vLLM's continuous batching: a running batch does not admit
new requests and lasts until its longest response ends. Batches run one at a time on one
thread, so the model is never used by two threads at once.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rollout_workers.types import Generation


@dataclass
class _Request:
    prompt: list[int]
    seed: int
    choices: list[str] | None
    key: tuple[float, float, int]
    """(temperature, top_p, max_tokens): only requests with equal settings share a batch."""
    future: asyncio.Future


class BatchingAsyncEngine:
    def __init__(self, engine):
        if not hasattr(engine, "generate_seeded"):
            raise TypeError(f"{type(engine).__name__} has no generate_seeded(prompts, seeds=...) to batch with")
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.stop_ids = engine.stop_ids
        self._pending: list[_Request] = []
        self._runner: asyncio.Task | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batching-engine")
        self.batch_sizes: list[int] = []
        """Size of every batch run by `generate_one` (tests and benchmarks read it)."""

    async def generate_one(
        self,
        prompt: list[int],
        *,
        temperature: float,
        top_p: float,
        max_tokens: int,
        seed: int,
        choices: list[str] | None = None,
    ) -> Generation:
        future = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(list(prompt), seed, choices, (temperature, top_p, max_tokens), future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            await asyncio.sleep(0)  # requests issued in the same event-loop tick join this batch
            key = self._pending[0].key
            batch = [r for r in self._pending if r.key == key]
            self._pending = [r for r in self._pending if r.key != key]
            temperature, top_p, max_tokens = key
            constrained = any(r.choices for r in batch)
            call = functools.partial(
                self.engine.generate_seeded,
                [r.prompt for r in batch],
                temperature=temperature,
                top_p=top_p,
                max_tokens=max_tokens,
                seeds=[r.seed for r in batch],
                choices=[r.choices or [] for r in batch] if constrained else None,
            )
            self.batch_sizes.append(len(batch))
            done = loop.run_in_executor(self._thread, call)
            await asyncio.wait([done])
            error = done.exception()  # a failed batch fails each of its requests with the error
            for i, r in enumerate(batch):
                if not r.future.done():
                    r.future.set_exception(error) if error is not None else r.future.set_result(done.result()[i])

    async def generate_batch(self, prompts, *, temperature, top_p, max_tokens, seed, choices=None):
        call = functools.partial(self.engine.generate, prompts, temperature=temperature, top_p=top_p,
                                 max_tokens=max_tokens, seed=seed, choices=choices)
        return await asyncio.get_running_loop().run_in_executor(self._thread, call)

    async def reload_weights(self, path: str) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, self.engine.reload_weights, path)

    @property
    def weight_group_ranks(self) -> int:
        return int(getattr(self.engine, "weight_group_ranks", 1))

    def join_weight_group(self, spec, base_rank: int) -> None:
        self.engine.join_weight_group(spec, base_rank)

    def receive_weights(self) -> int:
        return self.engine.receive_weights()

    def leave_weight_group(self) -> None:
        self.engine.leave_weight_group()

    def load_adapter(self, path: str) -> int:
        return self.engine.load_adapter(path)

    def receive_adapter(self, spec) -> int:
        return self.engine.receive_adapter(spec)

    def close(self) -> None:
        self._thread.shutdown(wait=True)
