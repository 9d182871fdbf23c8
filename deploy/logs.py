"""Where a run's output goes: the console shows the run, RUN/logs/ keeps the engines' chatter.

The commands that start the cluster (`train`, `eval`, `demo`, `analyze ralign-vs-rollout`) call
`route_logs(RUN)`. From then on

- every actor started by `deploy` (env pools, rollout workers, learner ranks, the skill bank) sends
  its whole process output to RUN/logs/<actor>.log: file descriptors 1 and 2 are pointed at the file
  when the actor's process starts (`actor_setup_hook`), so vLLM's and DeepSpeed's loggers, torch's C++
  warnings (NUMA binding), Triton notices, deprecation warnings and weight-loading progress bars all
  land there. Ray still forwards to the console what the actor writes to its original stderr, which
  is where `redirect_process_output` sends the lines the console rule below keeps. An actor that
  Ray restarts appends to the same file;
- the driver's own framework logging (Ray's start-up lines, torch, transformers) goes to
  RUN/logs/driver.log, while the console keeps the stages, progress bars and evaluation tables
  the commands print themselves.

The console rule (`record_to_console`, `warning_to_console`), applied to Python logging records and
`warnings.warn` in the driver and in every actor:

- a logging record reaches the console when it comes from a project package (`PROJECT_PACKAGES`) at
  WARNING or above (those are written for the user to act on), from Ray at WARNING or above
  (cluster-level trouble: unschedulable resources, dead nodes), or from anywhere at ERROR or above;
- a `warnings.warn` reaches the console when the line it is attributed to lies in a project package;
- everything else (framework INFO and WARNING records such as vLLM's expected "ParallelLMHead:
  Failed to load weights" on every weight sync of a tied-embedding model, dependencies'
  FutureWarnings, C-level output) goes to the log file only. Console lines are in the file too.

Frameworks that install their own console handlers are covered on the driver
(`divert_framework_handlers` filters those handlers by the same rule); inside an actor those
handlers write to the redirected descriptors, so their records, ERROR included, are in the actor's
file, and a failure reaches the console as the exception Ray raises on the driver. Ray's own
per-worker files (`ray logs`, the dashboard) hold only what reaches the console. The driver also
turns off huggingface_hub/transformers progress bars (weight loading, shard writing), which are
not the run's own.

`route_logs(..., verbose=True)` (`--verbose`) reroutes nothing: every process writes to the
console as Ray forwards it, and RUN/logs/ is not written. Library use (tests, notebooks) that never
calls `route_logs` behaves the same way.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from pathlib import Path

PROJECT_PACKAGES = ("deploy", "envs", "routing", "learner", "rollout_workers", "skillbank_service", "bench")
"""Top-level packages whose WARNING records and `warnings.warn` calls are meant for the user."""

CONSOLE_FRAMEWORKS = ("ray",)
"""Frameworks whose WARNING records still reach the console (the cluster itself is in trouble)."""

LOG_FILE_ENV = "AGENTRL_LOG_FILE"
"""Set in an actor's runtime_env: the file `actor_setup_hook` sends the process output to."""

HOOK = "deploy.logs.actor_setup_hook"
FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(filename)s:%(lineno)d] %(message)s"
CONSOLE_FORMAT = "%(levelname)s %(name)s: %(message)s"

_ROOT = Path(__file__).resolve().parents[1]
_log_dir: Path | None = None
_driver_file: logging.Handler | None = None
_installed: list[tuple[logging.Logger, logging.Handler]] = []
_original_showwarning = warnings.showwarning


# ---- the console rule ---------------------------------------------------------------------------
def record_to_console(name: str, levelno: int) -> bool:
    """Whether a logging record of logger `name` at `levelno` is shown on the console."""
    if levelno >= logging.ERROR:
        return True
    top = name.split(".", 1)[0]
    return levelno >= logging.WARNING and (top in PROJECT_PACKAGES or top in CONSOLE_FRAMEWORKS)


def warning_to_console(filename: str, root: Path | None = None) -> bool:
    """Whether a `warnings.warn` attributed to `filename` is shown on the console: it is when the
    file lies in one of the project's packages under the repository root (`root`, default: the
    one this module lives in)."""
    try:
        rel = Path(filename).resolve().relative_to(root or _ROOT)
    except (OSError, ValueError):
        return False
    return len(rel.parts) > 1 and rel.parts[0] in PROJECT_PACKAGES


class ConsoleFilter(logging.Filter):
    """Passes the records `record_to_console` keeps."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record_to_console(record.name, record.levelno)


class _OnceFilter(logging.Filter):
    """On the log file's handler: a record is written once, however many handlers pass it on."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_agentrl_filed", False):
            return False
        record._agentrl_filed = True
        return True


class _DivertFilter(logging.Filter):
    """On a framework's own console handler: every record goes to `file`; the handler prints
    only what the console rule keeps."""

    def __init__(self, file: logging.Handler):
        super().__init__()
        self.file = file

    def filter(self, record: logging.LogRecord) -> bool:
        self.file.handle(record)
        return record_to_console(record.name, record.levelno)


class _Stderr(logging.StreamHandler):
    """A handler on whatever `sys.stderr` is when a record comes (as logging's last resort)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def _warning_hook(console):
    """`warnings.showwarning` that writes every warning as before (the file, in an actor) and
    copies the project's own to `console`."""

    def showwarning(message, category, filename, lineno, file=None, line=None):
        _original_showwarning(message, category, filename, lineno, file, line)
        if file is None and warning_to_console(filename):
            try:
                console.write(warnings.formatwarning(message, category, filename, lineno, line))
                console.flush()
            except (OSError, ValueError):
                pass

    return showwarning


