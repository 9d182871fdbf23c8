"""The run config as it comes in: a YAML (or resolved JSON) file, possibly starting from a `base:`
file, plus `--set key=value` strings as the CLI passes them (deploy.config_loading.load_config).

Property: every input is either a valid `TrainConfig` or a `ConfigError` (the loader's own error
type, raised for pydantic's ValidationError too) with a message; never another exception type.
Trees are drawn both blind and along the real schema (so values reach the field validators and
the cross-section model validators), with mutated types at every level.
"""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path

import pytest
import yaml
from fuzzing import fuzz_settings, scaled
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from deploy.config import TrainConfig
from deploy.config_loading import ConfigError, apply_overrides, load_config

FUZZ = fuzz_settings(250)
CLASS = "config loader"


def _schema(model: type[BaseModel], prefix: str = "") -> dict[str, typing.Any]:
    """dotted key -> annotation of every leaf field (sections recursed)."""
    out: dict[str, typing.Any] = {}
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.update(_schema(ann, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = ann
    return out


SCHEMA = _schema(TrainConfig)
KEYS = sorted(SCHEMA)
SECTIONS = sorted({k.rsplit(".", 1)[0] for k in KEYS if "." in k})


def _literals(ann: typing.Any) -> list[typing.Any]:
    """The Literal values an annotation admits (through unions, tuples, optionals)."""
    if typing.get_origin(ann) is typing.Literal:
        return list(typing.get_args(ann))
    if typing.get_origin(ann) in (typing.Union, types.UnionType, tuple):
        return [v for a in typing.get_args(ann) for v in _literals(a)]
    return []


SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.integers(-3, 70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["~", "~nobody/x", "a\x00b", "", " ", "1e-5", "nan", "-inf", "runs/x", "../..", "/"]),
)
JUNK = st.recursive(SCALAR, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.one_of(st.text(max_size=6), st.integers()), inner, max_size=3)),
    max_leaves=8)


def _typed(ann: typing.Any) -> st.SearchStrategy[typing.Any]:
    """Values of the annotation's own type (small, mostly plausible)."""
    args = [a for a in typing.get_args(ann) if a is not type(None)] or [ann]
    base = args[0] if typing.get_origin(ann) in (typing.Union, types.UnionType) else ann
    if base is bool:
        return st.booleans()
    if base is int:
        return st.integers(-2, 300)
    if base is float:
        return st.floats(-1.0, 10.0)
    if base is str:
        return st.text(max_size=10)
    return st.none()


@st.composite
def schema_value(draw: st.DrawFn, key: str, plausible: bool = False) -> typing.Any:
    lits = _literals(SCHEMA[key])
    kinds = ["typed"] if plausible else ["junk", "scalar", "typed"]
    kinds += ["literal", "literal_list"] * bool(lits)
    match draw(st.sampled_from(kinds)):
        case "typed":
            return draw(_typed(SCHEMA[key]))
        case "literal":
            return draw(st.sampled_from(lits))
        case "literal_list":
            return draw(st.lists(st.sampled_from(lits), max_size=3))
        case "scalar":
            return draw(SCALAR)
    return draw(JUNK)


@st.composite
def schema_tree(draw: st.DrawFn) -> dict[str, typing.Any]:
    """A nested dict along the schema: plausible values of each field's type (so the cross-section
    validators run), or with some sections or leaves replaced by junk."""
    plausible = draw(st.booleans())
    tree: dict[str, typing.Any] = {}
    for key in draw(st.lists(st.sampled_from(KEYS), max_size=8, unique=True)):
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                break
            node = child
        else:
            node[leaf] = draw(schema_value(key, plausible))
    if not plausible and draw(st.booleans()):
        tree[draw(st.sampled_from([*SECTIONS, "run", "uniskill", "learner", "base"]))] = draw(JUNK)
    return tree


