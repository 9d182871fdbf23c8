"""32 simulated GPUs on one machine: the real driver (`deploy.trainer.Trainer.train_step` on a
`deploy.cluster.Cluster`), 32 light rollout-worker actors (`rollout_workers.worker.RolloutWorker`
with `engine.engine: simulated`, the per-episode async loop and the embedded household env
in-process) and learner actors that only receive, for a few steps:

  step 1  warm-up (first calls on fresh workers), not measured
  step 2  all 32 workers
  step 3  elastic leave: 2 workers removed between steps (`Cluster.remove_workers`)
  step 4  elastic join: 2 new workers join between steps (`Cluster.add_workers`)
  step 5  10% of the workers (3) killed mid-collect (`ray.kill`; Ray restarts them, the driver
          re-plays what they lost and brings them back to the current weights)

Stragglers: response lengths are lognormal around the median and, per task, scaled by a
lognormal factor (`engine.simulated_task_spread`: a hard task thinks longer in every turn of all
its episodes); random (but admissible) actions end some households early and run others to the
step limit.

Per step it reports the rollout phase's wall time against the ideal: the total simulated
generation time (the engines' time with a request in flight, summed over the calls that
returned: work lost with a killed worker counts against the wall, not the ideal) divided by the
step's workers. `--compare` runs the same steps with fixed chunks (`rollout.assignment: static`)
first, side by side.

    .venv/bin/python bench/sim_cluster.py                  # dynamic assignment
    .venv/bin/python bench/sim_cluster.py --compare        # static, then dynamic

Writes bench/results/sim_cluster.json; the last line is
`simulated 32 workers: rollout wall / ideal X.XX, workers killed K, episodes lost 0`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
DEFAULT_OUT = ROOT / "bench" / "results" / "sim_cluster.json"
for _k, _v in {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false",
               "HF_HUB_OFFLINE": "1", "RAY_DEDUP_LOGS": "0"}.items():
    os.environ.setdefault(_k, _v)


def _sim_cluster_class():
    from deploy.cluster import Cluster
    from deploy.recovery import get_all

    class SimCluster(Cluster):
        """The run's Cluster; weight sync tells each engine the new version (a simulated engine has
        no weights to load)."""

        def sync_weights(self, version: int) -> None:
            get_all([w.reload_weights.remote("", version) for w in self.workers], timeout_s=self._timeout_s,
                    what="simulated sync")
            self.policy_version = version

        def _make_current(self, handle, name: str) -> dict[str, float]:
            get_all([handle.reload_weights.remote("", self.policy_version)], timeout_s=self._timeout_s, what=name)
            return {"policy_version": float(self.policy_version)}

    return SimCluster


def start_workers(cfg, count: int, envs: int) -> list:
    import ray

    from deploy.actors import InProcessEnvPool
    from rollout_workers.worker import RolloutWorker

    cls = ray.remote(RolloutWorker).options(num_cpus=0, max_restarts=-1, max_task_retries=0)
    return [cls.remote(cfg.engine, cfg.rollout, "", [InProcessEnvPool(cfg.env, envs)]) for _ in range(count)]


def run(args: argparse.Namespace, assignment: str) -> dict:
    import ray
    from driver_scale import ReceivingLearner

    from deploy.actors import InProcessEnvPool
    from deploy.config_loading import load_config
    from deploy.metrics import MetricsSink
    from deploy.trainer import Trainer, TrainerState

    run_dir = Path(tempfile.mkdtemp(prefix="sim-cluster-"))
    cfg = load_config(None, [
        f"run.output_dir={run_dir}", "run.save_trajectories=false", f"run.total_steps={args.steps + 2}",
        "engine.engine=simulated", f"engine.simulated_gpu={args.gpu}", f"engine.simulated_time_scale={args.time_scale}",
        f"engine.simulated_response_tokens={args.response_tokens}", f"engine.simulated_task_spread={args.task_spread}",
        "rollout.loop=async",
        f"rollout.assignment={assignment}", f"rollout.num_workers={args.workers}", f"rollout.group_size={args.group_size}",
        f"rollout.tasks_per_step={args.tasks}", "rollout.use_think=false", "rollout.constrained_actions=true",
        f"rollout.max_turns={args.max_turns}", "rollout.max_response_tokens=1024", "rollout.max_prompt_tokens=100000",
        f"ray.env_pools={args.workers}", "ray.num_learners=1", "ray.call_timeout_s=600", "eval.at_start=false", "eval.at_end=false"])
    envs = args.group_size * args.groups_at_once
    workers = start_workers(cfg, args.workers, envs)
    learners = [ray.remote(num_cpus=0)(ReceivingLearner).remote()]
    cluster = _sim_cluster_class()(cfg=cfg, pools=[InProcessEnvPool(cfg.env, envs) for _ in workers], workers=workers,
                                   learner_group=SimpleNamespace(actors=learners))
    ray.get([w.policy_version.remote() for w in workers])
    trainer = Trainer(cfg, cluster, MetricsSink(run_dir, loggers=()), TrainerState())
    lengths: list[int] = []
    take = trainer.pipeline.take

    def take_and_measure(step, *, prefetched):  # episode lengths, to show the stragglers
        batch = take(step, prefetched=prefetched)
        lengths.extend(len(t.turns) for t in batch.trajectories)
        return batch

    trainer.pipeline.take = take_and_measure
    trainer.train_step(1)  # warm-up (first calls on fresh workers), not measured
    lengths.clear()
    steps = []
    for step in range(2, args.steps + 2):
        event, killed = "", 0
        if step == 3:
            cluster.remove_workers([len(cluster.workers) - 1, len(cluster.workers) - 2], reason="elastic leave")
            event = "2 workers left"
        if step == 4:
            joined = cluster.add_workers(start_workers(cfg, 2, envs), [[InProcessEnvPool(cfg.env, envs)]] * 2)
            event = f"{joined} workers joined"
        n = len(cluster.workers)
        killer = None
        if step == 5:
            k = max(1, round(0.1 * n))
            at = 0.4 * steps[0]["rollout_wall_s"]
            doomed = list(cluster.workers)[:k]
            killer = threading.Timer(at, lambda doomed=doomed: [ray.kill(h, no_restart=False) for h in doomed])
            killer.start()
            event, killed = f"{k} workers killed after {at:.1f} s", k
        record = trainer.train_step(step)
        if killer is not None:
            killer.join()
        wall, gen = record["time/rollout_s"], record["rollout/generate_s"]
        ideal = gen / n
        row = {"step": step, "workers": n, "event": event, "killed": killed, "episodes": int(record["episodes"]),
               "rollout_wall_s": round(wall, 3), "generate_s": round(gen, 3), "ideal_s": round(ideal, 3),
               "ratio": round(wall / ideal, 4), "simulated_wall_s": round(wall / args.time_scale, 1)}
        steps.append(row)
        print(f"[{assignment}] step {step}: {n} workers {event:28s} {row['episodes']} episodes  rollout "
              f"{wall:6.2f} s  ideal {ideal:6.2f} s  ratio {row['ratio']:.3f}", flush=True)
    for w in cluster.workers:
        ray.kill(w)
    wall = sum(s["rollout_wall_s"] for s in steps)
    ideal = sum(s["ideal_s"] for s in steps)
    expected = args.tasks * args.group_size
    lengths.sort()
    spread = {"min": lengths[0], "median": lengths[len(lengths) // 2], "p90": lengths[int(0.9 * len(lengths))],
              "max": lengths[-1]}
    return {"assignment": assignment, "steps": steps, "ratio": round(wall / ideal, 4), "episode_turns": spread,
            "killed": sum(s["killed"] for s in steps),
            "episodes_lost": sum(expected - s["episodes"] for s in steps)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=32)
    p.add_argument("--tasks", type=int, default=384, help="task groups per step")
    p.add_argument("--group-size", type=int, default=2)
    p.add_argument("--groups-at-once", type=int, default=2, help="groups a worker's env slots hold")
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--response-tokens", type=int, default=200)
    p.add_argument("--task-spread", type=float, default=0.5, help="engine.simulated_task_spread")
    p.add_argument("--gpu", default="1.7b-h100")
    p.add_argument("--time-scale", type=float, default=0.5, help="real seconds per simulated second")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--compare", action="store_true", help="also run the steps with fixed chunks (static) first")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    import driver_scale
    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(driver_scale)  # its receiving learner, pickled whole for the actors
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    runs = [run(args, "static")] if args.compare else []
    runs.append(run(args, "dynamic"))
    ray.shutdown()
    out = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
           "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "goal": 1.15,
           "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for r in runs:
        print(f"{r['assignment']:8s} rollout wall / ideal {r['ratio']:.3f} over {len(r['steps'])} steps; "
              f"turns per episode {r['episode_turns']}")
    last = runs[-1]
    print(f"simulated {args.workers} workers: rollout wall / ideal {last['ratio']:.2f}, workers killed {last['killed']}, "
          f"episodes lost {last['episodes_lost']}")


if __name__ == "__main__":
    main()
