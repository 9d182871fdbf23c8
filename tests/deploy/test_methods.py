"""The routing stage of the distilling methods, on real trajectories from the rollout loop
(HF engine, tiny model, embedded household env)."""

import random

import pytest

from deploy.laptop.tiny_model import TinyModelConfig, build_tiny_model
from deploy.stages.smrc_sd import RULES, TeacherRouter, choose_turns
from deploy.step_rows import StepRows
from envs.config import EnvConfig
from envs.pool import EnvPool
from envs.tasks import eval_tasks
from rollout_workers.config import EngineConfig, RolloutConfig
from rollout_workers.worker import RolloutWorker
from routing.types import RouteDecision

TINY = TinyModelConfig(vocab_size=300, hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                       intermediate_size=64, max_position_embeddings=2048)
ROLLOUT = RolloutConfig(use_think=False, constrained_actions=True, max_response_tokens=16, group_size=3)


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    """Two groups of 3 real trajectories; in each, the first is relabelled a success so it can
    serve as the others' reference (routing reads only actions and observations)."""
    from transformers import AutoTokenizer

    model = build_tiny_model(tmp_path_factory.mktemp("m") / "model", ["go to desk 1", "look"] * 20, TINY)
    env_cfg = EnvConfig(max_steps=5)
    worker = RolloutWorker(EngineConfig(engine="hf"), ROLLOUT, str(model), [EnvPool(env_cfg, 6)])
    trajs, _ = worker.collect(eval_tasks(env_cfg, "valid_unseen", 2), group_size=3, policy_version=0)
    firsts = {t.group_id: t.traj_id for t in reversed(trajs)}
    trajs = [t.model_copy(update={"success": t.traj_id == firsts[t.group_id]}) for t in trajs]
    return trajs, AutoTokenizer.from_pretrained(model)


def _router(tokenizer, method="smrc_sd", parts=None, matcher="structured"):
    return TeacherRouter(method=method, matcher=matcher, parts=parts, audit_matchers=("structured", "history"),
                         rollout=ROLLOUT, tokenizer=tokenizer, max_chars=4000, seed=0)


def test_teacher_prompt_without_context_is_the_student_prompt(episodes):
    trajs, tok = episodes
    result = _router(tok, method="fullpath_sd", parts=frozenset())(trajs, step=1)
    by_id = {t.traj_id: t for t in trajs}
    assert result.teacher_prompts, "every non-reference trajectory has a reference in its group"
    for (traj_id, t), ids in result.teacher_prompts.items():
        assert ids == list(by_id[traj_id].turns[t].prompt_ids)  # identical rendering path as the loop


def test_learner_ranks_render_the_routers_teacher_messages_to_the_same_ids(episodes):
    """The driver hands the learners text (`StepRows.teacher_messages`); a rank renders it with its
    own tokenizer (loaded from the model, as the router's) to the ids the router's would give."""
    from transformers import AutoTokenizer

    trajs, tok = episodes
    result = _router(tok)(trajs, step=1)
    step = StepRows(refs=(), played=frozenset(t.traj_id for t in trajs), teacher_messages=result.teacher_messages)
    rows = step.rows(trajs, AutoTokenizer.from_pretrained(tok.name_or_path))
    routed = {(r.traj_id, r.step_idx): list(r.teacher_prompt_ids) for r in rows if r.teacher_prompt_ids is not None}
    assert routed and routed == result.teacher_prompts
    with pytest.raises(ValueError, match="pass the model's tokenizer"):
        step.rows(trajs)


def test_fullpath_distils_every_turn_of_trajectories_with_a_reference(episodes):
    trajs, tok = episodes
    result = _router(tok, method="fullpath_sd")(trajs, step=1)
    refs = {t.traj_id for t in trajs if t.success}
    expected = {(t.traj_id, i) for t in trajs for i in range(len(t.turns))} - {
        (t.traj_id, i) for t in trajs if t.traj_id in refs for i in range(len(t.turns))}
    # the reference itself has no other success in its group (buffer empty at step 1)
    assert set(result.teacher_prompts) == expected
    by_id = {t.traj_id: t for t in trajs}
    for (traj_id, t), ids in result.teacher_prompts.items():
        student = list(by_id[traj_id].turns[t].prompt_ids)
        assert len(ids) > len(student) and ids[-3:] == student[-3:]  # same generation header
    assert 0 < result.metrics["route/teacher_rows"] <= 1


