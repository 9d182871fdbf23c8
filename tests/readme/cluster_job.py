"""Checks a cluster-only README command without a cluster: `python -m tests.readme.cluster_job 'ray job
submit --address http://<head>:8265 ... -- python -m deploy train --config C --set k=v'` parses the
`ray job submit` options with Ray's own CLI parser (nothing is submitted) and runs the entrypoint's
config and overrides through `python -m deploy validate-config`. Exit code 0 when both pass."""

from __future__ import annotations

import shlex
import subprocess
import sys


def split_submit(command: str) -> tuple[list[str], list[str]]:
    """(`ray job submit` options, entrypoint) of a README command; `<head>` stands for a host."""
    words = shlex.split(command.replace("<head>", "head"))
    cut = words.index("--")
    assert words[:3] == ["ray", "job", "submit"], words[:3]
    return words[3:cut], words[cut + 1:]


def validate_config_args(entrypoint: list[str]) -> list[str]:
    """The entrypoint `python -m deploy train ARGS` as `validate-config ARGS` (run-only flags dropped)."""
    assert entrypoint[:4] == ["python", "-m", "deploy", "train"], entrypoint[:4]
    return ["validate-config", *(a for a in entrypoint[4:] if a not in ("--resume", "--verbose"))]


def main(command: str) -> int:
    from ray.dashboard.modules.job.cli import submit

    options, entrypoint = split_submit(command)
    submit.make_context("submit", [*options, "--", *entrypoint])  # raises on an unknown or malformed option
    res = subprocess.run([sys.executable, "-m", "deploy", *validate_config_args(entrypoint)],
                         capture_output=True, text=True, check=False)
    sys.stderr.write(res.stderr)
    print(f"ray job submit options parsed: {' '.join(options)}")
    print(f"validate-config exit {res.returncode}")
    return res.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
