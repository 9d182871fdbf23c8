"""`python -m deploy ...`: the typer CLI. Heavy imports (torch, ray, vllm, deepspeed) happen inside
the commands so `--help` stays instant.

User errors (`deploy.errors.UserError`, which ConfigError and GridError are, and click's usage
errors) are printed by `DeployGroup` as one line on stderr with exit code 2; `--verbose` (on any
command, or before it: `python -m deploy --verbose ...`) or AGENTRL_VERBOSE=1 adds the traceback."""

from __future__ import annotations

import os
import shlex
import sys
import traceback
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup

from deploy.cli_doctor import doctor, require_preflight
from deploy.cli_env import env_app
from deploy.cli_experiment import experiment_app
from deploy.cli_skills import skills_app
from deploy.cli_testbed import DEFAULT_CONFIG as LAPTOP_CONFIG
from deploy.cli_testbed import testbed_app
from deploy.errors import UserError

try:  # typer >= 0.2x carries its own copy of click
    from typer._click.exceptions import NoArgsIsHelpError, UsageError
except ImportError:  # pragma: no cover
    from click.exceptions import NoArgsIsHelpError, UsageError

VERBOSE_ENV = "AGENTRL_VERBOSE"


def _fail(message: str, verbose: bool) -> NoReturn:
    """One line on stderr, exit 2; the traceback of the exception being handled first if verbose."""
    if verbose:
        traceback.print_exc()
    typer.secho("error: " + " ".join(message.split()), fg="red", err=True)
    raise typer.Exit(2)


