"""The tiny model's cold start: build it from environment text, then supervised fine-tuning on
handcoded-expert trajectories rendered in EXACTLY the agent's prompt format (same templates, same
history window, same chat template, response = "<action>{a}</action>" + EOS).

The tiny model has no language prior, so this is its only source of competence before RL; it is
labelled as such everywhere it is reported. Plain torch (one process): it is a data-prep step,
not part of the distributed RL loop.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

from deploy.config import TrainConfig
from deploy.config_sections import SFTConfig
from deploy.laptop.tiny_model import build_tiny_model
from deploy.progress import StepProgress
from envs.config import EnvConfig
from envs.registry import make_env
from envs.tasks import sample_tasks
from envs.types import TaskSpec
from rollout_workers.config import RolloutConfig
from rollout_workers.env_profiles import rollout_profile
from rollout_workers.parsing import action_choice
from rollout_workers.prompts import render_prompt_ids

EXTRA_KINDS = ("teacher", "skill", "proposer")
"""Context-literate SFT turn families (`deploy.testbed`), each with an `sft.<kind>_fraction` of all examples."""


@dataclass(frozen=True)
class ExpertTurn:
    observation: str
    admissible: tuple[str, ...]
    action: str


def expert_episodes(env_cfg: EnvConfig, tasks: list[TaskSpec]) -> list[list[ExpertTurn]]:
    """Play the handcoded expert on each task; only won episodes are kept (all, by construction)."""
    return [episode for _, episode in won_expert_episodes(env_cfg, tasks)]


def won_expert_episodes(env_cfg: EnvConfig, tasks: list[TaskSpec]) -> list[tuple[TaskSpec, list[ExpertTurn]]]:
    """(task, expert episode) for each task the expert wins (all, unless env.max_steps cuts it short)."""
    env = make_env(env_cfg)
    episodes = []
    for task in tasks:
        obs, info = env.reset(options={"task": task})
        turns, done, won = [], False, False
        while not done:
            action = env.expert_action()
            turns.append(ExpertTurn(obs, tuple(info["admissible_commands"]), action))
            obs, _, won, truncated, info = env.step(action)
            done = won or truncated
        if won:
            episodes.append((task, turns))
    return episodes


def _messages(episode: list[ExpertTurn], rollout_cfg: RolloutConfig, env: str = "alfworld") -> list[tuple[str, str]]:
    """(user message, assistant response) per turn, exactly as the rollout loop renders them (the
    env's template and task line, `rollout_workers.env_profiles`; the embedded envs' reset
    observations always show the instruction)."""
    profile = rollout_profile(env)
    task_text = profile.instruction(episode[0].observation)
    history: list[tuple[str, str]] = []
    out = []
    for turn in episode:
        message = profile.render_message(
            task=task_text, current_observation=turn.observation, admissible_actions=turn.admissible,
            history=history, history_length=rollout_cfg.history_length, use_think=rollout_cfg.use_think)
        out.append((message, action_choice(turn.action)))
        history.append((turn.observation, turn.action))
    return out


def demo_rows(tokenizer, rollout_cfg: RolloutConfig, episodes: list[list[ExpertTurn]],
              env: str = "alfworld") -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids incl. EOS) per expert turn, token-exact with the rollout loop."""
    if rollout_cfg.use_think:
        raise ValueError("SFT demonstrations carry no reasoning text: set rollout.use_think=false")
    rows = []
    for episode in episodes:
        for message, response in _messages(episode, rollout_cfg, env):
            prompt = render_prompt_ids(tokenizer, message)
            rows.append((prompt, tokenizer.encode(response, add_special_tokens=False) + [tokenizer.eos_token_id]))
    return rows


def build_model_from_env(cfg: TrainConfig, out: str | Path, *, num_episodes: int = 200,
                         extra_corpus: list[str] | None = None) -> Path:
    """Tokenizer corpus = chat-rendered expert episodes (train split) + every feedback form, plus
    `extra_corpus` (the testbed adds teacher / skill / proposer prompt text so their tokens merge)."""
    tasks = sample_tasks(cfg.env, "train", num_episodes, seed=cfg.run.seed + 1_000_003)
    corpus = []
    for episode in expert_episodes(cfg.env, tasks):
        for message, response in _messages(episode, cfg.rollout, cfg.env.name):
            corpus.append(f"<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n{response}<|im_end|>\n")
    corpus.append("Nothing happens.")
    corpus.extend(extra_corpus or ())
    return build_tiny_model(out, corpus, cfg.sft.tiny_model)


def extra_turns(cfg: TrainConfig, tokenizer, episodes, tasks, num_plain: int, rng: random.Random) -> list:
    """The context-literate turns (`deploy.testbed`) to mix with `num_plain` plain rows:
    kind k gets round(f_k * N) examples, N = num_plain / (1 - sum f) the total, so each
    `sft.<k>_fraction` is its share of all SFT examples. None when every fraction is 0."""
    fractions = {k: getattr(cfg.sft, f"{k}_fraction", 0.0) for k in EXTRA_KINDS}
    total = num_plain / (1.0 - sum(fractions.values()))
    out = []
    for kind, fraction in fractions.items():
        n = round(fraction * total)
        if n <= 0:
            continue
        if kind == "teacher":
            from deploy.testbed.teacher_data import teacher_turns as build
        else:
            try:
                from deploy.testbed import skill_data
            except ImportError as err:
                raise ValueError(f"sft.{kind}_fraction={fraction} needs deploy/testbed/skill_data.py, which is "
                                 f"missing ({err}); set sft.{kind}_fraction=0") from None
            build = getattr(skill_data, f"{kind}_turns")
        out.extend(build(cfg, tokenizer, episodes, tasks, rng, n=n))
    return out


