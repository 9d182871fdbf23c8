"""The driver's share of one training step at cluster scale, without models: synthetic trajectories
of a configurable size go through the real driver code path of one step (`deploy.trainer.Trainer.
train_step`: the pipeline's take, the infrastructure-failure split, routing, row building and the
hand-off to the learner actors) on local Ray. The rollout workers are real Ray actors that play no
episode (they build their share of the step's trajectories once, seeded, and return them from
`collect`); the learners are real Ray actors that only receive (they fetch what the driver hands
them and answer with empty metrics). Weight sync is not part of the data path and is skipped.

Per size (a fresh driver process each, so its peak RSS is that size's) it reports the driver's
CPU seconds (process time: every thread of the driver, Ray's own included) and wall seconds of
one step (the second, after a warm-up step), and the driver's peak RSS. The last line gives the
CPU seconds: the driver's own work. The wall seconds also hold the workers' and learners' own
serialisation, which on one small machine compete with the driver (and with anything else running)
for the same cores; on a cluster they run on their own nodes.

    .venv/bin/python bench/driver_scale.py                            # 128, 512, 1024 episodes
    .venv/bin/python bench/driver_scale.py --episodes 128,256 --out /tmp/x.json

Sizes default to the shipped GPU config's step (16 tasks x 8 = 128 episodes) at 25 turns of a
2,500-token prompt and a 200-token response; `--teacher-fraction` gives that share of turns an
SMRC-SD teacher message (text as long as the student prompt plus `--teacher-extra` tokens, written
by a stand-in for the router: the routing rule's own cost is bench/routing_cost.py's). The learner
ranks take their shard as learners do (`StepRows.shard`: the packs of their own episodes fetched and
joined, their episodes' teacher messages rendered with a real BPE tokenizer and the other ranks'
lengths gathered over a gloo group, the rows built) and report rank 0's seconds, rows and packs fetched; `--whole-step`
has every rank join every episode and build every row instead (`StepRows.rows`), to compare with.
`--allowed-width` gives every response position that many allowed ids (constrained decoding).

Writes bench/results/driver_scale.json; the last line is
`driver per step: 128 ep X.XX s Y.Y GB; 1024 ep Z.ZZ s W.W GB`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_OUT = ROOT / "bench" / "results" / "driver_scale.json"
GROUP_SIZE = 8
ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false",
       "HF_HUB_OFFLINE": "1", "RAY_DEDUP_LOGS": "0"}


# ---- synthetic data (worker side) -------------------------------------------------------------
def synthetic_trajectories(tasks, *, group_size: int, turns: int, prompt_tokens: int, response_tokens: int,
                           allowed_width: int, seed: int, policy_version: int):
    """`group_size` finished episodes per task, each `turns` turns of fresh random ids (what a
    worker's engine would have sampled), half of each group won."""
    import numpy as np

    from rollout_workers.types import Trajectory, Turn

    rng = np.random.default_rng(seed)
    out = []
    for task in tasks:
        group_id = f"{task.task_id}@{task.seed}#synthetic"
        for k in range(group_size):
            won = k % 2 == 0
            steps = []
            for t in range(turns):
                prompt = rng.integers(10, 150_000, prompt_tokens, dtype=np.int64)
                response = rng.integers(10, 150_000, response_tokens, dtype=np.int64)
                logps = -rng.random(response_tokens)
                allowed = None
                if allowed_width:
                    extra = rng.integers(10, 150_000, (response_tokens, allowed_width - 1)).tolist()
                    allowed = tuple((int(r), *e) for r, e in zip(response.tolist(), extra))
                steps.append(Turn(  # lists: the contracts before and after token arrays both take them
                    prompt_ids=prompt.tolist(), response_ids=response.tolist(), sampler_logprobs=logps.tolist(),
                    allowed_token_ids=allowed, response_text="<action>go to desk 1</action>", action="go to desk 1",
                    env_action="go to desk 1", action_valid=True, observation=f"You are in room {t}. You see a desk.",
                    admissible_actions=("go to desk 1", "look"), next_observation=f"You arrive at desk {t}.",
                    reward=10.0 if won and t == turns - 1 else 0.0))
            out.append(Trajectory(task=task, group_id=group_id, traj_id=f"{group_id}/{k}", turns=tuple(steps),
                                  success=won, score=10.0 if won else 0.0, policy_version=policy_version,
                                  end_reason="won" if won else "step_limit"))
    return out


class SyntheticWorker:
    """A rollout worker without an engine: `collect` answers with synthetic trajectories of the
    requested tasks (built at the first call for a task list, then reused)."""

    def __init__(self, shape: dict, seed: int):
        self.shape, self.seed, self.cache = shape, seed, {}

    def collect(self, tasks, *, group_size, policy_version, temperature=None, skill_texts=None):
        from rollout_workers.types import RolloutStats

        key = tuple(t.task_id for t in tasks)
        if key not in self.cache:
            self.cache[key] = synthetic_trajectories(tasks, group_size=group_size, seed=self.seed,
                                                     policy_version=policy_version, **self.shape)
        trajs = [t if t.policy_version == policy_version else t.model_copy(update={"policy_version": policy_version})
                 for t in self.cache[key]]
        stats = RolloutStats(num_episodes=len(trajs), num_turns=sum(len(t.turns) for t in trajs),
                             num_generated_tokens=0, num_prompt_tokens=0, generate_s=0.0, env_s=0.0, total_s=0.0)
        return trajs, stats

    def collect_apart(self, tasks, **kwargs):
        """`collect`'s result as the driver and the learners get it (`RolloutWorker.collect_apart`)."""
        from rollout_workers.summaries import summarize

        trajs, stats = self.collect(tasks, **kwargs)
        summaries, pack = summarize(trajs)
        return (summaries, stats), pack

    def policy_version(self) -> int:
        return 0


class ReceivingLearner:
    """A learner rank that receives the step's data as a learner does (`deploy.step_rows.StepRows.
    shard`: it fetches and joins the packs of the episodes it owns, renders their teacher messages
    to prompt ids and gathers the other ranks' lengths over a gloo group, and builds its rows, the
    others blank) and trains nothing. It reports that stage's seconds as
    `learner/logprob_s` (a stage this learner does not have), and what it held: its rows and the
    packs it fetched, with their share of the step's tokens."""

    def __init__(self, tokenizer_dir: str | None = None, rank: int = 0, world_size: int = 1, whole_step: bool = False):
        from transformers import AutoTokenizer

        self.tokenizer = None if tokenizer_dir is None else AutoTokenizer.from_pretrained(tokenizer_dir)
        self.rank, self.world_size, self.whole_step = rank, world_size, whole_step

    def join(self, init_method: str) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=init_method, rank=self.rank, world_size=self.world_size)

    def train_stored(self, step, proposals=(), align=(), *, proposer_warmup=False):
        import ray

        from deploy.step_rows import episodes_of

        start = time.perf_counter()
        if self.whole_step:  # every rank joins every episode and builds every row (`StepRows.rows`)
            rows = step.rows(step.trajectories(), self.tokenizer, rank=self.rank, world_size=self.world_size)
            owners, mine = [self.rank] * len(rows), {r.traj_id for r in rows}
        else:
            shard = step.shard(self.tokenizer, rank=self.rank, world_size=self.world_size)
            rows, owners, mine = shard.rows, shard.owners, set(shard.held)
        shard_s = time.perf_counter() - start
        calls = [episodes_of(v) for v in ray.get([summaries for summaries, _ in step.refs])]
        tokens = [sum(t.num_prompt_tokens + t.num_response_tokens for e in c for t in e.turns) for c in calls]
        fetched = [any(e.traj_id in mine for e in c) for c in calls]
        teacher = sum(len(r.teacher_prompt_ids) for r in rows if r.teacher_prompt_ids is not None)
        return self._metrics(len(rows), shard_s, teacher, {
            "shard/own_rows": float(sum(o == self.rank for o in owners)),
            "shard/packs_fetched": float(sum(fetched)), "shard/packs": float(len(calls)),
            "shard/token_fraction_fetched": sum(t for t, f in zip(tokens, fetched) if f) / max(sum(tokens), 1)})

    def train_step(self, rows, proposals=(), align=(), *, proposer_warmup=False):
        return self._metrics(len(list(rows)))

    def _metrics(self, num_rows: int, seconds: float = 0.0, teacher_tokens: int = 0, extra=None):
        from learner.types import StageSeconds, StepMetrics

        zero = StageSeconds(collate_s=0.0, logprob_s=seconds, advantage_s=0.0, update_s=0.0, total_s=0.0)
        return StepMetrics(policy_version=0, loss=0.0, pg_loss=0.0, kl_loss=0.0, entropy_loss=0.0, extra_losses={},
                           pg_clipfrac=0.0, pg_clipfrac_lower=0.0, ppo_kl=0.0, kl=0.0, entropy=0.0, grad_norm=0.0,
                           lr=0.0, num_rows=num_rows, num_tokens=teacher_tokens, num_optimizer_steps=0, score_mean=0.0,
                           advantage_abs_mean=0.0, response_length_mean=0.0, rep4gram_ratio=0.0,
                           sampler_logp_abs_diff=0.0, seconds=zero, extra_metrics=dict(extra or {}))

    def get_version(self) -> int:
        return 0


