"""Analysis tools: bootstrap CIs, run comparison, fixed-state teacher intervention (tiny model,
embedded household env, trajectories from the env's expert)."""

import json
import random
from pathlib import Path

import numpy as np
import pytest

from deploy.analysis.compare_runs import compare_runs
from deploy.analysis.stats import bootstrap_ci, paired_bootstrap_ci, unpaired_bootstrap_ci
from deploy.analysis.teacher_intervention import run_teacher_intervention
from deploy.config import TrainConfig
from deploy.config_sections import MethodConfig, RunConfig
from deploy.evaluation import EvalResult, TypeResult
from deploy.laptop.tiny_model import TinyModelConfig, build_tiny_model
from envs.alfworld.prompts import ALFWORLD_PROMPT, task_description
from envs.config import EnvConfig
from envs.registry import make_env
from envs.tasks import eval_tasks
from rollout_workers.config import RolloutConfig
from rollout_workers.parsing import action_choice
from rollout_workers.prompts import render_prompt_ids, render_turn_message
from rollout_workers.types import Trajectory, Turn

TINY = TinyModelConfig(vocab_size=300, hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                       intermediate_size=64)


# ---------------------------------------------------------------- stats

def test_bootstrap_ci_contains_mean_and_shrinks_with_n():
    rng = np.random.default_rng(1)
    small, large = rng.normal(0.5, 1.0, 30), rng.normal(0.5, 1.0, 3000)
    m1, lo1, hi1 = bootstrap_ci(small, n_boot=2000)
    m2, lo2, hi2 = bootstrap_ci(large, n_boot=2000)
    assert lo1 <= m1 <= hi1 and lo2 <= m2 <= hi2
    assert m1 == pytest.approx(small.mean()) and m2 == pytest.approx(large.mean())
    assert hi2 - lo2 < (hi1 - lo1) / 4  # ~ 1/sqrt(n): 10x narrower expected
    assert lo2 < 0.5 < hi2
    assert bootstrap_ci(small, n_boot=500, seed=3) == bootstrap_ci(small, n_boot=500, seed=3)
    assert bootstrap_ci([2.0]) == (2.0, 2.0, 2.0)
    assert all(np.isnan(bootstrap_ci([])))


def test_paired_bootstrap_of_identical_arrays_is_zero_and_pairing_helps():
    rng = np.random.default_rng(2)
    a = rng.normal(0, 5, 200)
    assert paired_bootstrap_ci(a, a) == (0.0, 0.0, 0.0)
    b = a + 0.1 + rng.normal(0, 0.05, 200)  # large state effect shared by both
    m, lo, hi = paired_bootstrap_ci(b, a, n_boot=2000)
    assert lo > 0 and lo <= m <= hi and m == pytest.approx(np.mean(b - a))
    um, ulo, uhi = unpaired_bootstrap_ci(b, a, n_boot=2000)
    assert um == pytest.approx(m) and (uhi - ulo) > 10 * (hi - lo)
    with pytest.raises(ValueError):
        paired_bootstrap_ci([1.0, 2.0], [1.0])


# ---------------------------------------------------------------- compare_runs

def _fake_run(root, name, method, avg, lens):
    run = root / name
    (run / "eval").mkdir(parents=True)
    sd = {"learner": {"sd": {"coef": 0.1}}} if method != "grpo" else {}
    cfg = TrainConfig.model_validate({"run": RunConfig(name=name).model_dump(),
                                      "method": MethodConfig(name=method).model_dump(), **sd})
    (run / "config.resolved.json").write_text(cfg.model_dump_json())
    with (run / "metrics.jsonl").open("w") as f:
        for step, ln in enumerate(lens, 1):
            f.write(json.dumps({"step": step, "response_len_mean": ln, "rep4gram_ratio": 0.01 * step}) + "\n")
    for step, a in ((1, avg / 2), (2, avg)):
        ev = EvalResult(label=f"step_{step:04d}", split="valid_unseen", num_tasks=4, k=4, temperature=0.4,
                        avg_at_k=a, avg_at_k_se=0.05, pass_at_k=min(1.0, a + 0.1),
                        per_task_type={"pick_and_place_simple": TypeResult(num_tasks=2, avg_at_k=a, pass_at_k=1.0),
                                       "look_at_obj_in_light": TypeResult(num_tasks=2, avg_at_k=a / 2, pass_at_k=0.5)},
                        num_episodes=16, end_reasons={"won": 8}, policy_version=step)
        (run / "eval" / f"step_{step:04d}.json").write_text(ev.model_dump_json())
    return run


