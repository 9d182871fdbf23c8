"""After a sync: cached GPU memory is released (a no-op on CPU), and vLLM's reload warning about a
tied lm_head is filtered on tied-embedding models only."""

from __future__ import annotations

import logging

import torch

from rollout_workers.engines.vllm_sync import (
    RELOAD_LOGGER,
    TiedHeadReloadFilter,
    silence_tied_head_warning,
    ties_lm_head,
)
from weightsync.protocol import release_cached_memory


class _Inner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(8, 4)


class _Model(torch.nn.Module):
    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.model = _Inner()
        self.lm_head = torch.nn.Linear(4, 8, bias=False)
        if tied:
            self.lm_head.weight = self.model.embed_tokens.weight


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _reload_lines(*layers: str) -> list[str]:
    logger = logging.getLogger(RELOAD_LOGGER)
    handler = _Collect()
    logger.addHandler(handler)
    try:
        for layer in layers:
            logger.warning("%s: Failed to load weights", layer)  # vLLM's own call, verbatim
        return handler.lines
    finally:
        logger.removeHandler(handler)


def _drop_filters() -> None:
    logger = logging.getLogger(RELOAD_LOGGER)
    for f in [f for f in logger.filters if isinstance(f, TiedHeadReloadFilter)]:
        logger.removeFilter(f)


def test_tied_model_drops_only_the_lm_head_line():
    _drop_filters()
    try:
        assert _reload_lines("ParallelLMHead") == ["ParallelLMHead: Failed to load weights"]
        assert silence_tied_head_warning(_Model(tied=True))
        silence_tied_head_warning(_Model(tied=True))  # installed once
        assert sum(isinstance(f, TiedHeadReloadFilter) for f in logging.getLogger(RELOAD_LOGGER).filters) == 1
        assert _reload_lines("ParallelLMHead", "QKVParallelLinear") == ["QKVParallelLinear: Failed to load weights"]
    finally:
        _drop_filters()


def test_untied_model_keeps_the_warning():
    _drop_filters()
    assert not ties_lm_head(_Model(tied=False)) and ties_lm_head(_Model(tied=True))
    assert not silence_tied_head_warning(_Model(tied=False))
    assert _reload_lines("ParallelLMHead") == ["ParallelLMHead: Failed to load weights"]


def test_the_filter_matches_the_message_vllm_prints():
    from pathlib import Path

    import vllm

    source = Path(vllm.__file__).parent / "model_executor" / "model_loader" / "reload" / "layerwise.py"
    text = source.read_text()
    assert "init_logger(__name__)" in text and '"%s: Failed to load weights", layer.__class__.__name__' in text
    assert RELOAD_LOGGER == "vllm.model_executor.model_loader.reload.layerwise"


def test_release_cached_memory_is_a_no_op_on_cpu():
    before = torch.cuda.is_initialized()
    release_cached_memory()
    assert torch.cuda.is_initialized() == before  # never initialises CUDA on its own


def test_meta_tensors_names_what_an_unfinished_reload_left_on_meta():
    from rollout_workers.engines.vllm_sync import meta_tensors

    model = _Model(tied=False)
    assert meta_tensors(model) == []
    model.lm_head.weight = torch.nn.Parameter(torch.empty(8, 4, device="meta"))
    assert meta_tensors(model) == ["lm_head.weight"]
