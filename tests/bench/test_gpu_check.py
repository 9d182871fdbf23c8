"""bench/gpu_check.py --tiny: every measurement of the GPU check on CPU with tiny shapes (gloo and
shared memory in place of NCCL and CUDA IPC), run as the device machine runs it: a subprocess from
the repo root in which the modules that machine lacks (deepspeed, vLLM, Ray, Redis, gymnasium,
spaCy) cannot be imported, in the script and in the engine process it starts. Then its table and
JSON: every measurement names the project functions it exercised, and those exist."""

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMES = ["logprobs_full", "logprobs_chunked", "fwd_bwd_7b_full", "fwd_bwd_7b_ckpt", "learner_train_1.7b_full",
         "learner_train_1.7b_ckpt", "weightsync_send_1.7b", "weightsync_ipc_1.7b", "engine_vs_learner_bf16",
         "colocate_release_1.7b", "colocate_handover_1.7b", "learner_train_1.7b_lora", "learner_train_1.7b_deepspeed"]
ABSENT_ON_DEVICE = ("deepspeed", "vllm", "ray", "redis", "gymnasium", "spacy")
# None in sys.modules: `import deepspeed` raises ImportError and importlib.util.find_spec returns None,
# as for an absent package (transformers probes deepspeed with find_spec when accelerate is installed)
BLOCKER = f"""
import sys
sys.modules.update(dict.fromkeys({ABSENT_ON_DEVICE!r}))
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {ABSENT_ON_DEVICE!r}:
            raise ImportError("absent on the device machine: " + name)
sys.meta_path.insert(0, _Block())
"""
PROJECT_PACKAGES = ("learner", "weightsync", "rollout_workers")


def _run_check(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    site = tmp_path / "site"  # sitecustomize: imported at start-up by this process and every child
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "PYTHONPATH": str(site)}
    res = subprocess.run([sys.executable, "bench/gpu_check.py", "--tiny", "--out", str(out), *args], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    return res, json.loads(out.read_text())


def _resolve(dotted: str) -> object:
    """The object a dotted name such as learner.worker.LearnerWorker.train_step names."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_tiny_run_exercises_the_projects_code_without_the_modules_the_device_lacks(tmp_path):
    res, report = _run_check(tmp_path)
    assert report["tiny"] is True and report["device"].startswith("cpu") and report["complete"] is True
    assert report["versions"]["deepspeed"] is None and report["versions"]["pydantic"] is not None
    by_name = {m["name"]: m for m in report["measurements"]}
    assert list(by_name) == NAMES
    assert {n for n, m in by_name.items() if m["status"] != "ok"} == {"learner_train_1.7b_deepspeed"}, \
        report["measurements"]
    assert by_name["learner_train_1.7b_deepspeed"]["error"] == "skipped: deepspeed missing"
    for m in report["measurements"]:
        assert m["exercises"], m["name"]
        for dotted in m["exercises"]:
            assert dotted.split(".")[0] in PROJECT_PACKAGES and callable(_resolve(dotted)), dotted

    assert by_name["logprobs_chunked"]["config"]["chunk_size"] < by_name["logprobs_chunked"]["positions"]
    assert by_name["logprobs_chunked"]["max_abs_diff"] < 1e-4 and by_name["logprobs_chunked"]["max_abs_grad_diff"] < 1e-4
    for name in ("learner_train_1.7b_full", "learner_train_1.7b_ckpt"):
        assert by_name[name]["backend"] == "TorchBackend" and by_name[name]["tokens_per_s"] > 0
        assert by_name[name]["grad_norm"] > 0
    assert by_name["learner_train_1.7b_ckpt"]["config"]["checkpointing"] is True
    lora, full = by_name["learner_train_1.7b_lora"], by_name["learner_train_1.7b_ckpt"]
    assert 0 < lora["trainable_params"] < full["trainable_params"] / 5 and lora["grad_norm"] > 0

    send, ipc = by_name["weightsync_send_1.7b"], by_name["weightsync_ipc_1.7b"]
    assert send["backend"] == "gloo" and send["world_size"] == 1 and send["bytes"] > 0
    assert ipc["transport"] == "shared memory" and ipc["bytes"] == send["bytes"]
    assert ipc["tensors_loaded"] == ipc["tensors"] > 0 and ipc["checksums_equal"] is True
    # after the handover the engine scores as the learner does (bf16 rounding, about 0.001-0.002 here);
    # the gap before it has measured 0.04-0.5 on the tiny model, so it is compared with the gap after
    assert ipc["logp_max_abs_diff_after"] < 0.05 and ipc["logp_max_abs_diff_before"] > 10 * ipc["logp_max_abs_diff_after"]

    release, handover = by_name["colocate_release_1.7b"], by_name["colocate_handover_1.7b"]
    assert set(release["allocated_gib"]) == {"both_resident", "generate_phase", "train_phase"}  # 0 on CPU: no device
    assert min(release[k] for k in ("offload_s", "reload_s", "sleep_s", "wake_weights_s")) >= 0
    assert handover["transport"] == "shared memory" and handover["bytes"] == send["bytes"]
    assert handover["tensors_loaded"] == handover["tensors"] > 0 and handover["checksums_equal"] is True

    gap = by_name["engine_vs_learner_bf16"]
    assert gap["tokens"] > 0 and 0 <= gap["mismatch/logp_abs_diff_mean"] <= gap["mismatch/logp_abs_diff_max"] < 0.1
    assert gap["mismatch/kl_k3"] >= 0

    lines = res.stdout.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("measurement"))
    assert [ln.split()[0] for ln in lines[header + 2:header + 2 + len(NAMES)]] == NAMES
    assert lines[-1].startswith(f"gpu check: {len(NAMES) - 1}/{len(NAMES)} measurements ok")


def test_time_budget_skips_what_would_start_too_late(tmp_path):
    res, report = _run_check(tmp_path, "--budget-s", "0")
    assert [m["status"] for m in report["measurements"]] == ["skipped"] * len(NAMES)
    assert all(m["error"].startswith("time budget") for m in report["measurements"])
    assert res.stdout.splitlines()[-1].startswith(f"gpu check: 0/{len(NAMES)} measurements ok")


def test_the_device_command_fits_its_timeout():
    """The command at the top of the docstring installs the carried wheels and runs the check under
    a timeout that the script's own watchdog (budget + 50 s) stays inside."""
    source = (ROOT / "bench" / "gpu_check.py").read_text()
    command = next(ln.strip() for ln in source.splitlines() if "pip install" in ln)
    assert command.startswith("python3 -m pip install -q --no-index --no-deps") and ".whl/*.whl" in command
    assert command.endswith('python3 bench/gpu_check.py --out "$OUT/gpu_check.json"')
    timeout = int(re.search(r"timeout (\d+) python3", command).group(1))
    budget = float(re.search(r'"--budget-s", type=float, default=([\d.]+)', source).group(1))
    assert budget + 50 < timeout