class DeployGroup(TyperGroup):
    """The root command: turns a user error raised anywhere below it into `_fail`'s one line."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        ctx.meta["deploy.verbose"] = "--verbose" in args or os.environ.get(VERBOSE_ENV) == "1"
        return super().parse_args(ctx, args)

    def invoke(self, ctx: typer.Context) -> Any:
        verbose = ctx.meta.get("deploy.verbose", False)
        try:
            return super().invoke(ctx)
        except UserError as err:
            _fail(str(err), verbose)
        except NoArgsIsHelpError:
            raise
        except UsageError as err:
            where = f" (`{err.ctx.command_path} --help` lists the options)" if err.ctx is not None else ""
            _fail(err.format_message() + where, verbose)


app = typer.Typer(cls=DeployGroup, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Ray-distributed RL for LLM agents on multi-turn text environments.")


@app.callback()
def _root(verbose: Annotated[bool, typer.Option(
        "--verbose", help=f"print the traceback of a user error too (or set {VERBOSE_ENV}=1)")] = False) -> None:
    """Ray-distributed RL for LLM agents on multi-turn text environments."""
    # --verbose is read by DeployGroup.parse_args; declared here so that it is accepted before any command


app.add_typer(env_app, name="env")
app.add_typer(skills_app, name="skills")
app.add_typer(testbed_app, name="testbed")
app.add_typer(experiment_app, name="experiment")
app.command("doctor")(doctor)

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="YAML config (or a saved config.resolved.json)")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="dotted override key=value; repeatable")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", help="print the engines' and frameworks' logs (vLLM, torch, DeepSpeed, Ray) on the console instead of RUN/logs/, and a user error's traceback")]


def _load(config: Path | None, overrides: list[str] | None):
    from deploy.config_loading import load_config

    return load_config(config, overrides or [])


def _check_model(path: str) -> None:
    from deploy.config_loading import resolve_model_path

    resolve_model_path(path)


def _options(**values: object) -> list[str]:
    """`--set` overrides for the command-line options the user gave (None = not given), so an
    option's absence never overrides the config's value."""
    return [f"{key}={value}" for key, value in values.items() if value is not None]


def _route_logs(run_dir: Path | str, verbose: bool) -> None:
    """Engine and framework logs to RUN/logs/ (`deploy.logs`), unless --verbose."""
    from deploy.logs import route_logs

    log_dir = route_logs(run_dir, verbose=verbose)
    if log_dir is not None:
        typer.secho(f"engine and framework logs: {log_dir}/ (--verbose prints them here)", dim=True, err=True)


@app.command("validate-config")
def validate_config(config: ConfigOpt, set_: SetOpt = None) -> None:
    """Parse and validate a config; print the resolved tree."""
    cfg = _load(config, set_)
    typer.echo(cfg.model_dump_json(indent=2))


@app.command()
def train(config: ConfigOpt, set_: SetOpt = None,
          resume: Annotated[bool, typer.Option(help="continue from the latest checkpoint in run.output_dir")] = False,
          verbose: VerboseOpt = False) -> None:
    """Train with the configured method on a local or remote Ray cluster."""
    import signal

    from deploy.runner import check_run_dir, run_training

    cfg = _load(config, set_)
    _check_model(cfg.model.path)
    require_preflight(cfg)
    check_run_dir(cfg, resume)
    _route_logs(cfg.run.output_dir, verbose)
    # `ray job stop` and a plain `kill` send SIGTERM: unwind, so the actors and the bank's server stop.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        run_dir = run_training(cfg, resume=resume)
    except KeyboardInterrupt:
        _interrupted(Path(cfg.run.output_dir))
    if cfg.faults.enabled:
        import ray

        from deploy.faults import FaultRecord

        ray.shutdown()  # nothing of Ray's may print after the last line
        record = FaultRecord.load(run_dir)
        typer.echo(record.line() if record is not None else f"faults: {cfg.faults.kill} was never injected")


def _interrupted(run_dir: Path) -> NoReturn:
    """Ctrl-C during `train`: one line saying what was saved and how to continue; exit 130."""
    from deploy.trainer import latest_checkpoint

    args = sys.argv[1:] if "train" in sys.argv[1:] else ["train", "..."]
    again = "python -m deploy " + shlex.join([*args, *([] if "--resume" in args else ["--resume"])])
    ckpt = latest_checkpoint(run_dir)
    saved = (f"the last checkpoint is step {int(ckpt.name.removeprefix('step_'))} in {ckpt}" if ckpt is not None
             else f"no checkpoint yet in {run_dir}/checkpoints (run.checkpoint_every sets how often one is saved)")
    action = "continues from it" if ckpt is not None else "starts the run over"
    typer.secho(f"interrupted: {saved}; `{again}` {action}", fg="yellow", err=True)
    raise typer.Exit(130)


@app.command("eval")
def eval_(config: ConfigOpt, checkpoint: Annotated[Path, typer.Option(help="checkpoint dir (with hf/) or an HF model dir")],
          k: Annotated[int | None, typer.Option(help="samples per task (default: the config's eval.k)")] = None,
          set_: SetOpt = None,
          retrieval: Annotated[str | None, typer.Option(
              help="UniSkill run (--config RUN/config.resolved.json): 'on' fills the actor's skill slot from the "
                   "run's skill bank, 'off' leaves it empty; writes eval/eval-retrieval_<on|off>.json")] = None,
          verbose: VerboseOpt = False) -> None:
    """Evaluate a checkpoint on the fixed evaluation set (Avg@k, Pass@k, per task type)."""
    if retrieval not in (None, "on", "off"):
        raise UserError(f"--retrieval {retrieval!r}: use on or off")
    cfg = _load(config, [*(set_ or []), *_options(**{"eval.k": k})])
    model, adapter = _checkpoint_model(cfg, checkpoint)
    _check_model(str(model))
    _route_logs(cfg.run.output_dir, verbose)
    if retrieval is None:
        from deploy.runner import run_eval_command

        run_eval_command(cfg, str(model), adapter=None if adapter is None else str(adapter))
        return
    if adapter is not None:
        raise UserError(f"--retrieval evaluates an HF model; {checkpoint} holds a LoRA adapter only: pass the "
                        "checkpoint of a run with learner.lora.export_merged=true")
    from deploy.eval_skills import run_eval_with_retrieval

    run_eval_with_retrieval(cfg, str(model), retrieval=retrieval, label=f"eval-retrieval_{retrieval}")


def _checkpoint_model(cfg, checkpoint: Path) -> tuple[Path, Path | None]:
    """(HF model dir, peft adapter dir or None) that `eval --checkpoint` evaluates: a checkpoint's
    hf/ (the merged model under LoRA), else its adapter/ on the config's model.path, else an HF
    model dir or a peft adapter dir given directly."""
    if (checkpoint / "hf").is_dir():
        return checkpoint / "hf", None
    adapter = checkpoint / "adapter" if (checkpoint / "adapter").is_dir() else checkpoint
    if not (adapter / "adapter_config.json").is_file():
        return checkpoint, None
    if cfg.engine.lora_rank is None:
        raise UserError(f"{adapter} is a LoRA adapter, but the config's engines load none: set "
                        "learner.lora.enabled=true (and its rank) as in the run that trained it, or pass its "
                        "config.resolved.json")
    return Path(cfg.model.path), adapter


@app.command("build-tiny-model")
def build_tiny_model_cmd(
    out: Annotated[Path, typer.Option(help="output HF directory")] = Path("runs/tiny/base"),
    config: Annotated[Path | None, typer.Option("--config", "-c", help="config whose env section shapes the corpus")] = None,
    set_: SetOpt = None,
    num_episodes: Annotated[int, typer.Option(help="expert episodes rendered into the tokenizer corpus")] = 200,
) -> None:
    """Byte-level BPE tokenizer on environment/prompt text + random-init Qwen2 (no download)."""
    from deploy.laptop.sft import build_model_from_env

    cfg = _load(config, set_)
    path = build_model_from_env(cfg, out, num_episodes=num_episodes)
    typer.echo(f"tiny model written to {path}")


@app.command()
def sft(
    model: Annotated[Path, typer.Option(help="HF directory to warm-start")] = Path("runs/tiny/base"),
    out: Annotated[Path, typer.Option(help="output HF directory")] = Path("runs/tiny/sft"),
    config: Annotated[Path, typer.Option("--config", "-c", show_default="deploy/configs/demo_cpu.yaml", help=(
        "config whose env, rollout (prompt format) and sft sections shape the demonstrations; the default is "
        "the laptop demo's, whose prompt format smoke_cpu*.yaml and demo_cpu.yaml train with"))] = LAPTOP_CONFIG,
    set_: SetOpt = None,
    num_tasks: Annotated[int | None, typer.Option(help="train-split expert episodes (default: sft.num_tasks)")] = None,
    max_steps: Annotated[int | None, typer.Option(help="optimiser steps at most (default: sft.max_steps)")] = None,
    minutes: Annotated[float | None, typer.Option(
        help="wall-clock safety cap: SFT fails, saving nothing, when it is reached (default: sft.minutes, off)")] = None,
) -> None:
    """Cold start: supervised fine-tuning on expert trajectories in the agent's exact prompt format."""
    from deploy.laptop.sft import SFTTimeCapReached, run_sft

    cfg = _load(config, [*(set_ or []), *_options(**{"sft.num_tasks": num_tasks, "sft.max_steps": max_steps,
                                                       "sft.minutes": minutes})])
    if cfg.rollout.use_think:
        raise UserError(f"sft: rollout.use_think is true in {config}, but the expert demonstrations carry no "
                        "reasoning text: pass --set rollout.use_think=false (and train with it too)")
    _check_model(str(model))
    try:
        run_sft(cfg, str(model), out)
    except SFTTimeCapReached as err:
        raise UserError(str(err)) from err