def test_smrc_distils_only_matched_turns_and_random_turn_matches_the_count(episodes):
    trajs, tok = episodes
    smrc = _router(tok, method="smrc_sd")(trajs, step=1)
    rand = _router(tok, method="random_turn")(trajs, step=1)
    assert len(rand.teacher_prompts) == len(smrc.teacher_prompts)
    assert smrc.metrics["route/teacher_rows"] == pytest.approx(smrc.metrics["route/coverage_structured"])
    # the first turn of every episode starts in the same state as its reference: always matched
    starts = {(t.traj_id, 0) for t in trajs if not t.success}
    assert starts <= set(smrc.teacher_prompts)


def test_choose_turns_rules():
    d = [RouteDecision(matched=m) for m in (True, False, True, False)]
    rng = random.Random(0)
    assert choose_turns("all", d, rng) == [0, 1, 2, 3]
    assert choose_turns("matched", d, rng) == [0, 2]
    picked = choose_turns("random", d, rng)
    assert len(picked) == 2 and len(set(picked)) == 2
    assert set(RULES) == {"fullpath_sd", "smrc_sd", "routing_only", "context_only", "random_turn", "skill_sd", "sdar"}


def test_success_buffer_survives_a_checkpoint(episodes, tmp_path):
    """A resumed run routes exactly like the uninterrupted one: the buffer travels with the checkpoint."""
    trajs, tok = episodes
    first, second = trajs[:3], trajs[3:]
    live = _router(tok)
    live(first, step=1)
    assert len(live.buffer) == 1
    live.save(tmp_path / "router_buffer.jsonl")
    resumed = _router(tok)
    resumed.load(tmp_path / "router_buffer.jsonl")
    assert [e.traj for e in resumed.buffer.items()] == [e.traj for e in live.buffer.items()]
    a, b = live(second, step=2), resumed(second, step=2)
    assert a.teacher_prompts == b.teacher_prompts and a.metrics == b.metrics
    fresh = _router(tok)
    fresh.load(tmp_path / "missing.jsonl")  # a checkpoint from a run without routing state
    assert len(fresh.buffer) == 0


def test_buffer_from_an_archived_run_with_retired_keys_loads(episodes, tmp_path):
    """Buffers written when turns carried `signature` / `skill_ids` and trajectories a
    `skill_bank_version` still load; the retired keys are ignored."""
    import json

    trajs, tok = episodes
    success = next(t for t in trajs if t.success)
    record = success.model_dump(mode="json")
    record["skill_bank_version"] = 3
    for turn in record["turns"]:
        turn["signature"] = {"env": "alfworld", "task_id": success.task.task_id, "fields": [["stage", "search_obj"]]}
        turn["skill_ids"] = ["s1"]
    (tmp_path / "router_buffer.jsonl").write_text(json.dumps(record) + "\n")
    router = _router(tok)
    router.load(tmp_path / "router_buffer.jsonl")
    assert [e.traj for e in router.buffer.items()] == [success]


@pytest.mark.parametrize("method", ["skill_sd", "sdar"])
def test_skill_methods_show_a_condensed_skill_on_every_turn(episodes, method):
    """Skill-SD / SDAR: every turn of a trajectory with a reference gets a teacher; the block is the
    reference's condensed workflow and the rejected actions of the group's other failures (never the
    row's own), inserted before the observation, with no reference steps, state summary or candidate."""
    from routing.skills import SKILL_HEADER, build_skill_context, collect_mistakes, condense_workflow
    from routing.teacher_context import CANDIDATE_PREFIX, STATE_PREFIX

    trajs, tok = episodes
    result = _router(tok, method=method)(trajs, step=1)
    fullpath = _router(tok, method="fullpath_sd")(trajs, step=1)
    assert set(result.teacher_prompts) == set(fullpath.teacher_prompts) and result.teacher_prompts
    for (traj_id, t), ids in result.teacher_prompts.items():
        traj = next(x for x in trajs if x.traj_id == traj_id)
        ref = next(x for x in trajs if x.success and x.group_id == traj.group_id)
        others = [x for x in trajs if x.group_id == traj.group_id and not x.success and x.traj_id != traj_id]
        block = build_skill_context(
            condense_workflow([(u.env_action, u.action_valid) for u in ref.turns]),
            collect_mistakes([[(u.env_action, u.action_valid) for u in o.turns] for o in others]), max_chars=4000)
        text = tok.decode(ids)
        assert SKILL_HEADER in text and block.strip() in text
        assert "Reference step" not in text and STATE_PREFIX not in text and CANDIDATE_PREFIX not in text
        student = list(traj.turns[t].prompt_ids)
        assert ids[-3:] == student[-3:] and len(ids) > len(student)
    # the teacher block is the same on every turn of a trajectory (no state matching)
    by_traj: dict[str, set[str]] = {}
    for (traj_id, t), ids in result.teacher_prompts.items():
        text = tok.decode(ids)
        by_traj.setdefault(traj_id, set()).add(text[text.index(SKILL_HEADER):text.index("[End of training-only")])
    assert all(len(blocks) == 1 for blocks in by_traj.values())


