"""LoRA vs full-weight training, side by side in one run, on a random-init Qwen2-shaped model of
>= 100M parameters (fp32, CPU), built locally from a config (no download).

For each mode a fresh learner process (torch backend, fp32, gradient checkpointing as in every GPU
config, kl_coef 0.01, so the full-weight learner holds its frozen reference copy and the LoRA
learner uses its base with the adapters disabled) trains one GRPO step (8 rows of 64 + 32 tokens), then syncs over a real two-member gloo weight-sync group into an HF engine in
a second process (`sync.method: broadcast`: every weight, or the adapter tensors alone); the engine
samples continuations of fixed prompts and the learner re-scores them. Recorded per mode: bytes per
sync, sync seconds (the sender's broadcast and the engine's receive + apply), the learner process's
peak RSS (ru_maxrss: model, reference, gradients, optimizer state and activations of the step;
glibc's mmap threshold fixed, `MALLOC_ENV`),
and parity max |engine - learner| log-prob after the step.

    .venv/bin/python bench/lora.py             # ~112M params, rank 16, a few minutes on 2 cores

Writes bench/results/lora.json; the last line is
`lora vs full: sync X.Xx smaller, learner peak memory Y.Yx lower, parity max |dlogp| Z`
(goals: sync >= 20x smaller, memory >= 2x lower, parity <= 1e-3).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path(__file__).parent / "results" / "lora.json"
SHAPE = {"vocab_size": 720, "hidden_size": 1024, "num_layers": 10, "num_heads": 16, "num_kv_heads": 4,
         "intermediate_size": 2816, "max_position_embeddings": 1024}
"""Qwen2-shaped, ~112M parameters (bench/weight_sync.py's model)."""
LORA = {"enabled": True, "rank": 16, "alpha": 32.0}
GOALS = {"sync_ratio": 20.0, "memory_ratio": 2.0, "parity": 1e-3}
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}
"""For both learner processes: glibc's dynamic mmap threshold would otherwise keep freed activation
blocks resident (RSS then counts memory the learner no longer holds, the same in both modes); a
fixed threshold hands large blocks back when torch frees them."""
ROWS, PROMPT, RESPONSE = 8, 64, 32
"""The step's rows (one GRPO group with mixed outcomes), one micro-batch, gradient checkpointing on
(as in every GPU config): the learner's state, not this small batch's activations, dominates."""
PROMPTS = ["You are in the middle of a room. Looking quickly around you, you see a cabinet 1.",
           "Your task is to: put a clean mug in cabinet.", "go to desk 1"]


def _env() -> None:
    for key, value in {"DS_ACCELERATOR": "cpu", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}.items():
        os.environ.setdefault(key, value)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def build_model(out: Path) -> int:
    from transformers import AutoModelForCausalLM

    from deploy.laptop.tiny_model import TinyModelConfig, build_tiny_model

    corpus = [*PROMPTS, "open fridge 1", "take mug 1 from countertop 1", "inventory", "look"] * 20
    build_tiny_model(out, corpus, TinyModelConfig(**SHAPE))
    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(out).parameters())


def learner_config(mode: str):
    from learner.config import LearnerConfig

    return LearnerConfig(lr=1e-4, use_deepspeed=False, kl_coef=0.01, micro_batch_rows=ROWS, shuffle_rows=False, seed=0,
                         entropy_coeff=0.01, gradient_checkpointing=True,
                         lora=LORA if mode == "lora" else {"enabled": False})


def _rows(vocab: int):
    import torch

    from learner.types import TrainRow

    gen = torch.Generator().manual_seed(0)
    rows = []
    for t in range(ROWS):
        prompt = tuple(torch.randint(3, vocab, (PROMPT,), generator=gen).tolist())
        response = tuple(torch.randint(3, vocab, (RESPONSE,), generator=gen).tolist())
        rows.append(TrainRow(prompt_ids=prompt, response_ids=response, sampler_logprobs=(-1.0,) * RESPONSE, group_id="g",
                             traj_id=f"t{t}", step_idx=0, episode_score=float(t % 2), action_valid=True))
    return rows


