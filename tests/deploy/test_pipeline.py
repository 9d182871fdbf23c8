"""The one-step-off pipeline's scheduling (deploy/pipeline.py, deploy/trainer.py) against a fake
cluster that records the order of its calls: K = 0 is the synchronous schedule (collect, train,
sync in turn), K = 1 submits step k+1's rollout before step k trains, never across an evaluation
or a checkpoint, and the staleness of every trained batch stays within K."""

import json
import math
from pathlib import Path

import pytest

from deploy.colocation import DevicePhases
from deploy.config_loading import load_config
from deploy.metrics import MetricsSink
from deploy.pipeline import (
    RolloutPipeline,
    StalenessExceeded,
    batch_staleness,
    check_staleness,
    may_prefetch,
)
from deploy.trainer import Trainer, TrainerState, learner_log_dict
from learner.types import StageSeconds, StepMetrics
from rollout_workers.types import RolloutStats, Trajectory, Turn

ROOT = Path(__file__).resolve().parents[2]


def _traj(task, i: int, version: int) -> Trajectory:
    turn = Turn(prompt_ids=(1, 2, 3), response_ids=(4, 5), sampler_logprobs=(-0.5, -0.25), response_text="go",
                action="go", action_valid=True, observation="room", next_observation="done")
    return Trajectory(task=task, group_id=f"{task.task_id}-g", traj_id=f"{task.task_id}-{i}-v{version}",
                      turns=(turn,), success=i % 2 == 0, score=float(i % 2 == 0), policy_version=version,
                      end_reason="won" if i % 2 == 0 else "step_limit")


def _metrics(*, entropy: float = 1.0, num_rows: int = 2) -> StepMetrics:
    """A learner step's metrics with plausible values."""
    return StepMetrics(policy_version=0, loss=0.1, pg_loss=0.1, kl_loss=0.0, entropy_loss=0.0, extra_losses={},
                       pg_clipfrac=0.0, pg_clipfrac_lower=0.0, ppo_kl=0.0, kl=0.0, entropy=entropy, grad_norm=1.0,
                       lr=1e-5, num_rows=num_rows, num_tokens=2 * num_rows, num_optimizer_steps=1, score_mean=0.5,
                       advantage_abs_mean=0.5, response_length_mean=2.0, rep4gram_ratio=0.0, sampler_logp_abs_diff=0.0,
                       seconds=StageSeconds(collate_s=0, logprob_s=0, advantage_s=0, update_s=0, total_s=0))


class FakeCluster:
    """Records every call; a collect is stamped with the version the engines hold when it is
    submitted (a plain actor runs calls in submission order, so a sync submitted later runs after it)."""

    def __init__(self):
        self.calls: list[str] = []
        self.engine_version = 0
        self.in_flight = 0
        self.checks: list[tuple[str, int]] = []  # (call, rollouts in flight at that moment)
        self.last_sync: dict[str, float] = {}
        self.on_submit = None
        self.workers, self.pools = ["rollout_worker_0"], ["env_pool_0"]  # fixed membership (no rollout.num_workers=auto)

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    def submit_collect(self, tasks, *, group_size, policy_version, temperature, skill_texts=None):
        self.calls.append(f"submit_collect(v{policy_version})")
        self.in_flight += 1
        trajs = [_traj(t, i, self.engine_version) for t in tasks for i in range(group_size)]
        return trajs

    def wait_collect(self, pending):
        self.calls.append("wait_collect")
        self.in_flight -= 1
        stats = RolloutStats(num_episodes=len(pending), num_turns=len(pending), num_generated_tokens=0,
                             num_prompt_tokens=0, generate_s=0.0, env_s=0.0, total_s=0.0)
        return pending, stats

    def wait_finished(self, pending):
        self.calls.append("wait_finished")

    def collect(self, tasks, tokens=True, **kw):  # evaluation (whole trajectories either way)
        self.checks.append(("eval", self.in_flight))
        return self.wait_collect(self.submit_collect(tasks, **kw))

    def train(self, rows, proposals=(), align=(), *, proposer_warmup=False):
        self.calls.append("train")
        return _metrics(num_rows=len(rows))

    def sync_weights(self, version):
        self.calls.append(f"sync(v{version})")
        self.engine_version = version

    def save_checkpoint(self, path):
        self.checks.append(("checkpoint", self.in_flight))
        self.calls.append("checkpoint")

    def export_hf(self, path):
        return Path(path)

    def drain_recoveries(self):
        return []


def _trainer(tmp_path, *sets: str) -> tuple[Trainer, FakeCluster]:
    cfg = load_config(ROOT / "deploy" / "configs" / "smoke_cpu.yaml", [f"run.output_dir={tmp_path}", *sets])
    cluster = FakeCluster()
    cluster.cfg = cfg
    cluster.phases = DevicePhases(cluster)  # disaggregated: every phase call is a no-op
    return Trainer(cfg, cluster, MetricsSink(tmp_path, loggers=()), TrainerState()), cluster


def _steps(trainer: Trainer, n: int) -> list[dict]:
    return [trainer.train_step(step) for step in range(1, n + 1)]


def test_k0_is_the_synchronous_schedule(tmp_path):
    trainer, cluster = _trainer(tmp_path, "run.total_steps=3")
    records = _steps(trainer, 3)
    # the schedule before the pipeline: collect (submit + wait) at the current version, train, sync;
    # nothing is ever in flight, so the sync waits for no engine
    assert cluster.calls == [c for v in range(3) for c in (f"submit_collect(v{v})", "wait_collect", "train",
                                                            f"sync(v{v + 1})")]
    assert all(r["async/staleness_max"] == 0 and r["async/staleness_mean"] == 0 for r in records)
    assert all(r["async/sync_wait_s"] >= 0 and r["async/learner_wait_s"] >= 0 for r in records)
    assert [r["policy_version"] for r in records] == [1, 2, 3]


