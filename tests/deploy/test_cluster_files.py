"""The cluster image and manifest say what a GPU cluster needs (no Docker engine or Kubernetes here,
so the files are parsed, not built): cmake and g++ for alfworld's native build before the project
install; torch pinned as pyproject pins it, from the CUDA wheel index of the base image; and a
memory-backed /dev/shm in every pod for Ray's object store."""

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
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], text)


def test_dockerfile_builds_alfworld_and_matches_torch_to_the_base_images_cuda():
    steps = _instructions((ROOT / "deploy" / "Dockerfile").read_text())
    args = dict(a.split("=", 1) for kind, a in steps if kind == "ARG" and "=" in a)
    base = _expand(next(a for kind, a in steps if kind == "FROM"), args)
    cuda = re.fullmatch(r"rayproject/ray:[\d.]+-py\d+-(cu\d+)", base)
    assert cuda, base
    runs = [_expand(a, args) for kind, a in steps if kind == "RUN"]
    apt = next(i for i, r in enumerate(runs) if "apt-get install" in r)
    assert {"cmake", "g++"} <= set(shlex.split(runs[apt]))
    pip = next(i for i, r in enumerate(runs) if "pip install" in r and "torch==" in r)
    assert apt < pip  # the compilers exist when alfworld builds
    words = shlex.split(runs[pip])
    pinned = next(d for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
                  if d.startswith("torch=="))
    assert pinned in words
    assert words[words.index("--index-url") + 1] == f"https://download.pytorch.org/whl/{cuda.group(1)}"
    assert ".[gpu]" in words[words.index(pinned):]  # then the project, finding torch satisfied


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