@app.command()
def demo(out: Annotated[Path, typer.Option(help="demo output directory")] = Path("runs/demo"),
         config: Annotated[Path, typer.Option("--config", "-c", show_default="deploy/configs/demo_cpu.yaml")] = LAPTOP_CONFIG,
         set_: SetOpt = None, verbose: VerboseOpt = False) -> None:
    """Embedded demo: tiny model -> SFT -> eval -> GRPO on local Ray -> eval (valid_unseen)."""
    from deploy.laptop.demo import run_demo

    cfg = _load(config, [*(set_ or []), f"run.output_dir={out / 'rl'}"])
    _route_logs(out, verbose)
    run_demo(cfg, out)


analyze = typer.Typer(no_args_is_help=True, help="Analysis tools over finished runs (JSON + PNG under RUN/analysis).")
app.add_typer(analyze, name="analyze")
RunOpt = Annotated[Path, typer.Option("--run", help="a run directory (with trajectories/ and config.resolved.json)")]


def _require_trajectories(run: Path) -> None:
    if not run.is_dir():
        raise UserError(f"--run {run} is not a directory: pass a run directory (run.output_dir of a `train`)")
    if not list((run / "trajectories").glob("step_*.jsonl")):
        raise UserError(f"{run}/trajectories holds no step_*.jsonl: train with run.save_trajectories=true "
                        "(the default) to archive trajectories")