def test_compare_runs_tables_final_metrics(tmp_path):
    runs = [_fake_run(tmp_path, "base", "grpo", 0.5, [10, 20, 30, 40, 50, 60, 70]),
            _fake_run(tmp_path, "smrc", "smrc_sd", 0.75, [5, 5, 5])]
    out = tmp_path / "cmp" / "compare"
    res = compare_runs(runs, out=out)
    assert [r.method for r in res] == ["grpo", "smrc_sd"]
    assert res[0].avg_at_k == 0.5 and res[1].avg_at_k == 0.75 and res[1].split == "valid_unseen"
    assert res[0].response_len_mean == pytest.approx(50.0)  # no eval figure: mean of the last 5 steps
    assert res[0].rep4gram_ratio == pytest.approx(0.05)
    assert res[1].response_len_mean == pytest.approx(5.0)
    assert res[0].per_task_type["look_at_obj_in_light"] == 0.25
    md = out.with_suffix(".md").read_text()
    assert "0.750 ± 0.050" in md and "smrc_sd" in md and "look_at_obj_in_light" in md
    assert out.with_suffix(".png").stat().st_size > 0


def _split_eval(run, split, step, avg, per_type, length=None, rep=None):
    ev = EvalResult(label=f"step_{step:04d}-{split}", split=split, num_tasks=2, k=4, temperature=0.4, avg_at_k=avg,
                    avg_at_k_se=0.05, pass_at_k=1.0, num_episodes=8, end_reasons={"won": 4}, policy_version=step,
                    per_task_type={t: TypeResult(num_tasks=1, avg_at_k=a, pass_at_k=1.0) for t, a in per_type.items()},
                    response_len_mean=length, rep4gram_ratio=rep)
    (run / "eval" / f"{ev.label}.json").write_text(ev.model_dump_json())


def test_compare_runs_gives_one_row_per_split_and_the_eval_health_figures(tmp_path):
    run = _fake_run(tmp_path, "two", "smrc_sd", 0.5, [7])
    for p in (run / "eval").glob("*.json"):
        p.unlink()
    _split_eval(run, "valid_seen", 1, 0.1, {"pick_and_place_simple": 0.1})
    _split_eval(run, "valid_seen", 3, 0.6, {"pick_and_place_simple": 0.5}, length=80.0, rep=0.1)
    _split_eval(run, "valid_unseen", 3, 0.4, {"pick_and_place_simple": 0.25}, length=90.0, rep=0.2)
    rows = compare_runs([run], out=tmp_path / "c")
    assert [(r.split, r.avg_at_k, r.response_len_mean, r.rep4gram_ratio) for r in rows] == [
        ("valid_seen", 0.6, 80.0, 0.1), ("valid_unseen", 0.4, 90.0, 0.2)]  # the last policy's evals only
    (only,) = compare_runs([run], out=tmp_path / "c", split="valid_unseen")
    assert only.per_task_type == {"pick_and_place_simple": 0.25}
    md = compare_runs([run], out=tmp_path / "p", layout="smrc_sd", split="valid_unseen")
    table = (tmp_path / "p").with_suffix(".md").read_text()
    smrc_line = next(line for line in table.splitlines() if "| SMRC-SD |" in line)
    assert "| 0.400 | 1.000 | 0.250 |" in smrc_line and "| 90.0 | 20.0 |" in smrc_line
    assert len(md) == 1
    with pytest.raises(ValueError, match="unknown layout"):
        compare_runs([run], out=tmp_path / "x", layout="paper")


RESULTS = Path(__file__).resolve().parents[2] / "results"


