"""`deploy.step_rows`: the learner ranks render the step's SMRC-SD teacher messages to prompt ids,
each its share, and exchange them over their process group (real gloo groups between spawned
processes, a real BPE tokenizer)."""

import multiprocessing as mp

import pytest

from deploy.laptop.tiny_model import TinyModelConfig, build_tiny_model
from deploy.step_rows import StepRows, own_render, render_share, shared_render
from rollout_workers.prompts import render_prompts

CTX = mp.get_context("spawn")
TINY = TinyModelConfig(vocab_size=300, hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                       intermediate_size=64, max_position_embeddings=256)
MESSAGES = {(f"g/{i}", t): f"You are in room {i}. " + "go to desk 1, look. " * (1 + (7 * i + t) % 9)
            for i in range(5) for t in range(3)}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tok") / "model", ["go to desk 1, look. You are in room"] * 20,
                                TINY))


def test_the_ranks_shares_hold_every_message_once_and_about_equal_text():
    shares = [render_share(MESSAGES, rank=r, world_size=3) for r in range(3)]
    assert sorted(k for s in shares for k in s) == sorted(MESSAGES)
    chars = [sum(len(MESSAGES[k]) for k in s) for s in shares]
    assert max(chars) - min(chars) <= max(len(m) for m in MESSAGES.values())
    assert render_share(MESSAGES, rank=1, world_size=3) == shares[1]  # the same on every rank


def _rank(init: str, rank: int, tokenizer_dir: str, queue, own: bool) -> None:
    """One of two gloo ranks: render the teacher messages (a share each, or, `own`, the messages of
    this rank's episodes: g/0, g/2 | g/1, g/3; no rank owns g/4) counting the texts it encodes."""
    import torch.distributed as dist
    from transformers import AutoTokenizer

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    rendered = []
    encode = tokenizer.encode
    tokenizer.encode = lambda text, **kw: rendered.append(text) or encode(text, **kw)
    if own:
        owned = {f"g/{i}" for i in range(5) if i % 2 == rank} - {"g/4"}
        prompts = own_render(tokenizer, MESSAGES, owned, world_size=2)
    else:
        prompts = shared_render(tokenizer, MESSAGES, rank=rank, world_size=2)
    queue.put((rank, {k: (v.tolist(), v.flags.writeable) for k, v in prompts.items()}, len(rendered)))
    dist.destroy_process_group()


