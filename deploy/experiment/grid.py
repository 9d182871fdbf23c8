"""Grid files (YAML): the schema, its validation and the run plan. Pure: no Ray, no subprocess.

A grid is arms x seeds of training runs that share one base config, one budget, one evaluation and
one task stream per seed; an arm changes only the method (its overrides may not touch the shared
keys, `ARM_FORBIDDEN`). A seed k sets run.seed (the training task stream: tasks of step s derive
from (k, s), and random-turn's turn choice), rollout.seed (the engines' sampling seeds, UniSkill's
candidate choice and the evaluation's sampling seeds) and learner.seed (torch RNG, row shuffling);
the initial model and the fixed evaluation tasks are the same for every run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from deploy.config_sections import EvalSplit, Section
from deploy.errors import UserError

SEED_KEYS = ("run.seed", "rollout.seed", "learner.seed")
"""What a grid seed sets (module docstring)."""
RUNNER_KEYS = (*SEED_KEYS, "run.output_dir", "run.name", "model.path", "eval.split", "eval.splits", "eval.num_tasks",
               "eval.k", "eval.temperature", "eval.at_end")
"""Keys the runner sets for every run: neither the common nor an arm's overrides may set them."""
ARM_FORBIDDEN = (*RUNNER_KEYS, "run.total_steps", "run.eval_every", "rollout.tasks_per_step", "rollout.group_size",
                 "env.", "eval.")
"""Keys (or prefixes ending in '.') that all arms must share: budget, task stream, environment."""
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


RUNS_ROOT = Path("runs/experiments")
"""Where a grid's run directories go by default: RUNS_ROOT/<grid>/."""
PUBLISHED_ROOT = Path("results")
"""The committed results (`experiment run/report --publish`): PUBLISHED_ROOT/<grid>/."""


def default_dirs(name: str, *, publish: bool) -> tuple[Path, Path]:
    """(run directories, results directory) of grid `name`: results stay beside the runs, in
    runs/experiments/<grid>/results/, unless published to the committed results/<grid>/."""
    runs_dir = RUNS_ROOT / name
    return runs_dir, PUBLISHED_ROOT / name if publish else runs_dir / "results"


class GridError(UserError, ValueError):
    """A grid-file problem, phrased so the user knows which key to fix."""


ANALYSES = ("replay-audit", "ralign-vs-rollout", "skills-growth", "teacher-intervention")
"""`deploy analyze` subcommands a grid may run on its runs (each takes --run and writes RUN/analysis/)."""


class BuildSpec(Section):
    """Build the initial model once with `python -m deploy testbed build --out OUT ARGS...`."""

    out: str
    """Directory passed to --out (relative to the working directory; `${VAR}` allowed). The build is
    skipped when the model is already there, so every later sitting reuses it."""
    args: list[str] = Field(default_factory=list)
    """Extra command-line arguments of `deploy testbed build`."""
    model_subdir: str = "model"
    """The HF model directory inside `out` that the runs start from ("" = `out` itself)."""
    done_marker: str = "build.json"
    """A file in `out` the build writes last: the model counts as built only when it exists, so a build
    that died half-way is redone ("" = the model's config.json alone)."""


class ModelSpec(Section):
    """The initial model of every run: exactly one of `path` and `build`."""

    path: str | None = None
    """An HF model directory, e.g. "${TESTBED_MODEL}" (the testbed build's model)."""
    build: BuildSpec | None = None
    """Or: build it with `deploy testbed build` (once, cached in build.out)."""

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.path is None) == (self.build is None):
            raise ValueError("give exactly one of model.path (an HF model directory) and model.build "
                             "(out: DIR for `deploy testbed build`)")
        return self


class EvalSpec(Section):
    """The fixed evaluation, identical for every run of the grid (set as eval.* of each run)."""

    split: EvalSplit = "valid_unseen"
    """Evaluation split."""
    num_tasks: int = Field(32, ge=1)
    """Fixed evaluation tasks (the same tasks for every arm and seed: paired differences use them)."""
    k: int = Field(4, ge=1)
    """Samples per task (Avg@k, Pass@k)."""
    temperature: float = Field(0.4, ge=0)
    """Sampling temperature at evaluation."""


Overrides = dict[str, Any]


