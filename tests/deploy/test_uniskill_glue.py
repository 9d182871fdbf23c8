"""UniSkill's trainer glue (deploy/stages/uniskill_glue.py), pure parts, on real trajectories from the rollout
loop (HF engine, tiny model, embedded household env) with outcomes relabelled to form groups of
2 successes + 2 failures. The bank and the critic are small fakes (their real versions are tested in
skillbank_service); generation on the rollout workers is tested with fake workers."""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pytest

from deploy.config_loading import load_config
from deploy.config_uniskill import UniSkillConfig
from deploy.laptop.tiny_model import TinyModelConfig, build_tiny_model
from deploy.stages import uniskill_glue as us
from deploy.stages.uniskill import UniSkillStage
from envs.config import EnvConfig
from envs.pool import EnvPool
from envs.tasks import eval_tasks
from learner.batch import rows_from_trajectories
from learner.types import ProposalScore
from rollout_workers.config import EngineConfig, RolloutConfig
from rollout_workers.engines.base import derive_seed
from rollout_workers.prompts import SKILL_INTRO, render_prompt_ids
from rollout_workers.proposer import op_first_token_ids
from rollout_workers.turn_messages import recorded_turn_message
from rollout_workers.types import Generation
from rollout_workers.worker import RolloutWorker
from skillbank_service.types import CriticVerdict, Provenance, RetrievedSkill, Skill

TINY = TinyModelConfig(vocab_size=300, hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                       intermediate_size=64, max_position_embeddings=4096)
ROLLOUT = RolloutConfig(use_think=False, constrained_actions=True, max_response_tokens=16, group_size=4)
CFG = UniSkillConfig(enabled=True, max_candidates_per_step=8,
                     proposer={"max_prompt_tokens": 4000, "trajectory_max_chars": 600})
S_NEW = "Open every closed receptacle before searching it for the target object."


