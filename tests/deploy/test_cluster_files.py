"""The cluster image and manifest say what a GPU cluster needs (no Docker engine or Kubernetes here,
so the files are parsed, not built): cmake and g++ for alfworld's native build before the project
install; torch pinned as pyproject pins it, for the base image's CUDA major (the CUDA stack's pins
themselves: tests/deploy/test_dockerfile.py); and a memory-backed /dev/shm in every pod for Ray's
object store."""

import re
import shlex
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in joined.splitlines() if ln.strip()]


def _expand(text: str, args: dict[str, str]) -> str:
    """${NAME} / $NAME replaced by the Dockerfile's ARG defaults; other variables (set at build or run
    time, e.g. LD_LIBRARY_PATH) are left as written."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), text)


def test_dockerfile_builds_alfworld_with_torch_pinned_as_pyproject_pins_it():
    steps = _instructions((ROOT / "deploy" / "Dockerfile").read_text())
    args = dict(a.split("=", 1) for kind, a in steps if kind == "ARG" and "=" in a)
    base = _expand(next(a for kind, a in steps if kind == "FROM"), args)
    cuda = re.fullmatch(r"rayproject/ray:[\d.]+-py\d+-cu(\d+)", base)
    assert cuda, base
    runs = [_expand(a, args) for kind, a in steps if kind == "RUN"]
    apt = next(i for i, r in enumerate(runs) if "apt-get install" in r)
    assert {"cmake", "g++"} <= set(shlex.split(runs[apt]))
    pip = next(i for i, r in enumerate(runs) if "pip install" in r and "torch==" in r)
    assert apt < pip  # the compilers exist when alfworld builds (the project's install comes later)
    project = next(i for i, r in enumerate(runs) if "pip install" in r and ".[gpu]" in r)
    assert pip < project
    pinned = next(d for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
                  if d.startswith("torch=="))
    assert pinned in shlex.split(runs[pip])
    # the base image's CUDA major is the one the pip wheels are built for (deploy/vllm_requirements.txt)
    recorded = re.search(r"^# torch\.version\.cuda: (\d+)", (ROOT / "deploy" / "vllm_requirements.txt").read_text(),
                         re.MULTILINE)
    assert recorded and cuda.group(1).startswith(recorded.group(1)), (base, recorded)


def test_every_ray_pod_mounts_a_memory_backed_dev_shm():
    job = yaml.safe_load((ROOT / "deploy" / "k8s" / "rayjob.yaml").read_text())
    spec = job["spec"]["rayClusterSpec"]
    pods = [spec["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in spec["workerGroupSpecs"]]
    assert len(pods) >= 2
    for pod in pods:
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod["containers"]:
            shm = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
            assert len(shm) == 1, container["name"]
            assert volumes[shm[0]["name"]]["emptyDir"]["medium"] == "Memory", container["name"]
