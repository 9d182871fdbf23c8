"""`deploy.step_rows`: the learner ranks render the step's SMRC-SD teacher messages to prompt ids,
each its share, and exchange them over their process group (real gloo groups between spawned
processes, a real BPE tokenizer)."""

import multiprocessing as mp

import pytest

from deploy.laptop.tiny_model import TinyModelConfig, build_tiny_model
from deploy.step_rows import render_share, shared_render
from rollout_workers.prompts import render_prompts

CTX = mp.get_context("spawn")
TINY = TinyModelConfig(vocab_size=300, hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                       intermediate_size=64, max_position_embeddings=256)
MESSAGES = {(f"g/{i}", t): f"You are in room {i}. " + "go to desk 1, look. " * (1 + (7 * i + t) % 9)
            for i in range(5) for t in range(3)}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tok") / "model", ["go to desk 1, look. You are in room"] * 20,
                                TINY))


def test_the_ranks_shares_hold_every_message_once_and_about_equal_text():
    shares = [render_share(MESSAGES, rank=r, world_size=3) for r in range(3)]
    assert sorted(k for s in shares for k in s) == sorted(MESSAGES)
    chars = [sum(len(MESSAGES[k]) for k in s) for s in shares]
    assert max(chars) - min(chars) <= max(len(m) for m in MESSAGES.values())
    assert render_share(MESSAGES, rank=1, world_size=3) == shares[1]  # the same on every rank


def _rank(init: str, rank: int, tokenizer_dir: str, queue) -> None:
    import torch.distributed as dist
    from transformers import AutoTokenizer

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    rendered = []
    encode = tokenizer.encode
    tokenizer.encode = lambda text, **kw: rendered.append(text) or encode(text, **kw)
    prompts = shared_render(tokenizer, MESSAGES, rank=rank, world_size=2)
    queue.put((rank, {k: v.tolist() for k, v in prompts.items()}, len(rendered)))
    dist.destroy_process_group()


def test_two_ranks_each_render_half_and_both_get_every_prompt(tmp_path, tokenizer_dir):
    from transformers import AutoTokenizer

    queue = CTX.Queue()
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [CTX.Process(target=_rank, args=(init, r, tokenizer_dir, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    want = render_prompts(AutoTokenizer.from_pretrained(tokenizer_dir), MESSAGES)
    for _, prompts, count in results:
        assert prompts == want  # every rank holds every teacher prompt, as one tokenizer renders it
    assert [count for _, _, count in results] == [8, 7]  # and rendered only its share of the 15


def test_without_a_process_group_a_rank_renders_them_all(tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    prompts = shared_render(tokenizer, MESSAGES, rank=1, world_size=2)
    assert {k: v.tolist() for k, v in prompts.items()} == render_prompts(tokenizer, MESSAGES)
