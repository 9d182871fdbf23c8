"""`deploy testbed build`: tokenizer + tiny model + the context-literate SFT cold start.

Stages (each timed in DIR/build.json):
1. a bootstrap tokenizer on the plain corpus (`deploy.laptop.sft.build_model_from_env`), only
   to render a sample of teacher / skill / proposer turns, which are decoded back to text;
2. the real tokenizer and random-init model on the plain corpus PLUS that text, so the blocks'
   words ("Reference step", "Suggested next action", skill wording) become merged tokens rather
   than byte soup (byte-level BPE decodes losslessly, so the text is exactly what was rendered);
3. SFT (`deploy.laptop.sft.run_sft`) on plain expert turns mixed with the context-literate turns
   by `sft.*_fraction`, for the configured steps (`sft.epochs`, `sft.max_steps`): the model does
   not depend on the machine's speed. `minutes` is an optional cap on the SFT that fails the build
   rather than cutting it short.
Writes DIR/base (the random-init model), DIR/model (the cold-started HF dir), DIR/config.resolved.json
(loadable by `load_config`, so `testbed abilities --model DIR` uses the same env and prompts) and
DIR/build.json (config, fractions, stage seconds, rows per kind, git commit).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import time
from pathlib import Path

from rich.console import Console

from deploy.config import TrainConfig
from deploy.config_sections import SFTConfig
from deploy.laptop.sft import (
    EXTRA_KINDS,
    build_model_from_env,
    demo_rows,
    extra_turns,
    run_sft,
    won_expert_episodes,
)
from envs.tasks import sample_tasks

TESTBED_SFT = {"teacher_fraction": 0.2, "skill_fraction": 0.15, "proposer_fraction": 0.1, "epochs": 6}
"""The testbed's default mix (plain turns stay 55%) and epochs (about 14 minutes of SFT on an idle
2-core machine; a loaded one takes longer, to the same weights); applied before the user's
--set overrides, and only for the keys `SFTConfig` has."""
CORPUS_TASKS = 40
"""Train tasks whose extra turns are rendered into the tokenizer corpus (a sample is enough for BPE)."""


UNISKILL_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "demo_uniskill_cpu.yaml"
"""The laptop UniSkill runs' config: its `uniskill.proposer` section shapes the proposer turns."""


def testbed_overrides() -> list[str]:
    """Overrides applied before the user's --set: `TESTBED_SFT` (keys the config knows only), and the
    laptop UniSkill runs' `uniskill.proposer` settings
    (prompt budget, trajectory excerpt length, max tokens, constrained op), so the proposer turns
    and the proposer measurement see the prompts the UniSkill grid's runs render."""
    from deploy.config_loading import read_tree

    proposer = read_tree(UNISKILL_CONFIG).get("uniskill", {}).get("proposer", {})
    return ([f"sft.{k}={v}" for k, v in TESTBED_SFT.items() if k in SFTConfig.model_fields]
            + [f"uniskill.proposer.{k}={json.dumps(v)}" for k, v in proposer.items()])


def fractions(cfg: TrainConfig) -> dict[str, float]:
    return {f"{k}_fraction": getattr(cfg.sft, f"{k}_fraction", 0.0) for k in EXTRA_KINDS}


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def extra_corpus(cfg: TrainConfig, boot_dir: Path, *, num_tasks: int = CORPUS_TASKS) -> list[str]:
    """Chat text of the context-literate turns of `num_tasks` corpus tasks, rendered with the
    bootstrap tokenizer and decoded back (empty when every fraction is 0)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(boot_dir)
    won = won_expert_episodes(cfg.env, sample_tasks(cfg.env, "train", num_tasks, seed=cfg.run.seed + 1_000_003))
    tasks, episodes = [task for task, _ in won], [episode for _, episode in won]
    num_plain = len(demo_rows(tokenizer, cfg.rollout, episodes, cfg.env.name))
    turns = extra_turns(cfg, tokenizer, episodes, tasks, num_plain, random.Random(cfg.sft.seed + 2))
    return [tokenizer.decode(list(t.prompt_ids) + list(t.target_ids)) for t in turns]


def build_testbed(cfg: TrainConfig, out: str | Path, *, minutes: float | None = None, corpus_episodes: int = 200,
                  console: Console | None = None) -> dict:
    """Stages 1-3 above; `minutes` caps the SFT (None: `sft.minutes`, off by default). Returns the
    build.json record."""
    console = console or Console(stderr=True)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    seconds: dict[str, float] = {}

    console.print(f"[bold]testbed build[/] env={cfg.env.name} fractions={fractions(cfg)}")
    t = time.perf_counter()
    boot = build_model_from_env(cfg, out / "boot", num_episodes=corpus_episodes)
    corpus = extra_corpus(cfg, boot)
    shutil.rmtree(boot, ignore_errors=True)
    seconds["extra_corpus"] = time.perf_counter() - t
    console.print(f"  {len(corpus)} context-literate turns rendered into the tokenizer corpus "
                  f"({seconds['extra_corpus']:.0f}s)")

    t = time.perf_counter()
    base = build_model_from_env(cfg, out / "base", num_episodes=corpus_episodes, extra_corpus=corpus)
    seconds["tokenizer_and_model"] = time.perf_counter() - t
    console.print(f"  tokenizer + model -> {base} ({seconds['tokenizer_and_model']:.0f}s)")

    t = time.perf_counter()
    model = run_sft(cfg, str(base), out / "model", minutes=minutes)
    seconds["sft"] = time.perf_counter() - t
    seconds["total"] = time.perf_counter() - start
    summary = json.loads((model / "sft_summary.json").read_text())
    record = {"model": str(model), "env": cfg.env.name, "fractions": fractions(cfg), "sft_minutes_cap": minutes,
              "seconds": seconds, "rows_by_kind": summary.get("rows_by_kind"),
              "sft_final_loss": summary.get("final_loss"), "sft_optimizer_steps": summary.get("optimizer_steps"),
              "corpus_extra_turns": len(corpus), "load_average_at_end": list(os.getloadavg()), "commit": git_commit(),
              "config": cfg.model_dump(mode="json")}
    (out / "config.resolved.json").write_text(cfg.model_dump_json(indent=2))
    (out / "build.json").write_text(json.dumps(record, indent=2))
    console.print(f"[green]testbed built in {seconds['total'] / 60:.1f} min[/]: {out / 'build.json'}")
    return record