class _Pool:
    def __init__(self, envs: int):
        self.envs = envs

    def num_envs(self) -> int:
        return self.envs


WORDS = ("you", "are", "in", "the", "middle", "of", "a", "room", "looking", "around", "see", "desk", "drawer",
         "shelf", "go", "to", "take", "put", "open", "close", "mug", "from", "on", "1", "2", "3", "nothing", "happens")
CHARS_PER_TOKEN = 4
"""A teacher message's length in characters per student prompt token (English text under a BPE)."""


class _Router:
    """Stand-in for the SMRC-SD router: a teacher message (seeded words, as long in characters as
    the student's prompt plus `extra` tokens of text) for a fixed share of the turns, chosen by a
    seeded hash. It reads what the router reads: the episodes' summaries; like the router, it
    writes text and leaves the tokenizer to the learners. The routing rule's own cost is
    bench/routing_cost.py's."""

    def __init__(self, fraction: float, extra: int):
        import random

        self.fraction, self.extra = fraction, extra
        rng = random.Random(0)
        self.text = " ".join(rng.choice(WORDS) for _ in range(400_000))  # sliced per message: text is cheap to build

    def __call__(self, trajectories, *, step: int):
        import zlib

        from deploy.stages.smrc_sd import RoutingResult

        out = RoutingResult()
        for traj in trajectories:
            for t, turn in enumerate(traj.turns):
                key = zlib.crc32(f"{traj.traj_id}:{t}".encode())
                if key % 1000 < self.fraction * 1000:
                    chars = CHARS_PER_TOKEN * (turn.num_prompt_tokens + self.extra)
                    start = key % max(1, len(self.text) - chars)
                    out.teacher_messages[(traj.traj_id, t)] = f"{traj.traj_id} {t}: " + self.text[start:start + chars]
        out.metrics = {"route/teacher_rows": float(len(out.teacher_messages))}
        return out


