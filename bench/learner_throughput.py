"""Learner throughput on the laptop-sized model (default TinyModelConfig: hidden 192, 4 layers).

Two measurements per batch shape (rows x prompt tokens + response tokens):
- `fwd_bwd`: one forward + backward of the bare HF model over the padded batch (tokens/s over
  all prompt + response tokens);
- `train_step`: a full `LearnerWorker.train_step` (collate, no-grad old/ref pass, advantages, PPO
  update, optimiser step) with the plain-torch backend and with DeepSpeed ZeRO-0 on CPU;
  tokens/s over all tokens and over response (trained) tokens.

    OMP_NUM_THREADS=2 .venv/bin/python bench/learner_throughput.py           # table + json
    .venv/bin/python bench/learner_throughput.py --repeats 1 --shapes 4x32+8 --out /tmp/x.json  # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import socket
import tempfile
import time
from pathlib import Path

import torch

from deploy.laptop.tiny_model import TinyModelConfig, build_tiny_model
from learner.config import LearnerConfig
from learner.types import TrainRow
from learner.worker import LearnerWorker

DEFAULT_OUT = Path(__file__).parent / "results" / "learner_throughput.json"
CORPUS = [
    "You arrive at countertop 1. On the countertop 1, you see a mug 1, a knife 2, and a apple 3.",
    "Your task is to: heat some egg and put it in diningtable. <action>take egg 1 from fridge 1</action>",
] * 50


def synthetic_rows(
    num_rows: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0
) -> list[TrainRow]:
    """Groups of 4 trajectories, 2 turns each, half of them successful; fixed lengths."""
    rng = random.Random(seed)
    rows = []
    for i in range(num_rows):
        traj = i // 2
        rows.append(
            TrainRow(
                prompt_ids=tuple(rng.randrange(3, vocab) for _ in range(prompt_len)),
                response_ids=tuple(rng.randrange(3, vocab) for _ in range(response_len)),
                sampler_logprobs=(-1.0,) * response_len,
                group_id=f"g{traj // 4}",
                traj_id=f"t{traj}",
                step_idx=i % 2,
                episode_score=10.0 * (traj % 2),
                action_valid=True,
            )
        )
    return rows


def time_fwd_bwd(model_dir: Path, rows: int, seq_len: int, repeats: int) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.randint(3, model.config.vocab_size, (rows, seq_len))
    best = float("inf")
    for _ in range(repeats + 1):  # first call warms up
        t0 = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)
        best = min(best, time.perf_counter() - t0)
    return rows * seq_len / best


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def time_train_step(model_dir: Path, rows: list[TrainRow], *, use_deepspeed: bool, repeats: int) -> float:
    cfg = LearnerConfig(lr=3e-5, use_deepspeed=use_deepspeed, micro_batch_rows=8, kl_coef=0.01)
    worker = LearnerWorker(cfg, str(model_dir), master_port=free_port())
    best = float("inf")
    for _ in range(repeats + 1):
        best = min(best, worker.train_step(rows).seconds.total_s)
    return best


def parse_shape(text: str) -> tuple[int, int, int]:
    rows, rest = text.split("x")
    prompt, response = rest.split("+")
    return int(rows), int(prompt), int(response)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shapes", nargs="+", default=["16x256+32", "32x128+64"], help="ROWSxPROMPT+RESPONSE"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed repeats after one warm-up (best is kept)"
    )
    parser.add_argument("--no-deepspeed", action="store_true", help="skip the DeepSpeed train_step rows")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()

    tiny = TinyModelConfig()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model", CORPUS, tiny)
        vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        for shape in args.shapes:
            num_rows, prompt_len, response_len = parse_shape(shape)
            seq = prompt_len + response_len
            rows = synthetic_rows(num_rows, prompt_len, response_len, vocab)
            entry = {"rows": num_rows, "prompt_len": prompt_len, "response_len": response_len}
            entry["fwd_bwd_tokens_per_s"] = time_fwd_bwd(model_dir, num_rows, seq, args.repeats)
            for name, use_ds in [("torch", False), ("deepspeed_zero0", True)]:
                if use_ds and args.no_deepspeed:
                    continue
                seconds = time_train_step(model_dir, rows, use_deepspeed=use_ds, repeats=args.repeats)
                entry[f"train_step_{name}_s"] = seconds
                entry[f"train_step_{name}_tokens_per_s"] = num_rows * seq / seconds
                entry[f"train_step_{name}_response_tokens_per_s"] = num_rows * response_len / seconds
            results.append(entry)

    print(
        f"{'shape':>14} {'fwd+bwd tok/s':>14} {'torch step s':>13} {'torch tok/s':>12} {'ds step s':>10} {'ds tok/s':>10}"
    )
    for e in results:
        shape = f"{e['rows']}x{e['prompt_len']}+{e['response_len']}"
        ds_s = e.get("train_step_deepspeed_zero0_s", float("nan"))
        ds_tps = e.get("train_step_deepspeed_zero0_tokens_per_s", float("nan"))
        print(
            f"{shape:>14} {e['fwd_bwd_tokens_per_s']:>14.0f} {e['train_step_torch_s']:>13.3f} "
            f"{e['train_step_torch_tokens_per_s']:>12.0f} {ds_s:>10.3f} {ds_tps:>10.0f}"
        )
    report = {
        "model": tiny.model_dump(),
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],  # other processes on the machine skew the numbers
        "machine": platform.machine(),
        "torch": torch.__version__,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