class GridSpec(Section):
    name: str
    """Grid name: runs go to runs/experiments/<name>/, results to its results/ (results/<name>/ with
    --publish); lower case, digits, - and _."""
    base: str
    """Base training config (a deploy/configs/*.yaml), relative to the grid file."""
    overrides: Overrides = Field(default_factory=dict)
    """Dotted key -> value applied to every run (the budget: run.total_steps, rollout.*; checkpoints)."""
    model: ModelSpec
    """Initial model of every run."""
    eval: EvalSpec = Field(default_factory=EvalSpec)
    """Fixed evaluation of every run."""
    arms: dict[str, Overrides]
    """Arm name -> its dotted overrides (method.name, learner.sd.coef, uniskill.variant, ...)."""
    reference: str | None = None
    """The arm every other arm is compared with (paired differences); None = the first arm."""
    comparisons: list[tuple[str, str]] = Field(default_factory=list)
    """Further paired differences [arm A, arm B] (A - B) beyond every arm vs the reference, e.g. the
    pre-registered hypotheses' pairs (docs/testbed.md)."""
    seeds: list[int]
    """Training seeds; every arm runs every seed (what a seed changes: deploy/experiment/grid.py)."""
    min_seeds: int = Field(3, ge=1)
    """Fewest seeds the grid may list (3 for a real comparison; a test grid may lower it)."""
    initial_eval: bool = True
    """Evaluate the initial model once, exactly as every run's final evaluation (`eval:`), into
    RESULTS/initial.json: the report then says what training added (each arm - initial,
    paired over tasks), not only how arms differ."""
    analyses: dict[str, list[str]] = Field(default_factory=dict)
    """Arm -> `deploy analyze` commands (a subcommand of `ANALYSES` and its options, without --run)
    run on each of that arm's runs after training and before its results JSON is written; their
    outputs go to RESULTS/analysis/<arm>_seed<k>/. A run directory does not outlive a
    sitting on a fresh machine, so whatever needs a run's trajectories or checkpoints runs here."""

    @field_validator("name")
    @classmethod
    def _slug(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError(f"{v!r} must be lower case letters, digits, '-' and '_' (it names directories)")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> GridSpec:
        if not self.arms:
            raise ValueError("arms: list at least one arm (name: {overrides})")
        for arm in self.arms:
            if not _NAME.fullmatch(arm):
                raise ValueError(f"arms.{arm}: an arm name must be lower case letters, digits, '-' and '_'")
        if self.reference is not None and self.reference not in self.arms:
            raise ValueError(f"reference={self.reference!r} is not an arm ({', '.join(self.arms)})")
        for a, b in self.comparisons:
            if a not in self.arms or b not in self.arms or a == b:
                raise ValueError(f"comparisons: [{a}, {b}] must name two different arms ({', '.join(self.arms)})")
        if len(set(self.seeds)) != len(self.seeds) or any(s < 0 for s in self.seeds):
            raise ValueError(f"seeds={self.seeds}: list distinct non-negative integers")
        if len(self.seeds) < self.min_seeds:
            raise ValueError(f"seeds={self.seeds}: a grid needs at least min_seeds={self.min_seeds} training seeds "
                             "per arm; add seeds")
        for where, overrides in [("overrides", self.overrides), *((f"arms.{a}", o) for a, o in self.arms.items())]:
            for key, value in overrides.items():
                if isinstance(value, dict):  # pydantic reports ValueError with the key
                    raise ValueError(  # noqa: TRY004
                        f"{where}.{key}: give dotted keys with plain values ({key}.<field>: value), "
                        "not a mapping (it would replace the whole section)")
        for key in self.overrides:
            if _hits(key, RUNNER_KEYS):
                raise ValueError(f"overrides.{key}: the runner sets it for every run; use the grid's seeds, "
                                 "eval or model keys instead")
        for arm, commands in self.analyses.items():
            if arm not in self.arms:
                raise ValueError(f"analyses.{arm}: not an arm ({', '.join(self.arms)})")
            for command in commands:
                words = shlex.split(command)
                if not words or words[0] not in ANALYSES:
                    raise ValueError(f"analyses.{arm}: {command!r} must start with one of {', '.join(ANALYSES)}")
                if "--run" in words:
                    raise ValueError(f"analyses.{arm}: {command!r}: drop --run (the runner passes each run's "
                                     "directory)")
        for arm, overrides in self.arms.items():
            for key in overrides or {}:
                if _hits(key, ARM_FORBIDDEN):
                    raise ValueError(f"arms.{arm}.{key}: every arm shares the budget, task stream, environment "
                                     "and evaluation; move it to the grid's overrides (or seeds/eval/model)")
        return self

    @property
    def reference_arm(self) -> str:
        return self.reference or next(iter(self.arms))


def _hits(key: str, forbidden: tuple[str, ...]) -> bool:
    return any(key.startswith(f) if f.endswith(".") else key == f or key.startswith(f + ".") for f in forbidden)


def load_grid(path: str | Path) -> GridSpec:
    """Read and validate a grid file; every error names the file and the key."""
    p = Path(path)
    if not p.is_file():
        raise GridError(f"grid file {path} does not exist (shipped grids: deploy/experiments/*.yaml)")
    try:
        tree = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError, ValueError) as err:
        raise GridError(f"grid {path} cannot be parsed: {err}") from None
    if not isinstance(tree, dict):
        raise GridError(f"grid {path} must be a mapping at the top level (name, base, model, arms, seeds, ...)")
    arms = tree.get("arms")
    if isinstance(arms, dict):  # `arm_name:` with nothing under it = the base config as is
        tree["arms"] = {k: ({} if v is None else v) for k, v in arms.items()}
    try:
        return GridSpec.model_validate(tree)
    except ValidationError as err:
        lines = [f"invalid grid {path}:"]
        for e in err.errors():
            key = ".".join(str(x) for x in e["loc"]) or "<root>"
            msg = "unknown key (typo?)" if e["type"] == "extra_forbidden" else e["msg"]
            lines.append(f"  {key}: {msg}")
        raise GridError("\n".join(lines)) from None


