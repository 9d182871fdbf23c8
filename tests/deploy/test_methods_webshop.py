"""The routing stage on WebShop: a shopper's winning episode (embedded env, through the rollout
loop) is the reference of tiny-model episodes of the same task; signatures come from the WebShop
tracker and teacher prompts from the WebShop renderer."""

import pytest

from deploy.laptop.tiny_model import TinyModelConfig, build_tiny_model
from deploy.stages.smrc_sd import TeacherRouter
from envs.config import EnvConfig
from envs.pool import EnvPool
from envs.tasks import eval_tasks
from rollout_workers.config import EngineConfig, RolloutConfig
from rollout_workers.engines.hf_engine import HFEngine
from rollout_workers.episode import Episode
from rollout_workers.loop import run_episodes
from rollout_workers.types import Generation

TINY = TinyModelConfig(
    vocab_size=300,
    hidden_size=64,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=64,
    max_position_embeddings=2048,
)
ENV = EnvConfig(name="webshop", webshop_num_products=20)
ROLLOUT = RolloutConfig(
    use_think=False,
    constrained_actions=True,
    max_response_tokens=16,
    group_size=2,
    history_length=1,
    max_turns=3,
    max_prompt_tokens=100_000,
)


class ShopperEngine:
    """The env's scripted shopper as the policy (one live episode in slot 0)."""

    def __init__(self, tokenizer, pool):
        self.tokenizer, self.pool = tokenizer, pool

    def generate(self, prompts, *, temperature, top_p, max_tokens, seed, choices=None):
        text = f"<action>{self.pool.expert_actions([0])[0]}</action>"
        ids = tuple(self.tokenizer.encode(text, add_special_tokens=False)) + (self.tokenizer.eos_token_id,)
        return [Generation(token_ids=ids, logprobs=(-0.5,) * len(ids), text=text, finish_reason="stop")]


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny-model ops are latency-bound; a second thread only waits (2 shared cores)
    model = build_tiny_model(
        tmp_path_factory.mktemp("m") / "model", ["click[buy now]", "search[shirt]"] * 20, TINY
    )
    engine = HFEngine(str(model), EngineConfig(engine="hf", device="cpu"))
    task = eval_tasks(ENV, "valid_unseen", 1)
    pool = EnvPool(ENV, 3)
    run = {"policy_version": 0, "temperature": 1.0, "seed": 1}
    shopper = ShopperEngine(engine.tokenizer, pool)
    reference, _ = run_episodes(
        shopper, [pool], task, group_size=1, cfg=ROLLOUT.model_copy(update={"max_turns": 15}), **run
    )
    students, _ = run_episodes(engine, [pool], task, group_size=2, cfg=ROLLOUT, **run)
    torch.set_num_threads(threads)
    assert reference[0].success and not any(s.success for s in students)
    return reference, students, engine.tokenizer


def _router(tokenizer, method, parts=None):
    return TeacherRouter(
        method=method,
        matcher="structured",
        parts=parts,
        audit_matchers=("history", "observation"),
        rollout=ROLLOUT,
        tokenizer=tokenizer,
        max_chars=6000,
        seed=0,
    )


def test_teacher_prompt_without_context_is_the_student_prompt(episodes):
    reference, students, tok = episodes
    router = _router(tok, "fullpath_sd", parts=frozenset())
    assert router(reference, step=0).teacher_prompts == {}  # no other success yet; it joins the buffer
    result = router(students, step=1)
    assert len(result.teacher_prompts) == sum(len(s.turns) for s in students)
    by_id = {s.traj_id: s for s in students}
    for (traj_id, t), ids in result.teacher_prompts.items():
        assert ids == list(by_id[traj_id].turns[t].prompt_ids)


def test_smrc_routes_matched_turns_with_webshop_context(episodes):
    reference, students, tok = episodes
    router = _router(tok, "smrc_sd")
    router(reference, step=0)
    result = router(students, step=1)
    assert (students[0].traj_id, 0) in result.teacher_prompts  # every episode starts on the search page
    assert (
        result.metrics["route/coverage_structured"] > 0
        and result.metrics["route/turns_with_reference"] == 1.0
    )
    text = tok.decode(result.teacher_prompts[(students[0].traj_id, 0)])
    ref = Episode(reference[0])
    assert "[Training-only guidance: a successful attempt at this same task]" in text
    assert f"Reference step 1: observation ''Search'', action '{ref.actions[0]}'" in text
    assert "Current state: stage=start" in text and "page=search" in text
    assert f"Suggested next action (from the matching step of the reference): '{ref.actions[0]}'" in text
    sigs = ref.trace().signatures
    assert sigs[0].env == "webshop" and dict(sigs[-1].fields)["page"] == "done"