def _skill(skill_id: str, task_type: str, text: str) -> Skill:
    prov = Provenance(candidate_id="seed", step=0, r_align=0.1, delta_plus=0.1)
    return Skill(skill_id=skill_id, task_type=task_type, text=text, revision=1, provenance=prov)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Two groups of 4 real trajectories; in each, the first two are relabelled successes."""
    from transformers import AutoTokenizer

    corpus = ["go to desk 1", "look", "<action>ADD_NEW_SKILL</action>", "Observation Action"] * 20
    model = build_tiny_model(tmp_path_factory.mktemp("m") / "model", corpus, TINY)
    env_cfg = EnvConfig(max_steps=3)
    worker = RolloutWorker(EngineConfig(engine="hf"), ROLLOUT, str(model), [EnvPool(env_cfg, 8)])
    tasks = eval_tasks(env_cfg, "valid_unseen", 2)
    trajs, _ = worker.collect(tasks, group_size=4, policy_version=0)
    trajs = [t.model_copy(update={"success": t.traj_id.endswith(("/0", "/1"))}) for t in trajs]
    return trajs, tasks, AutoTokenizer.from_pretrained(model), model


# ---- variants and retrieval ------------------------------------------------------------------------


def test_variant_switches_reach_the_learner_config(monkeypatch, tmp_path):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))  # the cluster config's dataset path
    for variant, (sees, proposer, r_align, sup, train_prop, train_actor) in {
        "uniskill": (True, True, True, True, True, True),
        "actor_only": (True, True, True, True, False, True),  # same procedure and bank rule, proposer not trained
        "proposer_only": (True, True, True, True, True, False),  # the actor acts with skills, untrained
        "no_r_align": (True, True, False, True, True, True),
        "no_support_reg": (True, True, True, False, True, True),
    }.items():
        name = "uniskill" if variant == "uniskill" else variant
        cfg = load_config(f"deploy/configs/smoke_cpu_{name}.yaml")
        sw = us.switches(cfg.uniskill)
        assert (sw.actor_sees_skills, sw.proposer) == (sees, proposer)
        p = cfg.learner.proposer
        assert (p.enabled, p.use_r_align, p.support_regularizer) == (proposer, r_align, sup)
        assert (p.train_proposer, p.train_actor, p.lambda_prop) == (train_prop, train_actor, 0.5)
        assert cfg.learner.sd.total_steps == cfg.run.total_steps
    both = load_config("deploy/configs/smoke_cpu_uniskill_smrc_sd.yaml")
    assert both.method.name == "smrc_sd" and both.learner.proposer.enabled
    gpu = load_config("deploy/configs/alfworld_uniskill_gpu.yaml")
    assert gpu.uniskill.bank.warmup_steps == 3 and not hasattr(gpu.learner.proposer, "warmup_steps")
    off = us.switches(UniSkillConfig())  # UniSkill off: nothing of it runs (the actor trains as plain GRPO)
    assert not any(dataclasses.astuple(off)[:5]) and off.train_actor


def test_learner_slice_is_derived_not_duplicated():
    from deploy.config_loading import ConfigError

    base = "deploy/configs/smoke_cpu_uniskill.yaml"
    cfg = load_config(base, ["run.total_steps=7", "learner.sd.warm_down=true"])
    assert cfg.learner.sd.total_steps == 7
    with pytest.raises(ConfigError, match=r"learner.sd.total_steps=5 contradicts run.total_steps=7"):
        load_config(base, ["run.total_steps=7", "learner.sd.total_steps=5"])
    with pytest.raises(ConfigError, match=r"learner.proposer.warmup_steps=2 contradicts uniskill.bank.warmup_steps"):
        load_config(base, ["learner.proposer.warmup_steps=2"])
    # a resolved config of an older run (warm-up in both places, sd.total_steps 0) still loads
    old = load_config(base, ["learner.proposer.warmup_steps=0", "learner.sd.total_steps=0"])
    assert old.learner.sd.total_steps == old.run.total_steps


def test_resolved_config_resumes_with_a_longer_run(tmp_path):
    from deploy.config_loading import save_resolved

    saved = save_resolved(load_config("deploy/configs/smoke_cpu_smrc_sd.yaml", ["learner.sd.warm_down=true"]), tmp_path)
    longer = load_config(saved, ["run.total_steps=9"])
    assert longer.learner.sd.total_steps == 9 and longer.learner.sd.warm_down


def test_config_errors_name_the_key():
    from deploy.config_loading import ConfigError

    with pytest.raises(ConfigError, match="rollout.group_size=2"):
        load_config("deploy/configs/smoke_cpu.yaml", ["uniskill.enabled=true"])
    with pytest.raises(ConfigError, match="learner.proposer.use_r_align"):
        load_config("deploy/configs/smoke_cpu_no_r_align.yaml", ["learner.proposer.use_r_align=true"])
    with pytest.raises(ConfigError, match="uniskill.proposer.max_prompt_tokens"):
        load_config("deploy/configs/smoke_cpu_uniskill.yaml", ["uniskill.proposer.max_prompt_tokens=2040"])
    with pytest.raises(ConfigError, match="uniskill.bank.top_k"):
        load_config("deploy/configs/smoke_cpu_uniskill.yaml", ["uniskill.bank.top_k=3"])
    with pytest.raises(ConfigError, match="rollout.group_size=2"):  # actor_only proposes too
        load_config("deploy/configs/smoke_cpu_actor_only.yaml", ["rollout.group_size=2", "ray.envs_per_pool=4"])


class FakeBank:
    def __init__(self, skills):
        self.skills, self.calls = skills, []

    def retrieve_many(self, queries, k=None, task_types=None):
        self.calls.append((list(queries), k, list(task_types)))
        return [[RetrievedSkill(skill=s, score=0.9)] if (s := self.skills.get(t)) else [] for t in task_types]


def test_retrieve_and_actor_slot(setup):
    _, tasks, _, _ = setup
    seeded = _skill("sk1", tasks[0].task_type, "Seeded advice.")
    bank = FakeBank({tasks[0].task_type: seeded})
    got = us.retrieve_skills(bank, [tasks[0], tasks[0], tasks[1]], CFG)
    assert len(bank.calls) == 1 and bank.calls[0][1] == 1 and len(bank.calls[0][0]) == 2
    expect_second = seeded if tasks[1].task_type == tasks[0].task_type else None
    assert got == {tasks[0].task_id: seeded, tasks[1].task_id: expect_second}
    assert us.actor_skill_texts(got, CFG)[tasks[0].task_id] == "Seeded advice."
    # proposer_only trains the proposer alone; its (untrained) actor still acts with the retrieved skill
    assert us.actor_skill_texts(got, CFG.model_copy(update={"variant": "proposer_only"}))[tasks[0].task_id] == "Seeded advice."
    off_at_eval = CFG.model_copy(update={"retrieval_at_eval": False})
    assert us.actor_skill_texts(got, off_at_eval)[tasks[0].task_id] == "Seeded advice."
    assert us.actor_skill_texts(got, off_at_eval, evaluation=True)[tasks[0].task_id] is None
    assert us.retrieve_skills(bank, tasks, UniSkillConfig()) == {t.task_id: None for t in tasks}
    assert len(bank.calls) == 1


# ---- candidates, prompts, rows -----------------------------------------------------------------------


def _stage(setup, skill_for_first=True):
    trajs, tasks, tok, _ = setup
    skills = {t.task_id: None for t in tasks}
    if skill_for_first:
        skills[tasks[0].task_id] = _skill("sk1", tasks[0].task_type, "Look around first.")
    cands = us.build_candidates(trajs, random.Random(0), CFG)
    prompts, too_long = us.proposer_prompts(cands, trajs, skills, tok, CFG)
    return SimpleNamespace(trajs=trajs, tok=tok, skills=skills, cands=cands, prompts=prompts, too_long=too_long)


def test_candidates_and_prompts(setup):
    st = _stage(setup)
    trajs, tok, skills, cands, prompts, too_long = st.trajs, st.tok, st.skills, st.cands, st.prompts, st.too_long
    assert len(cands) == 8 and too_long == 0 and len(prompts) == 8
    for p in prompts:
        has_skill = skills[p.candidate.task_id] is not None
        assert p.legal == (True, True, has_skill) and (p.skill is not None) == has_skill
        text = tok.decode(p.prompt_ids)
        assert text.endswith("<action>") and ("UPDATE_SKILL" in text) == has_skill
    broken = [t.model_copy(update={"end_reason": "env_error"}) if t.traj_id.endswith("/3") else t for t in trajs]
    assert us.build_candidates(broken, random.Random(0), CFG) == []  # groups drop to 2S + 1F
    too_long = [t.model_copy(update={"end_reason": "prompt_too_long"}) if t.traj_id.endswith("/3") else t
                for t in trajs]
    assert us.build_candidates(too_long, random.Random(0), CFG) == []  # the same rule for both causes
    tight = CFG.model_copy(update={"proposer": CFG.proposer.model_copy(update={"max_prompt_tokens": 50})})
    assert us.proposer_prompts(cands, trajs, skills, tok, tight) == ([], 8)


def _gen(tok, text: str) -> Generation:
    ids = tuple(tok.encode(text, add_special_tokens=False))
    return Generation(token_ids=ids, logprobs=tuple(-1.0 for _ in ids), text=text, finish_reason="stop")


class FakeCritic:
    def __init__(self):
        self.requests = []

    def judge(self, r):
        self.requests.append(r)
        return CriticVerdict(op_reasonable=r.op != "update", content_supported=r.op == "add",
                             passed=r.op == "add", critic="rule")


LIMITS = {"min_chars": CFG.bank.min_chars, "max_chars": CFG.bank.max_chars}


def _outputs(prompts):
    """ADD for the first, NO_SKILL, a parse failure, UPDATE (illegal without a skill), an empty gen."""
    texts = [f"ADD_NEW_SKILL</action>\n{S_NEW}", "NO_SKILL</action>", "garbage", f"UPDATE_SKILL</action>{S_NEW}"]
    return [texts[i % 4] for i in range(len(prompts))]


def test_judge_rows_and_warmup(setup):
    st = _stage(setup)
    tok, prompts = st.tok, st.prompts
    gens = [_gen(tok, t) for t in _outputs(prompts)]
    gens[-1] = Generation(token_ids=(), logprobs=(), text="", finish_reason="length")
    parsed = us.parse_proposals(prompts, gens, CFG)
    critic = FakeCritic()
    verdicts = us.judge(critic, prompts, parsed, **LIMITS)
    assert set(verdicts) == {p.candidate.candidate_id for p, q in zip(prompts, parsed) if q.ok}
    assert all(r.source_trajectory.startswith("Outcome:") for r in critic.requests)
    op_ids = op_first_token_ids(tok)
    rows = us.proposal_rows(prompts, gens, parsed, verdicts, op_ids, eta=0.05)
    assert len(rows) == len(prompts) - 1  # the empty generation cannot be trained on
    for row, p, q in zip(rows, prompts, parsed):
        assert row.prompt_ids == p.prompt_ids and row.op_position == 0 and row.op_token_ids == op_ids
        assert row.r_fmt == (0.05 if q.ok else -0.05) and row.op == (q.op if q.ok else None)
        if not q.ok:
            assert row.r_op is None and row.content_supported is None
        elif q.op == "no_edit":
            assert row.r_op == 0.05 and row.content_supported is None
        else:
            assert row.r_op == (0.05 if q.op == "add" else -0.05) and row.content_supported == (q.op == "add")
    warm = us.proposal_rows(prompts, gens, parsed, {}, op_ids, eta=0.05)  # warm-up: no critic
    assert all(r.r_op is None and r.content_supported is None for r in warm)

    class Down:
        def judge(self, r):
            return CriticVerdict(op_reasonable=False, content_supported=False, passed=False, critic="llm",
                                 failed=True, reason="critic_timeout")

    failed = us.proposal_rows(prompts, gens, parsed, us.judge(Down(), prompts, parsed, **LIMITS), op_ids, eta=0.05)
    assert all(r.r_op is None and r.content_supported is None for r in failed)  # masked, not punished


def test_text_the_bank_would_refuse_is_unsupported_and_keeps_the_critics_op_verdict(setup):
    st = _stage(setup)
    tok, prompts = st.tok, st.prompts
    texts = ["ADD_NEW_SKILL</action>go to desk 1</action> then take the mug from it", f"ADD_NEW_SKILL</action>{S_NEW}"]
    gens = [_gen(tok, texts[i % 2]) for i in range(len(prompts))]
    parsed = us.parse_proposals(prompts, gens, CFG)
    critic = FakeCritic()
    verdicts = us.judge(critic, prompts, parsed, **LIMITS)
    assert {r.candidate_id for r in critic.requests} == {p.candidate.candidate_id for p in prompts}
    rows = us.proposal_rows(prompts, gens, parsed, verdicts, op_first_token_ids(tok), eta=0.05)
    for i, (p, row) in enumerate(zip(prompts, rows)):
        v = verdicts[p.candidate.candidate_id]
        assert v.critic == "rule" and v.op_reasonable and row.r_op == 0.05  # the op judgement stands
        if i % 2 == 0:  # a tag inside the skill: refused by the bank, so unsupported (r_skill = -eta only)
            assert not v.passed and not v.content_supported and "tag" in v.reason and row.content_supported is False
        else:
            assert v.passed and row.content_supported is True


def test_critic_requests_carry_the_source_and_the_reference(setup):
    st = _stage(setup)
    tok, prompts, trajs = st.tok, st.prompts, st.trajs
    parsed = us.parse_proposals(prompts, [_gen(tok, "NO_SKILL</action>") for _ in prompts], CFG)
    by_id = {t.traj_id: t for t in trajs}
    requests = us.critic_requests(prompts, parsed)
    assert len(requests) == len(prompts)
    for r, p in zip(requests, prompts):
        src, ref = by_id[p.candidate.source_id], by_id[p.candidate.reference_id]
        assert r.source == us.trajectory_evidence(src) and r.reference == us.trajectory_evidence(ref)
        assert r.source.won == src.success and r.reference.won == ref.success != src.success
        assert r.source.actions == tuple(t.env_action for t in src.turns if t.action_valid)
        assert r.reference_trajectory.startswith("Outcome: " + ("SUCCESS" if ref.success else "FAILURE"))


def test_align_requests_swap_only_the_skill(setup):
    st = _stage(setup)
    trajs, tok, prompts = st.trajs, st.tok, st.prompts
    parsed = us.parse_proposals(prompts, [_gen(tok, t) for t in _outputs(prompts)], CFG)
    rows = rows_from_trajectories(trajs)
    index = us.rows_index(rows)
    by_id = {t.traj_id: t for t in trajs}
    # re-rendering with the skill the rollout had (none) reproduces the recorded prompt exactly
    for t in trajs:
        for k, turn in enumerate(t.turns):
            assert render_prompt_ids(tok, recorded_turn_message(t, k, ROLLOUT, skill_text=None)) == list(turn.prompt_ids)
    requests, skipped = us.align_requests(prompts, parsed, index, trajs, tok, ROLLOUT, max_prompt_tokens=4000)
    scored_ids = {p.candidate.candidate_id for p, q in zip(prompts, parsed) if q.ok and q.op in ("add", "update")}
    assert {r.candidate_id for r in requests} == scored_ids and skipped == {}
    cand = {p.candidate.candidate_id: p.candidate for p in prompts}
    for r in requests:
        c = cand[r.candidate_id]
        for anchors, traj_id, turns in ((r.plus, c.plus_id, r.plus_turns), (r.minus, c.minus_id, r.minus_turns)):
            assert turns == len(by_id[traj_id].turns) == len(anchors)
            for k, a in enumerate(anchors):
                row = rows[a.row_index]
                assert (row.traj_id, row.step_idx) == (traj_id, k)
                swapped = tok.decode(a.swapped_prompt_ids)
                assert S_NEW in swapped and SKILL_INTRO in swapped
                assert swapped.replace(S_NEW, "").count("<skill>") == 1
    short, skipped = us.align_requests(prompts, parsed, index, trajs, tok, ROLLOUT, max_prompt_tokens=60)
    assert short == [] and set(skipped) == scored_ids and all("prompt_too_long" in v for v in skipped.values())


def test_scored_proposals_for_the_bank(setup):
    st = _stage(setup)
    tok, prompts = st.tok, st.prompts
    parsed = us.parse_proposals(prompts, [_gen(tok, t) for t in _outputs(prompts)], CFG)
    verdicts = us.judge(FakeCritic(), prompts, parsed, **LIMITS)
    scores = [ProposalScore(candidate_id=p.candidate.candidate_id, r_align=0.2, delta_plus=0.3, delta_minus=0.1,
                            coverage_plus=1.0, coverage_minus=0.5 if i == 0 else 1.0, r_skill=0.05, reward=0.1,
                            advantage=0.0, valid=True) for i, p in enumerate(prompts)]
    out = us.scored_proposals(prompts, parsed, verdicts, scores[1:] + scores[:1], step=5)
    assert [s.candidate_id for s in out] == [p.candidate.candidate_id for p in prompts]
    for s, p, q in zip(out, prompts, parsed):
        assert s.step == 5 and s.r_fmt_ok == q.ok and s.op == (q.op or "no_edit") and s.r_align == 0.2
        assert s.target_skill_id == ("sk1" if q.op == "update" and p.skill else None)
        c = p.candidate
        assert s.source_trajectory_ids == (c.source_id, c.reference_id, c.plus_id, c.minus_id)
    assert not out[0].coverage_ok and all(s.coverage_ok for s in out[1:])
    unscored = us.scored_proposals(prompts, parsed, verdicts, [], step=5)
    assert all(s.r_align is None and not s.coverage_ok for s in unscored)
    m = us.proposal_metrics(prompts, parsed, too_long=2)
    assert m["uniskill/candidates"] == len(prompts) + 2 and 0 < m["uniskill/parse_rate"] < 1


def test_generate_proposals_splits_and_restores_order():
    class Workers:
        """Two fake rollout workers: request i runs on worker "ab"[i], echoing its prompt ids."""

        num_workers = 2

        def __init__(self):
            self.requests = []

        def generate_proposals(self, requests):
            self.requests += requests
            return [[Generation(token_ids=tuple(p), logprobs=(0.0,) * len(p), text="ab"[i], finish_reason="stop")
                     for p in r.prompt_ids] for i, r in enumerate(requests)]

    prompts = [us.ProposerPrompt(candidate=None, prompt_ids=(i, i), legal=(True, True, False), skill=None,  # type: ignore[arg-type]
                                 task_type="x", source_text="") for i in range(5)]
    workers = Workers()
    gens = us.generate_proposals(workers, prompts, CFG, seed=0)
    assert [g.token_ids for g in gens] == [(i, i) for i in range(5)]
    assert [g.text for g in gens] == ["a", "b", "a", "b", "a"]
    expected = [["NO_SKILL</action>", "ADD_NEW_SKILL</action>"]] if CFG.proposer.constrain_op else None
    for i, r in enumerate(workers.requests):  # UPDATE is illegal without a retrieved skill
        assert (r.max_tokens, r.temperature) == (CFG.proposer.max_tokens, CFG.proposer.temperature)
        assert r.seed == derive_seed(0, i) and r.op_choices == (expected * len(r.prompt_ids) if expected else None)
    assert us.generate_proposals(workers, [], CFG, seed=0) == [] and len(workers.requests) == 2
    one = us.proposal_requests(prompts[:1], 2, CFG, seed=0)
    assert [r.prompt_ids for r in one] == [[[0, 0]]]  # a worker without prompts gets no request


def test_policy_critic_generates_greedily_on_the_first_worker(setup):
    from deploy.stages.uniskill import policy_generate

    tok = setup[2]

    class Workers:
        num_workers = 2

        def __init__(self):
            self.requests = []

        def generate_proposals(self, requests):
            self.requests += requests
            return [[Generation(token_ids=(1,), logprobs=(0.0,), text="verdict", finish_reason="stop")]]

    workers = Workers()
    assert policy_generate(workers, tok, max_tokens=7)("judge this") == "verdict"
    (r,) = workers.requests
    assert r.prompt_ids == [render_prompt_ids(tok, "judge this")]
    assert (r.max_tokens, r.temperature, r.seed, r.op_choices) == (7, 0.0, 0, None)


def test_programmatic_config_derives_the_learner_switches():
    from deploy.config import TrainConfig
    from learner.config import LearnerConfig

    cfg = TrainConfig(uniskill=UniSkillConfig(enabled=True, variant="no_support_reg"),
                      learner=LearnerConfig(lr=1e-5), rollout=RolloutConfig(group_size=4))
    p = cfg.learner.proposer
    assert (p.enabled, p.support_regularizer, p.use_r_align, cfg.learner.lr) == (True, False, True, 1e-5)
    assert TrainConfig.model_validate(cfg.model_dump()) == cfg  # the resolved config reloads as is
    assert not TrainConfig().learner.proposer.enabled


@pytest.mark.slow
def test_stage_end_to_end_with_learner_and_bank(setup, tmp_path):
    """Two steps through UniSkillStage (warm-up 1) with the real skill bank (private Redis,
    hashing embeddings), the torch LearnerWorker on the tiny model, and canned proposer outputs:
    warm-up trains r_fmt only and writes nothing; step 2 is judged, R_align-scored and committed."""
    from deploy.config import TrainConfig
    from learner.config import LearnerConfig
    from learner.worker import LearnerWorker
    from skillbank_service.config import SkillBankConfig
    from skillbank_service.service import SkillBankService

    trajs, tasks, tok, model = setup
    bank_cfg = SkillBankConfig(embedding_model="hashing", warmup_steps=1, key_prefix="glue-test",
                               data_dir=str(tmp_path / "redis"))
    small = CFG.proposer.model_copy(update={"trajectory_max_chars": 200})
    u = CFG.model_copy(update={"bank": bank_cfg, "max_candidates_per_step": 4, "proposer": small})
    cfg = TrainConfig(uniskill=u, rollout=ROLLOUT,
                      learner=LearnerConfig(use_deepspeed=False, lr=1e-4, micro_batch_rows=8))
    bank = SkillBankService(bank_cfg)
    try:
        calls = []

        def generate(prompts, seed):
            calls.append(seed)
            return [_gen(tok, t) for t in _outputs(prompts)]

        stage = UniSkillStage(cfg.uniskill, cfg.rollout, cfg.learner.proposer, bank=bank, critic=FakeCritic(),
                              tokenizer=tok, generate=generate)
        learner = LearnerWorker(cfg.learner, str(model))
        for step in (1, 2):
            shown = stage.retrieve(tasks)
            assert shown == {t.task_id: None for t in tasks}  # the bank starts empty
            batch = stage.propose(trajs, step=step)
            assert batch.warmup == (step == 1) and len(batch.prompts) == 4
            assert bool(batch.verdicts) == (step == 2)
            rows = rows_from_trajectories(trajs)
            props, align = stage.learner_inputs(batch, rows)
            assert len(props) == 4 and (align == []) == (step == 1)
            metrics = learner.train_step(rows, props, align, proposer_warmup=batch.warmup)
            scores = {s.candidate_id: s for s in metrics.proposal_scores}
            assert set(scores) == {p.candidate_id for p in props}
            if step == 2:
                for r in align:
                    s = scores[r.candidate_id]
                    assert s.coverage_plus > 0 and s.r_align is not None
                    assert s.r_align == pytest.approx(s.delta_plus - s.delta_minus)
            out = stage.commit(batch, metrics.proposal_scores)
            assert out["uniskill/proposals"] == 4
            decisions = bank.decisions()
            assert len(decisions) == (0 if step == 1 else 4)
        adds = [d for d in decisions if d.outcome == "accepted"]
        assert all(d.op == "add" for d in adds)
        assert len(bank.snapshot().skills) == len({(d.skill_id) for d in adds})
        assert len(set(calls)) == 2  # a fresh generation seed per step
    finally:
        bank.shutdown()
