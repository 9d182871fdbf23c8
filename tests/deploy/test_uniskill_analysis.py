"""UniSkill analysis tools: the R_align-vs-rollout statistics (hand-made numbers), the op
distribution / bank growth plots from a synthetic metrics.jsonl, the proposal archive round trip
(UniSkillStage.commit -> MetricsSink.save_proposals -> load_proposals), and the rollout part of
`ralign-vs-rollout` with the HF engine on the tiny model and the embedded household env in-process."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from deploy.analysis import ralign_vs_rollout as rv
from deploy.analysis.uniskill_plots import growth_summary, run_skills_growth
from deploy.config import TrainConfig
from deploy.config_uniskill import UniSkillConfig
from deploy.laptop.tiny_model import TinyModelConfig, build_tiny_model
from deploy.metrics import MetricsSink
from deploy.plots import plot_skills, skill_series
from deploy.stages.uniskill import ProposalBatch, ProposalRecord, UniSkillStage, proposal_records
from deploy.stages.uniskill_glue import ProposerPrompt
from envs.config import EnvConfig
from envs.tasks import eval_tasks
from learner.types import ProposalScore
from rollout_workers.config import RolloutConfig
from rollout_workers.proposer import ParsedProposal
from rollout_workers.types import Candidate, Trajectory
from skillbank_service.types import ApplyResult, CriticVerdict, Decision, Provenance, Skill

TINY = TinyModelConfig(vocab_size=300, hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                       intermediate_size=64, max_position_embeddings=4096)
ENV = EnvConfig(max_steps=3)


# ---- pure statistics ---------------------------------------------------------------------------------


def test_average_ranks_share_ties():
    assert rv.average_ranks([10, 20, 20, 5]) == [2.0, 3.5, 3.5, 1.0]
    assert rv.average_ranks([1, 1, 1]) == [2.0, 2.0, 2.0]


def test_spearman_by_hand_and_against_scipy():
    from scipy.stats import spearmanr

    rho, reason = rv.spearman([1, 2, 3, 4], [1, 3, 2, 4])  # d = 0, 1, 1, 0: 1 - 6*2/(4*15)
    assert rho == pytest.approx(0.8) and reason == ""
    rho, _ = rv.spearman([1, 2, 2, 3], [1, 2, 3, 4])  # ranks (1, 2.5, 2.5, 4): 4.5 / sqrt(4.5 * 5)
    assert rho == pytest.approx(4.5 / math.sqrt(22.5))
    x, y = [0.3, -0.1, 0.3, 0.0, 0.2, -0.4], [0.5, 0.0, 0.25, 0.0, -0.25, 0.0]
    assert rv.spearman(x, y)[0] == pytest.approx(spearmanr(x, y).statistic)
    assert rv.spearman([3, 2, 1], [1, 2, 3])[0] == pytest.approx(-1.0)


def test_spearman_undefined_cases_say_why():
    assert rv.spearman([0.1, 0.2], [1.0, 0.0]) == (None, "n=2 < 3 pairs")
    rho, reason = rv.spearman([0.1, 0.2, 0.3], [0.0, 0.0, 0.0])
    assert rho is None and "gain is constant" in reason
    rho, reason = rv.spearman([0.1, 0.1, 0.1], [0.0, 0.5, 1.0])
    assert rho is None and "R_align is constant" in reason
    with pytest.raises(ValueError, match="paired"):
        rv.spearman([1, 2, 3], [1, 2])


def test_rank_stats_split_positive_and_negative():
    s = rv.rank_stats([0.2, 0.1, 0.05, -0.1, 0.0], [0.5, -0.25, 0.0, -0.5, 0.25])
    assert (s.n, s.n_positive, s.n_nonpositive) == (5, 3, 2)
    assert s.mean_gain_positive == pytest.approx((0.5 - 0.25 + 0.0) / 3)
    assert s.mean_gain_nonpositive == pytest.approx((-0.5 + 0.25) / 2)
    assert s.share_positive_losing == pytest.approx(1 / 3)  # gain 0 is not a loss
    assert s.spearman_rho is not None
    empty = rv.rank_stats([], [])
    assert empty.spearman_rho is None and empty.share_positive_losing is None and empty.mean_gain is None
    neg = rv.rank_stats([-0.1, -0.2, -0.3], [0.0, 0.5, 1.0])
    assert neg.share_positive_losing is None and neg.spearman_rho == pytest.approx(-1.0)


# ---- op distribution and bank growth -----------------------------------------------------------------


def _metrics() -> list[dict]:
    """Warm-up steps 1-2 (ops, no bank keys), then commits; step 5 logged twice (the last wins)."""
    out = [
        {"step": 1, "success_rate": 0.1, "uniskill/proposals": 4.0, "uniskill/parse_rate": 0.5,
         "uniskill/op_no_edit": 0.25, "uniskill/op_add": 0.25, "uniskill/op_update": 0.0},
        {"step": 2, "uniskill/proposals": 4.0, "uniskill/parse_rate": 1.0, "uniskill/op_no_edit": 0.0,
         "uniskill/op_add": 1.0, "uniskill/op_update": 0.0},
        {"step": 3, "uniskill/proposals": 4.0, "uniskill/parse_rate": 1.0, "uniskill/op_no_edit": 0.25,
         "uniskill/op_add": 0.75, "uniskill/op_update": 0.0, "uniskill/bank_version": 2.0,
         "uniskill/added": 2.0, "uniskill/updated": 0.0, "uniskill/decision_accepted": 2.0,
         "uniskill/decision_rejected": 2.0},
        {"step": 4, "uniskill/proposals": 4.0, "uniskill/parse_rate": 0.75, "uniskill/op_no_edit": 0.25,
         "uniskill/op_add": 0.25, "uniskill/op_update": 0.25, "uniskill/bank_version": 4.0,
         "uniskill/added": 1.0, "uniskill/updated": 1.0, "uniskill/decision_accepted": 2.0,
         "uniskill/decision_superseded": 1.0},
        {"step": 5, "uniskill/proposals": 4.0, "uniskill/parse_rate": 1.0, "uniskill/op_no_edit": 1.0},
    ]
    return [out[4] | {"uniskill/op_no_edit": 0.0}, *out]


def test_skill_series_from_metrics():
    s = skill_series(_metrics())
    assert s.steps == [1, 2, 3, 4, 5]
    assert s.ops["add"] == [0.25, 1.0, 0.75, 0.25, 0.0]
    assert s.ops["unparsed"] == [0.5, 0.0, 0.0, 0.25, 0.0]
    for i in range(5):  # stacked shares sum to one
        assert sum(s.ops[k][i] for k in s.ops) == pytest.approx(1.0)
    assert s.bank_version == [0.0, 0.0, 2.0, 4.0, 4.0]  # forward-filled; 0 in warm-up
    assert s.skills == [0.0, 0.0, 2.0, 3.0, 3.0]  # cumulative adds
    assert s.updated == [0.0, 0.0, 0.0, 1.0, 0.0]
    assert s.decisions == {"accepted": [0, 0, 2, 2, 0], "rejected": [0, 0, 2, 0, 0], "superseded": [0, 0, 0, 1, 0]}
    g = growth_summary(s)
    assert (g["final_skills"], g["total_added"], g["added_first_half"], g["added_second_half"]) == (3, 3, 0, 3)
    assert g["steps_one_op_ge_95pct"] == 2  # step 2 (all add) and step 5 (all no_edit)
    assert skill_series([{"step": 1, "success_rate": 0.5}]).empty


def test_skills_growth_writes_json_and_pngs(tmp_path):
    sink = MetricsSink(tmp_path / "run")
    for r in _metrics():
        sink.log_step(r)
    result = run_skills_growth(tmp_path / "run")
    data = json.loads(Path(result.json_path).read_text())
    assert data["summary"]["final_skills"] == 3 and data["series"]["steps"] == [1, 2, 3, 4, 5]
    for png in (result.png_path, result.bank_png_path):
        assert Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    names = {p.name for p in sink.plot()}  # the run's automatic plots include both
    assert {"success.png", "loss.png", "skills_ops.png", "skills_bank.png"} <= names
    sink.close()
    assert plot_skills([{"step": 1, "success_rate": 0.5}], tmp_path) == []
    plain = MetricsSink(tmp_path / "grpo")
    plain.log_step({"step": 1, "success_rate": 0.5})
    with pytest.raises(ValueError, match="uniskill.enabled=true"):
        run_skills_growth(tmp_path / "grpo")
    plain.close()
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        run_skills_growth(tmp_path / "nothing")


def test_skills_growth_cli(tmp_path):
    from typer.testing import CliRunner

    from deploy.cli import app

    sink = MetricsSink(tmp_path)
    for r in _metrics():
        sink.log_step(r)
    sink.close()
    out = CliRunner().invoke(app, ["analyze", "skills-growth", "--run", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "3 skills (bank version 4)" in out.output and (tmp_path / "analysis" / "skills_ops.png").is_file()
    bad = CliRunner().invoke(app, ["analyze", "ralign-vs-rollout", "--run", str(tmp_path), "--model", str(tmp_path)])
    assert bad.exit_code == 2  # not an HF model dir


# ---- the proposal archive ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    corpus = ["go to desk 1", "look", "<action>ADD_NEW_SKILL</action>", "Observation Action"] * 20
    return build_tiny_model(tmp_path_factory.mktemp("m") / "model", corpus, TINY)


def _traj(task, i: int, won: bool, skill: str | None = None) -> Trajectory:
    return Trajectory(task=task, group_id=f"g-{task.task_id}", traj_id=f"{task.task_id}/{i}", turns=(), success=won,
                      score=10.0 * won, policy_version=0, end_reason="won" if won else "step_limit", skill_text=skill)


class RecordingBank:
    def __init__(self):
        self.applied = []

    def retrieve_many(self, queries, k=None, task_types=None):
        return [[] for _ in queries]

    def apply(self, proposals):
        self.applied.append(list(proposals))
        return ApplyResult(bank_version=7, num_added=1, num_updated=0, decisions=tuple(
            Decision(candidate_id=p.candidate_id, step=p.step, op=p.op,
                     outcome="accepted" if p.op == "add" else "rejected",
                     reason="" if p.op == "add" else "not_eligible: critic", skill_id="sk9" if p.op == "add" else None)
            for p in proposals))


def _batch(task, step: int, warmup: bool) -> tuple[ProposalBatch, list[ProposalScore]]:
    trajs = [_traj(task, i, i < 2, skill="Look before you leap.") for i in range(4)]  # the actor saw s_orig
    ids = [t.traj_id for t in trajs]
    cands = [Candidate(candidate_id=f"c{j}", group_id=trajs[0].group_id, task_id=task.task_id, source_id=ids[j],
                       reference_id=ids[2 + j], plus_id=ids[1 - j], minus_id=ids[3 - j], source_won=True)
             for j in range(2)]
    orig = Skill(skill_id="sk1", task_type=task.task_type, text="Look before you leap.", revision=1,
                 provenance=Provenance(candidate_id="seed", step=0, r_align=0.1, delta_plus=0.1))
    prompts = [ProposerPrompt(c, (1, 2, 3), (True, True, True), orig, task.task_type, "src") for c in cands]
    parsed = [ParsedProposal(op="add", skill_text="Open closed receptacles first.", ok=True, reason=None,
                             has_chinese=False),
              ParsedProposal(op="update", skill_text="Look in every drawer.", ok=True, reason=None,
                             has_chinese=False)]
    verdicts = {"c0": CriticVerdict(op_reasonable=True, content_supported=True, passed=True, critic="rule"),
                "c1": CriticVerdict(op_reasonable=False, content_supported=True, passed=False, reason="too vague",
                                    critic="rule")}
    scores = [ProposalScore(candidate_id="c0", r_align=0.03, delta_plus=0.05, delta_minus=0.02, coverage_plus=1.0,
                            coverage_minus=1.0, r_skill=0.03, reward=0.13, advantage=0.5, valid=True),
              ProposalScore(candidate_id="c1", r_align=-0.01, delta_plus=0.0, delta_minus=0.01, coverage_plus=1.0,
                            coverage_minus=1.0, r_skill=-0.01, reward=-0.11, advantage=-0.5, valid=True)]
    batch = ProposalBatch(step=step, warmup=warmup, trajectories=trajs, prompts=prompts, parsed=parsed,
                          verdicts=verdicts)
    return batch, scores


def test_proposal_archive_round_trip(model_dir, tmp_path):
    from transformers import AutoTokenizer

    task = eval_tasks(ENV, "valid_unseen", 1)[0]
    cfg = TrainConfig(uniskill=UniSkillConfig(enabled=True), rollout=RolloutConfig(group_size=4))
    bank = RecordingBank()
    stage = UniSkillStage(cfg.uniskill, cfg.rollout, cfg.learner.proposer, bank=bank, critic=None, tokenizer=AutoTokenizer.from_pretrained(model_dir),
                          generate=lambda prompts, seed: [])
    sink = MetricsSink(tmp_path)
    warm, warm_scores = _batch(task, step=1, warmup=True)
    stage.commit(warm, warm_scores)
    assert not bank.applied and [r.decision for r in warm.records] == [None, None] and warm.records[0].warmup
    batch, scores = _batch(task, step=5, warmup=False)
    out = stage.commit(batch, scores)
    assert out["uniskill/decision_accepted"] == 1.0 and len(bank.applied) == 1
    for b in (warm, batch):
        sink.save_proposals(b.step, b.records)
    assert sink.save_proposals(9, []) is None
    sink.close()
    assert sorted(p.name for p in (tmp_path / "uniskill").iterdir()) == ["proposals_step_000001.jsonl",
                                                                        "proposals_step_000005.jsonl"]
    loaded = rv.load_proposals(tmp_path)
    assert loaded == warm.records + batch.records
    add, upd = loaded[2:]
    assert (add.step, add.candidate_id, add.op, add.text, add.orig_text, add.orig_skill_id) == (
        5, "c0", "add", "Open closed receptacles first.", "Look before you leap.", "sk1")
    assert add.task == task and add.task_type == task.task_type
    assert (add.r_align, add.delta_plus, add.delta_minus, add.r_skill, add.reward) == (0.03, 0.05, 0.02, 0.03, 0.13)
    assert (add.verdict_passed, add.decision, add.skill_id) == (True, "accepted", "sk9")
    # the anchors and their coverage are archived, not recoverable only by replaying the candidate draw
    ids = [t.traj_id for t in batch.trajectories]
    assert (add.source_id, add.reference_id, add.plus_id, add.minus_id) == (ids[0], ids[2], ids[1], ids[3])
    assert (upd.source_id, upd.reference_id, upd.plus_id, upd.minus_id) == (ids[1], ids[3], ids[0], ids[2])
    assert (add.coverage_plus, add.coverage_minus) == (1.0, 1.0)
    assert loaded[0].plus_id == ids[1] and loaded[0].coverage_plus is None  # warm-up: anchors, no coverage
    assert (upd.verdict_reason, upd.decision, upd.decision_reason) == ("too vague", "rejected", "not_eligible: critic")
    assert [r.candidate_id for r in rv.eligible(loaded)] == ["c0", "c1"]  # the warm-up ones have no R_align
    assert proposal_records(batch, []) and proposal_records(batch, [])[0].r_align is None
    hidden, hidden_scores = _batch(task, step=6, warmup=False)  # proposer_only: the actor saw no skill
    hidden.trajectories = [t.model_copy(update={"skill_text": None}) for t in hidden.trajectories]
    rec = proposal_records(hidden, hidden_scores)[0]
    assert (rec.orig_text, rec.orig_skill_id) == (None, "sk1")  # s_orig is what the actor saw


# ---- rollouts ----------------------------------------------------------------------------------------------


def _record(task, cid: str, text: str, orig: str | None, r_align: float, step: int = 5) -> ProposalRecord:
    return ProposalRecord(step=step, candidate_id=cid, task=task, task_type=task.task_type, op="add", text=text,
                          orig_text=orig, r_align=r_align)


def test_measure_gains_pairs_arms_and_splits_repeated_tasks():
    """A scripted runner: an episode wins iff its skill text contains "good"."""
    t1, t2 = eval_tasks(ENV, "valid_unseen", 2)
    calls = []

    def runner(tasks, skills, k, seed):
        calls.append(([t.task_id for t in tasks], dict(skills), k, seed))
        return [_traj(t, i, "good" in (skills.get(t.task_id) or "")) for t in tasks for i in range(k)]

    props = [_record(t1, "a", "good skill", None, 0.2), _record(t1, "b", "bad skill", "good old", 0.1),
             _record(t2, "c", "bad", "bad", -0.1)]
    gains = rv.measure_gains(props, runner, k=3, seed=1)
    assert [(g.candidate_id, g.gain, g.episodes) for g in gains] == [("a", 1.0, 3), ("b", -1.0, 3), ("c", 0.0, 3)]
    assert len(calls) == 4  # t1 twice -> two rounds, two arms each
    assert calls[0][3] == calls[1][3] != calls[2][3]  # the arms of a round share the seed
    assert calls[0][1] == {t1.task_id: "good skill", t2.task_id: "bad"}
    assert calls[1][1] == {t1.task_id: None, t2.task_id: "bad"}
    stats, by_step = rv.analyse(gains)
    assert stats.share_positive_losing == 0.5  # "b": R_align +0.1 but gain -1
    assert stats.spearman_rho == pytest.approx(0.5)  # ranks (3, 2, 1) vs (3, 1, 2): 1 - 6*2/(3*8)
    assert set(by_step) == {"5"}


def test_ralign_vs_rollout_with_hf_engine_in_process(model_dir, tmp_path):
    """Real episodes (tiny model, HF engine, embedded env): identical skills in both arms give gain 0
    exactly (common random numbers); the s~ arm's prompts carry s~; JSON + PNG are written."""
    from envs.pool import EnvPool
    from rollout_workers.config import EngineConfig
    from rollout_workers.engines.hf_engine import HFEngine

    engine = HFEngine(str(model_dir), EngineConfig(engine="hf", device="cpu"))
    rollout = RolloutConfig(use_think=False, constrained_actions=True, max_response_tokens=12, max_turns=3)
    base = rv.local_runner(engine, [EnvPool(ENV, 4)], rollout, temperature=1.0)
    seen = []

    def runner(tasks, skills, k, seed):
        trajs = base(tasks, skills, k, seed)
        seen.append((dict(skills), trajs))
        return trajs

    t1, t2 = eval_tasks(ENV, "valid_unseen", 2)
    same = "Check every countertop first."
    sink = MetricsSink(tmp_path)
    sink.save_proposals(5, [_record(t1, "same", same, same, 0.02),
                            _record(t2, "new", "Open the fridge before anything else.", None, -0.01),
                            _record(t2, "noop", "", None, 0.5)])  # no text: not eligible
    sink.close()
    result = rv.run_ralign_vs_rollout(tmp_path, sample=5, k=2, seed=0, runner=runner)
    by = {g.candidate_id: g for g in result.gains}
    assert set(by) == {"same", "new"} and result.num_eligible == 2
    assert by["same"].gain == 0.0 and by["same"].episodes == 2

    def played(trajs, task):
        return [(t.success, [(x.prompt_ids, x.response_ids) for x in t.turns]) for t in trajs if t.task == task]

    assert played(seen[0][1], t1) == played(seen[1][1], t1)  # same skill, same seed: identical episodes
    assert played(seen[0][1], t2) != played(seen[1][1], t2)  # s~ vs no skill: different prompts
    new_arm = [t for t in seen[0][1] if t.task.task_id == t2.task_id]
    assert len(new_arm) == 2 and all(t.skill_text == "Open the fridge before anything else." for t in new_arm)
    assert all(t.skill_text is None for t in seen[1][1] if t.task.task_id == t2.task_id)
    data = json.loads(Path(result.json_path).read_text())
    assert data["stats"]["n"] == 2 and data["stats"]["spearman_rho"] is None and "n=2" in data["stats"]["rho_reason"]
    assert rv.summary_line(result.stats) == "spearman rho: None (n=2 < 3 pairs) (n=2)"
    assert Path(result.png_path).read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="no proposals_step"):
        rv.run_ralign_vs_rollout(tmp_path / "empty", runner=runner)


