"""WebShop parity tools on a generated catalogue: record -> replay is identical; changed pages,
rewards and rankings are reported in the right place; the reward checker on recorded cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from deploy.cli import app
from envs.config import EnvConfig
from envs.webshop.catalogue import build_catalogue, read_raw
from envs.webshop.env import WebShopEnv
from envs.webshop.generate import generate_catalogue
from envs.webshop.parity import check_rewards, record, replay
from envs.webshop.reward import get_reward


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("webshop")
    generate_catalogue(root / "data", num_products=30, seed=2)
    n = record(
        backend="embedded", data_path=root / "data", out=root / "t.jsonl", episodes=12, seed=1, max_steps=None
    )
    assert n == 12 and (root / "t.meta.json").is_file()
    return root / "data", root / "t.jsonl"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_record_then_replay_is_identical(recorded):
    data, transcripts = recorded
    episodes = _lines(transcripts)
    assert any(s.get("search_ranking") for e in episodes for s in e["steps"])
    assert any(s["done"] and s["reward"] > 0 for e in episodes for s in e["steps"])
    report = replay(
        backend="embedded",
        data_path=data,
        transcripts=transcripts,
        env_meta=transcripts.with_suffix(".meta.json"),
    )
    assert report.total_steps == sum(len(e["steps"]) for e in episodes)
    assert report.identical_steps == report.total_steps and not report.mismatches and not report.notes
    assert report.lines()[-1] == f"identical steps: {report.total_steps}/{report.total_steps}"


def test_changed_page_and_reward_are_mismatches(recorded, tmp_path):
    data, transcripts = recorded
    episodes = _lines(transcripts)
    done_episode = next(e for e in episodes if e["steps"][-1]["done"])
    done_episode["steps"][1]["observation"] += " [SEP] extra"
    done_episode["steps"][-1]["reward"] = 0.123
    path = tmp_path / "changed.jsonl"
    path.write_text(json.dumps(done_episode) + "\n")
    report = replay(backend="embedded", data_path=data, transcripts=path)
    fields = [(m.step, m.field) for m in report.mismatches]
    assert (1, "observation") in fields and (len(done_episode["steps"]) - 1, "reward") in fields
    assert report.identical_steps == report.total_steps - 2


def test_ranking_differences_are_notes_and_pages_use_the_recorded_ranking(recorded, tmp_path):
    data, _ = recorded
    catalogue = build_catalogue(read_raw(data), "synthetic", seed=0)
    goal = catalogue.goals[0]
    ours = catalogue.search.search(["shirt"])
    assert len(ours) >= 2
    other = list(reversed(ours))
    env = WebShopEnv(EnvConfig(name="webshop", data_path=str(data)), catalogues={"synthetic": catalogue})
    obs0, _ = env.reset(options={"session": 0})
    env.session.next_ranker = lambda _kw: other
    obs1, *_ = env.step("search[shirt]")
    episode = {
        "goal_mode": "synthetic",
        "session": 0,
        "steps": [
            {
                "action": None,
                "observation": obs0,
                "available_actions": {"has_search_bar": True, "clickables": ["search"]},
                "reward": 0.0,
                "done": False,
            },
            {
                "action": "search[shirt]",
                "observation": obs1,
                "available_actions": env.available_actions(),
                "reward": 0.0,
                "done": False,
                "search_ranking": other,
            },
        ],
    }
    assert goal["instruction_text"] in obs0
    path = tmp_path / "ranked.jsonl"
    path.write_text(json.dumps(episode) + "\n")
    report = replay(backend="embedded", data_path=data, transcripts=path)
    assert report.identical_steps == 2 and not report.mismatches
    assert len(report.notes) == 1 and "search ranking differs" in report.notes[0]


def test_replay_cli_exit_codes(recorded):
    data, transcripts = recorded
    result = CliRunner().invoke(
        app,
        ["env", "replay", "--env", "webshop", "--data-path", str(data), "--transcripts", str(transcripts)],
    )
    assert result.exit_code == 0 and result.output.strip().splitlines()[-1].startswith("identical steps: ")


def test_bad_transcript_line_names_the_problem(recorded, tmp_path):
    data, _ = recorded
    path = tmp_path / "bad.jsonl"
    path.write_text('{"goal_mode": "synthetic", "steps": []}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: transcript lacks 'session'"):
        replay(backend="embedded", data_path=data, transcripts=path)


def _cases(data: Path) -> list[dict]:
    catalogue = build_catalogue(read_raw(data), "synthetic", seed=0)
    cases = []
    for goal in catalogue.goals[:6]:
        for asin in (goal["asin"], catalogue.products[0]["asin"]):
            product = catalogue.by_asin[asin]
            options = {k: v[0] for k, v in product["options"].items()}
            price = catalogue.prices[asin]
            total = get_reward(product, goal, price, options).total
            cases.append(
                {
                    "goal": goal,
                    "purchased_product": product,
                    "selected_options": options,
                    "price": price,
                    "result": {"total": total},
                }
            )
    return cases


def test_check_rewards(recorded, tmp_path):
    data, _ = recorded
    cases = _cases(data)
    path = tmp_path / "cases.jsonl"
    path.write_text("\n".join(json.dumps(c) for c in cases) + "\n")
    assert check_rewards(path) == (len(cases), len(cases), [])
    cases[0]["result"]["total"] += 0.25
    path.write_text("\n".join(json.dumps(c) for c in cases) + "\n")
    matched, total, lines = check_rewards(path)
    assert (matched, total) == (len(cases) - 1, len(cases)) and lines[0].startswith("line 1\t")
    result = CliRunner().invoke(app, ["env", "webshop-reward", "--cases", str(path)])
    assert (
        result.exit_code == 1
        and result.output.strip().splitlines()[-1] == f"matching rewards: {matched}/{total}"
    )


def test_reward_case_missing_keys(tmp_path):
    path = tmp_path / "cases.jsonl"
    path.write_text('{"goal": {}}\n')
    with pytest.raises(ValueError, match="lacks \\['purchased_product'"):
        check_rewards(path)


def test_generate_webshop_cli(tmp_path):
    result = CliRunner().invoke(
        app, ["env", "generate-webshop", "--out", str(tmp_path), "--num-products", "12", "--seed", "3"]
    )
    assert result.exit_code == 0 and "items_shuffle.json" in result.output
    assert len(read_raw(tmp_path).products) == 12


# --- env options per episode and pinned goals -------------------------------


@pytest.fixture(scope="module")
def recorded_with_options(recorded, tmp_path_factory) -> Path:
    data, _ = recorded
    out = tmp_path_factory.mktemp("options") / "attrs.jsonl"
    options = {"show_attrs": True, "num_prev_actions": 1}
    assert record(backend="embedded", data_path=data, out=out, episodes=6, seed=3, max_steps=None,
                  env_kwargs=options) == 6
    return out


def test_episode_env_kwargs_are_replayed(recorded, recorded_with_options, tmp_path):
    data, plain = recorded
    episodes = _lines(recorded_with_options)
    assert all(e["env_kwargs"] == {"show_attrs": True, "num_prev_actions": 1} for e in episodes)
    assert any("[SEP] Attributes [SEP]" in s["observation"] for e in episodes for s in e["steps"])
    meta = recorded_with_options.with_suffix(".meta.json")
    # one file mixing episodes with and without options: each is replayed under its own
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(recorded_with_options.read_text() + plain.read_text())
    report = replay(backend="embedded", data_path=data, transcripts=mixed, env_meta=meta)
    assert report.identical_steps == report.total_steps and not report.mismatches
    # without its env_kwargs the same episode differs from the first action on (the action prefix)
    stripped = tmp_path / "stripped.jsonl"
    stripped.write_text("".join(json.dumps({k: v for k, v in e.items() if k != "env_kwargs"}) + "\n" for e in episodes))
    report = replay(backend="embedded", data_path=data, transcripts=stripped, env_meta=meta)
    assert {m.step for m in report.mismatches if m.field == "observation"} >= {1}
    assert report.identical_steps == len(episodes)  # only the resets still match


def test_bad_env_kwargs_are_named(recorded, tmp_path):
    data, transcripts = recorded
    episode = _lines(transcripts)[0]
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({**episode, "env_kwargs": {"show_atrs": True}}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: env_kwargs: unknown WebShop option\(s\) \['show_atrs'\]"):
        replay(backend="embedded", data_path=data, transcripts=path)
    result = CliRunner().invoke(app, ["env", "replay", "--env", "webshop", "--data-path", str(data),
                                      "--transcripts", str(path)])
    assert result.exit_code == 2 and "show_atrs" in result.output and "Traceback" not in result.output


def test_cli_records_with_env_kwargs(recorded, tmp_path):
    data, _ = recorded
    out = tmp_path / "cli.jsonl"
    args = ["env", "replay", "--env", "webshop", "--data-path", str(data)]
    result = CliRunner().invoke(app, [*args, "--record", str(out), "--episodes", "2",
                                      "--env-kwargs", '{"show_attrs": true}'])
    assert result.exit_code == 0, result.output
    assert all(e["env_kwargs"] == {"show_attrs": True} for e in _lines(out))
    result = CliRunner().invoke(app, [*args, "--transcripts", str(out), "--env-meta", str(out.with_suffix(".meta.json"))])
    assert result.exit_code == 0 and result.output.strip().endswith("identical steps: " + "/".join(
        [str(sum(len(e["steps"]) for e in _lines(out)))] * 2))
    bad = CliRunner().invoke(app, [*args, "--record", str(out), "--env-kwargs", "[1]"])
    assert bad.exit_code == 2 and "--env-kwargs must be a JSON object" in bad.output


def _meta_without(meta: Path, tmp_path: Path, index: int, *keys: str, **changes) -> Path:
    pinned = json.loads(meta.read_text())
    goal = pinned["synthetic"]["goals"][index]
    for key in keys:
        del goal[key]
    goal.update(changes)
    out = tmp_path / "meta.json"
    out.write_text(json.dumps(pinned))
    return out


def test_pinned_goal_is_completed_from_the_catalogue_by_asin(recorded, tmp_path):
    """upstream's goal carries its product's category, query, name and product_category; a pinned
    goal without them gets them from the catalogue and replays identically (the reward reads
    product_category and name, the task type category)."""
    data, transcripts = recorded
    episodes = _lines(transcripts)
    bought = next(e for e in episodes if e["steps"][-1]["done"] and e["steps"][-1]["reward"] > 0)
    meta = _meta_without(transcripts.with_suffix(".meta.json"), tmp_path, bought["session"],
                         "product_category", "category", "name", "query")
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(bought) + "\n")
    report = replay(backend="embedded", data_path=data, transcripts=path, env_meta=meta)
    assert report.identical_steps == report.total_steps == len(bought["steps"])


@pytest.mark.parametrize(("drop", "changes", "message"), [
    (("attributes",), {}, r"goal 0 \(asin '\w+'\) lacks 'attributes', which the engine needs and only the goal"),
    (("product_category",), {"asin": "B0NOTHERE"},
     r"goal 0 \(asin 'B0NOTHERE'\) lacks 'product_category' and its asin is not in the catalogue"),
    (("asin", "query"), {}, r"goal 0 \(asin None\) lacks 'asin'"),
])
def test_pinned_goal_lacking_a_field_is_named(recorded, tmp_path, drop, changes, message):
    data, transcripts = recorded
    meta = _meta_without(transcripts.with_suffix(".meta.json"), tmp_path, 0, *drop, **changes)
    with pytest.raises(ValueError, match=f"meta.json: env meta synthetic {message}"):
        replay(backend="embedded", data_path=data, transcripts=transcripts, env_meta=meta)
