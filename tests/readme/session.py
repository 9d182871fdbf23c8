"""Runs README.md's bash blocks in a scratch copy of the repository and keeps what each command printed.

The scratch copy links every top-level entry of the repository except run outputs and caches, and has a
`runs/` of its own, so the README's relative paths work and nothing is written into the checkout. A
block runs as one bash script (its variables, background jobs and `$!` carry from command to command),
with markers around each command so that its output and exit code can be told apart.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.readme.blocks import Block, bash_blocks
from tests.readme.manifest import FIRST_RUN_HEADING, HEAD_PORTS, MANIFEST, Instead, Run

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
_NOT_COPIED = {".git", "runs", ".cache", ".pytest_cache", ".hypothesis", "agentrl.egg-info"}
ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled", "DS_ACCELERATOR": "cpu",
       "VLLM_TARGET_DEVICE": "cpu", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
BLOCK_TIMEOUT_S = 1200
"""Under pytest's 1800 s, so that a hung block fails with what each command printed."""


@dataclass
class CommandResult:
    command: str
    """The README command."""
    ran: str
    """The shell line that ran for it."""
    returncode: int | None = None
    """None: not reached (an earlier command failed)."""
    output: str = ""


@dataclass
class BlockResult:
    block: Block
    commands: list[CommandResult]
    ports: dict[str, int] = field(default_factory=dict)
    """README port -> the free port used instead."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shell_line(command: str, ports: dict[str, int]) -> str:
    treatment = MANIFEST[command]
    if isinstance(treatment, Instead):
        line = treatment.shell.format(command=shlex.quote(command))
    else:
        background = command.endswith("&")
        line = command[:-1].rstrip() if background else command
        line = " ".join([line, *map(shlex.quote, treatment.extra)]) + (" &" if background else "")
    for readme_port, port in ports.items():
        line = re.sub(rf"(?<!\d){readme_port}(?!\d)", str(port), line)
    return line


def _script(lines: list[str]) -> str:
    out = ["set -u"]
    for i, line in enumerate(lines):
        out += [f"echo '@@readme {i}'; echo '@@readme {i}' >&2", line,
                f"rc=$?; echo '@@readme-rc {i}' $rc; [ $rc -eq 0 ] || exit $rc"]
    return "\n".join(out) + "\n"


def _split(text: str, n: int) -> list[str]:
    parts = [""] * n
    current = None
    for line in text.splitlines(keepends=True):
        m = re.match(r"@@readme (\d+)$", line.strip())
        if m:
            current = int(m.group(1))
        elif current is not None and not line.startswith("@@readme-rc"):
            parts[current] += line
    return parts


def _codes(stdout: str) -> dict[int, int]:
    return {int(i): int(rc) for i, rc in re.findall(r"^@@readme-rc (\d+) (\d+)$", stdout, re.MULTILINE)}


def make_workspace(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for entry in ROOT.iterdir():
        if entry.name not in _NOT_COPIED:
            (path / entry.name).symlink_to(entry)
    (path / "runs").mkdir()
    return path


def run_block(block: Block, workspace: Path, tmpdir: Path) -> BlockResult:
    ports = {p: free_port() for p in HEAD_PORTS if any(p in c for c in block.commands)}
    lines = [shell_line(c, ports) for c in block.commands]
    env = {**os.environ, **ENV, "TMPDIR": str(tmpdir)}
    proc = subprocess.Popen(["bash", "-c", _script(lines)], cwd=workspace, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        stdout, stderr = proc.communicate()
    finally:
        try:  # whatever the block left running (only this block's own process group)
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    outs, errs, codes = _split(stdout, len(lines)), _split(stderr, len(lines)), _codes(stdout)
    results = [CommandResult(c, line, codes.get(i), outs[i] + errs[i])
               for i, (c, line) in enumerate(zip(block.commands, lines))]
    return BlockResult(block, results, ports)


class ReadmeSession:
    """One scratch workspace per test session; each block runs at most once (later calls reuse it)."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        # every command's TMPDIR, inherited by the actors of the runs it starts: short, for Ray's
        # socket paths (under 108 bytes), and private, so what the runs leave there can be checked
        self.tmpdir = Path(tempfile.mkdtemp(prefix="readme", dir="/tmp"))
        self.blocks = bash_blocks(README)
        self._done: dict[int, BlockResult] = {}

    def needs_first_run(self, block: Block) -> bool:
        return block.heading != FIRST_RUN_HEADING and any("runs/tiny/" in c for c in block.commands)

    def first_run_index(self) -> int:
        return next(i for i, b in enumerate(self.blocks) if b.heading == FIRST_RUN_HEADING)

    def run(self, index: int) -> BlockResult:
        if index not in self._done:
            block = self.blocks[index]
            if self.needs_first_run(block):
                self.run(self.first_run_index())
            self._done[index] = run_block(block, self.workspace, self.tmpdir)
        return self._done[index]

    def result_of(self, command: str) -> CommandResult:
        """What a README command did, in a block that has run."""
        (found,) = [r for b in self._done.values() for r in b.commands if r.command == command]
        return found


def failures(result: BlockResult, workspace: Path) -> list[str]:
    """What went wrong in a block, command by command (empty: every command did what the README says)."""
    problems: list[str] = []
    for r in result.commands:
        treatment: Run | Instead = MANIFEST[r.command]
        if r.returncode != 0:
            problems.append(f"`{r.ran}` exited {r.returncode}:\n{r.output[-4000:]}")
            break
        problems += [f"`{r.ran}` wrote no {g}" for g in treatment.files if not list(workspace.glob(g))]
        problems += [f"`{r.ran}` did not print /{p}/:\n{r.output[-2000:]}" for p in treatment.prints
                     if not re.search(p, r.output, re.MULTILINE)]
        if treatment.check is not None:
            try:
                treatment.check(workspace)
            except AssertionError as err:
                problems.append(f"`{r.ran}`: {err!r}")
    return problems


@pytest.fixture(scope="session")
def readme_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReadmeSession]:
    session = ReadmeSession(make_workspace(tmp_path_factory.mktemp("readme") / "repo"))
    yield session
    shutil.rmtree(session.tmpdir, ignore_errors=True)


@pytest.fixture(scope="session")
def readme_first_run(readme_session: ReadmeSession) -> Path:
    """The workspace after README's first-run block succeeded: runs/tiny/{base,sft} and the 4-step
    runs/smoke (checkpoints, eval, metrics). Shared by the session; treat it as read-only."""
    result = readme_session.run(readme_session.first_run_index())
    problems = failures(result, readme_session.workspace)
    assert not problems, "\n".join(problems)
    return readme_session.workspace


@dataclass(frozen=True)
class FinishedDemo:
    out: Path
    """runs/demo of the README workspace: read-only, copy it before running the demo there again."""
    output: str
    """What the demo printed (stdout, then stderr)."""


@pytest.fixture(scope="session")
def readme_demo(readme_session: ReadmeSession) -> FinishedDemo:
    """The workspace's runs/demo after README's `make demo` ran (at the manifest's tiny sizes) and did
    what the README says. Shared by the session (tests/deploy/test_demo_resume.py runs it again)."""
    index = next(i for i, b in enumerate(readme_session.blocks) if "make demo" in b.commands)
    result = readme_session.run(index)
    problems = failures(result, readme_session.workspace)
    assert not problems, "\n".join(problems)
    return FinishedDemo(readme_session.workspace / "runs" / "demo", readme_session.result_of("make demo").output)
