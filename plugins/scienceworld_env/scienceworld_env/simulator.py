"""The ScienceWorld simulator (the `scienceworld` package's JVM), started lazily and once per process.

The wheel ships the simulator's jar and talks to it through py4j; it needs a Java 17 runtime on the
PATH (Debian/Ubuntu: `apt-get install default-jre-headless`). Without one, `require_java` raises a
RuntimeError saying so before anything starts.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from importlib import resources
from typing import Any

JAVA_FIX = "install a Java 17 runtime (Debian/Ubuntu: apt-get install default-jre-headless; `make install` does)"
SPLIT_VARIATIONS = {"train": "get_variations_train", "valid_seen": "get_variations_dev",
                    "valid_unseen": "get_variations_test"}
"""The project's splits -> ScienceWorld's own variation splits (train, dev, test)."""


def require_java() -> None:
    """RuntimeError naming the fix when no usable `java` is on the PATH."""
    java = shutil.which("java")
    if java is None:
        raise RuntimeError(f"ScienceWorld needs Java, and `java` is not on the PATH: {JAVA_FIX}")
    res = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"`java -version` failed ({res.stderr.strip()[:200]}): {JAVA_FIX}")


def start(step_limit: int) -> Any:
    """A fresh ScienceWorldEnv (one JVM)."""
    require_java()
    from scienceworld import ScienceWorldEnv

    return ScienceWorldEnv("", envStepLimit=step_limit)


def task_names() -> list[str]:
    """ScienceWorld's 30 task names, in the package's own order (its tasks.json)."""
    with resources.files("scienceworld").joinpath("tasks.json").open() as f:
        return [t["task_name"] for t in json.load(f)]


def task_titles() -> dict[str, str]:
    """Task name -> "<topic>: <title>" (tasks.json), the TaskSpec's instruction before a reset."""
    with resources.files("scienceworld").joinpath("tasks.json").open() as f:
        return {t["task_name"]: f"{t['topic']}: {t['task']}" for t in json.load(f)}


@functools.cache
def variations(split: str, names: tuple[str, ...] | None = None) -> dict[str, tuple[int, ...]]:
    """Task name -> the variation indices of `split` (ScienceWorld's train/dev/test lists) for `names`
    (None: all 30 tasks), read once per process from the simulator (about 0.3 s a task)."""
    sim = start(step_limit=100)
    try:
        out = {}
        for name in names or task_names():
            sim.load(name, 0, "")
            out[name] = tuple(int(v) for v in getattr(sim, SPLIT_VARIATIONS[split])())
        return out
    finally:
        sim.close()