def test_skill_methods_select_their_loss_form_and_validate(monkeypatch, tmp_path):
    from pathlib import Path

    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))  # the cluster configs' dataset path

    from deploy.config_loading import ConfigError, load_config

    configs = Path(__file__).resolve().parents[2] / "deploy" / "configs"
    for method, form in (("skill_sd", "rkl"), ("sdar", "sdar")):
        for name in (f"smoke_cpu_{method}.yaml", f"alfworld_{method}_gpu.yaml"):
            cfg = load_config(configs / name)
            assert (cfg.method.name, cfg.learner.sd.form, cfg.learner.sd.coef) == (method, form, 0.1)
            assert cfg.learner.sd.sdar_beta == 5.0
        # the same config switched to a reference method keeps the user's (default) form
        assert load_config(configs / f"smoke_cpu_{method}.yaml", ["method.name=fullpath_sd"]).learner.sd.form == "rkl"
    with pytest.raises(ConfigError, match="learner.sd.form='rkl' contradicts method.name='sdar'"):
        load_config(configs / "smoke_cpu_sdar.yaml", ["learner.sd.form=rkl"])
    with pytest.raises(ConfigError, match="method.context_parts.*remove method.context_parts"):
        load_config(configs / "smoke_cpu_skill_sd.yaml", ["method.context_parts=[full_reference]"])
    with pytest.raises(ConfigError, match="learner.sd.coef > 0"):
        load_config(configs / "smoke_cpu_skill_sd.yaml", ["learner.sd.coef=0"])


def test_each_skill_method_builds_its_loss_hand_computed():
    """The learner's "sd" hook built from each shipped config computes that method's per-token term:
    one row, two tokens, logp = old = (-1, -2), teacher = (-0.5, -3), all matched, lambda 0.1.
    Skill-SD: d = (-0.5, 1), k3 = e^-d - 1 + d = (0.148721, 0.367879), w = 1 -> mean 0.258300.
    SDAR: g = sigmoid(5 * (teacher - logp)) = (0.924142, 0.006693), g * (teacher - logp) =
    (0.462071, -0.006693) -> mean 0.227689."""
    from pathlib import Path

    import torch

    from deploy.config_loading import load_config
    from learner.batch import collate_rows
    from learner.teacher_pass import build_sd_loss
    from learner.types import MicroBatchView, TrainRow

    configs = Path(__file__).resolve().parents[2] / "deploy" / "configs"
    row = TrainRow(prompt_ids=(1, 2), response_ids=(3, 4), sampler_logprobs=(-1.0, -2.0), group_id="g",
                   traj_id="t", step_idx=0, episode_score=0.0, action_valid=True)
    batch = collate_rows([row], pad_token_id=0)
    logp, teacher = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-0.5, -3.0]])
    for method, mean in (("skill_sd", 0.258300), ("sdar", 0.227689)):
        hook = build_sd_loss(load_config(configs / f"smoke_cpu_{method}.yaml").learner.sd)
        hook.set_teacher(teacher, torch.tensor([True]))
        view = MicroBatchView(batch, logp, logp.clone(), torch.zeros(1, 2), torch.ones(1), 2.0, 2.0)
        assert float(hook(view)) == pytest.approx(0.1 * mean, abs=1e-6)
