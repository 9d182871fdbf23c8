"""R_align cost per evaluated proposal vs rollout-based evaluation of the same proposals, side by
side in one run (docs/algorithms.md S8: UniSkill "is cheaper per step because R_align needs no rollouts";
rollout-based skill evaluation such as Evolving-RL plays K extra episodes per proposal).

Setup (the smoke UniSkill config's env, rollout and learner settings; tiny model): anchor groups of
4 real episodes per task are played once; each of P proposals is a skill text s~ for one task with
the candidate's held-out anchors tau+ and tau-.

- `ralign`: what one training step adds for R_align (S4), per proposal: the driver renders and
  tokenizes every anchor turn's prompt with s~ in the skill slot (`deploy.stages.uniskill_glue.align_requests`,
  as the trainer does), then the learner scores the identical response ids under those prompts
  with no grad (`LearnerWorker.score`, the torch backend, all proposals in one call like the
  learner's batched no-grad pass). J(tau; s_orig) costs nothing extra (it reuses theta_old).
- `rollout K=4` / `rollout K=8`: K extra episodes per proposal with s~ in the actor's skill slot
  (`rollout_workers.loop.run_episodes`, HF or vLLM engine, one EnvPool holding all P x K episodes).

Each measurement is repeated (same seeds, so the same work) and the median is kept; per-proposal
seconds = median / P; `ratio` = rollout seconds / R_align seconds.

    OMP_NUM_THREADS=1 .venv/bin/python bench/ralign_cost.py                    # table + json
    .venv/bin/python bench/ralign_cost.py --proposals 2 --ks 2 --repeats 1 --out /tmp/x.json  # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

DEFAULT_OUT = Path(__file__).parent / "results" / "ralign_cost.json"
CONFIG = Path(__file__).parents[1] / "deploy" / "configs" / "smoke_cpu_uniskill.yaml"
SKILLS = [
    ("Before searching, list every receptacle in the room; open each closed one and look inside before "
     "moving on, and never revisit a receptacle you already checked. Take the target as soon as you see it."),
    ("Find the lamp first: go to each desk, sidetable and dresser in turn, and when you see a desklamp "
     "or floorlamp remember where it is. Then fetch the object and use the lamp while holding it."),
    ("When an action does nothing, do not repeat it: check the admissible actions and pick the one that "
     "moves you to an unvisited place. Holding the object is required before you can use a light."),
    ("Prefer actions that mention the task's object by name. If the object is not visible, go to the "
     "nearest unvisited receptacle; if it is visible, take it, then go to the lamp and turn it on."),
]


def median_s(fn, repeats: int) -> tuple[float, list[float], object]:
    """Median wall time of `repeats` calls after one warm-up call; returns (median, all, last result)."""
    fn()
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, out


def build_engine(name: str, model_dir: Path):
    from rollout_workers.config import EngineConfig

    cfg = EngineConfig(engine=name, dtype="float32", device="cpu", kv_cache_memory_bytes=256 << 20)
    if name == "hf":
        from rollout_workers.engines.hf_engine import HFEngine

        return HFEngine(str(model_dir), cfg)
    from rollout_workers.engines.vllm_engine import VLLMEngine

    return VLLMEngine(str(model_dir), cfg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None,
                        help="HF model dir (default: runs/tiny/base if present, else a tiny model built in /tmp)")
    parser.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="rollout engine")
    parser.add_argument("--proposals", type=int, default=4, help="P proposals evaluated (one task each)")
    parser.add_argument("--ks", type=int, nargs="+", default=[4, 8], help="episodes per proposal (rollout-based)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats after one warm-up (median kept)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (both sides)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch
    from transformers import AutoTokenizer

    from deploy.config_loading import load_config
    from deploy.stages.uniskill_glue import ProposerPrompt, align_requests, rows_index
    from envs.pool import EnvPool
    from envs.tasks import sample_tasks
    from learner.batch import rows_from_trajectories
    from learner.worker import LearnerWorker
    from rollout_workers.loop import run_episodes
    from rollout_workers.proposer import ParsedProposal
    from rollout_workers.types import Candidate

    torch.set_num_threads(args.threads)
    cfg = load_config(CONFIG)
    env_cfg, rollout = cfg.env, cfg.rollout.model_copy(update={"seed": args.seed})
    p = args.proposals
    with tempfile.TemporaryDirectory(prefix="agentrl-ralign-") as tmp:
        model_dir = args.model
        if model_dir is None:
            default = Path(__file__).parents[1] / "runs" / "tiny" / "base"
            if (default / "config.json").is_file():
                model_dir = default
            else:
                from deploy.laptop.sft import build_model_from_env

                model_dir = build_model_from_env(cfg, Path(tmp) / "tiny", num_episodes=100)
        model_used = str(model_dir) if Path(model_dir).parent != Path(tmp) else "tiny model built by the bench"
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        engine = build_engine(args.engine, model_dir)
        tasks = sample_tasks(env_cfg, "train", p, seed=args.seed)

        # Anchors: one group of 4 real episodes per task (source, reference, tau+, tau-).
        anchors, _ = run_episodes(engine, [EnvPool(env_cfg, 4 * p)], tasks, group_size=4, policy_version=0,
                                  cfg=rollout, temperature=rollout.temperature, seed=args.seed)
        rows = rows_from_trajectories(anchors)
        groups = [[t for t in anchors if t.task.task_id == task.task_id] for task in tasks]
        prompts, parsed = [], []
        for i, g in enumerate(groups):
            ids = [t.traj_id for t in g]
            cand = Candidate(candidate_id=f"p{i}", group_id=g[0].group_id, task_id=g[0].task.task_id,
                             source_id=ids[0], reference_id=ids[1], plus_id=ids[2], minus_id=ids[3],
                             source_won=g[0].success)
            prompts.append(ProposerPrompt(cand, (0,), (True, True, False), None, g[0].task.task_type, ""))
            parsed.append(ParsedProposal(op="add", skill_text=SKILLS[i % len(SKILLS)], ok=True, reason=None,
                                         has_chinese=False))

        def build_requests():
            return align_requests(prompts, parsed, rows_index(rows), anchors, tokenizer, rollout,
                                  max_prompt_tokens=10**9)[0]

        requests = build_requests()
        swapped = [rows[a.row_index].model_copy(update={"prompt_ids": a.swapped_prompt_ids})
                   for r in requests for a in (*r.plus, *r.minus)]
        learner = LearnerWorker(cfg.learner.model_copy(update={"use_deepspeed": False}), str(model_dir))
        render_s, render_all, _ = median_s(build_requests, args.repeats)
        score_s, score_all, _ = median_s(lambda: learner.score(swapped), args.repeats)
        swapped_tokens = sum(len(r.prompt_ids) + len(r.response_ids) for r in swapped)
        results = [{
            "method": "ralign", "k": None, "proposals": p, "scored_turns": len(swapped),
            "tokens": swapped_tokens, "episodes": 0,
            "seconds_total": render_s + score_s, "seconds_render": render_s, "seconds_score": score_s,
            "seconds_per_proposal": (render_s + score_s) / p,
            "repeats_s": [a + b for a, b in zip(render_all, score_all, strict=True)],
        }]
        skills = {task.task_id: SKILLS[i % len(SKILLS)] for i, task in enumerate(tasks)}
        for k in args.ks:
            pool = EnvPool(env_cfg, p * k)

            def rollouts(k=k, pool=pool):
                return run_episodes(engine, [pool], tasks, group_size=k, policy_version=0, cfg=rollout,
                                    temperature=rollout.temperature, seed=args.seed + 1, skill_texts=skills)

            total_s, all_s, (trajs, stats) = median_s(rollouts, args.repeats)
            results.append({
                "method": "rollout", "k": k, "proposals": p, "scored_turns": stats.num_turns,
                "tokens": stats.num_prompt_tokens + stats.num_generated_tokens, "episodes": stats.num_episodes,
                "seconds_total": total_s, "seconds_generate": stats.generate_s, "seconds_env": stats.env_s,
                "seconds_per_proposal": total_s / p, "repeats_s": all_s,
                "success_rate": sum(t.success for t in trajs) / max(len(trajs), 1),
            })
    base = results[0]["seconds_per_proposal"]
    for r in results:
        r["ratio_vs_ralign"] = r["seconds_per_proposal"] / base
    print_table(results)
    report = {
        "benchmark": "ralign_cost",
        "config": str(CONFIG.name), "engine": args.engine, "model": model_used,
        "env_max_steps": env_cfg.max_steps, "max_response_tokens": rollout.max_response_tokens,
        "torch_threads": args.threads, "repeats": args.repeats, "host": platform.node(),
        "cpu_count": os.cpu_count(), "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


def print_table(rows: list[dict]) -> None:
    head = f"{'method':<12}{'turns scored/played':>20}{'tokens':>10}{'episodes':>10}{'s / proposal':>14}{'x R_align':>11}"
    print(head)
    for r in rows:
        name = "R_align" if r["method"] == "ralign" else f"rollout K={r['k']}"
        print(f"{name:<12}{r['scored_turns']:>20}{r['tokens']:>10}{r['episodes']:>10}"
              f"{r['seconds_per_proposal']:>14.3f}{r['ratio_vs_ralign']:>11.1f}")


if __name__ == "__main__":
    main()