OVERRIDE = st.one_of(
    st.text(max_size=30),
    st.builds(lambda k, v: f"{k}={v}", st.one_of(st.sampled_from(KEYS), st.sampled_from(SECTIONS),
                                                 st.text(max_size=10), st.sampled_from(["", ".", "a..b", " run.seed"])),
              st.one_of(st.text(max_size=20), st.sampled_from(
                  ["[", "{", "{a: 1}", "[1, 2", "a: b: c", "!!python/object:os.system", "*x", "&a 1", "~", ".inf",
                   "1e999", "-", "? x", "'unterminated", '"\\x"', "%TAG", "---", "!!binary ZZZ", "@", "`", "\t"]))),
)
YAML_TEXT = st.one_of(
    st.text(max_size=200),
    st.builds(lambda t: yaml.safe_dump(t, allow_unicode=True), schema_tree()),
    st.sampled_from(["[1, 2]", "42", "- a\n- b", "run: [", "run:\n\tname: x", "a: &x [*x]", "!!set {a}",
                     "base: 5", "base: [a]", "base: {x: 1}", "base: self.yaml", "base: missing.yaml", "base: ''",
                     "base: \"a\\0b\"", "base: /", "base: .", "{run: {name: a}, run: {seed: 1}}", "\udcff"]),
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz_config")


def _assert_clean(call: typing.Callable[[], typing.Any]) -> None:
    try:
        cfg = call()
    except ConfigError as err:
        assert str(err).strip()
        return
    assert isinstance(cfg, TrainConfig)


@FUZZ
@given(tree=schema_tree(), overrides=st.lists(st.one_of(OVERRIDE, st.sampled_from(KEYS).flatmap(
    lambda k: schema_value(k).map(lambda v: f"{k}={json.dumps(v, allow_nan=True)}"))), max_size=3))
def test_schema_trees_and_overrides_load_or_raise_config_error(fuzz_cases, folder, tree, overrides):
    fuzz_cases(CLASS)
    path = folder / "tree.json"
    path.write_text(json.dumps(tree, allow_nan=True))
    _assert_clean(lambda: load_config(path, overrides))


@FUZZ
@given(text=YAML_TEXT, suffix=st.sampled_from([".yaml", ".json"]))
def test_any_file_text_loads_or_raises_config_error(fuzz_cases, folder, text, suffix):
    fuzz_cases(CLASS)
    path = folder / f"self{suffix}"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    (folder / "self.yaml").touch()
    _assert_clean(lambda: load_config(path, []))


@FUZZ
@given(overrides=st.lists(OVERRIDE, min_size=1, max_size=4))
def test_set_strings_apply_or_raise_config_error(fuzz_cases, overrides):
    fuzz_cases(CLASS)
    try:
        tree = apply_overrides({}, overrides)
    except ConfigError as err:
        assert str(err).strip()
        return
    assert isinstance(tree, dict)
    _assert_clean(lambda: load_config(None, overrides))


CLI_FUZZ = settings(FUZZ, max_examples=scaled(60))
DEMO = Path(__file__).resolve().parents[2] / "deploy" / "configs" / "demo_cpu.yaml"


@CLI_FUZZ
@given(overrides=st.lists(st.one_of(OVERRIDE, st.sampled_from(KEYS).flatmap(
    lambda k: schema_value(k).map(lambda v: f"{k}={json.dumps(v, allow_nan=True)}"))), min_size=1, max_size=3))
def test_cli_set_options_validate_or_exit_2_with_a_message(fuzz_cases, overrides):
    """`python -m deploy validate-config -c demo_cpu.yaml --set ...` as a user types it: the
    resolved config (exit 0) or the loader's message (exit 2), never a traceback."""
    from typer.testing import CliRunner

    from deploy.cli import app

    fuzz_cases(CLASS)
    args = ["validate-config", "--config", str(DEMO)]
    for item in overrides:
        args += ["--set", item]
    result = CliRunner().invoke(app, args)
    assert result.exit_code in (0, 2), (result.exit_code, result.output[-500:], result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    if result.exit_code == 0:
        assert json.loads(result.stdout)["run"]
    else:
        assert result.output.strip()