def _engine_main(model_dir: str, spec: dict, mode: str, conn) -> None:
    """The receiving engine (its own process): join, receive, sample the prompts, send them back."""
    _env()
    from rollout_workers.config import EngineConfig
    from rollout_workers.engines.hf_engine import HFEngine
    from weightsync.adapter import AdapterSpec
    from weightsync.group import GroupSpec

    engine = HFEngine(model_dir, EngineConfig(engine="hf", device="cpu", dtype="float32"))
    engine.join_weight_group(GroupSpec(**{**spec, "members": tuple(spec["members"])}), 1)
    start = time.perf_counter()
    if mode == "lora":
        adapter = AdapterSpec(rank=LORA["rank"], alpha=LORA["alpha"], target_modules=learner_config(mode).lora.target_modules)
        engine.receive_adapter(adapter)
    else:
        engine.receive_weights()
    receive_s = time.perf_counter() - start
    prompts = [list(engine.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in PROMPTS]
    gens = engine.generate(prompts, temperature=1.0, top_p=1.0, max_tokens=16, seed=0)
    conn.send({"receive_s": receive_s, "samples": [(p, list(g.token_ids), list(g.logprobs)) for p, g in zip(prompts, gens)]})
    engine.leave_weight_group()


def run_mode(mode: str, model_dir: str) -> dict:
    """One learner process's measurements (called in a fresh interpreter: `--mode`)."""
    _env()
    import torch

    from learner.types import TrainRow
    from learner.worker import LearnerWorker

    torch.manual_seed(0)
    w = LearnerWorker(learner_config(mode), model_dir)
    trainable = sum(p.numel() for p in w.backend.module.parameters() if p.requires_grad)
    start = time.perf_counter()
    metrics = w.train_step(_rows(len(w.tokenizer)))
    step_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory(prefix="agentrl-lora-bench-") as tmp:
        spec = {"name": uuid.uuid4().hex, "members": ["learner_0", "engine"], "timeout_s": 600.0,
                "store_file": str(Path(tmp) / "store")}
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_engine_main, args=(model_dir, spec, mode, child))
        proc.start()
        from weightsync.group import GroupSpec

        w.join_weight_group(GroupSpec(**{**spec, "members": tuple(spec["members"])}))
        start = time.perf_counter()
        sent = w.broadcast_weights()
        send_s = time.perf_counter() - start
        result = parent.recv()
        proc.join(timeout=600)
    rows = [TrainRow(prompt_ids=tuple(p), response_ids=tuple(ids), sampler_logprobs=tuple(lp), group_id="p",
                     traj_id=f"p{i}", step_idx=0, episode_score=0.0, action_valid=True)
            for i, (p, ids, lp) in enumerate(result["samples"])]
    scores = w.score(rows)
    parity = max(abs(a - b) for row, s in zip(rows, scores) for a, b in zip(row.sampler_logprobs, s))
    return {"mode": mode, "trainable_params": trainable, "step_s": step_s, "loss": metrics.loss,
            "sync_bytes": sent, "sync_send_s": send_s, "sync_receive_s": result["receive_s"],
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "parity_max_dlogp": parity}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--mode", choices=["full", "lora"], help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    _env()
    if args.mode:  # a learner process of the parent run
        print(json.dumps(run_mode(args.mode, args.model)))
        return
    import torch

    with tempfile.TemporaryDirectory(prefix="agentrl-lora-bench-") as tmp:
        model = Path(tmp) / "model"
        params = build_model(model)
        assert params >= 100_000_000, params
        modes = {}
        for mode in ("full", "lora"):
            res = subprocess.run([sys.executable, __file__, "--mode", mode, "--model", str(model)], cwd=ROOT,
                                 capture_output=True, text=True, check=False, env={**os.environ, **MALLOC_ENV})
            if res.returncode != 0:
                raise SystemExit(f"{mode} run failed:\n{res.stderr[-4000:]}")
            modes[mode] = json.loads(res.stdout.strip().splitlines()[-1])
    full, lora = modes["full"], modes["lora"]
    summary = {"sync_ratio": full["sync_bytes"] / lora["sync_bytes"],
               "memory_ratio": full["peak_rss_bytes"] / lora["peak_rss_bytes"],
               "parity": max(full["parity_max_dlogp"], lora["parity_max_dlogp"])}
    met = {"sync_ratio": summary["sync_ratio"] >= GOALS["sync_ratio"],
           "memory_ratio": summary["memory_ratio"] >= GOALS["memory_ratio"], "parity": summary["parity"] <= GOALS["parity"]}
    record = {"model_params": params, "shape": SHAPE, "lora": LORA, "rows": ROWS, "prompt_tokens": PROMPT,
              "response_tokens": RESPONSE, "gradient_checkpointing": True, "malloc_env": MALLOC_ENV, "modes": modes, "summary": summary, "goals": GOALS,
              "goals_met": met, "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                                            "torch_threads": torch.get_num_threads(), "note": "shared, loaded machine"}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    for m in (full, lora):
        print(f"{m['mode']:>4}: trainable {m['trainable_params'] / 1e6:.1f}M, step {m['step_s']:.1f}s, sync "
              f"{m['sync_bytes'] / 2**20:.1f} MiB in {m['sync_send_s']:.2f}s (engine receive+apply "
              f"{m['sync_receive_s']:.2f}s), learner peak RSS {m['peak_rss_bytes'] / 2**30:.2f} GiB, parity "
              f"{m['parity_max_dlogp']:.2g}")
    print(f"goals met: {met}")
    print(f"lora vs full: sync {summary['sync_ratio']:.1f}x smaller, learner peak memory "
          f"{summary['memory_ratio']:.1f}x lower, parity max |dlogp| {summary['parity']:.2g}")


if __name__ == "__main__":
    main()
