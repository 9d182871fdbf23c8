"""Gold replay: ScienceWorld's own gold action sequences (`get_gold_action_sequence`) replayed through
this package's wrapper (`ScienceWorldTextEnv`), counting the tasks they win.

`gold_replay(num_tasks)` takes tasks round-robin over the 30 task types (the k-th variation of each
type's list in `split`, k = 0, 1, ...), so N tasks cover min(N, 30) types. A task counts as won when
the wrapper reports `won` (ScienceWorld's score reached 100) by the end of the sequence.
"""

from __future__ import annotations

from envs.api import EnvConfig, GoldReplay, Split, TaskSpec
from scienceworld_env import simulator
from scienceworld_env.env import ScienceWorldTextEnv


def gold_tasks(num_tasks: int, split: Split = "train") -> list[TaskSpec]:
    """`num_tasks` tasks round-robin over the task types, in the package's task order."""
    titles, by_task = simulator.task_titles(), simulator.variations(split)
    names = [n for n in simulator.task_names() if by_task[n]]
    out: list[TaskSpec] = []
    k = 0
    while len(out) < num_tasks:
        for name in names:
            if len(out) < num_tasks and k < len(by_task[name]):
                out.append(TaskSpec(env="scienceworld", task_id=f"{name}/{by_task[name][k]}", task_type=name,
                                    split=split, instruction=titles[name], seed=len(out)))
        k += 1
    return out


def gold_replay(*, num_tasks: int, split: Split = "train", simplifications: str = "easy") -> GoldReplay:
    """Replay each task's gold sequence through the wrapper (module docstring)."""
    tasks = gold_tasks(num_tasks, split)
    longest = 500  # gold sequences are a few dozen steps; the step limit must not cut any
    cfg = EnvConfig(plugin="scienceworld_env.plugin:ScienceWorldPlugin", max_steps=longest,
                    options={"simplifications": simplifications, "gold_path": True})
    env = ScienceWorldTextEnv(cfg)
    won, failures = 0, []
    try:
        for task in tasks:
            env.reset(options={"task": task})
            actions = env.gold_actions()
            info: dict = {"won": False, "score": 0.0}
            for action in actions:
                _, _, terminated, truncated, info = env.step(action)
                if terminated or truncated:
                    break
            if info["won"]:
                won += 1
            else:
                failures.append(f"{task.task_id}\tnot won: score {info['score']:.2f} after "
                                f"{info.get('step', 0)}/{len(actions)} gold actions")
    finally:
        env.close()
    return GoldReplay(won=won, total=len(tasks), task_types=len({t.task_type for t in tasks}), failures=failures)
