"""Episode loop: lockstep (one batched generate per turn, rollout_workers/loop.py) vs the
per-episode async loop (`rollout.loop: async`, rollout_workers/agent_loop.py), side by side in
one run on the same tasks, prompts and seeds: generated tokens per second of wall time.

Episodes answer free-form (no constrained decoding, no think) on the CPU demo env, and response
lengths vary: the tiny model's EOS embedding row is scaled (`--eos-scale`) so that EOS becomes
likely at some positions, giving responses from a few tokens to `--max-tokens`. Lockstep waits at
every turn for the longest response in the batch; the async loop lets each episode move on.
Engines: vllm = the in-process `VLLMEngine` (lockstep) vs `VLLMAsyncEngine` on AsyncLLM
(continuous batching); hf = `HFEngine` vs the same engine behind `BatchingAsyncEngine`.
Each repeat runs both loops once (order alternating); the speedup is the median over repeats of
the ratio within a repeat (the two runs of a repeat see the same load on a shared machine).

    OMP_NUM_THREADS=1 .venv/bin/python bench/agent_loop.py                 # vllm, writes bench/results/agent_loop.json
    .venv/bin/python bench/agent_loop.py --engine hf --repeats 2 --out /tmp/agent_loop.json
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

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "agent_loop.json"


def build_model(out_dir: Path, env_cfg, eos_scale: float) -> Path:
    import torch
    from safetensors.torch import load_file, save_file

    from deploy.laptop.tiny_model import TinyModelConfig, build_tiny_model
    from envs.alfworld.prompts import ALFWORLD_PROMPT
    from envs.pool import EnvPool
    from envs.tasks import sample_tasks
    from rollout_workers.prompts import render_turn_message

    steps = EnvPool(env_cfg, 8).reset(list(range(8)), sample_tasks(env_cfg, "train", 8, seed=123))
    corpus = [render_turn_message(ALFWORLD_PROMPT, task="t", current_observation=s.observation, history=[], history_length=2,
                                      admissible_actions=s.admissible_actions, use_think=False) for s in steps]
    corpus += [f"<action>{a}</action>" for s in steps for a in s.admissible_actions]
    shape = TinyModelConfig(vocab_size=720, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2,
                            intermediate_size=512)
    path = build_tiny_model(out_dir, corpus * 4, shape)
    weights_file = path / "model.safetensors"
    weights = load_file(weights_file)
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(path).eos_token_id
    with torch.no_grad():
        weights["model.embed_tokens.weight"][eos] *= eos_scale
        if "lm_head.weight" in weights:
            weights["lm_head.weight"][eos] *= eos_scale
    save_file(weights, weights_file, metadata={"format": "pt"})
    return path


def run(args) -> dict:
    import torch

    from envs.config import EnvConfig
    from envs.pool import EnvPool
    from envs.tasks import sample_tasks
    from rollout_workers.agent_loop import EventLoopThread, run_episodes_async
    from rollout_workers.config import EngineConfig, RolloutConfig
    from rollout_workers.engines.registry import make_async_engine, make_engine
    from rollout_workers.loop import run_episodes

    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]  # other processes on a shared machine make single runs noisy
    env_cfg = EnvConfig(max_steps=args.turns)
    model = build_model(Path(tempfile.mkdtemp(prefix="agent-loop-bench-")), env_cfg, args.eos_scale)
    engine_cfg = EngineConfig(engine=args.engine, device="cpu", dtype="float32",
                              kv_cache_memory_bytes=256 << 20, max_model_len=2048)
    rollout = RolloutConfig(use_think=False, constrained_actions=False, max_response_tokens=args.max_tokens,
                            max_prompt_tokens=1536, max_turns=args.turns, seed=0)
    tasks = sample_tasks(env_cfg, "train", args.tasks, seed=0)
    slots = args.tasks * args.group_size
    kw = {"group_size": args.group_size, "policy_version": 0, "cfg": rollout, "temperature": 1.0}

    lock_engine = make_engine(engine_cfg, str(model), seed=0)
    loop = EventLoopThread()

    async def make():
        return make_async_engine(engine_cfg, str(model), seed=0)

    async_engine = loop.run(make())

    def lockstep(seed):
        return run_episodes(lock_engine, [EnvPool(env_cfg, slots)], tasks, seed=seed, **kw)

    def agent(seed):
        return loop.run(run_episodes_async(async_engine, [EnvPool(env_cfg, slots)], tasks, seed=seed, **kw))

    lockstep(999), agent(999)  # warm-up (kernels, prefix caches are reset below)
    rows = []
    for r in range(args.repeats):
        order = [("lockstep", lockstep), ("async", agent)]
        row = {}
        for name, fn in order if r % 2 == 0 else order[::-1]:
            if args.engine == "vllm":  # both runs start from a cold prefix cache
                lock_engine.reset_prefix_cache() if name == "lockstep" else loop.run(async_engine.reset_prefix_cache())
            trajs, stats = fn(seed=r)
            lengths = [len(u.response_ids) for t in trajs for u in t.turns]
            row[name] = {
                "generated_tokens": stats.num_generated_tokens,
                "wall_s": stats.total_s,
                "tokens_per_s": stats.num_generated_tokens / stats.total_s,
                "generate_s": stats.generate_s,
                "env_s": stats.env_s,
                "turns": stats.num_turns,
                "response_len_min_median_max": [min(lengths), statistics.median(lengths), max(lengths)],
            }
        rows.append(row)
        print(f"repeat {r}: lockstep {row['lockstep']['tokens_per_s']:.1f} tok/s "
              f"({row['lockstep']['generated_tokens']} tokens, {row['lockstep']['wall_s']:.2f} s) | "
              f"async {row['async']['tokens_per_s']:.1f} tok/s "
              f"({row['async']['generated_tokens']} tokens, {row['async']['wall_s']:.2f} s)", flush=True)
    close = getattr(async_engine, "close", None)
    if close is not None:
        close()
    loop.close()
    med = {name: statistics.median(r[name]["tokens_per_s"] for r in rows) for name in ("lockstep", "async")}
    ratios = [r["async"]["tokens_per_s"] / r["lockstep"]["tokens_per_s"] for r in rows]
    return {
        "bench": "agent_loop",
        "engine": args.engine,
        "setup": {"tasks": args.tasks, "group_size": args.group_size, "episodes": slots, "turns": args.turns,
                  "max_response_tokens": args.max_tokens, "eos_scale": args.eos_scale,
                  "torch_threads": args.threads, "repeats": args.repeats},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "load_avg_1min_at_start_and_end": [load_start, os.getloadavg()[0]]},
        "repeats": rows,
        "median_tokens_per_s": med,
        "paired_speedups": ratios,
        "speedup": statistics.median(ratios),
        "speedup_note": "median over repeats of (async tokens/s / lockstep tokens/s) within the same repeat",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--eos-scale", type=float, default=8.0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    t0 = time.time()
    result = run(args)
    result["bench_s"] = time.time() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    print(f"async loop vs lockstep: {result['speedup']:.2f}x generated tokens/s")


if __name__ == "__main__":
    main()
