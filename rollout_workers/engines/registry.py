"""`make_engine`: the engine named by `EngineConfig.engine`, imported lazily (vllm and torch load
only when their engine is chosen)."""

from __future__ import annotations

from collections.abc import Callable

from rollout_workers.config import EngineConfig
from rollout_workers.engines.base import Engine


def _vllm(cfg: EngineConfig, model_path: str, seed: int) -> Engine:
    from rollout_workers.engines.vllm_engine import VLLMEngine

    return VLLMEngine(model_path, cfg, seed=seed)


def _hf(cfg: EngineConfig, model_path: str, seed: int) -> Engine:
    from rollout_workers.engines.hf_engine import HFEngine

    return HFEngine(model_path, cfg)


def _simulated(cfg: EngineConfig, model_path: str, seed: int) -> Engine:
    from rollout_workers.engines.simulated import SimulatedEngine

    return SimulatedEngine(cfg, seed=seed)


ENGINES: dict[str, Callable[[EngineConfig, str, int], Engine]] = {"vllm": _vllm, "hf": _hf, "simulated": _simulated}


def make_engine(cfg: EngineConfig, model_path: str, *, seed: int = 0) -> Engine:
    """Build the configured engine on `model_path` (an HF directory or hub id)."""
    return ENGINES[cfg.engine](cfg, model_path, seed)


def make_async_engine(cfg: EngineConfig, model_path: str, *, seed: int = 0):
    """The `AsyncEngine` for `rollout.loop: async`: vLLM's AsyncLLM (continuous batching), or the
    HF engine behind a dynamic batcher. Call it on the event loop the engine will serve from."""
    if cfg.engine == "vllm":
        from rollout_workers.engines.vllm_async import VLLMAsyncEngine

        return VLLMAsyncEngine(model_path, cfg, seed=seed)
    if cfg.engine == "simulated":
        from rollout_workers.engines.simulated import SimulatedAsyncEngine

        return SimulatedAsyncEngine(cfg, seed=seed)
    from rollout_workers.engines.async_batch import BatchingAsyncEngine
    from rollout_workers.engines.hf_engine import HFEngine

    return BatchingAsyncEngine(HFEngine(model_path, cfg))