def _batches(rows, batch_rows: int, rng: random.Random):
    """Length-bucketed shuffled batches (similar lengths together -> little padding)."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]) + len(rows[i][1]) + rng.random())
    chunks = [order[i : i + batch_rows] for i in range(0, len(order), batch_rows)]
    rng.shuffle(chunks)
    return chunks


def _collate(rows, idx, pad_id: int):
    import torch

    seqs = [rows[i][0] + rows[i][1] for i in idx]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
    labels = torch.full((len(idx), width), -100, dtype=torch.long)
    mask = torch.zeros((len(idx), width), dtype=torch.long)
    for r, i in enumerate(idx):
        p, s = len(rows[i][0]), seqs[r]
        ids[r, : len(s)] = torch.tensor(s)
        mask[r, : len(s)] = 1
        labels[r, p : len(s)] = torch.tensor(rows[i][1])
    return ids, mask, labels


def _response_loss(model, ids, mask, labels):
    import torch.nn.functional as F

    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)


class SFTTimeCapReached(RuntimeError):
    """`sft.minutes` (a safety cap, off by default) ran out before the last planned step."""


def planned_steps(sft: SFTConfig, num_rows: int) -> int:
    """Optimiser steps of an SFT run: `epochs` passes in `batch_rows`-row batches, at most `max_steps`."""
    steps = sft.epochs * math.ceil(num_rows / sft.batch_rows)
    return steps if sft.max_steps is None else min(steps, sft.max_steps)


def _sft_rows(cfg: TrainConfig, tokenizer, num_tasks: int, max_len: int) -> tuple[list, dict[str, int], int]:
    """(rows, rows per kind, extra turns dropped as longer than the model's context)."""
    s = cfg.sft
    won = won_expert_episodes(cfg.env, sample_tasks(cfg.env, "train", num_tasks, seed=s.seed))
    episodes = [episode for _, episode in won]
    rows = demo_rows(tokenizer, cfg.rollout, episodes, cfg.env.name)
    kinds = {"plain": len(rows)}
    extra = extra_turns(cfg, tokenizer, episodes, [task for task, _ in won], len(rows), random.Random(s.seed + 1))
    too_long = sum(len(t.prompt_ids) + len(t.target_ids) > max_len for t in extra)
    for turn in extra:
        if len(turn.prompt_ids) + len(turn.target_ids) <= max_len:  # longer rows cannot be scored at all
            rows.append((list(turn.prompt_ids), list(turn.target_ids)))
            kinds[turn.kind] = kinds.get(turn.kind, 0) + 1
    return rows, kinds, too_long


def _check_time_cap(minutes: float | None, start: float, done: int, total: int) -> None:
    if minutes is not None and done < total and time.perf_counter() - start > minutes * 60:
        raise SFTTimeCapReached(
            f"sft reached its {minutes:g}-minute safety cap (sft.minutes) after {done} of {total} steps and saved "
            "nothing, since weights cut short by the clock depend on the machine's speed and load: raise "
            "sft.minutes or unset it (off by default) so that every step runs")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def run_sft(cfg: TrainConfig, model_path: str, out: str | Path, *, num_tasks: int | None = None,
            minutes: float | None = None) -> Path:
    """Fine-tune `model_path` on expert demos for `planned_steps` optimiser steps; save to `out`.
    `minutes` (default `sft.minutes`, off) is a safety cap: reaching it raises SFTTimeCapReached
    and saves nothing. `out/sft_summary.json` is written last: its presence marks a finished run."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    s = cfg.sft
    num_tasks, minutes = num_tasks or s.num_tasks, minutes if minutes is not None else s.minutes
    torch.manual_seed(s.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    rows, kinds, too_long = _sft_rows(cfg, tokenizer, num_tasks, model.config.max_position_embeddings)
    rng = random.Random(s.seed)
    total = planned_steps(s, len(rows))
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 20) * max(0.1, 0.5 * (1 + math.cos(math.pi * min(i / total, 1.0)))))
    model.train()
    batches = itertools.islice(((epoch, idx) for epoch in range(s.epochs) for idx in _batches(rows, s.batch_rows, rng)),
                               total)
    start, done_steps, tokens, log = time.perf_counter(), 0, 0, []
    with StepProgress("sft", total, every=max(1, total // 20)) as bar:
        for epoch, idx in batches:
            ids, mask, labels = _collate(rows, idx, tokenizer.pad_token_id)
            loss = _response_loss(model, ids, mask, labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            done_steps, tokens, value = done_steps + 1, tokens + int(mask.sum()), loss.item()
            log.append({"step": done_steps, "epoch": epoch, "loss": value})
            bar.advance(f"loss {value:.4f}  {tokens / (time.perf_counter() - start):.0f} tok/s")
            _check_time_cap(minutes, start, done_steps, total)
    out = Path(out)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    elapsed = time.perf_counter() - start
    summary = {"rows": len(rows), "rows_by_kind": kinds, "dropped_longer_than_model": too_long, "episodes": num_tasks,
               "optimizer_steps": done_steps, "planned_steps": total,
               "stopped_by": "max_steps" if total == s.max_steps else "epochs",
               "tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / max(elapsed, 1e-9),
               "final_loss": log[-1]["loss"] if log else None,
               "note": "cold start: the tiny model has no language prior; SFT on expert demos is its only warm start"}
    (out / "sft_log.jsonl").write_text("\n".join(json.dumps(r) for r in log) + "\n")
    _write_atomic(out / "sft_summary.json", json.dumps(summary, indent=2))
    return out
