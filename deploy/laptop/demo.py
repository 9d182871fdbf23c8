"""`make demo`: the whole laptop pipeline on local Ray, with success on a fixed valid_unseen set at
three points: random init, after the SFT cold start, after GRPO. The last line printed is
`demo success rate (valid_unseen): X.XXX -> Y.YYY` (X after SFT, Y after RL), i.e. what RL added.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from deploy.config import TrainConfig
from deploy.evaluation import EvalResult, paired_difference
from deploy.plots import save_figure
from deploy.runner import console, print_eval, run_eval_command, run_training


def _with(cfg: TrainConfig, **sections) -> TrainConfig:
    """Copy with some sections' fields replaced, re-validated."""
    tree = cfg.model_dump()
    for section, values in sections.items():
        tree[section].update(values)
    return TrainConfig.model_validate(tree)


def _plot(points: list[tuple[str, EvalResult]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    names = [n for n, _ in points]
    ax.bar(names, [r.avg_at_k for _, r in points], yerr=[r.avg_at_k_se for _, r in points], capsize=6,
           color=["#bbbbbb", "#6a9fd4", "#d4766a"][: len(points)])
    for i, (_, r) in enumerate(points):
        ax.text(i, r.avg_at_k + r.avg_at_k_se + 0.01, f"{r.avg_at_k:.3f}", ha="center", fontsize=9)
    r0 = points[0][1]
    ax.set_ylabel(f"Avg@{r0.k} success ({r0.split}, {r0.num_tasks} tasks)")
    ax.set_ylim(0, 1)
    ax.set_title("embedded demo: success on fixed unseen tasks (± s.e.)", fontsize=10)
    return save_figure(fig, out)


def run_demo(cfg: TrainConfig, out: Path) -> dict:
    from deploy.laptop.sft import build_model_from_env, run_sft

    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    console.rule("[bold]1/5 build the tiny model (tokenizer + random init)")
    base = build_model_from_env(cfg, out / "base")
    console.rule("[bold]2/5 evaluate the random-init policy")
    eval_cfg = _with(cfg, run={"output_dir": str(out)})
    (r_init,) = run_eval_command(eval_cfg, str(base), label="random_init")
    console.rule("[bold]3/5 SFT cold start on expert demonstrations")
    sft_dir = run_sft(cfg, str(base), out / "sft")
    console.rule("[bold]4/5 evaluate the SFT policy")
    (r_sft,) = run_eval_command(eval_cfg, str(sft_dir), label="after_sft")
    console.rule("[bold]5/5 GRPO on local Ray (vLLM engines, DeepSpeed learner, env actors)")
    rl_cfg = _with(cfg, model={"path": str(sft_dir)}, eval={"at_end": True})
    run_dir = run_training(rl_cfg)
    final = max((run_dir / "eval").glob("step_*.json"))
    r_rl = EvalResult.model_validate_json(final.read_text())
    print_eval(r_rl)
    points = [("random init", r_init), ("after SFT", r_sft), ("after RL", r_rl)]
    plot = _plot(points, out / "plots" / "demo_success.png")
    gain = paired_difference(r_sft, r_rl)
    summary = {name: r.model_dump() for name, r in points}
    summary["rl_gain_paired"] = gain.model_dump()
    summary["minutes"] = (time.perf_counter() - start) / 60
    (out / "demo_summary.json").write_text(json.dumps(summary, indent=2))
    console.print(f"plot: {plot}   summary: {out / 'demo_summary.json'}   total {summary['minutes']:.1f} min")
    for name, r in points:
        console.print(f"  {name:<12} Avg@{r.k} = {r.avg_at_k:.3f} ± {r.avg_at_k_se:.3f}   Pass@{r.k} = {r.pass_at_k:.3f}")
    console.print(f"  RL gain over SFT (paired over the same {gain.num_tasks} tasks): "
                  f"{gain.mean:+.3f} ± {gain.se:.3f} s.e.")
    print(f"demo success rate ({r_rl.split}): {r_sft.avg_at_k:.3f} -> {r_rl.avg_at_k:.3f}", flush=True)
    return summary
