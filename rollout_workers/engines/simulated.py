"""`engine.engine: simulated`: a rollout engine without a model, for running the real driver,
rollout workers and environments at cluster scale on one machine (bench/sim_cluster.py).

A response is seeded tokens: a think block of a seeded length (lognormal around
`engine.simulated_response_tokens`, times a per-task factor of spread
`engine.simulated_task_spread`: hard tasks think longer, capped by max_tokens) followed by the action, which is one of
`choices` when the loop decodes constrained (so environments see admissible actions) and "look"
otherwise, then EOS. It arrives after the delay the latency model (`engines.latency`, the GPU
named by `engine.simulated_gpu`) gives for serving it, times `engine.simulated_time_scale` (real
seconds per simulated second). `busy_s` counts the simulated seconds the GPU was serving.

The async engine (`rollout.loop: async`) batches continuously like vLLM: requests join the running
batch at the next scheduler step (after their prefill) and leave when their last token is out; the
sync engine (lockstep loop, proposals, probes) serves each call as one batch.

The tokenizer is word-level and needs no files: every whitespace-separated piece is one token
whose id is a hash of the piece, and decoding joins the pieces with spaces.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
import zlib
from dataclasses import dataclass

from rollout_workers.config import EngineConfig
from rollout_workers.engines.base import derive_seed
from rollout_workers.engines.latency import MODELS, LatencyModel
from rollout_workers.types import Generation

EOS = 2
_THINK_OPEN, _THINK_CLOSE = 3, 4
_FIRST_WORD_ID = 1000
_VOCAB = 150_000


class SimTokenizer:
    """Word-level tokenizer with the methods the rollout loop uses (chat template, encode,
    decode, __call__)."""

    eos_token_id = EOS
    pad_token_id = 0

    def __init__(self) -> None:
        self._words: dict[int, str] = {_THINK_OPEN: "<think>", _THINK_CLOSE: "</think>"}

    def _id(self, word: str) -> int:
        tid = _FIRST_WORD_ID + zlib.crc32(word.encode()) % (_VOCAB - _FIRST_WORD_ID)
        self._words.setdefault(tid, word)
        return tid

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [self._id(w) for w in text.split()]

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text)}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(self._words.get(int(i), f"w{int(i)}") for i in ids if int(i) != EOS)

    def apply_chat_template(self, messages, tokenize: bool = False, add_generation_prompt: bool = True) -> str:
        text = " ".join(f"<|{m['role']}|> {m['content']}" for m in messages)
        return text + (" <|assistant|>" if add_generation_prompt else "")


def task_factor(prompt: list[int], spread: float) -> float:
    """A per-task length factor: lognormal(0, spread) seeded by the prompt's first 48 tokens (the
    template and the task line, the same in every turn of every episode of a task)."""
    if spread <= 0:
        return 1.0
    return random.Random(zlib.crc32(str(list(prompt[:48])).encode())).lognormvariate(0.0, spread)


def simulated_response(tokenizer: SimTokenizer, *, max_tokens: int, seed: int, choices: list[str] | None,
                       mean_think_tokens: float) -> Generation:
    """One seeded response: think block, action (a choice, else "look"), EOS."""
    rng = random.Random(seed)
    action = tokenizer.encode(rng.choice(choices) if choices else "<action>look</action>")
    room = max(0, max_tokens - len(action) - 3)
    think = min(room, max(1, int(rng.lognormvariate(math.log(max(mean_think_tokens, 1.0)), 0.6))))
    ids = [_THINK_OPEN, *(rng.randrange(_FIRST_WORD_ID, _VOCAB) for _ in range(think)), _THINK_CLOSE, *action, EOS]
    logprobs = [-rng.random() * 2.0 for _ in ids]
    return Generation(token_ids=tuple(ids), logprobs=tuple(logprobs), text=tokenizer.decode(ids), finish_reason="stop")


def _gpu(cfg: EngineConfig) -> LatencyModel:
    return MODELS[cfg.simulated_gpu]


class SimulatedEngine:
    """The sync `Engine`: one call = one batch served after `LatencyModel.batch_s`."""

    def __init__(self, cfg: EngineConfig, seed: int = 0) -> None:
        self.cfg, self.gpu, self.scale = cfg, _gpu(cfg), cfg.simulated_time_scale
        self.tokenizer = SimTokenizer()
        self.stop_ids = (EOS,)
        self.busy_s = 0.0

    def generate(self, prompts, *, temperature, top_p, max_tokens, seed, choices=None) -> list[Generation]:
        gens = [simulated_response(self.tokenizer, max_tokens=max_tokens, seed=derive_seed(seed, i),
                                   choices=(choices[i] or None) if choices else None,
                                   mean_think_tokens=self.cfg.simulated_response_tokens
                                   * task_factor(p, self.cfg.simulated_task_spread))
                for i, p in enumerate(prompts)]
        delay = self.gpu.batch_s([len(p) for p in prompts], [len(g.token_ids) for g in gens])
        self.busy_s += delay
        time.sleep(delay * self.scale)
        return gens

    def reload_weights(self, path: str) -> None:
        """Nothing to load (the responses do not depend on weights)."""


@dataclass
class _Request:
    prompt_tokens: int
    left: int
    future: asyncio.Future
    admitted: bool = False


class SimulatedAsyncEngine:
    """The `AsyncEngine`: continuous batching on one simulated GPU. The scheduler advances the
    running batch by up to `steps_per_tick` decode steps at a time (new requests join at the next
    tick), sleeping the simulated time those steps take."""

    steps_per_tick = 16

    def __init__(self, cfg: EngineConfig, seed: int = 0) -> None:
        self.cfg, self.gpu, self.scale = cfg, _gpu(cfg), cfg.simulated_time_scale
        self.tokenizer = SimTokenizer()
        self.stop_ids = (EOS,)
        self.busy_s = 0.0
        self._queue: list[_Request] = []
        self._runner: asyncio.Task | None = None

    async def generate_one(self, prompt, *, temperature, top_p, max_tokens, seed, choices=None) -> Generation:
        gen = simulated_response(self.tokenizer, max_tokens=max_tokens, seed=seed, choices=choices or None,
                                 mean_think_tokens=self.cfg.simulated_response_tokens
                                 * task_factor(prompt, self.cfg.simulated_task_spread))
        request = _Request(len(prompt), len(gen.token_ids), asyncio.get_running_loop().create_future())
        self._queue.append(request)
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._serve())
        await request.future
        return gen

    async def generate_batch(self, prompts, *, temperature, top_p, max_tokens, seed, choices=None) -> list[Generation]:
        return list(await asyncio.gather(*(
            self.generate_one(p, temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                              seed=derive_seed(seed, i), choices=choices[i] if choices else None)
            for i, p in enumerate(prompts))))

    async def _serve(self) -> None:
        while self._queue:
            new = [r for r in self._queue if not r.admitted]
            for r in new:
                r.admitted = True
            running = list(self._queue)
            steps = min(self.steps_per_tick, min(r.left for r in running))
            delay = self.gpu.prefill_s(sum(r.prompt_tokens for r in new)) + steps * self.gpu.step_s(len(running))
            await asyncio.sleep(delay * self.scale)
            self.busy_s += delay
            for r in running:
                r.left -= steps
                if r.left <= 0:
                    self._queue.remove(r)
                    if not r.future.done():
                        r.future.set_result(None)

    async def reload_weights(self, path: str) -> None:
        """Nothing to load (the responses do not depend on weights)."""
