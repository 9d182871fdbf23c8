"""WebShop catalogue files (envs.webshop.catalogue: items_shuffle*.json, items_ins_v2*.json,
items_human_ins.json) and the WebShop parity transcripts replayed over them.

Properties: random or mutated files either give a catalogue or fail with `CatalogueError` (or
FileNotFoundError for a missing file), naming the file or the product; a catalogue whose records
keep upstream's field types also plays: its search index builds and sessions over its goals run.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import pytest
from fuzzing import fuzz_settings, json_junk, replay_mutated
from hypothesis import given
from hypothesis import strategies as st

from envs.config import EnvConfig
from envs.webshop.catalogue import (
    ATTRIBUTE_FILES,
    HUMAN_FILE,
    PRODUCT_FILES,
    CatalogueError,
    build_catalogue,
    read_raw,
)
from envs.webshop.env import WebShopEnv
from envs.webshop.generate import generate_raw
from envs.webshop.parity import check_rewards, record, replay

FUZZ = fuzz_settings(150)
CLASS = "webshop catalogue"

JSON_JUNK = json_junk(max_int=10**12)
TEXT = st.one_of(st.text(max_size=12), st.sampled_from(["", " ", "nan", "B000000001", "x" * 11, "/", "$", "[", "]"]))


@functools.cache
def _raw() -> tuple[list, dict, dict]:
    raw = generate_raw(num_products=4, seed=1)
    return raw.products, raw.attributes, raw.human_instructions


PRODUCT_FIELDS = ["asin", "name", "full_description", "small_description", "pricing", "customization_options",
                  "category", "query", "product_category", "images"]


@st.composite
def raw_files(draw: st.DrawFn, typed: bool) -> tuple[object, object, object]:
    """(products, attributes, human) documents: the generated ones with mutations. `typed`: every
    value keeps its upstream type (strings stay strings, lists lists ...), only contents vary."""
    products, attributes, human = copy.deepcopy(_raw())
    for _ in range(draw(st.integers(0, 5))):
        which = draw(st.sampled_from(["product", "option", "attr", "human", "pricing", "drop", "dup", "top"]))
        p = draw(st.sampled_from(products)) if products else None
        asin = p.get("asin") if isinstance(p, dict) and isinstance(p.get("asin"), str) else None
        match which:
            case "product" if p is not None:
                field = draw(st.sampled_from(PRODUCT_FIELDS))
                if typed and field in p:
                    p[field] = draw(st.lists(TEXT, max_size=3)) if isinstance(p[field], list) else (
                        draw(TEXT) if isinstance(p[field], str) else p[field])
                else:
                    p[field] = draw(JSON_JUNK)
            case "option" if p is not None and isinstance(p.get("customization_options"), dict):
                options = p["customization_options"]
                name = draw(TEXT)
                if typed:
                    options[name] = draw(st.lists(st.fixed_dictionaries({"value": TEXT, "image": st.none()}), max_size=3))
                else:
                    options[name] = draw(st.one_of(JSON_JUNK, st.lists(JSON_JUNK, max_size=2)))
            case "pricing" if p is not None:
                p["pricing"] = draw(st.one_of(TEXT, st.sampled_from(["$1,0.0$", "$$", "$1e5", "$.", "$0$0$0", "$-3"]),
                                              *([] if typed else [JSON_JUNK])))
            case "attr" if asin in attributes:
                key = draw(st.sampled_from(["attributes", "instruction", "instruction_attributes"]))
                if typed:
                    attributes[asin][key] = draw(TEXT) if key == "instruction" else draw(st.lists(TEXT, max_size=3))
                else:
                    attributes[asin][key] = draw(JSON_JUNK)
            case "human" if asin in human:
                ins = human[asin][0]
                key = draw(st.sampled_from(["instruction", "instruction_attributes", "instruction_options"]))
                if typed:
                    ins[key] = draw(TEXT) if key == "instruction" else draw(st.lists(TEXT, max_size=3))
                else:
                    ins[key] = draw(JSON_JUNK)
            case "drop" if p is not None:
                field = draw(st.sampled_from(PRODUCT_FIELDS))
                if not typed or field not in ("asin", "name", "full_description", "small_description",
                                              "customization_options", "category", "query", "product_category"):
                    p.pop(field, None)
            case "dup" if p is not None:
                products.append(copy.deepcopy(p))
            case "top" if not typed:
                slot = draw(st.integers(0, 2))
                junk = draw(st.one_of(JSON_JUNK, st.lists(JSON_JUNK, max_size=3)))
                products, attributes, human = (
                    (junk, attributes, human) if slot == 0 else
                    (products, junk, human) if slot == 1 else (products, attributes, junk))
                break
    return products, attributes, human


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz_webshop")


def _write(folder: Path, docs: tuple[object, object, object], broken: tuple[str, str] | None) -> None:
    for name, doc in zip((PRODUCT_FILES[0], ATTRIBUTE_FILES[0], HUMAN_FILE), docs, strict=True):
        (folder / name).write_text(json.dumps(doc))
    if broken is not None:  # one file unreadable: truncated JSON, not UTF-8, or gone
        target = folder / broken[0]
        match broken[1]:
            case "truncated":
                target.write_bytes(target.read_bytes()[:7])
            case "not_utf8":
                target.write_bytes(b"\xff\xfe" + target.read_bytes())
            case _:
                target.unlink()


def _load(folder: Path, goal_mode: str):
    return build_catalogue(read_raw(folder), goal_mode, seed=0)


@FUZZ
@given(docs=raw_files(typed=False), goal_mode=st.sampled_from(["synthetic", "human"]),
       broken=st.one_of(st.none(), st.none(), st.tuples(st.sampled_from([PRODUCT_FILES[0], ATTRIBUTE_FILES[0], HUMAN_FILE]),
                                                        st.sampled_from(["truncated", "not_utf8", "gone"]))))
def test_mutated_catalogue_files_load_or_raise_catalogue_error(fuzz_cases, data_dir, docs, goal_mode, broken):
    fuzz_cases(CLASS)
    _write(data_dir, docs, broken)
    try:
        catalogue = _load(data_dir, goal_mode)
    except CatalogueError as err:
        assert str(data_dir) in str(err) or "product" in str(err), str(err)
        return
    except FileNotFoundError as err:
        assert broken is not None and broken[1] == "gone" and broken[0] != HUMAN_FILE, str(err)
        return
    assert isinstance(catalogue.goals, list) and set(catalogue.prices) == set(catalogue.by_asin)


@FUZZ
@given(docs=raw_files(typed=True), goal_mode=st.sampled_from(["synthetic", "human"]),
       actions=st.lists(st.sampled_from(["search[shirt]", "click[next >]", "click[< prev]", "click[buy now]",
                                         "click[back to search]", "click[description]", "search[ ]"]), max_size=5),
       pick=st.integers(0, 3))
def test_typed_catalogues_play(fuzz_cases, data_dir, docs, goal_mode, actions, pick):
    """Records that keep upstream's types load (or are refused by name) and then play."""
    fuzz_cases(CLASS)
    _write(data_dir, docs, None)
    try:
        catalogue = _load(data_dir, goal_mode)
    except CatalogueError as err:
        assert "product" in str(err) or str(data_dir) in str(err), str(err)
        return
    if not catalogue.goals:
        return
    env = WebShopEnv(EnvConfig(name="webshop", webshop_goal_mode=goal_mode, max_steps=100),
                     catalogues={goal_mode: catalogue})
    _obs, info = env.reset(options={"session": pick % len(catalogue.goals), "goal_mode": goal_mode})
    for action in actions:
        clicks = [a for a in info["admissible_commands"] if a.startswith("click[")]
        if action == "click[buy now]" and clicks:  # land on an item page first when one is listed
            action = clicks[pick % len(clicks)]
        _obs, _r, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break


