"""bench/gpu_check.py --tiny: the GPU check's code on CPU with tiny shapes, run as the GPU machine
runs it (a subprocess from the repo root) with transformers, deepspeed, vLLM and Ray made
unimportable, so it proves the script needs torch alone; then its table and JSON. Plus the pieces
the numbers rest on: the script's fallback chunked log-probs equal the learner's, and gradient
checkpointing in the plain-torch decoder leaves the gradients unchanged."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
NAMES = ["train_1.7b_full", "train_1.7b_ckpt", "fwd_bwd_7b_full", "fwd_bwd_7b_ckpt", "logprobs_full",
         "logprobs_chunked", "broadcast_bf16"]

BLOCKED = ("transformers", "deepspeed", "vllm", "ray")
RUNNER = f"""
import runpy, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError("blocked by the test: " + name)
sys.meta_path.insert(0, Block())
sys.argv = ["bench/gpu_check.py", *sys.argv[1:]]
runpy.run_path("bench/gpu_check.py", run_name="__main__")
assert not [m for m in sys.modules if m.split(".")[0] in {BLOCKED!r}]
"""


def test_tiny_run_needs_torch_alone_and_writes_table_and_json(tmp_path):
    out = tmp_path / "gpu_check.json"
    res = subprocess.run([sys.executable, "-c", RUNNER, "--tiny", "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["tiny"] is True and report["device"].startswith("cpu") and report["complete"] is True
    assert report["versions"]["transformers"] is None and report["versions"]["deepspeed"] is None
    assert report["chunked_impl"] == "learner.logprobs"
    by_name = {m["name"]: m for m in report["measurements"]}
    assert list(by_name) == NAMES
    assert {m["status"] for m in by_name.values()} == {"ok"}, report["measurements"]
    for name in NAMES[:4]:
        assert by_name[name]["impl"] == "torch" and by_name[name]["tokens_per_s"] > 0
    assert by_name["train_1.7b_ckpt"]["config"]["checkpointing"] is True
    assert by_name["logprobs_chunked"]["max_abs_diff"] < 1e-4
    assert by_name["broadcast_bf16"]["backend"] == "gloo" and by_name["broadcast_bf16"]["bytes"] > 0
    lines = res.stdout.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("measurement"))
    assert [ln.split()[0] for ln in lines[header + 2:header + 2 + len(NAMES)]] == NAMES
    assert lines[-1].startswith("gpu check: 7/7 measurements ok")


def test_time_budget_skips_what_would_start_too_late(tmp_path):
    out = tmp_path / "gpu_check.json"
    res = subprocess.run([sys.executable, "bench/gpu_check.py", "--tiny", "--budget-s", "0", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [m["status"] for m in report["measurements"]] == ["skipped"] * len(NAMES)
    assert all(m["error"].startswith("time budget") for m in report["measurements"])
    assert res.stdout.splitlines()[-1].startswith("gpu check: 0/7 measurements ok")


def test_fallback_chunked_logprobs_equal_the_learners():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from gpu_check import _fallback_chunked, _full_logprobs

        from learner.logprobs import chunked_logprobs
    finally:
        sys.path.remove(str(ROOT / "bench"))
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(70, 16, generator=gen, requires_grad=True)
    weight = torch.randn(50, 16, generator=gen)
    targets = torch.randint(0, 50, (70,), generator=gen)
    ours, _ = _fallback_chunked(hidden, weight, targets, chunk_size=32)
    ours.sum().backward()
    grad, hidden.grad = hidden.grad.clone(), None
    theirs, _ = chunked_logprobs(hidden, weight, targets, chunk_size=32)
    theirs.sum().backward()
    assert torch.allclose(ours, theirs, atol=1e-5) and torch.allclose(grad, hidden.grad, atol=1e-5)
    assert torch.allclose(ours, _full_logprobs(hidden, weight, targets), atol=1e-5)


@pytest.mark.parametrize("shape_name", ["TINY_1P7B", "TINY_7B"])
def test_checkpointing_in_the_torch_decoder_keeps_the_gradients(shape_name):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import gpu_model
    finally:
        sys.path.remove(str(ROOT / "bench"))
    shape = getattr(gpu_model, shape_name)
    torch.manual_seed(0)
    model, impl = gpu_model.build_model(shape, device=torch.device("cpu"), dtype=torch.float32, prefer_hf=False)
    assert impl == "torch" and sum(p.numel() for p in model.parameters()) >= shape.num_params()
    ids = torch.randint(0, shape.vocab, (2, 24))
    grads = []
    for on in (False, True):
        model.set_checkpointing(on)
        model.zero_grad()
        (model.hidden(ids) @ model.head_weight().T).logsumexp(-1).mean().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads, strict=True))