@pytest.mark.slow
def test_ralign_cost_bench_runs(tmp_path):
    """Subprocess smoke run of bench/ralign_cost.py: one proposal, K=2, one repeat."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "bench.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    cmd = [sys.executable, "bench/ralign_cost.py", "--proposals", "1", "--ks", "2", "--repeats", "1", "--out", str(out)]
    subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True, timeout=300)
    ralign, rollout = json.loads(out.read_text())["results"]
    assert ralign["method"] == "ralign" and ralign["scored_turns"] > 0 and ralign["seconds_per_proposal"] > 0
    assert rollout["method"] == "rollout" and rollout["k"] == 2 and rollout["episodes"] == 2
    assert rollout["ratio_vs_ralign"] == pytest.approx(rollout["seconds_per_proposal"] / ralign["seconds_per_proposal"])


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.ray
def test_ralign_vs_rollout_cli_on_local_ray(tmp_path):
    """`analyze ralign-vs-rollout` end to end: a local Ray cluster from the run's config (rollout
    workers on the HF engine, env actors), 3 archived proposals, K=2 per arm. The HF engine because
    this test is about the analysis on a cluster, not the engine (`shared_runs_a`)."""
    import os
    import subprocess
    import sys

    from deploy.config_loading import load_config
    from envs.tasks import sample_tasks
    from tests.deploy.shared_runs import HF_ENGINE, ONE_THREAD

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
    smoke = root / "deploy" / "configs" / "smoke_cpu_uniskill.yaml"
    model, run = tmp_path / "model", tmp_path / "run"

    def deploy(*args: str) -> subprocess.CompletedProcess:
        res = subprocess.run([sys.executable, "-m", "deploy", *args], cwd=root, env=env, capture_output=True,
                             text=True, timeout=600, check=False)
        assert res.returncode == 0, f"deploy {args[:2]} failed:\n{res.stdout[-3000:]}\n{res.stderr[-4000:]}"
        return res

    deploy("build-tiny-model", "--out", str(model), "--config", str(smoke), "--num-episodes", "20")
    cfg = load_config(smoke, [f"model.path={model}", f"run.output_dir={run}", "run.name=ralign-e2e", HF_ENGINE,
                              ONE_THREAD])
    run.mkdir()
    (run / "config.resolved.json").write_text(cfg.model_dump_json(indent=2))
    tasks = sample_tasks(cfg.env, "train", 2, seed=0)
    sink = MetricsSink(run)
    sink.save_proposals(3, [_record(tasks[0], "a", "Turn on the lamp first.", None, 0.02, step=3),
                            _record(tasks[1], "b", "Look on every desk.", "Look on every shelf.", -0.01, step=3),
                            _record(tasks[0], "c", "Pick up the object, then find the lamp.", None, 0.0, step=3)])
    sink.close()
    res = deploy("analyze", "ralign-vs-rollout", "--run", str(run), "--model", str(model), "--sample", "3", "--k", "2")
    assert res.stdout.strip().splitlines()[-1].startswith("spearman rho: ")
    assert res.stdout.strip().endswith("(n=3)")
    data = json.loads((run / "analysis" / "ralign_vs_rollout.json").read_text())
    assert sorted(g["candidate_id"] for g in data["gains"]) == ["a", "b", "c"]
    assert all(g["episodes"] == 2 and g["gain"] == g["success_new"] - g["success_orig"] for g in data["gains"])
    assert (run / "analysis" / "ralign_vs_rollout.png").stat().st_size > 0


def test_steps_play_each_step_with_the_policy_that_scored_it(tmp_path):
    """--steps 1,3: step 1's proposals are played with the run's initial model, step 3's with the
    checkpoint written after step 2; a step whose previous checkpoint is missing is refused."""
    t1, t2 = eval_tasks(ENV, "valid_unseen", 2)
    (tmp_path / "config.resolved.json").write_text(json.dumps({"model": {"path": "/models/base"}}))
    (tmp_path / "checkpoints" / "step_000002" / "hf").mkdir(parents=True)
    sink = MetricsSink(tmp_path)
    for step in (1, 3, 5):
        sink.save_proposals(step, [_record(t1, f"a{step}", "good", None, 0.1, step=step),
                                   _record(t2, f"b{step}", "bad", None, -0.1, step=step)])
    sink.close()
    played = []

    def runner_for(model):
        def run(tasks, skills, k, seed):
            played.append((model, sorted(t.task_id for t in tasks)))
            return [_traj(t, i, "good" in (skills.get(t.task_id) or "")) for t in tasks for i in range(k)]
        return run

    result = rv.run_ralign_vs_rollout(tmp_path, k=2, steps=[3, 1], runner_for=runner_for)
    ckpt = str(tmp_path / "checkpoints" / "step_000002" / "hf")
    assert result.models == {"1": "/models/base", "3": ckpt}
    assert [m for m, _ in played] == ["/models/base"] * 2 + [ckpt] * 2  # two arms per step
    assert [(g.step, g.candidate_id, g.gain) for g in result.gains] == [(1, "a1", 1.0), (1, "b1", 0.0),
                                                                         (3, "a3", 1.0), (3, "b3", 0.0)]
    assert set(result.by_step) == {"1", "3"}
    with pytest.raises(ValueError, match=r"checkpoints/step_000004/hf does not exist.*checkpoint_every"):
        rv.run_ralign_vs_rollout(tmp_path, k=2, steps=[5], runner_for=runner_for)
    with pytest.raises(ValueError, match=r"none of steps \[2\] has an archived.*steps that have: \[1, 3, 5\]"):
        rv.run_ralign_vs_rollout(tmp_path, k=2, steps=[2], runner_for=runner_for)
    # a listed step without proposals (the proposer stopped editing) is skipped and named; the others run
    played.clear()
    partial = rv.run_ralign_vs_rollout(tmp_path, k=2, steps=[2, 3], runner_for=runner_for)
    assert set(partial.by_step) == {"3"} and [m for m, _ in played] == [ckpt] * 2
    assert list(partial.skipped_steps) == ["2"] and "no archived ADD/UPDATE" in partial.skipped_steps["2"]
    assert json.loads(Path(partial.json_path).read_text())["skipped_steps"] == partial.skipped_steps
    with pytest.raises(ValueError, match="do not pass --model"):
        rv.run_ralign_vs_rollout(tmp_path, model_path="/x", steps=[1], runner_for=runner_for)


def test_ralign_vs_rollout_steps_option_errors(tmp_path):
    """--steps takes step numbers, replaces --model, and names a missing checkpoint (exit 2, no cluster)."""
    from typer.testing import CliRunner

    from deploy.cli import app

    task = eval_tasks(ENV, "valid_unseen", 1)[0]
    (tmp_path / "config.resolved.json").write_text(json.dumps({"model": {"path": "/models/base"}}))
    sink = MetricsSink(tmp_path)
    sink.save_proposals(25, [_record(task, "a", "good", None, 0.1, step=25)])
    sink.close()
    run = ["analyze", "ralign-vs-rollout", "--run", str(tmp_path)]
    bad = CliRunner().invoke(app, [*run, "--steps", "25,x"])
    assert bad.exit_code == 2 and "comma-separated" in bad.output
    both = CliRunner().invoke(app, [*run, "--steps", "25", "--model", str(tmp_path)])
    assert both.exit_code == 2 and "drop --model" in both.output
    missing = CliRunner().invoke(app, [*run, "--steps", "25"])
    assert missing.exit_code == 2 and "step_000024" in missing.output