def test_k1_submits_the_next_rollout_before_training(tmp_path):
    trainer, cluster = _trainer(tmp_path, "run.total_steps=3", "rollout.max_staleness=1")
    records = _steps(trainer, 3)
    assert cluster.calls == [
        "submit_collect(v0)", "wait_collect",  # step 1: nothing was prefetched
        "submit_collect(v0)", "train", "wait_finished", "sync(v1)",  # step 2's rollout runs while step 1 trains
        "wait_collect", "submit_collect(v1)", "train", "wait_finished", "sync(v2)",
        "wait_collect", "train", "sync(v3)",  # step 3 is the last: nothing to prefetch, nothing to wait for
    ]
    assert [r["async/staleness_max"] for r in records] == [0, 1, 1]
    assert [r["async/staleness_mean"] for r in records] == [0, 1, 1]
    assert "time/sample_s" in records[1] and "time/retrieve_s" in records[1]  # logged with the step they belong to


def test_no_prefetch_across_evaluation_or_checkpoint(tmp_path):
    trainer, cluster = _trainer(tmp_path, "run.total_steps=4", "rollout.max_staleness=1", "run.checkpoint_every=2",
                                "run.eval_every=3", "run.progress=false")
    trainer._train_steps(lambda record: None)
    trainer._finish()
    assert cluster.checks == [("checkpoint", 0), ("eval", 0), ("checkpoint", 0), ("eval", 0), ("checkpoint", 0)]
    steps = MetricsSink(tmp_path, loggers=()).read_steps()
    # step 1 prefetches 2 (staleness 1); 2 is checkpointed, 3 evaluated: 3 and 4 are collected fresh
    assert [s["async/staleness_max"] for s in steps] == [0, 1, 0, 0]
    assert cluster.calls.count("submit_collect(v0)") == 2 and trainer.pipeline.in_flight_step is None


def test_learner_restart_drops_the_in_flight_rollout(tmp_path):
    trainer, cluster = _trainer(tmp_path, "run.total_steps=3", "rollout.max_staleness=1")
    trainer.train_step(1)
    assert trainer.pipeline.in_flight_step == 2
    cluster.restart_learners = lambda: cluster.calls.append("restart_learners")
    from deploy.recovery import LearnerGroupFailed

    trainer._current = 2
    trainer.restart_learners(LearnerGroupFailed("rank 1 died"))
    assert trainer.pipeline.in_flight_step is None and trainer.state.step == 0
    assert cluster.calls[-3:] == ["wait_finished", "restart_learners", "sync(v0)"]


# ---- the pure rules ------------------------------------------------------------------------------


def test_staleness_is_learner_version_minus_stamp(tmp_path):
    from envs.tasks import sample_tasks

    cfg = load_config(ROOT / "deploy" / "configs" / "smoke_cpu.yaml", [f"run.output_dir={tmp_path}"])
    [task] = sample_tasks(cfg.env, "train", 1, 7)
    trajs = [_traj(task, 0, 3), _traj(task, 1, 4), _traj(task, 2, 4), _traj(task, 3, 5)]
    assert batch_staleness(trajs, 5) == (1.0, 2)
    assert batch_staleness([], 5) == (0.0, 0)
    assert check_staleness(trajs, 5, 2, step=9) == (1.0, 2)
    with pytest.raises(StalenessExceeded, match="rollout.max_staleness=1"):
        check_staleness(trajs, 5, 1, step=9)


@pytest.mark.parametrize(("step", "kw", "expected"), [
    (1, {"max_staleness": 0}, False),
    (1, {"max_staleness": 1}, True),
    (5, {"max_staleness": 1}, False),  # the last step
    (2, {"max_staleness": 1, "eval_every": 2}, False),
    (3, {"max_staleness": 1, "eval_every": 2}, True),
    (4, {"max_staleness": 2, "checkpoint_every": 4}, False),
])
def test_may_prefetch(step, kw, expected):
    args = {"total_steps": 5, "eval_every": 0, "checkpoint_every": 0, **kw}
    assert may_prefetch(step, **args) is expected


def test_pipeline_refuses_a_second_rollout_and_the_wrong_step():
    cluster = FakeCluster()
    pipe = RolloutPipeline(cluster, max_staleness=1)
    assert pipe.wait_engines() >= 0 and cluster.calls == []  # nothing in flight: nothing to wait for
    pipe.submit(3, [], group_size=2, policy_version=0, temperature=1.0, skill_texts=None)
    with pytest.raises(RuntimeError, match="step 3 is still in flight"):
        pipe.submit(4, [], group_size=2, policy_version=0, temperature=1.0, skill_texts=None)
    with pytest.raises(RuntimeError, match="step 4 asks for its rollout but step 3 is in flight"):
        pipe.take(4, prefetched=True)
    pipe.wait_engines()
    assert pipe.in_flight_step == 3 and cluster.calls[-1] == "wait_finished"
    got = pipe.take(3, prefetched=True)
    assert got.step == 3 and got.prefetched and pipe.in_flight_step is None
    assert pipe.discard() is None


@pytest.mark.parametrize("entropy", [0.7, float("nan")])
def test_learner_log_dict_omits_entropy_that_was_not_measured(entropy):
    """learner.log_entropy off gives StepMetrics.entropy NaN: metrics.jsonl leaves the key out, not NaN."""
    out = learner_log_dict(_metrics(entropy=entropy))
    assert out.get("entropy", "absent") == ("absent" if math.isnan(entropy) else entropy)
    json.dumps(out, allow_nan=False)  # raises on NaN
