"""Reading a config: YAML (or a saved config.resolved.json) with `base:` inheritance, dotted
`--set key=value` overrides, validation into `TrainConfig` with errors that name the key, and the
driver-side check of `model.path`."""

from __future__ import annotations

import difflib
import json
import os
import re
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from deploy.config import TrainConfig
from deploy.errors import UserError


class ConfigError(UserError, ValueError):
    """A configuration problem, phrased so the user knows which key to fix."""


def _parse_value(text: str, key: str = "") -> Any:
    """YAML scalar/list parsing, plus floats YAML 1.1 leaves as strings (`3e-5`)."""
    try:
        value = yaml.safe_load(text) if text != "" else ""
    except (yaml.YAMLError, ValueError, RecursionError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(f"override {key}={text!r}: the value is not valid YAML ({reason}); wrap it in "
                          "quotes to pass it as text") from None
    if isinstance(value, str):
        try:
            return float(value) if value.strip().lower() not in ("nan", "inf", "-inf", "infinity") else value
        except ValueError:
            return value
    return value


def apply_overrides(tree: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply dotted `key=value` overrides (values parsed as YAML scalars/lists) to a nested dict."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r} has no '=': write it as section.key=value, e.g. --set run.total_steps=4")
        key, raw = item.split("=", 1)
        node = tree
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {key!r}: {part!r} is a value, not a section")
            node = child
        node[parts[-1]] = _parse_value(raw, key.strip())
    return tree


def _sections(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation may hold (`X`, `X | None`, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _sections(arg)]


def config_keys(model: type[BaseModel] = TrainConfig, prefix: str = "") -> list[str]:
    """Every dotted key a config may set (sections and their keys), e.g. `learner.lr`."""
    keys = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        keys.append(key)
        for section in _sections(field.annotation):
            keys.extend(config_keys(section, f"{key}."))
    return keys


def _suggest(key: str) -> str:
    """`did you mean ...?` with the nearest valid keys (among the section's keys when the section
    exists), or where the valid keys are listed."""
    keys = config_keys()
    section = key.rpartition(".")[0]
    pool = ([k for k in keys if k.rpartition(".")[0] == section] if section in keys
            else [k for k in keys if k.count(".") == key.count(".")])
    near = difflib.get_close_matches(key, pool, n=3, cutoff=0.6)
    if near:
        return "did you mean " + " or ".join(near) + "?"
    return "`python -m deploy validate-config --config deploy/configs/smoke_cpu.yaml` prints every valid key"


def _set_key(key: str, overrides: list[str]) -> str | None:
    """The --set key that gave `key` (itself, a key below it, or a section above it), if any."""
    for item in overrides:
        k = item.split("=", 1)[0].strip()
        if k == key or k.startswith(key + ".") or key.startswith(k + "."):
            return k
    return None


def _problem(e: dict[str, Any], source: str, overrides: list[str]) -> str:
    key = ".".join(str(p) for p in e["loc"])
    set_key = _set_key(key, overrides) if key else None
    where = f"--set {set_key}" if set_key else source
    if e["type"] == "extra_forbidden":
        unknown = set_key if set_key and set_key.startswith(key) else key
        return f"unknown config key {unknown} (from {where}); {_suggest(unknown)}"
    reason = " ".join(e["msg"].removeprefix("Value error, ").split())
    if not key or not isinstance(e.get("input"), (str, int, float, bool, type(None))):
        return f"{where}: {reason}"  # a check across keys: its message names them and the fix
    return f"{key}={e['input']!r} is invalid (from {where}): {reason}; fix the value"


def _format_errors(err: ValidationError, source: str, overrides: list[str]) -> str:
    """The validation errors on one line: an unknown key names where it came from (the file or
    --set) and the nearest valid keys; a bad value names the key and pydantic's reason."""
    return "; ".join(_problem(e, source, overrides) for e in err.errors())


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        out[key] = _deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def read_tree(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A config file as a dict. YAML files may start from another with `base: other.yaml`
    (relative to the file); keys given here override the base's, section by section."""
    try:
        p = Path(path).resolve()
    except (OSError, RuntimeError, ValueError) as err:
        raise ConfigError(f"config file {str(path)!r} is not a usable path ({err})") from None
    if not p.is_file():
        raise ConfigError(f"config file {path} does not exist: check the path (the laptop configs are "
                          "deploy/configs/*.yaml)")
    if p in _seen:
        raise ConfigError(f"config {p} includes itself through 'base'")
    try:
        text = p.read_text()
        tree = (json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)) or {}
    except (OSError, yaml.YAMLError, ValueError, RecursionError) as err:  # JSON and UTF-8 errors are ValueErrors
        raise ConfigError(f"config {p} cannot be parsed: {err}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"config {p} must be a mapping at the top level")
    base = tree.pop("base", None)
    if base and not isinstance(base, str):
        raise ConfigError(f"config {p}: 'base' must name another config file, got {base!r}")
    return _deep_merge(read_tree(p.parent / base, (*_seen, p)), tree) if base else tree


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_env(tree: Any, env: dict[str, str] | None = None, _key: str = "") -> Any:
    """Replace every `${NAME}` inside string values with the environment variable NAME (after
    `base:` merging and `--set` overrides, so either may use it). An unset or empty variable is a
    ConfigError naming the variable and the key; `$$` is not special and a bare `$NAME` stays as is."""
    env = os.environ if env is None else env
    if isinstance(tree, dict):
        return {k: expand_env(v, env, f"{_key}.{k}" if _key else str(k)) for k, v in tree.items()}
    if isinstance(tree, list):
        return [expand_env(v, env, f"{_key}[{i}]") for i, v in enumerate(tree)]
    if not isinstance(tree, str) or "${" not in tree:
        return tree

    def one(match: re.Match) -> str:
        name = match.group(1)
        value = env.get(name)
        if not value:
            raise ConfigError(f"{_key}={tree!r} needs the environment variable {name}, which is not set: "
                              f"export {name}=<value> before loading the config (or override the key with "
                              f"--set {_key}=<value>)")
        return value

    return _ENV_REF.sub(one, tree)


def _unicode_text(tree: Any, _key: str = "") -> Any:
    """Join the UTF-16 surrogate pairs YAML leaves split (`"\\ud800\\udc00"` in a YAML file or a --set
    value is one character), and refuse a lone surrogate: it cannot be written to the resolved config."""
    if isinstance(tree, dict):
        return {_unicode_text(k, _key): _unicode_text(v, f"{_key}.{k}" if _key else str(k))
                for k, v in tree.items()}
    if isinstance(tree, list):
        return [_unicode_text(v, f"{_key}[{i}]") for i, v in enumerate(tree)]
    if not isinstance(tree, str) or tree.isascii():
        return tree
    try:
        return tree.encode("utf-16", "surrogatepass").decode("utf-16")
    except UnicodeDecodeError:
        raise ConfigError(f"{_key}={tree!r} holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff "
                          "escape), which is not text: write the character itself or a full pair") from None


def _check_cross_section(cfg: TrainConfig) -> None:
    """Checks that need more than one section or the driver's environment."""
    from envs.tasks import is_generated

    if cfg.eval.num_tasks is None and is_generated(cfg.env):
        raise ConfigError("eval.num_tasks=all evaluates a whole split, but generated households (env.backend="
                          "embedded without env.data_path) have no end: set eval.num_tasks=<N> or env.data_path")
    if "wandb" in cfg.run.loggers:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ConfigError("run.loggers lists wandb but the wandb package is not installed: "
                              "pip install '.[wandb]' (or remove wandb from run.loggers)") from None


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    """Read YAML (or a saved config.resolved.json), apply overrides, expand `${ENV_VARS}`, validate."""
    tree = read_tree(path) if path is not None else {}
    source = str(path) if path is not None else "<defaults>"
    tree = apply_overrides(tree, overrides or [])
    try:
        tree = _unicode_text(expand_env(tree))
    except RecursionError:  # a YAML alias that contains itself, or absurd nesting
        raise ConfigError(f"config {source} nests too deeply or refers to itself (YAML alias cycle)") from None
    try:
        cfg = TrainConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source, overrides or [])) from None
    _check_cross_section(cfg)
    data_path = cfg.env.data_path
    if data_path is not None:
        try:
            expanded = Path(data_path).expanduser()
            resolved = None if expanded.is_absolute() else str(expanded.resolve())
        except (OSError, RuntimeError, ValueError) as err:  # "~unknown_user", a NUL byte, a link loop
            raise ConfigError(f"env.data_path={data_path!r} is not a usable path ({err})") from None
        if resolved is not None:
            # Actors (and `ray job submit` jobs, whose working dir leaves runs/ out) must see the same
            # folder the driver meant: resolve against the driver's working directory once, here.
            cfg = cfg.model_copy(update={"env": cfg.env.model_copy(update={"data_path": resolved})})
    return cfg


def save_resolved(cfg: TrainConfig, run_dir: str | Path) -> Path:
    out = Path(run_dir) / "config.resolved.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    # Derived fields stay out, so a resumed run with another run.total_steps derives them afresh.
    out.write_text(cfg.model_dump_json(indent=2, exclude={"learner": {"sd": {"total_steps"}}}))
    return out


def resolve_model_path(path: str) -> str:
    """The model every actor will load, checked on the driver before any actor starts: an existing
    directory (made absolute, so actors and `ray job submit` jobs see the folder the driver meant)
    or a hub id already in the local Hugging Face cache. Anything else is a ConfigError that names
    the path and the fix, instead of the hub's "Repo id must be in the form ..." from inside an actor."""
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ConfigError(f"model.path {path!r} is a directory without config.json: point it at a "
                              "Hugging Face model directory")
        return str(local.resolve())
    if local.exists():
        raise ConfigError(f"model.path {path!r} is a file; it must be a Hugging Face model directory")
    if _in_hf_cache(path):
        return path
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", path):  # looks like a hub id
        raise ConfigError(
            f"model.path {path!r} (a Hugging Face hub id) is not in the local Hugging Face cache "
            f"({_hf_cache_dir()}), and runs never download (HF_HUB_OFFLINE=1 on every actor). Provide it "
            f"before submitting: `huggingface-cli download {path}` on a machine that can reach the hub, "
            "into the cache every node reads (HF_HOME / HF_HUB_CACHE on shared storage), or download it "
            "to a directory and pass --set model.path=/shared/models/<name>")
    raise ConfigError(
        f"model.path {path!r} is neither a directory nor a model in the local Hugging Face cache. "
        "Build the laptop model with `python -m deploy build-tiny-model --out runs/tiny/base` (then "
        "`python -m deploy sft` for runs/tiny/sft), download the model first "
        "(`huggingface-cli download <org/name>`), or set --set model.path=<HF model directory>")


def _hf_cache_dir() -> str:
    try:
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:
        return "~/.cache/huggingface/hub"
    return str(HF_HUB_CACHE)


def _in_hf_cache(repo_id: str) -> bool:
    if repo_id.count("/") != 1 or repo_id.startswith(("/", ".", "~")):
        return False
    try:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.errors import HFValidationError
    except ImportError:
        return False
    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except HFValidationError:
        return False