def teacher_tokenizer(run_dir: Path) -> str:
    """A real BPE tokenizer with a chat template (the project's tiny model's, trained on the stand-in
    router's words) for the learners to render teacher messages with."""
    from deploy.laptop.tiny_model import TinyModelConfig, build_tiny_model

    tiny = TinyModelConfig(vocab_size=300, hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                           intermediate_size=64, max_position_embeddings=64)
    return str(build_tiny_model(run_dir / "tokenizer", [" ".join(WORDS)] * 50, tiny))


# ---- one size, in its own process --------------------------------------------------------------
def run_one(args: argparse.Namespace, episodes: int) -> dict:
    import ray

    from deploy.config_loading import load_config
    from deploy.metrics import MetricsSink
    from deploy.trainer import Trainer, TrainerState

    tasks_per_step = episodes // GROUP_SIZE
    run_dir = Path(tempfile.mkdtemp(prefix="driver-scale-"))
    cfg = load_config(None, [f"run.output_dir={run_dir}", "run.save_trajectories=false", "run.total_steps=3",
                             f"rollout.group_size={GROUP_SIZE}", f"rollout.tasks_per_step={tasks_per_step}",
                             f"rollout.num_workers={args.workers}", f"ray.env_pools={args.workers}",
                             f"ray.num_learners={args.learners}",
                             "run.loggers=[]", "eval.at_start=false", "eval.at_end=false"])
    ray.init(address="local", num_cpus=max(4, args.workers + args.learners), include_dashboard=False, log_to_driver=False,
             object_store_memory=args.object_store_gb << 30)
    shape = {"turns": args.turns, "prompt_tokens": args.prompt_tokens, "response_tokens": args.response_tokens,
             "allowed_width": args.allowed_width}
    worker_cls = ray.remote(num_cpus=0)(SyntheticWorker)
    workers = [worker_cls.remote(shape, seed=w) for w in range(args.workers)]
    tokenizer = args.tokenizer_dir if args.teacher_fraction > 0 else None
    learners = [ray.remote(num_cpus=0)(ReceivingLearner).remote(tokenizer, r, args.learners, args.whole_step)
                for r in range(args.learners)]
    ray.get([a.join.remote(f"file://{run_dir / 'rendezvous'}") for a in learners])
    cluster = _BenchCluster(cfg=cfg, pools=[_Pool(10**6)] * args.workers, workers=workers,
                            learner_group=SimpleNamespace(actors=learners))
    trainer = Trainer(cfg, cluster, MetricsSink(run_dir, loggers=()), TrainerState())
    if args.teacher_fraction > 0:
        trainer.router = _Router(args.teacher_fraction, args.teacher_extra)
    # the workers build the step's trajectories before the clock starts (a worker's own work)
    _prebuild(cluster, trainer, steps=(1, 2))
    trainer.train_step(1)  # warm-up: imports, Ray's first transfers
    wall0, cpu0 = time.perf_counter(), time.process_time()
    record = trainer.train_step(2)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    ray.shutdown()
    stages = {k: round(v, 3) for k, v in record.items() if k.startswith("time/")}
    return {"episodes": episodes, "turns": args.turns * episodes, "tokens": episodes * args.turns *
            (args.prompt_tokens + args.response_tokens), "driver_cpu_s": round(cpu, 3), "driver_wall_s": round(wall, 3),
            "driver_peak_rss_gb": round(peak / 2**30, 3), "stages": stages,
            "teacher_rows": int(record.get("route/teacher_rows", 0)), "teacher_prompt_tokens": int(record["num_tokens"]),
            "learner_shard_s": round(record["learner/logprob_s"], 3),
            "rank0": {k.removeprefix("shard/"): round(v, 3) for k, v in record.items() if k.startswith("shard/")}}


