"""`deploy.doctor`'s checks on given facts, the checklist a config gets, and `python -m deploy doctor`
on this CPU machine: a GPU config fails one line per unmet need, the laptop config passes."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.config_loading import load_config
from deploy.doctor import (
    Check,
    GpuDemand,
    Node,
    check_critic,
    check_cuda_build,
    check_data_path,
    check_gpus,
    check_nccl,
    check_nccl_cumem,
    check_ports,
    check_shared_storage,
    critic_address,
    filesystem_of,
    gpu_demand,
    preflight,
    recorded_stack,
)
from deploy.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "deploy" / "configs"
MOUNTS = """/dev/vda / ext4 rw 0 0
server:/export /shared nfs4 rw 0 0
tmpfs /shared/tmp tmpfs rw 0 0
"""


def _model_dir(tmp_path: Path) -> Path:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    return tmp_path / "m"


def test_gpus_fail_when_the_cluster_has_fewer_than_the_config_reserves() -> None:
    demand = GpuDemand(total=8, largest_actor=1)
    assert check_gpus(demand, [Node("a", 8)]).status == "ok"
    assert check_gpus(demand, [Node("a", 4), Node("b", 4)]).status == "ok"
    failed = check_gpus(demand, [Node("a", 4)])
    assert failed.failed and "4 visible" in failed.line() and "the config reserves 8" in failed.line()
    assert check_gpus(GpuDemand(total=2, largest_actor=2), [Node("a", 1), Node("b", 1)]).failed


def test_gpu_config_demand_counts_engines_and_learner_ranks() -> None:
    gpu = gpu_demand(load_config(CONFIGS / "alfworld_grpo_gpu.yaml", ["env.data_path=/data"]))
    assert (gpu.total, gpu.largest_actor) == (8, 1)
    assert not gpu_demand(load_config(CONFIGS / "smoke_cpu.yaml")).wants_gpus


def test_cuda_build_must_be_the_one_vllm_was_built_for() -> None:
    torch, cuda = recorded_stack()
    assert (torch, cuda) == ("2.13.0", "13.0")
    assert check_cuda_build("2.13.0+cu130", "13.0", torch, cuda).status == "ok"
    assert check_cuda_build("2.13.0", "13.0.3", torch, cuda).status == "ok"
    assert check_cuda_build("2.13.0+cu128", "12.8", torch, cuda).failed
    assert check_cuda_build("2.13.0+cpu", None, torch, cuda).failed
    assert check_cuda_build("2.12.0+cu130", "13.0", torch, cuda).failed


def test_nccl_and_its_cumem_setting() -> None:
    assert check_nccl(False, None).failed and check_nccl(True, "2.29.7").line() == "ok   NCCL: NCCL 2.29.7"
    assert check_nccl_cumem(None, None).status == "ok" and check_nccl_cumem("0", "0").status == "ok"
    mismatch = check_nccl_cumem("1", "0")
    assert mismatch.failed and "runtime_env.yaml" in mismatch.fix


def test_files_critic_storage_and_ports(tmp_path: Path) -> None:
    assert check_data_path(str(tmp_path), True).status == "ok" and check_data_path("/nope", False).failed
    assert critic_address("http://critic.internal:8000/v1") == ("critic.internal", 8000)
    assert critic_address("https://api.example.com/v1") == ("api.example.com", 443)
    assert check_critic("http://x:1/v1", "refused").failed
    assert check_critic("http://x:1/v1", "refused", required=False).status == "warn"
    assert filesystem_of("/shared/runs/a", MOUNTS) == "nfs4" and filesystem_of("/shared/tmp/x", MOUNTS) == "tmpfs"
    assert filesystem_of("/sharedother", MOUNTS) == "ext4"
    assert check_shared_storage("/shared/runs", "nfs4", 2).status == "ok"
    assert check_shared_storage("/runs", "ext4", 1).status == "ok"
    assert check_shared_storage("/runs", "ext4", 2).status == "warn"
    assert check_ports(20, 20, 2, (20_000, 32_768)).status == "ok" and check_ports(1, 20, 2, (20_000, 32_768)).failed


def test_check_line_names_the_fix_only_when_not_ok() -> None:
    assert Check("x", "ok", "fine", "do y").line() == "ok   x: fine"
    assert Check("x", "FAIL", "broken", "do y").line() == "FAIL x: broken -> do y"


def test_cpu_config_runs_no_gpu_check_and_passes(tmp_path: Path) -> None:
    cfg = load_config(CONFIGS / "smoke_cpu.yaml", [f"model.path={_model_dir(tmp_path)}",
                                                    f"run.output_dir={tmp_path / 'run'}"])
    checks = preflight(cfg, nodes=lambda _: pytest.fail("a CPU config must not look for GPUs"))
    assert [c.name for c in checks] == ["model", "shared storage", "free ports"]
    assert all(c.status == "ok" for c in checks), [c.line() for c in checks]


def test_uniskill_critic_endpoint_is_connected_to(tmp_path: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        overrides = [f"model.path={_model_dir(tmp_path)}", f"run.output_dir={tmp_path / 'run'}",
                     "uniskill.bank.critic=llm", f"uniskill.bank.llm.base_url=http://127.0.0.1:{port}/v1"]
        cfg = load_config(CONFIGS / "smoke_cpu_uniskill.yaml", overrides)
        (live,) = [c for c in preflight(cfg) if c.name == "critic endpoint"]
    (dead,) = [c for c in preflight(cfg) if c.name == "critic endpoint"]
    assert live.status == "ok" and dead.failed, (live.line(), dead.line())


def test_gpu_config_on_this_machine_fails_one_line_per_unmet_need(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "deploy", "doctor", "--config", str(CONFIGS / "alfworld_grpo_gpu.yaml"),
                          "--set", f"env.data_path={tmp_path / 'missing'}", "--set", f"run.output_dir={tmp_path}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 1, run.stderr
    failed = {line.split(":")[0] for line in run.stdout.splitlines() if line.startswith("FAIL")}
    assert failed == {"FAIL GPUs", "FAIL torch CUDA build", "FAIL NCCL", "FAIL model", "FAIL data"}, run.stdout
    assert run.stderr.strip() == "5 of 8 checks failed"


def test_unresolvable_config_is_a_user_error(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "deploy", "doctor", "--config", str(CONFIGS / "alfworld_grpo_gpu.yaml")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env={}, check=False)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1 and "ALFWORLD_DATA" in run.stderr


def test_laptop_config_with_a_built_model_passes(model: Path, tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "deploy", "doctor", "--config", str(CONFIGS / "smoke_cpu.yaml"),
                          "--set", f"model.path={model}", "--set", f"run.output_dir={tmp_path / 'run'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert [line.split()[0] for line in run.stdout.splitlines()] == ["ok", "ok", "ok"]


def test_train_stops_before_any_actor_on_an_unmet_need(tmp_path: Path) -> None:
    from deploy.cli_doctor import require_preflight

    cfg = load_config(CONFIGS / "smoke_cpu.yaml", [f"model.path={_model_dir(tmp_path)}",
                                                    f"env.data_path={tmp_path / 'missing'}",
                                                    "env.backend=embedded", "eval.num_tasks=2"])
    with pytest.raises(UserError, match="FAIL data: env.data_path .*missing does not exist"):
        require_preflight(cfg)
