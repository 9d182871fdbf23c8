"""A colocated learner rank between the phases (`learner.offload`, `learner.colocation`): offload
and reload on TorchBackend and on DeepSpeed (ZeRO 0 by tensor moves, ZeRO 1 and 3 through
DeepSpeed's own offload_states / reload_states) leave training exactly as it would have gone
without them, and the handover export carries the current weights. On CPU the moves stay in host
memory; the memory they release on a GPU is bench/gpu_check.py's measurement."""

from __future__ import annotations

import pytest
import torch

from learner.colocation import ColocatedLearner
from learner.config import LearnerConfig
from learner.worker import LearnerWorker
from weightsync.ipc import open_handover

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]


class Learner(ColocatedLearner, LearnerWorker):
    pass


BACKENDS = {
    "torch": {"use_deepspeed": False},
    "zero0": {"use_deepspeed": True, "zero_stage": 0},
    "zero1": {"use_deepspeed": True, "zero_stage": 1},
    "zero3": {"use_deepspeed": True, "zero_stage": 3},
}


def _learner(model_dir, port: int, **backend) -> Learner:
    cfg = LearnerConfig(lr=1e-2, kl_coef=0.01, micro_batch_rows=4, shuffle_rows=False, seed=3, **backend)
    return Learner(cfg, str(model_dir), master_port=port)


def _state(w: Learner) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().clone() for k, v in w.backend.export_state_dict().items()}


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_offload_and_reload_between_updates_change_nothing(tiny_model_dir, make_rows, free_port, backend):
    rows = make_rows()
    plain, colocated = (_learner(tiny_model_dir, free_port(), **BACKENDS[backend]) for _ in range(2))
    first = [w.train_step(rows).loss for w in (plain, colocated)]
    out = colocated.offload_states()
    assert colocated._offloader().offloaded and out["learner_bytes"] >= 0 and out["seconds"] >= 0
    assert colocated.offload_states()["seconds"] < 1.0  # idempotent: nothing left to move
    back = colocated.reload_states()
    assert not colocated._offloader().offloaded and back["learner_bytes"] > 0
    second = [w.train_step(rows) for w in (plain, colocated)]
    assert first[0] == first[1]
    assert second[0].loss == second[1].loss and second[0].grad_norm == second[1].grad_norm
    a, b = _state(plain), _state(colocated)
    assert all(torch.equal(a[k], b[k]) for k in a)

    handover = colocated.export_handover()
    loaded = {name: t.float().clone() for bucket in open_handover(handover) for name, t in bucket}
    assert colocated.release_handover() == 2  # the ring and its control block
    assert loaded.keys() <= b.keys() and len(loaded) == len(list(colocated.backend.module.parameters()))
    assert all(torch.equal(loaded[k], b[k]) for k in loaded)
