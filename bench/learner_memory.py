"""Learner peak memory of one `train_step` at a scaled shape with the real 151,936-token vocabulary.

A random-init Qwen2-shaped model (default hidden 256, 2 layers, tied embeddings, vocabulary
151,936) trains on ROWS rows of PROMPT + RESPONSE tokens (default 4 x 2,048 + 512), plain-torch
backend, fp32, no reference model (kl_coef 0), old log-probs recomputed (the no-grad pass runs).
Two variants, each in a fresh subprocess, on identical rows and weights:

- baseline: the learner as it was before its memory settings: every row of the step in one micro-batch
  (micro_batch_rows = ROWS), no gradient checkpointing, and the full-vocabulary fp32 logits of
  every response position materialised (`response_logits` + `logprobs_from_logits` /
  `entropy_of_logits`, patched in for the chunked scorer);
- scaled: gradient_checkpointing, chunked log-probs (logprob_chunk_size), token-budget
  micro-batches (max_tokens_per_micro_batch).

Memory is the process's peak resident set size (Linux VmHWM) during `train_step`: the peak is
reset (`echo 5 > /proc/self/clear_refs`) right before the step, and the figure reported is that
peak minus the resident size just before the step (model, tokenizer and Python are excluded;
gradients and the AdamW state created by the step are included). The loss and grad norm of the
two variants must agree to 1e-5.

    .venv/bin/python bench/learner_memory.py                       # table + json, ~2 min
    .venv/bin/python bench/learner_memory.py --rows 1 --prompt 256 --response 64 --out /tmp/m.json  # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

DEFAULT_OUT = Path(__file__).parent / "results" / "learner_memory.json"
QWEN_VOCAB = 151_936
KNOBS = ("micro_batch_rows", "gradient_checkpointing", "logprob_chunk_size", "max_tokens_per_micro_batch")
CORPUS = ["You arrive at countertop 1. On the countertop 1, you see a mug 1. <action>take mug 1</action>"] * 20


def build_model(out: Path, *, vocab: int, hidden: int, layers: int) -> Path:
    """The laptop tokenizer with a Qwen2 model of the given shape and vocabulary (random init)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from deploy.laptop.tiny_model import TinyModelConfig, build_tiny_model

    build_tiny_model(out, CORPUS, TinyModelConfig(vocab_size=300, hidden_size=64, num_layers=1, num_heads=1))
    base = json.loads((out / "config.json").read_text())
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=max(hidden // 64, 1), num_key_value_heads=1, max_position_embeddings=8192,
        tie_word_embeddings=True, bos_token_id=base["bos_token_id"], eos_token_id=base["eos_token_id"],
        pad_token_id=base["pad_token_id"],
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(out, safe_serialization=True)
    return out


def synthetic_rows(num_rows: int, prompt_len: int, response_len: int, vocab: int):
    """Groups of two rows, one winner each; random token ids over the whole vocabulary. Response
    lengths step down by response_len / (2 num_rows) per row (the first row is the longest), so
    the token-mean loss at theta_old is not zero by symmetry."""
    from learner.types import TrainRow

    gen = torch.Generator().manual_seed(0)
    rows = []
    for i in range(num_rows):
        n = response_len - i * response_len // (2 * num_rows)
        rows.append(TrainRow(
            prompt_ids=tuple(torch.randint(3, vocab, (prompt_len,), generator=gen).tolist()),
            response_ids=tuple(torch.randint(3, vocab, (n,), generator=gen).tolist()),
            sampler_logprobs=(-12.0,) * n,
            group_id=f"g{i // 2}", traj_id=f"t{i}", step_idx=0, episode_score=float(i % 2), action_valid=True,
        ))  # fmt: skip
    return rows


def full_vocabulary_scores(model, batch, *, temperature, with_entropy=False, chunk_size=None):
    """The pre-issue-11 scorer: every response position's fp32 logits at once."""
    from learner.logprobs import ResponseScores, entropy_of_logits, logprobs_from_logits, response_logits

    logits = response_logits(model, batch, temperature=temperature)
    device = logits.device
    allowed = None if batch.allowed_ids is None else batch.allowed_ids.to(device)
    mask = batch.response_mask.to(device)
    logp = logprobs_from_logits(logits, batch.responses.to(device), allowed) * mask
    entropy = entropy_of_logits(logits, allowed) * mask if with_entropy else None
    return ResponseScores(logp=logp, entropy=entropy)


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def run_variant(args: argparse.Namespace) -> dict:
    """Child process: one train_step of one variant; returns its figures."""
    import learner.worker as worker_module
    from learner.config import LearnerConfig

    torch.set_num_threads(args.threads)
    scaled = args.variant == "scaled"
    cfg = LearnerConfig(
        lr=1e-5, use_deepspeed=False, kl_coef=0.0, shuffle_rows=False, seed=0,
        micro_batch_rows=args.rows,
        gradient_checkpointing=scaled,
        logprob_chunk_size=args.chunk,
        max_tokens_per_micro_batch=args.budget if scaled else None,
    )  # fmt: skip
    if not scaled:
        worker_module.response_logprobs = full_vocabulary_scores
    vocab = json.loads((Path(args.model_dir) / "config.json").read_text())["vocab_size"]
    rows = synthetic_rows(args.rows, args.prompt, args.response, vocab)
    worker = worker_module.LearnerWorker(cfg, args.model_dir)
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before_kb = _status_kb("VmRSS")
    t0 = time.perf_counter()
    metrics = worker.train_step(rows)
    seconds = time.perf_counter() - t0
    peak_kb = _status_kb("VmHWM")
    return {
        "variant": args.variant,
        "config": {k: getattr(cfg, k) for k in KNOBS} | {"full_vocabulary_logits": not scaled},
        "rss_before_step_mb": before_kb / 1024,
        "peak_rss_mb": peak_kb / 1024,
        "step_peak_mb": (peak_kb - before_kb) / 1024,
        "loss": metrics.loss,
        "grad_norm": metrics.grad_norm,
        "entropy": metrics.entropy,
        "step_seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--response", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=QWEN_VOCAB)
    parser.add_argument("--chunk", type=int, default=256, help="scaled: logprob_chunk_size")
    parser.add_argument("--budget", type=int, default=2560, help="scaled: max_tokens_per_micro_batch")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--variant", choices=["baseline", "scaled"], help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:  # child
        Path(args.child_out).write_text(json.dumps(run_variant(args)))
        return

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(Path(tmp) / "model", vocab=args.vocab, hidden=args.hidden, layers=args.layers)
        for variant in ("baseline", "scaled"):
            child_out = Path(tmp) / f"{variant}.json"
            forwarded = [f"--{k}={getattr(args, k)}" for k in (
                "rows", "prompt", "response", "chunk", "budget", "threads"
            )]  # fmt: skip
            cmd = [sys.executable, __file__, *forwarded, f"--variant={variant}", f"--model-dir={model_dir}",
                   f"--child-out={child_out}"]  # fmt: skip
            subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
            results[variant] = json.loads(child_out.read_text())

    base, scaled = results["baseline"], results["scaled"]
    loss_diff = abs(base["loss"] - scaled["loss"])
    print(f"{'variant':>9} {'step peak MB':>13} {'peak RSS MB':>12} {'loss':>12} {'grad norm':>11} {'step s':>8}")
    for r in (base, scaled):
        print(f"{r['variant']:>9} {r['step_peak_mb']:>13.0f} {r['peak_rss_mb']:>12.0f} {r['loss']:>12.8f} "
              f"{r['grad_norm']:>11.6f} {r['step_seconds']:>8.1f}")  # fmt: skip
    ratio = base["step_peak_mb"] / max(scaled["step_peak_mb"], 1e-9)
    report = {
        "shape": {k: getattr(args, k) for k in ("rows", "prompt", "response", "hidden", "layers", "vocab")},
        "measure": "VmHWM - VmRSS around one train_step (peak reset via /proc/self/clear_refs), fresh process each",
        "torch_threads": args.threads,
        "cpu_count": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "machine": platform.machine(),
        "torch": torch.__version__,
        "results": results,
        "ratio": ratio,
        "loss_abs_diff": loss_diff,
        "grad_norm_rel_diff": abs(base["grad_norm"] - scaled["grad_norm"]) / max(abs(base["grad_norm"]), 1e-12),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}; |loss difference| {loss_diff:.2e}")
    if loss_diff > 1e-5:
        raise SystemExit(f"loss differs by {loss_diff:.2e} > 1e-5 between baseline and scaled")
    print(f"learner peak memory baseline vs scaled: {ratio:.1f}x lower")


if __name__ == "__main__":
    main()