@analyze.command("replay-audit")
def replay_audit(run: RunOpt,
                 max_turns: Annotated[int | None, typer.Option(help="replay at most this many matched turns")] = None) -> None:
    """Coverage of each matcher and whether its matched candidates replay to a win (SMRC-SD audit)."""
    from deploy.analysis.replay_audit import format_summary, load_env_config, run_replay_audit

    _require_trajectories(run)
    result = run_replay_audit(run, env_cfg=load_env_config(run), max_turns=max_turns)
    for line in format_summary(result):
        typer.echo(line)


@analyze.command("candidate-quality")
def candidate_quality(run: RunOpt) -> None:
    """Whether each matched turn's candidate equals the expert's next action from the student's
    state, per matcher and candidate rule (first-visit, last-visit, loop-erased)."""
    from deploy.analysis.candidate_quality import NoExpertError, format_summary, run_candidate_quality

    _require_trajectories(run)
    try:
        result = run_candidate_quality(run)
    except NoExpertError as err:
        raise UserError(str(err)) from None
    typer.echo(f"wrote {result.json_path} and {result.png_path}")
    for line in format_summary(result):
        typer.echo(line)


@analyze.command("teacher-intervention")
def teacher_intervention(
    run: RunOpt,
    model: Annotated[Path | None, typer.Option(help="HF model dir to score with (default: the run's last checkpoint)")] = None,
    max_states: Annotated[int, typer.Option(help="states sampled (half matched, half mismatched)")] = 200,
) -> None:
    """Fixed states: change in log p(correct action) when only the teacher context varies."""
    from deploy.analysis.teacher_intervention import run_teacher_intervention

    _require_trajectories(run)
    model = model or _last_hf(run)
    result = run_teacher_intervention(run, model_path=str(model), max_states=max_states)
    for variant, groups in result.summary.items():
        if variant == "student_logprob":
            continue
        for group, s in groups.items():
            typer.echo(f"{variant:<14} {group:<10} mean Δ {s['mean']:+.4f} [{s['lo']:+.4f}, {s['hi']:+.4f}] (n={s['n']})")
    for name, s in result.differences.items():
        typer.echo(f"{name:<40} {s['mean']:+.4f} [{s['lo']:+.4f}, {s['hi']:+.4f}]")
    typer.echo(f"wrote {result.json_path} and {result.png_path}")


def _last_hf(run: Path) -> Path:
    ckpts = sorted((run / "checkpoints").glob("step_*/hf"))
    if not ckpts:
        raise UserError(f"{run} has no checkpoints/step_*/hf: pass --model <HF model directory>")
    return ckpts[-1]


@analyze.command("skills-growth")
def skills_growth(run: RunOpt) -> None:
    """UniSkill: edit-op distribution over steps and skill-bank growth, from metrics.jsonl."""
    from deploy.analysis.uniskill_plots import run_skills_growth

    try:
        result = run_skills_growth(run)
    except (FileNotFoundError, ValueError) as err:
        raise UserError(str(err)) from err
    s = result.summary
    typer.echo(f"steps {s['steps']}: {s['final_skills']:.0f} skills (bank version {s['final_bank_version']:.0f}); "
               f"adds {s['total_added']:.0f} ({s['added_first_half']:.0f} in the first half, "
               f"{s['added_second_half']:.0f} in the second), updates {s['total_updated']:.0f}")
    typer.echo("mean op shares: " + ", ".join(f"{op} {s[f'op_{op}_mean']:.2f}"
                                              for op in ("no_edit", "add", "update", "unparsed")))
    typer.echo(f"wrote {result.json_path}, {result.png_path} and {result.bank_png_path}")


