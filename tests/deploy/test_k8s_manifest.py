"""deploy/k8s/rayjob.yaml starts its own config: its exact entrypoint arguments validate with no
environment variable set, its paths are absolute inside the image, and every pod shares the
Hugging Face cache and the data on the shared volume."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "deploy" / "k8s" / "rayjob.yaml"
SHARED = "/shared"


def _job() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


def _containers(job: dict) -> list[dict]:
    cluster = job["spec"]["rayClusterSpec"]
    templates = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    return [c for t in templates for c in t["spec"]["containers"]]


def _image_root(job: dict) -> str:
    (workdir,) = {c["workingDir"] for c in _containers(job)}
    return workdir


def _entrypoint_args(job: dict) -> list[str]:
    args = shlex.split(job["spec"]["entrypoint"])
    assert args[:4] == ["python", "-m", "deploy", "train"], args
    return args[4:]


def test_entrypoint_arguments_validate_without_environment_variables() -> None:
    job = _job()
    args = _entrypoint_args(job)
    config = args[args.index("--config") + 1]
    assert config.startswith(_image_root(job) + "/"), "the config path must be absolute inside the image"
    # The image copies deploy/ to /app/deploy: the same file is this checkout's deploy/ here.
    local = [str(ROOT / Path(a).relative_to(_image_root(job))) if a == config else a for a in args]
    run = subprocess.run([sys.executable, "-m", "deploy", "validate-config", *local], cwd=ROOT, env={},
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    cfg = json.loads(run.stdout)
    assert cfg["env"]["data_path"].startswith(SHARED + "/")
    assert cfg["model"]["path"].startswith(SHARED + "/")
    assert cfg["run"]["output_dir"].startswith(SHARED + "/")


def test_every_pod_shares_the_hf_cache_and_the_data() -> None:
    job = _job()
    containers = _containers(job)
    assert len(containers) >= 2
    for container in containers:
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert SHARED in mounts, container["name"]
        assert env.get("HF_HOME", "").startswith(SHARED + "/"), container["name"]
        assert env.get("ALFWORLD_DATA", "").startswith(SHARED + "/"), container["name"]
    args = _entrypoint_args(job)
    assert f"env.data_path={env['ALFWORLD_DATA']}" in args


def test_manifest_says_how_the_uniskill_critic_is_provided() -> None:
    text = MANIFEST.read_text()
    assert "uniskill.bank.llm.base_url" in text and "SKILL_CRITIC_API_KEY" in text
