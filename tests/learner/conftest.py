"""Fixtures for learner tests: a ~100k-parameter Qwen2 model and synthetic GRPO rows."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch

from deploy.laptop.tiny_model import TinyModelConfig, build_tiny_model
from learner.types import TrainRow

CORPUS = [
    "You are in the middle of a room. Looking around you, you see a cabinet 1, a countertop 1.",
    "Your task is to: put a clean mug in cabinet. <action>go to countertop 1</action>",
    "take mug 1 from countertop 1. clean mug 1 with sinkbasin 1. put mug 1 in/on cabinet 1.",
] * 8
TINY = TinyModelConfig(
    vocab_size=400, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128
)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", CORPUS, TINY)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def free_port():
    return _free_port


@pytest.fixture
def make_rows():
    return _make_rows


def _make_rows(*, seed: int = 0, groups: int = 2, per_group: int = 3, vocab: int = 300) -> list[TrainRow]:
    """`groups` x `per_group` trajectories of 1-3 turns with varied prompt/response lengths; the
    first trajectory of each group wins (score 10), the others fail; every third turn is invalid."""
    gen = torch.Generator().manual_seed(seed)

    def ids(lo: int, hi: int) -> tuple[int, ...]:
        n = int(torch.randint(lo, hi, (1,), generator=gen))
        return tuple(torch.randint(3, vocab, (n,), generator=gen).tolist())

    rows, turn = [], 0
    for g in range(groups):
        for t in range(per_group):
            for step in range(1 + (g + t) % 3):
                response = ids(2, 7)
                rows.append(
                    TrainRow(
                        prompt_ids=ids(3, 12),
                        response_ids=response,
                        sampler_logprobs=(-1.0,) * len(response),
                        group_id=f"g{g}",
                        traj_id=f"g{g}-t{t}",
                        step_idx=step,
                        episode_score=10.0 if t == 0 else 0.0,
                        action_valid=turn % 3 != 2,
                    )
                )
                turn += 1
    return rows


def _surrogate_loss(worker, rows: list[TrainRow], old: list[list[float]], new: list[list[float]]) -> float:
    """Token-mean PPO surrogate of `rows` at log-probs `new` relative to `old` (both from
    `worker.score`), with the worker's GRPO advantages: lower means the update helped."""
    from learner.actor import row_advantages
    from learner.algos import agg_loss, broadcast_advantages, ppo_policy_loss
    from learner.batch import collate_rows

    batch = collate_rows(rows, pad_token_id=0)
    mask = batch.response_mask

    def padded(logps: list[list[float]]) -> torch.Tensor:
        out = torch.zeros_like(mask)
        for i, v in enumerate(logps):
            out[i, : len(v)] = torch.tensor(v)
        return out

    adv = broadcast_advantages(row_advantages(worker.cfg, batch), mask)
    pl = ppo_policy_loss(padded(new), padded(old), adv, mask, clip_low=0.2, clip_high=0.2, clip_c=3.0)
    return agg_loss(pl.loss, mask, "token-mean").item()


@pytest.fixture
def surrogate_loss():
    return _surrogate_loss