@analyze.command("ralign-vs-rollout")
def ralign_vs_rollout(
    run: RunOpt,
    model: Annotated[Path | None, typer.Option(help="HF model dir to roll out (default: the run's last checkpoint)")] = None,
    sample: Annotated[int, typer.Option(help="archived ADD/UPDATE proposals sampled")] = 32,
    k: Annotated[int, typer.Option(help="episodes per proposal and arm (s~ and s_orig)")] = 4,
    seed: Annotated[int, typer.Option(help="sampling seed")] = 0,
    steps: Annotated[str | None, typer.Option(
        help="comma-separated training steps (e.g. 25,75): each step's proposals are played with the policy "
             "that scored them (the checkpoint after the previous step), reported per step")] = None,
    verbose: VerboseOpt = False,
) -> None:
    """UniSkill: R_align vs the real rollout gain of sampled proposals (Spearman rho; analysis only)."""
    from deploy.analysis.ralign_vs_rollout import run_ralign_vs_rollout, summary_line

    step_list = None
    if steps is not None:
        try:
            step_list = [int(x) for x in steps.split(",") if x.strip()]
        except ValueError:
            raise UserError(f"--steps {steps!r}: give comma-separated step numbers, e.g. 25,75") from None
        if model is not None:
            raise UserError("--steps plays each step with its own checkpoint: drop --model")
    else:
        model = model or _last_hf(run)
        _check_model(str(model))
    _route_logs(run / "analysis", verbose)
    try:
        result = run_ralign_vs_rollout(run, model_path=None if step_list else str(model), sample=sample, k=k,
                                       seed=seed, steps=step_list)
    except ValueError as err:
        raise UserError(str(err)) from err
    st = result.stats

    def f(x: float | None, fmt: str = "+.3f") -> str:
        return "-" if x is None else format(x, fmt)

    for g in result.gains:
        typer.echo(f"step {g.step:>4} {g.op:<6} R_align {g.r_align:+.4f}  success {g.success_new:.2f} vs "
                   f"{g.success_orig:.2f}  gain {g.gain:+.2f}  {g.candidate_id}")
    typer.echo(f"positive R_align: n={st.n_positive}, mean gain {f(st.mean_gain_positive)}, "
               f"losing share {f(st.share_positive_losing, '.3f')}; "
               f"non-positive: n={st.n_nonpositive}, mean gain {f(st.mean_gain_nonpositive)}")
    for step, stats in result.by_step.items() if step_list else ():
        typer.echo(f"step {step} ({result.models[step]}): {summary_line(stats)}")
    for step, why in result.skipped_steps.items():
        typer.echo(f"step {step} skipped: {why}")
    typer.echo(f"wrote {result.json_path} and {result.png_path}")
    typer.echo(summary_line(st))


@analyze.command("compare-runs")
def compare_runs_cmd(
    runs: Annotated[list[Path], typer.Argument(help="run directories and/or results files (results/*.json)")],
    out: Annotated[Path, typer.Option(help="output stem (.md and .png)")] = Path("runs/compare_runs"),
    layout: Annotated[str, typer.Option(help="runs | smrc_sd (the SMRC-SD main table) | uniskill (UniSkill's table)")] = "runs",
    split: Annotated[str | None, typer.Option(help="only this evaluation split (default: every split)")] = None,
    export: Annotated[Path | None, typer.Option(help="also write the run directories' rows as a results JSON")] = None,
    title: Annotated[str, typer.Option(help="title of the --export file")] = "compare-runs export",
) -> None:
    """Final metrics of several runs side by side (Markdown table + PNG), in a paper's layout if asked."""
    from deploy.analysis.compare_runs import compare_runs, export_results

    try:
        compare_runs(runs, out=out, layout=layout, split=split)
    except ValueError as err:
        raise UserError(str(err)) from err
    if export is not None:
        command = "python -m deploy analyze compare-runs " + " ".join(sys.argv[sys.argv.index("compare-runs") + 1:]
                                                                       if "compare-runs" in sys.argv else map(str, runs))
        export_results([r for r in runs if r.is_dir()], export, title=title, command=command, split=split)
        typer.echo(f"wrote {export}")
    typer.echo(out.with_suffix(".md").read_text())


def main() -> None:
    """`python -m deploy` (deploy/__main__.py)."""
    app(prog_name="python -m deploy")


if __name__ == "__main__":  # pragma: no cover
    main()