def base_config_path(grid: GridSpec, grid_file: str | Path) -> Path:
    """The base config, relative to the grid file."""
    p = (Path(grid_file).parent / grid.base).resolve()
    if not p.is_file():
        raise GridError(f"grid {grid_file}: base={grid.base!r} does not exist (looked at {p}); name a "
                        "deploy/configs/*.yaml relative to the grid file")
    return p


def expand_vars(text: str, key: str, env: dict[str, str] | None = None) -> str:
    """`${NAME}` -> the environment variable; `${NAME:-default}` -> the variable, or `default` when it
    is unset or empty (as the shell does); an unset one without a default is a GridError naming it
    and the key."""
    env = os.environ if env is None else env

    def one(match: re.Match) -> str:
        value = env.get(match.group(1)) or match.group(2)
        if not value:
            raise GridError(f"{key}={text!r}: environment variable {match.group(1)} is not set; export it "
                            "(e.g. the testbed build's model directory)")
        return value

    return _ENV_REF.sub(one, text)


def as_set_args(overrides: Overrides) -> list[str]:
    """Dotted overrides -> `--set key=value` strings (values as JSON, which the config loader reads as YAML)."""
    return [f"{key}={json.dumps(value)}" for key, value in overrides.items()]


@dataclass(frozen=True)
class PlannedRun:
    """One training run of the grid."""

    arm: str
    seed: int
    run_dir: Path
    """The run's output_dir (checkpoints, metrics.jsonl, eval/)."""
    result_path: Path
    """RESULTS/<arm>_seed<k>.json: written when the run has finished; its presence skips the run."""

    @property
    def key(self) -> str:
        return f"{self.arm}_seed{self.seed}"


def plan_runs(grid: GridSpec, *, runs_dir: Path, results_dir: Path, only: list[str] | None = None,
              seeds: list[int] | None = None) -> list[PlannedRun]:
    """Runs in seed-major order (seed 0 of every arm, then seed 1, ...), so an interrupted grid
    leaves every arm with the same number of finished seeds. `only`/`seeds` filter the grid."""
    for arm in only or []:
        if arm not in grid.arms:
            raise GridError(f"--only {arm}: not an arm of grid {grid.name} ({', '.join(grid.arms)})")
    for seed in seeds or []:
        if seed not in grid.seeds:
            raise GridError(f"--seeds {seed}: not a seed of grid {grid.name} ({grid.seeds})")
    return [PlannedRun(arm, seed, runs_dir / f"{arm}_seed{seed}", results_dir / f"{arm}_seed{seed}.json")
            for seed in grid.seeds if seeds is None or seed in seeds
            for arm in grid.arms if only is None or arm in only]


def initial_run(grid: GridSpec, *, runs_dir: Path, results_dir: Path) -> PlannedRun:
    """The initial-model evaluation as a run of the reference arm at the first seed (its overrides are
    those of a training run; only model, eval and output dir matter): runs dir initial/, results
    initial.json."""
    return PlannedRun(grid.reference_arm, grid.seeds[0], runs_dir / "initial", results_dir / "initial.json")


def run_overrides(grid: GridSpec, run: PlannedRun, model_path: str) -> list[str]:
    """The `--set` arguments of one run: the grid's common overrides, the arm's, then the runner's
    (seed, output dir, name, model, evaluation), which neither of the former may set."""
    e = grid.eval
    own = {"run.seed": run.seed, "rollout.seed": run.seed, "learner.seed": run.seed,
           "run.output_dir": str(run.run_dir), "run.name": f"{grid.name}-{run.arm}-seed{run.seed}",
           "model.path": model_path, "eval.split": e.split, "eval.num_tasks": e.num_tasks, "eval.k": e.k,
           "eval.temperature": e.temperature, "eval.at_end": True}
    return as_set_args({**grid.overrides, **grid.arms[run.arm], **own})


def run_state(run: PlannedRun, total_steps: int, split: str) -> str:
    """What to do with a planned run:
    "done" (its results JSON exists: skip), "collect" (trained and evaluated, JSON not yet written),
    "resume" (a checkpoint before the end: `train --resume`), "restart" (a run dir without a
    checkpoint: moved aside and trained afresh) or "fresh"."""
    if run.result_path.is_file():
        return "done"
    final = run.run_dir / "checkpoints" / f"step_{total_steps:06d}" / "trainer_state.json"
    if final.is_file() and final_eval_path(run.run_dir, total_steps, split) is not None:
        return "collect"
    if any((run.run_dir / "checkpoints").glob("step_*/trainer_state.json")):
        return "resume"
    return "restart" if run.run_dir.exists() else "fresh"


def final_eval_path(run_dir: Path, total_steps: int, split: str) -> Path | None:
    """The end-of-training evaluation file of `split` (eval/step_N.json, or eval/step_N-<split>.json
    when the run evaluates several splits), or None."""
    for name in (f"step_{total_steps:04d}.json", f"step_{total_steps:04d}-{split}.json"):
        if (run_dir / "eval" / name).is_file():
            return run_dir / "eval" / name
    return None