# ---- actors --------------------------------------------------------------------------------------
def actor_log_file(log_dir: Path | str, actor: str) -> Path:
    return Path(log_dir) / f"{actor}.log"


def actor_runtime_env(runtime_env: dict, actor: str) -> dict:
    """`runtime_env` for an actor named `actor`, plus (when logs are routed) the log file and the
    start-up hook that redirects the actor's output to RUN/logs/<actor>.log. Unchanged when logs
    are not routed, or when the job already runs its own worker setup hook (which would clash)."""
    from ray._private.ray_constants import WORKER_PROCESS_SETUP_HOOK_ENV_VAR

    if _log_dir is None or WORKER_PROCESS_SETUP_HOOK_ENV_VAR in os.environ:
        return runtime_env
    env = {**runtime_env.get("env_vars", {}), LOG_FILE_ENV: str(actor_log_file(_log_dir, actor)),
           # Ray runs the module path in this variable when the worker process starts, before
           # the actor's class (and vLLM, torch, DeepSpeed) is imported.
           WORKER_PROCESS_SETUP_HOOK_ENV_VAR: HOOK}
    return {**runtime_env, "env_vars": env}


def actor_setup_hook() -> None:
    """Ray's worker-process setup hook for actors started under routed logs. Never raises: a
    failed redirect leaves the output on the console, where it went before."""
    path = os.environ.get(LOG_FILE_ENV)
    if not path:
        return
    try:
        redirect_process_output(Path(path))
    except OSError as err:
        print(f"could not send this actor's logs to {path}: {err}", file=sys.stderr)


def redirect_process_output(log_file: Path) -> None:
    """Point this process's descriptors 1 and 2 at `log_file` (appending) and keep a handle on the
    original stderr for what the console rule keeps: records through the root logger and project
    warnings."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    console = open(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115
    name = log_file.stem
    try:
        from ray._private.ray_constants import LOG_PREFIX_ACTOR_NAME

        # Ray's log monitor names the forwarded lines after this marker: "(rollout_worker_0 pid=..)"
        console.write(f"{LOG_PREFIX_ACTOR_NAME}{name}\n")
    except ImportError:
        pass
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.write(2, f"==== {name} pid={os.getpid()} started {time.strftime('%Y-%m-%d %H:%M:%S')} ====\n".encode())
    _install_root_handlers(logging.StreamHandler(sys.stderr), logging.StreamHandler(console))
    warnings.showwarning = _warning_hook(console)


def _install_root_handlers(file: logging.Handler, shown: logging.Handler) -> None:
    """Root logger: every record to `file`, the console rule's share to `shown`."""
    root = logging.getLogger()
    for logger, handler in _installed:
        logger.removeHandler(handler)
    _installed.clear()
    file.setFormatter(logging.Formatter(FILE_FORMAT))
    file.addFilter(_OnceFilter())
    shown.setFormatter(logging.Formatter(CONSOLE_FORMAT))
    shown.addFilter(ConsoleFilter())
    for handler in (file, shown):
        root.addHandler(handler)
        _installed.append((root, handler))


# ---- the driver ----------------------------------------------------------------------------------
def log_dir() -> Path | None:
    """RUN/logs while logs are routed, else None."""
    return _log_dir


def route_logs(run_dir: Path | str, *, verbose: bool = False) -> Path | None:
    """Route this driver's framework logs to RUN/logs/driver.log and make the actors started from
    now on write to RUN/logs/<actor>.log; returns RUN/logs (None with `verbose`: nothing moves)."""
    global _log_dir, _driver_file
    if verbose:
        return None
    # Absolute: actors do not share the driver's working directory.
    _log_dir = Path(run_dir).resolve() / "logs"
    _log_dir.mkdir(parents=True, exist_ok=True)
    # Weight-loading / shard-writing bars of transformers and huggingface_hub (read at import).
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if _driver_file is not None:
        _driver_file.close()
    _driver_file = logging.FileHandler(_log_dir / "driver.log", encoding="utf-8")
    _install_root_handlers(_driver_file, _Stderr())
    warnings.showwarning = _driver_showwarning
    divert_framework_handlers()
    return _log_dir


def _driver_showwarning(message, category, filename, lineno, file=None, line=None):
    if file is not None or warning_to_console(filename):
        _original_showwarning(message, category, filename, lineno, file, line)
    if _driver_file is not None and _driver_file.stream is not None:
        _driver_file.stream.write(warnings.formatwarning(message, category, filename, lineno, line))
        _driver_file.flush()


def _console_stream(handler: logging.Handler) -> bool:
    if not isinstance(handler, logging.StreamHandler) or isinstance(handler, logging.FileHandler):
        return False
    return handler.stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)


def divert_framework_handlers() -> None:
    """Filter the console handlers frameworks installed on their own loggers (torch, Ray,
    transformers, DeepSpeed) by the console rule, their records going to driver.log. Idempotent;
    run again after importing a framework (`deploy.topology.init_ray` does, before `ray.init`)."""
    if _driver_file is None:
        return
    ours = {id(h) for _, h in _installed}
    loggers = [logging.getLogger(), *(lg for lg in logging.root.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            if id(handler) in ours or not _console_stream(handler):
                continue
            if not any(isinstance(f, _DivertFilter) for f in handler.filters):
                handler.addFilter(_DivertFilter(_driver_file))