def _two_ranks(tmp_path, tokenizer_dir: str, *, own: bool) -> list[tuple[int, dict, int]]:
    """(rank, its prompts as (ids, writeable), texts it encoded) of two spawned `_rank`s, by rank."""
    queue = CTX.Queue()
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [CTX.Process(target=_rank, args=(init, r, tokenizer_dir, queue, own)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    return results


def test_two_ranks_each_render_half_and_both_get_every_prompt(tmp_path, tokenizer_dir):
    from transformers import AutoTokenizer

    results = _two_ranks(tmp_path, tokenizer_dir, own=False)
    want = render_prompts(AutoTokenizer.from_pretrained(tokenizer_dir), MESSAGES)
    for _, prompts, count in results:
        assert {k: ids for k, (ids, _) in prompts.items()} == want  # every rank holds every teacher prompt
    assert [count for _, _, count in results] == [8, 7]  # and rendered only its share of the 15


def test_a_rank_renders_its_own_episodes_messages_and_learns_the_others_lengths(tmp_path, tokenizer_dir):
    from transformers import AutoTokenizer

    results = _two_ranks(tmp_path, tokenizer_dir, own=True)
    want = render_prompts(AutoTokenizer.from_pretrained(tokenizer_dir), MESSAGES)
    for rank, prompts, count in results:
        assert sorted(prompts) == sorted(k for k in MESSAGES if k[0] != "g/4")
        for (traj, turn), (ids, writeable) in prompts.items():
            own = int(traj[2:]) % 2 == rank
            assert ids == (want[traj, turn] if own else [0] * len(want[traj, turn]))
            assert writeable or not own  # the others' are views of one zero
        assert count == 6  # its own two episodes, three turns each: g/0, g/2 | g/1, g/3


def test_without_a_process_group_a_rank_renders_them_all(tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    prompts = shared_render(tokenizer, MESSAGES, rank=1, world_size=2)
    assert {k: v.tolist() for k, v in prompts.items()} == render_prompts(tokenizer, MESSAGES)
    prompts = own_render(tokenizer, MESSAGES, {"g/0"}, world_size=2)
    assert {k: v.tolist() for k, v in prompts.items()} == render_prompts(tokenizer, MESSAGES)


def _episode(name: str, group: str, turn_lengths: list[tuple[int, int]], score: float):
    import json

    from rollout_workers.types import Trajectory
    from tests.rollout_workers.test_arrays import ARCHIVED

    base = json.loads(ARCHIVED)
    turns = [dict(base["turns"][0], prompt_ids=list(range(10, 10 + p)), response_ids=list(range(20, 20 + r)),
                  sampler_logprobs=[-0.5] * r, allowed_token_ids=None, observation=f"{name} o{i}", reward=float(i))
             for i, (p, r) in enumerate(turn_lengths)]
    return Trajectory.model_validate(dict(base, group_id=group, traj_id=name, score=score, turns=turns))


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False, namespace="test_step_rows", log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.ray
def test_each_rank_joins_only_its_own_episodes_and_fetches_only_their_packs(ray_local):
    """Two collect calls: one long episode, and three short ones (plus one lost to the env). Cut into
    two runs of about equal tokens, pack by pack, rank 0 owns the long one and rank 1 the short ones. Each rank's rows equal the rows
    built from every whole trajectory where it owns them and are blank of the same lengths elsewhere;
    rank 0 never fetches the other call's pack (here one whose fetch would raise)."""
    from learner.batch import rows_from_trajectories
    from rollout_workers.summaries import summarize

    ray = ray_local
    long_call = [_episode("g0/0", "g0", [(40, 30), (50, 20)], 10.0)]
    short_call = [_episode(f"g1/{i}", "g1", [(20, 8 + i), (3, 2)], float(i)) for i in range(3)]
    lost = _episode("g1/3", "g1", [(5, 5)], 0.0).model_copy(update={"end_reason": "env_error"})
    calls = [long_call, [*short_call, lost]]
    split = [summarize(c) for c in calls]
    refs = [(ray.put((summaries, None)), ray.put(pack)) for summaries, pack in split]
    played = [s for summaries, _ in split for s in summaries if s.traj_id != "g1/3"]
    step = StepRows.of(refs, played, None, gamma=0.5)
    whole = rows_from_trajectories([t for c in calls for t in c if t.traj_id != "g1/3"], gamma=0.5)

    @ray.remote
    def unreachable():
        raise RuntimeError("this pack was fetched")

    no_second_pack = StepRows.of([refs[0], (refs[1][0], unreachable.remote())], played, None, gamma=0.5)
    shards = [no_second_pack.shard(rank=0, world_size=2), step.shard(rank=1, world_size=2)]
    assert shards[0].owners == shards[1].owners == [0, 0, 1, 1, 1, 1, 1, 1]  # the same on both ranks
    assert shards[0].keepers == shards[1].keepers == {"g0/0": 0, "g1/0": 1, "g1/1": 1, "g1/2": 1, "g1/3": 1}
    assert sorted(shards[0].held) == ["g0/0"] and sorted(shards[1].held) == ["g1/0", "g1/1", "g1/2"]
    for rank, shard in enumerate(shards):
        assert len(shard.rows) == len(whole)
        for row, full, owner in zip(shard.rows, whole, shard.owners, strict=True):
            if owner == rank:
                assert row == full
                continue
            assert (len(row.prompt_ids), len(row.response_ids)) == (len(full.prompt_ids), len(full.response_ids))
            assert not any(row.prompt_ids) and not any(row.response_ids) and not any(row.sampler_logprobs)
            skip = {"prompt_ids", "response_ids", "sampler_logprobs"}
            assert row.model_dump(exclude=skip) == full.model_dump(exclude=skip)
    one = step.shard(rank=0, world_size=1)
    assert (one.rows, one.owners) == (whole, [0] * len(whole))


@pytest.mark.ray
def test_the_ranks_archive_what_they_hold_and_rank_0_merges_it_in_step_order(ray_local, tmp_path):
    """Archived, each rank also joins the episodes it keeps that are not played (here the episode the
    env lost, kept by rank 1 with its neighbours); the merged archive is every episode of the step,
    in step order, as whole trajectories (what rank 0 wrote alone before)."""
    from rollout_workers.summaries import summarize
    from rollout_workers.types import Trajectory

    ray = ray_local
    calls = [[_episode("g0/0", "g0", [(40, 30), (50, 20)], 10.0)],
             [_episode("g1/0", "g1", [(20, 8)], 1.0), _episode("g1/1", "g1", [(5, 5)], 0.0)
              .model_copy(update={"end_reason": "env_error"}), _episode("g1/2", "g1", [(20, 9)], 0.0)]]
    split = [summarize(c) for c in calls]
    refs = [(ray.put((summaries, None)), ray.put(pack)) for summaries, pack in split]
    played = [s for summaries, _ in split for s in summaries if s.traj_id != "g1/1"]
    archive = tmp_path / "trajectories" / "step_000003.jsonl"
    step = StepRows.of(refs, played, None, gamma=1.0, archive=archive)
    shards = [step.shard(rank=r, world_size=2) for r in range(2)]
    assert sorted(shards[1].held) == ["g1/0", "g1/1", "g1/2"]  # the lost episode too, for the archive
    for r, shard in enumerate(shards):
        step.archive_part(shard, rank=r, world_size=2)
    assert not archive.exists() and sorted(p.name for p in archive.parent.iterdir()) == \
        ["step_000003.jsonl.rank0", "step_000003.jsonl.rank1"]
    step.merge_archive(shards[0], world_size=2)
    assert [p.name for p in archive.parent.iterdir()] == ["step_000003.jsonl"]
    lines = archive.read_text().splitlines()
    assert [Trajectory.model_validate_json(line) for line in lines] == [t for c in calls for t in c]
