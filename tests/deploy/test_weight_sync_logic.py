"""Pure parts of the driver's weight sync: the probe rows, its per-step metrics, the default
tolerance by precision, the failure message naming members, the count of group rebuilds, and
the `sync` config section's checks."""

from __future__ import annotations

import pytest

from deploy.config import TrainConfig
from deploy.weight_sync import (
    BroadcastSync,
    _message,
    max_logprob_gap,
    probe_gaps,
    probe_rows,
    verify_tolerance,
)
from rollout_workers.types import Generation


def test_probe_rows_and_gap():
    gen = Generation(token_ids=(5, 6, 7), logprobs=(-1.0, -2.0, -0.5), text="x", finish_reason="length")
    [row] = probe_rows([([1, 2, 3], gen)])
    assert row.prompt_ids == (1, 2, 3) and row.response_ids == (5, 6, 7) and row.sampler_logprobs == (-1.0, -2.0, -0.5)
    assert max_logprob_gap([row], [[-1.0, -2.00003, -0.5]]) == pytest.approx(3e-5)
    assert max_logprob_gap([row], [[-1.0, -2.0, -0.2]]) == pytest.approx(0.3)


def test_probe_metrics_are_the_max_and_mean_token_gap():
    gen = Generation(token_ids=(5, 6), logprobs=(-1.0, -2.0), text="x", finish_reason="length")
    rows = probe_rows([([1], gen), ([2], gen)])
    got = probe_gaps(rows, [[-1.5, -2.0], [-1.0, -2.1]])  # gaps 0.5, 0, 0, 0.1
    assert got == pytest.approx({"probe_max_dlogp": 0.5, "probe_mean_dlogp": 0.15})
    assert probe_gaps([], []) == {"probe_max_dlogp": 0.0, "probe_mean_dlogp": 0.0}


def test_rebuilds_count_every_group_after_the_first():
    sync = BroadcastSync(TrainConfig.model_validate({}))
    assert sync.rebuilds == 0
    sync.builds = 1
    assert sync.rebuilds == 0
    sync.builds = 3
    assert sync.rebuilds == 2


def test_default_tolerance_follows_precision():
    fp32 = TrainConfig.model_validate({"engine": {"dtype": "float32"}})
    assert fp32.sync.method == "broadcast" and verify_tolerance(fp32) == 1e-4
    assert verify_tolerance(TrainConfig.model_validate({"engine": {"dtype": "bfloat16"}})) == 0.1
    assert verify_tolerance(TrainConfig.model_validate({"sync": {"verify_tol": 0.02}})) == 0.02


def test_sync_config_names_bad_keys():
    with pytest.raises(ValueError, match="sync.method"):
        TrainConfig.model_validate({"sync": {"method": "nccl"}})
    with pytest.raises(ValueError, match="bucket_mb"):
        TrainConfig.model_validate({"sync": {"bucket_mb": 0}})
    with pytest.raises(ValueError, match="extra"):
        TrainConfig.model_validate({"sync": {"timeout": 5}})


def test_failure_message_names_every_member():
    msg = _message("the weight broadcast of version 3", {"learner_0": "WeightSyncError: failed sending to rollout_worker_1",
                                                         "rollout_worker_1": "the actor died (ActorDiedError)"})
    assert msg.startswith("the weight broadcast of version 3 failed: learner_0: ")
    assert msg.endswith("(dead: rollout_worker_1)")