def _timer():
    from deploy.trainer import StageTimer

    return StageTimer()


def _prebuild(cluster, trainer, steps) -> None:
    """Collect each measured step's tasks once so the workers cache their trajectories."""
    for step in steps:
        job = trainer.prepare_rollout(step, _timer())
        cluster.collect(job["tasks"], group_size=job["group_size"], policy_version=0, temperature=1.0, tokens=False)


def _bench_cluster():
    from deploy.cluster import Cluster

    class BenchCluster(Cluster):
        """The run's Cluster; weight sync (not part of the data path) is skipped."""

        def sync_weights(self, version: int) -> None:
            self.policy_version = version

    return BenchCluster


_BenchCluster = None  # set in main_one (Cluster imports Ray's world)


def main_one(args: argparse.Namespace) -> None:
    global _BenchCluster
    _BenchCluster = _bench_cluster()
    print(json.dumps(run_one(args, args.one)), flush=True)


# ---- the sweep -----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", default="128,512,1024", help="comma-separated episodes per step")
    p.add_argument("--turns", type=int, default=25)
    p.add_argument("--prompt-tokens", type=int, default=2500)
    p.add_argument("--response-tokens", type=int, default=200)
    p.add_argument("--teacher-fraction", type=float, default=0.0)
    p.add_argument("--teacher-extra", type=int, default=500)
    p.add_argument("--allowed-width", type=int, default=0)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--learners", type=int, default=2)
    p.add_argument("--object-store-gb", type=int, default=6)
    p.add_argument("--whole-step", action="store_true",
                   help="learners join every episode and build every row (`StepRows.rows`, the path before each "
                        "rank took its own episodes; UniSkill's), to compare with")
    p.add_argument("--label", default="", help="recorded with the results (e.g. the data path measured)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--tokenizer-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one is not None:
        main_one(args)
        return
    # one tokenizer for every size's learners, built here (each size's driver process stays fresh)
    tokenizer = teacher_tokenizer(Path(tempfile.mkdtemp(prefix="driver-scale-"))) if args.teacher_fraction > 0 else None
    results = []
    for n in [int(x) for x in args.episodes.split(",")]:
        if n % GROUP_SIZE:
            raise SystemExit(f"--episodes {n}: must be a multiple of the group size {GROUP_SIZE}")
        cmd = [sys.executable, __file__, "--one", str(n), *(argv if argv is not None else sys.argv[1:]),
               *(["--tokenizer-dir", tokenizer] if tokenizer else [])]
        res = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **ENV}, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise SystemExit(f"{n} episodes failed:\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}")
        row = json.loads(res.stdout.strip().splitlines()[-1])
        results.append(row)
        print(f"{n:5d} ep  {row['tokens'] / 1e6:6.1f}M tokens  driver cpu {row['driver_cpu_s']:6.2f} s  "
              f"wall {row['driver_wall_s']:6.2f} s  peak RSS {row['driver_peak_rss_gb']:5.2f} GB  {row['stages']}"
              + f"  learner rank 0: {row['learner_shard_s']:.2f} s to build its rows, own rows {row['rank0']['own_rows']:.0f}"
                f" of {row['turns']}, packs {row['rank0']['packs_fetched']:.0f} of {row['rank0']['packs']:.0f}"
                f" ({row['rank0']['token_fraction_fetched']:.0%} of the tokens)"
              + (f", teacher rows {row['teacher_rows']} (each rendered by the rank that owns its episode)" if row["teacher_rows"] else ""),
              flush=True)
    out = {"label": args.label, "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
           "shape": {"turns": args.turns, "prompt_tokens": args.prompt_tokens, "response_tokens": args.response_tokens,
                     "teacher_fraction": args.teacher_fraction, "teacher_extra": args.teacher_extra,
                     "allowed_width": args.allowed_width, "workers": args.workers, "learners": args.learners,
                     "whole_step": args.whole_step},
           "goals": {"128": {"wall_s": 0.5, "rss_gb": 1.0}, "1024": {"wall_s": 4.0, "rss_gb": 2.0}},
           "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    by = {r["episodes"]: r for r in results}
    first, last = by.get(128, results[0]), by.get(1024, results[-1])
    print(f"driver per step: {first['episodes']} ep {first['driver_cpu_s']:.2f} s {first['driver_peak_rss_gb']:.1f} GB; "
          f"{last['episodes']} ep {last['driver_cpu_s']:.2f} s {last['driver_peak_rss_gb']:.1f} GB")


if __name__ == "__main__":
    main()