def test_committed_results_validate_and_say_where_they_come_from():
    from deploy.analysis.results_tables import read_results

    files = sorted(RESULTS.glob("*.json"))
    assert {"demo.json", "laptop_method_comparison.json", "laptop_uniskill_run.json", "benchmarks.json",
            "paper_smrc_sd.json", "paper_uniskill.json"} <= {f.name for f in files}
    for f in files:
        doc = read_results(f)
        assert doc.command and doc.provenance, f.name
        if doc.provenance.startswith("transcribed from docs/results.md"):
            assert doc.provenance == "transcribed from docs/results.md; run artifacts not preserved"
            assert doc.commit is None and doc.documented_in is not None and len(doc.documented_in) == 40
    demo = read_results(RESULTS / "demo.json")
    assert [r.avg_at_k for r in demo.rows] == [0.016, 0.167, 0.328]  # the 20-step record (docs/results.md, History)
    for name, info in read_results(RESULTS / "benchmarks.json").extra["committed"].items():
        assert (RESULTS.parent / info["json"]).is_file() and len(info["committed_in"]) == 40, name


def test_the_papers_tables_render_from_the_committed_results(tmp_path):
    compare_runs([RESULTS / "paper_smrc_sd.json"], out=tmp_path / "smrc", layout="smrc_sd")
    lines = (tmp_path / "smrc").with_suffix(".md").read_text().splitlines()
    methods = [line.split(" | ")[1] for line in lines[2:]]
    assert methods[:5] == ["GRPO", "FullPath-SD", "Skill-SD", "SDAR", "SMRC-SD"]  # the main table's rows
    skill = next(line for line in lines if "| Qwen3-1.7B | Skill-SD |" in line)
    assert skill.endswith("| 0.818 | 0.539 | 255.6 | 38.6 |")  # WebShop score, acc, length, repeats
    assert any("| Qwen2.5-3B | SMRC-SD | 0.883 | 0.938 |" in line for line in lines)
    compare_runs([RESULTS / "paper_uniskill.json"], out=tmp_path / "uni", layout="uniskill")
    uni = (tmp_path / "uni").with_suffix(".md").read_text()
    assert "| UniSkill | on | - | - | - | - | - | - | 98.4 | 90.5 | 84.7 |" in uni
    assert "| Skill Proposer Only | off |" in uni and "34.4" in uni
    # laptop rows and paper rows side by side
    rows = compare_runs([RESULTS / "laptop_method_comparison.json", RESULTS / "paper_smrc_sd.json"],
                        out=tmp_path / "both", layout="smrc_sd")
    assert {r.model for r in rows} >= {"Qwen3-1.7B", "tiny-2M (Qwen2 architecture, built offline)"}
    both = (tmp_path / "both").with_suffix(".md").read_text()
    # two laptop runs of one method each keep their own line, labelled with the row's name
    assert "| SMRC-SD: SMRC-SD | 0.156 | 0.229 |" in both
    assert "| SMRC-SD: SMRC-SD, re-run with the final signature | 0.078 | 0.188 |" in both


def test_export_writes_a_results_file_with_command_and_commit(tmp_path):
    from deploy.analysis.compare_runs import export_results
    from deploy.analysis.results_tables import read_results

    run = _fake_run(tmp_path, "exp", "grpo", 0.5, [10])
    doc = export_results([run], tmp_path / "r.json", title="t", command="python -m deploy analyze compare-runs X")
    back = read_results(tmp_path / "r.json")
    assert back == doc and back.rows[0].avg_at_k == 0.5 and back.command.endswith("compare-runs X")
    assert back.commit is not None and len(back.commit) == 40 and back.commit in back.provenance


# ---------------------------------------------------------------- teacher intervention

ROLLOUT = RolloutConfig(use_think=False, constrained_actions=True, max_response_tokens=16, group_size=3)