CLASS_TRANSCRIPT = "webshop parity transcripts"


@pytest.fixture(scope="module")
def webshop_recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict], list[dict]]:
    """A catalogue folder, transcripts recorded on it by the embedded env, and reward cases."""
    root = tmp_path_factory.mktemp("fuzz_webshop_parity")
    _write(root, _raw(), None)
    out = root / "recorded.jsonl"
    record(backend="embedded", data_path=root, out=out, episodes=4, seed=0, max_steps=6)
    catalogue = _load(root, "synthetic")
    cases = [{"goal": g, "purchased_product": catalogue.by_asin[g["asin"]], "selected_options": g["goal_options"],
              "price": catalogue.prices[g["asin"]], "result": {"total": 1.0}} for g in catalogue.goals[:3]]
    return root, [json.loads(line) for line in out.read_text().splitlines()], cases


@st.composite
def mutated_row(draw: st.DrawFn, row: dict, keys: list[str], step_keys: list[str]) -> dict:
    row = json.loads(json.dumps(row))
    for _ in range(draw(st.integers(0, 3))):
        match draw(st.sampled_from(["top", "drop", "step", "cut"])):
            case "top":
                row[draw(st.sampled_from(keys))] = draw(st.one_of(JSON_JUNK, st.integers(-2, 10**6)))
            case "drop":
                row.pop(draw(st.sampled_from(keys)), None)
            case "step" if isinstance(row.get("steps"), list) and row["steps"]:
                i = draw(st.integers(0, len(row["steps"]) - 1))
                if isinstance(row["steps"][i], dict):
                    row["steps"][i][draw(st.sampled_from(step_keys))] = draw(st.one_of(JSON_JUNK, TEXT))
            case "cut" if isinstance(row.get("steps"), list):
                row["steps"] = row["steps"][: draw(st.integers(0, 2))]
    return row


