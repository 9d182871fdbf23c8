"""The phases of colocated placement (`deploy.colocation.DevicePhases`) in order, on a real rollout
worker (HF engine, tiny model, in-process) and a real learner rank (TorchBackend) whose calls go
straight to the objects (`_Direct`, standing in for Ray's `.remote`): the side that is done
releases the device before the other takes it, a handover loads the learner's weights into the
engine through shared memory and frees the buckets after the engine answered, and a generating
call that reaches a sleeping engine is refused. With disaggregated placement nothing is called."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from deploy.colocation import DevicePhases
from deploy.config_loading import load_config
from envs.config import EnvConfig
from envs.pool import EnvPool
from learner.colocation import ColocatedLearner
from learner.config import LearnerConfig
from learner.worker import LearnerWorker
from rollout_workers.colocation import ColocatedRolloutWorker, EngineAsleep
from rollout_workers.config import EngineConfig, RolloutConfig
from tests.deploy.test_placement import COLOCATED, SMOKE


class Learner(ColocatedLearner, LearnerWorker):
    pass


class _Direct:
    """`obj.method.remote(...)` runs `obj.method(...)` now (what the driver's Ray calls do, in order)."""

    def __init__(self, obj):
        self.obj = obj

    def __getattr__(self, name):
        method = getattr(self.obj, name)
        return type("Call", (), {"remote": staticmethod(method)})


@dataclass
class _Cluster:
    cfg: object
    workers: list
    learners: list
    policy_version: int = 0
    weights_digest: str | None = None
    log: list = field(default_factory=list)

    def _on_learners(self, submit, *, what):
        self.log.append(what)
        return [submit(lw) for lw in self.learners]

    def _on_workers(self, jobs, *, what):
        self.log.append(what)
        return [submit(self.workers[w]) for w, submit in jobs]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from deploy.laptop.tiny_model import TinyModelConfig, build_tiny_model

    model = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", ["go to cabinet 1. take mug 1."] * 8,
                             TinyModelConfig(vocab_size=300, hidden_size=64, num_layers=1, num_heads=2,
                                             num_kv_heads=1, intermediate_size=64))
    worker = ColocatedRolloutWorker(EngineConfig(engine="hf", device="cpu"),
                                    RolloutConfig(use_think=False, max_response_tokens=4, seed=1), str(model),
                                    [EnvPool(EnvConfig(max_steps=2), 2)])
    learner = Learner(LearnerConfig(use_deepspeed=False, kl_coef=0.0, lr=1e-2), str(model))
    return worker, learner


def test_disaggregated_placement_calls_nothing():
    cluster = _Cluster(load_config(SMOKE), [], [])
    phases = DevicePhases(cluster)
    phases.generate()
    phases.train()
    assert cluster.log == [] and phases.calls == [] and phases.step_metrics() == {}


def test_phases_hand_the_device_over_in_order_and_the_weights_in_place(pair):
    worker, learner = pair
    cluster = _Cluster(load_config(COLOCATED), [_Direct(worker)], [_Direct(learner)])
    phases = DevicePhases(cluster)
    prompt = [5, 6, 7]

    phases.generate()
    assert phases.calls == ["learners.offload_states", "engines.wake_up"] and phases.holder == "engines"
    worker.probe("go to", max_tokens=2, temperature=1.0, seed=0)  # generating while the engines hold the device
    phases.generate()  # already there: nothing more
    assert len(phases.calls) == 2

    phases.train()
    assert phases.calls[2:] == ["engines.sleep2", "learners.reload_states"] and worker.asleep() == ["kv_cache", "weights"]
    with pytest.raises(EngineAsleep, match="learner holds the device"):
        worker.probe("go to", max_tokens=2, temperature=1.0, seed=0)

    with torch.no_grad():  # stands in for an update: the learner's weights now differ from the engine's
        for p in learner.backend.module.parameters():
            p.mul_(1.5)
    assert phases.handover(1) > 0
    assert phases.calls[4:] == ["engines.wake_weights", "learners.export_handover", "engines.receive_handover",
                                "learners.release_handover"]
    assert learner._exporter.holding == 0 and worker.policy_version() == 1
    ours = dict(learner.backend.module.named_parameters())
    assert all(torch.equal(p, ours[n]) for n, p in worker.engine.model.named_parameters())
    assert worker.asleep() == ["kv_cache"]

    phases.generate()
    assert phases.calls[8:] == ["learners.offload_states", "engines.wake_up"] and worker.asleep() == []
    gen = worker.engine.generate([prompt], temperature=1.0, top_p=1.0, max_tokens=2, seed=0, choices=None)[0]
    assert len(gen.token_ids) >= 1
    calls = [c["call"] for c in worker.call_timeline()]
    assert calls.index("sleep2") < calls.index("wake_weights") < calls.index("receive_handover")
    metrics = phases.step_metrics()
    assert {"colocate/offload_s", "colocate/reload_s", "colocate/sleep_s", "colocate/wake_s", "colocate/handover_s",
            "colocate/learner_bytes_generate", "colocate/learner_bytes_train"} <= metrics.keys()