def _episode(env_cfg, task, tok, *, detour: int, rng: random.Random, traj_id: str, group_id: str) -> Trajectory:
    env = make_env(env_cfg)
    obs, info = env.reset(options={"task": task})
    adm = tuple(info["admissible_commands"])
    task_text = task_description(obs) or task.instruction
    history, turns, won, done = [], [], False, False
    while not done:
        action = rng.choice([a for a in adm if a != "help"]) if len(turns) < detour else env.unwrapped.expert_action()
        msg = render_turn_message(ALFWORLD_PROMPT, task=task_text, current_observation=obs, admissible_actions=adm,
                                      history=history, history_length=ROLLOUT.history_length, use_think=False)
        resp = tuple(tok.encode(action_choice(action), add_special_tokens=False)) + (tok.eos_token_id,)
        nxt, reward, won, truncated, info = env.step(action)
        turns.append(Turn(prompt_ids=tuple(render_prompt_ids(tok, msg)), response_ids=resp,
                          sampler_logprobs=(-1.0,) * len(resp), response_text=action_choice(action), action=action,
                          env_action=action, action_valid=True, observation=obs, next_observation=nxt,
                          admissible_actions=adm, reward=reward))
        history.append((obs, action))
        obs, adm, done = nxt, tuple(info["admissible_commands"]), won or truncated
    return Trajectory(task=task, group_id=group_id, traj_id=traj_id, turns=tuple(turns), success=won,
                      score=10.0 * won, policy_version=0, end_reason="won" if won else "step_limit")


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("ti")
    env_cfg = EnvConfig(max_steps=30)
    tasks = eval_tasks(env_cfg, "valid_unseen", 2)
    corpus = [t.instruction for t in tasks] + ["go to desk 1", "take mug 1 from desk 1", "look", "<action></action>"] * 10
    model = build_tiny_model(root / "model", corpus, TINY)
    tok = AutoTokenizer.from_pretrained(model)
    run = root / "run"
    (run / "trajectories").mkdir(parents=True)
    cfg = TrainConfig.model_validate({"env": env_cfg.model_dump(), "rollout": ROLLOUT.model_dump()})
    (run / "config.resolved.json").write_text(cfg.model_dump_json())
    rng = random.Random(0)
    trajs = []
    for i, task in enumerate(tasks):
        for j, detour in enumerate((0, 0, 2)):
            trajs.append(_episode(env_cfg, task, tok, detour=detour, rng=rng, traj_id=f"t{i}_{j}", group_id=f"g{i}"))
    (run / "trajectories" / "step_0001.jsonl").write_text("".join(t.model_dump_json() + "\n" for t in trajs))
    return run, model, trajs


def test_teacher_intervention_on_tiny_run(fake_run, tmp_path):
    run, model, trajs = fake_run
    assert all(t.success for t in trajs[:2])
    res = run_teacher_intervention(run, model_path=str(model), max_states=40, seed=0)
    out = run / "analysis"
    assert (out / "teacher_intervention.json").exists() and (out / "teacher_intervention.png").stat().st_size > 0
    data = json.loads((out / "teacher_intervention.json").read_text())
    assert data["num_states"] == res.num_states and sum(res.num_states.values()) == len(res.states) > 0
    assert res.num_states["matched"] > 0 and res.num_states["mismatched"] > 0
    for s in res.states:
        assert s.delta["none"] == 0.0  # the student prompt itself: exactly zero
        assert s.logprob["full_path"] != s.student_logprob  # the block changes the context
        assert s.student_logprob < 0
        assert s.action_source == ("candidate" if s.matched else "expert")
    for g in ("matched", "mismatched", "all"):
        assert res.summary["none"][g]["mean"] == 0.0 and res.summary["none"][g]["hi"] == 0.0
        assert res.summary["full_path"][g]["lo"] <= res.summary["full_path"][g]["mean"] <= res.summary["full_path"][g]["hi"]
    assert "full_path:matched-mismatched" in res.differences and "state_matched-full_path:all" in res.differences
    # a mismatched state's a* is the expert's next action after replaying the student's prefix
    by_id = {t.traj_id: t for t in trajs}
    expert_states = [s for s in res.states if not s.matched]
    s = expert_states[0]
    assert s.correct_action in by_id[s.traj_id].turns[s.turn].admissible_actions
    # max_states caps the sample, out_dir redirects the outputs
    small = run_teacher_intervention(run, model_path=str(model), max_states=4, seed=1, out_dir=tmp_path / "o")
    assert len(small.states) == 4 and (tmp_path / "o" / "teacher_intervention.json").exists()