STEP_KEYS = ["action", "observation", "available_actions", "reward", "done", "search_ranking"]


@FUZZ
@given(data=st.data())
def test_mutated_webshop_transcripts_replay_or_name_the_line(fuzz_cases, webshop_recorded, data):
    fuzz_cases(CLASS_TRANSCRIPT)
    root, rows, _cases = webshop_recorded
    picked = data.draw(st.lists(st.sampled_from(rows), min_size=1, max_size=2))
    lines = [json.dumps(data.draw(mutated_row(r, ["goal_mode", "session", "steps"], STEP_KEYS))) for r in picked]
    if data.draw(st.integers(0, 9)) == 5:
        lines.append(data.draw(st.sampled_from(["{", "[1]", "NaN", "\"x\"", "[" * 5000])))
    path = root / "mutated.jsonl"
    path.write_text("\n".join(lines) + "\n")
    replay_mutated(replay, root, path)


def test_unmutated_webshop_transcripts_replay_identically(webshop_recorded):
    root, rows, _cases = webshop_recorded
    path = root / "same.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    report = replay(backend="embedded", data_path=root, transcripts=path)
    assert report.total_steps > 0 and report.identical_steps == report.total_steps, report.lines()[:5]


@FUZZ
@given(data=st.data())
def test_mutated_reward_cases_score_or_name_the_line(fuzz_cases, webshop_recorded, data):
    fuzz_cases(CLASS_TRANSCRIPT)
    root, _rows, cases = webshop_recorded
    case = json.loads(json.dumps(data.draw(st.sampled_from(cases))))
    for _ in range(data.draw(st.integers(0, 3))):
        target = data.draw(st.sampled_from([case, case.get("goal"), case.get("purchased_product"), case.get("result")]))
        if not isinstance(target, dict) or not target:
            continue
        key = data.draw(st.sampled_from(sorted(target)))
        if data.draw(st.booleans()):
            target.pop(key)
        else:
            target[key] = data.draw(st.one_of(JSON_JUNK, TEXT))
    path = root / "cases.jsonl"
    path.write_text(json.dumps(case) + "\n")
    try:
        matched, total, lines = check_rewards(path)
    except (ValueError, TypeError) as err:  # raised on purpose: it names the file and line
        assert str(path) in str(err), repr(err)
        return
    assert total == 1 and matched + len(lines) == 1
