"""The Engine interface every policy engine implements, plus the small pieces both share.

Contract of `generate` (token-in/token-out):
- one batched call for all prompts; prompts are token ids (already chat-templated);
- `Generation.token_ids` are exactly the sampled ids, including the final stop token when the
  sequence stopped (the learner trains on it);
- `Generation.logprobs[j]` is log p(token_ids[j]) under the distribution it was sampled from:
  temperature-scaled logits (as the learner computes them), restricted to the allowed ids and
  renormalised when constrained, truncated by top_p when top_p < 1;
- `choices[i]` (when given and non-empty) are the only full responses allowed for prompt i, and
  `Generation.allowed_token_ids[j]` lists the ids that were allowed at position j;
- `temperature=0` is greedy decoding; its logprobs are then those of the untempered distribution;
- request i is seeded with `derive_seed(seed, i)`, so a call is reproducible.

`AsyncEngine` (the per-episode loop, `rollout.loop: async`) serves one request per call,
`generate_one`, with the same contract for that request; `seed` is the request's own seed (what
`generate` derives as `derive_seed(seed, i)` for row i). Concurrent calls are served together
(continuous batching on vLLM), so a request never waits for another one to finish first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from rollout_workers.types import Generation


class Engine(Protocol):
    tokenizer: object
    """The HF tokenizer whose chat template renders prompts (the same files the model uses)."""

    def generate(
        self,
        prompts: list[list[int]],
        *,
        temperature: float,
        top_p: float,
        max_tokens: int,
        seed: int,
        choices: list[list[str]] | None = None,
    ) -> list[Generation]: ...

    def reload_weights(self, path: str) -> None:
        """Load new weights (an HF safetensors directory) in place; the tokenizer is unchanged."""
        ...

    # Collective weight sync (`sync.method: broadcast`, weightsync/): both engines implement
    # `weight_group_ranks` (members it contributes), `join_weight_group(spec, base_rank)`,
    # `receive_weights() -> tensors loaded` and `leave_weight_group()`.


class AsyncEngine(Protocol):
    """An engine serving single requests concurrently on an asyncio event loop. Weight updates
    (`reload_weights`, `receive_weights`) must not run while a request is in flight: the caller
    (`RolloutWorker`) orders them."""

    tokenizer: object

    async def generate_one(
        self,
        prompt: list[int],
        *,
        temperature: float,
        top_p: float,
        max_tokens: int,
        seed: int,
        choices: list[str] | None = None,
    ) -> Generation: ...

    async def generate_batch(
        self,
        prompts: list[list[int]],
        *,
        temperature: float,
        top_p: float,
        max_tokens: int,
        seed: int,
        choices: list[list[str]] | None = None,
    ) -> list[Generation]:
        """`Engine.generate`'s contract (request i seeded with `derive_seed(seed, i)`)."""
        ...

    async def reload_weights(self, path: str) -> None: ...


_MASK63 = (1 << 63) - 1


def derive_seed(*parts: int) -> int:
    """A deterministic 63-bit seed from integer parts (splitmix64-style mixing)."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (p & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        x = (x ^ (x >> 31)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
    return (x ^ (x >> 29)) & _MASK63


def stop_token_ids(tokenizer, generation_eos: int | Iterable[int] | None) -> tuple[int, ...]:
    """The ids that end a response: the tokenizer's EOS plus generation_config's eos ids
    (the set vLLM stops on and lets its grammar emit once a choice is complete)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if isinstance(generation_eos, int):
        ids.add(generation_eos)
    elif generation_eos is not None:
        ids.update(int(i) for i in generation_eos)
    if not ids:
        raise ValueError("the model defines no EOS token; responses could never stop")
    return tuple(sorted(ids))


def decode_response(tokenizer, token_ids: Sequence[int], stop_ids: Sequence[int]) -> str:
    """Response text for parsing: the ids without a trailing stop token, special tokens skipped.
    Both engines decode this way, so the same ids always give the same text."""
    ids = list(token_ids)
    if ids and ids[-1] in stop_ids:
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=True)


def active_choices(choices: list[list[str]] | None, n: int) -> list[list[str] | None]:
    """Per-prompt choice list, None where unconstrained (choices None, or an empty list)."""
    if choices is None:
        return [None] * n
    if len(choices) != n:
        raise ValueError(f"choices has {len(choices)} entries for {n} prompts")
    return [list(c) if c else None for c in choices]
