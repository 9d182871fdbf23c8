"""Environment registration: name -> `envs.api.EnvPlugin`, and environment construction from config.

A name resolves, in order, to: a plugin this process already loaded; a built-in
(`BUILTIN_PLUGINS`, loaded through the same "package.module:Factory" path a user's plugin takes);
a plugin named by a config's `env.plugin` in this process or in the driver that started it (the
driver passes `PLUGINS_ENV` on to every actor); a package's entry point in the `agentrl.envs`
group (`[project.entry-points."agentrl.envs"] myenv = "mypkg.env:MyEnvPlugin"`).

A factory is a class or a callable taking no arguments and returning the plugin; plugins are
loaded lazily (a run imports only the packages of the environment it uses) and once per process.
This module imports nothing of the plugins, so the config and the contracts can use it.
"""

from __future__ import annotations

import importlib
import json
import os
from importlib import metadata
from typing import Any

from envs.types import NAME_CHECKS

ENTRY_POINT_GROUP = "agentrl.envs"
PLUGINS_ENV = "AGENTRL_ENV_PLUGINS"
"""Environment variable holding {name: "package.module:Factory"} (JSON) of the plugins that configs
named by `env.plugin`, so actors in other processes resolve the same names."""
BUILTIN_PLUGINS: dict[str, str] = {
    "alfworld": "envs.alfworld.plugin:AlfworldPlugin",
    "webshop": "envs.webshop.plugin:WebShopPlugin",
}
_REQUIRED = ("name", "prompt", "make_env", "task_list", "instruction", "constrained_actions", "tracker")
_loaded: dict[str, Any] = {}


def load_plugin(spec: str, *, where: str = "env.plugin") -> Any:
    """The plugin a "package.module:Factory" spec names (not registered); a ValueError naming the
    problem and the fix for a malformed spec, a module that does not import or a factory whose
    product lacks the interface."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{where}={spec!r} must look like 'package.module:Factory'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{where}={spec!r}: cannot import {module_name!r} ({err}); install the package "
                         "that provides it (pip install -e <its folder>) or fix the module path") from err
    factory = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise ValueError(f"{where}={spec!r}: module {module_name!r} has no attribute {attr!r}")
    plugin = factory() if callable(factory) else factory
    missing = [m for m in _REQUIRED if not hasattr(plugin, m)]
    if missing:
        raise ValueError(f"{where}={spec!r} gives a {type(plugin).__name__} without {', '.join(missing)}: "
                         "an environment plugin subclasses envs.api.EnvPlugin")
    if not isinstance(getattr(plugin, "name", None), str) or not plugin.name:
        raise ValueError(f"{where}={spec!r}: the plugin's `name` must be a non-empty string")
    return plugin


def register(plugin: Any, *, spec: str | None = None) -> Any:
    """Make `plugin` the one for `plugin.name` in this process (and, with its `spec`, in the actors
    this process starts afterwards). A different plugin already under that name is a ValueError."""
    known = _loaded.get(plugin.name)
    if known is not None and type(known) is not type(plugin):
        raise ValueError(f"env name {plugin.name!r} is already registered by {type(known).__module__}."
                         f"{type(known).__name__}; give the plugin another name")
    _loaded.setdefault(plugin.name, plugin)
    if spec is not None and plugin.name not in BUILTIN_PLUGINS:
        specs = _env_specs()
        if specs.get(plugin.name) != spec:
            os.environ[PLUGINS_ENV] = json.dumps({**specs, plugin.name: spec}, sort_keys=True)
    return _loaded[plugin.name]


def register_spec(spec: str, *, where: str = "env.plugin") -> Any:
    """Load and register the plugin `spec` names; returns it."""
    return register(load_plugin(spec, where=where), spec=spec)


def _env_specs() -> dict[str, str]:
    text = os.environ.get(PLUGINS_ENV, "")
    try:
        value = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _entry_points() -> dict[str, str]:
    return {ep.name: ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def plugin_env_vars() -> dict[str, str]:
    """{PLUGINS_ENV: ...} when this process registered plugins by spec (for an actor's runtime_env)."""
    return {PLUGINS_ENV: os.environ[PLUGINS_ENV]} if os.environ.get(PLUGINS_ENV) else {}


def registered_names() -> list[str]:
    """Every name that resolves here (built-ins, loaded, passed-on and entry-point plugins), sorted."""
    return sorted({*BUILTIN_PLUGINS, *_loaded, *_env_specs(), *_entry_points()})


def get_plugin(name: str) -> Any:
    """The plugin registered as `name`; a ValueError naming the registered names and the ways to
    register one for any other name."""
    if name in _loaded:
        return _loaded[name]
    for where, specs in (("built-in", BUILTIN_PLUGINS), (PLUGINS_ENV, _env_specs())):
        if name in specs:
            return _register_as(name, specs[name], where)
    eps = _entry_points()
    if name in eps:
        return _register_as(name, eps[name], f"entry point {ENTRY_POINT_GROUP}:{name}")
    raise ValueError(f"env.name={name!r} is not a registered environment (registered: "
                     f"{', '.join(registered_names())}); give env.plugin: 'package.module:Factory', or "
                     f"install a package declaring it in the {ENTRY_POINT_GROUP!r} entry-point group")


def _register_as(name: str, spec: str, where: str) -> Any:
    plugin = load_plugin(spec, where=where)
    if plugin.name != name:
        raise ValueError(f"{where}: {spec!r} gives env {plugin.name!r}, not {name!r}")
    return register(plugin)


def check_registered(name: str) -> None:
    """ValueError unless `name` resolves to a plugin (`get_plugin`)."""
    get_plugin(name)


def plugin_for(cfg: Any) -> Any:
    """The plugin of an `EnvConfig`: its `plugin` spec when given (registered here), else its name."""
    if getattr(cfg, "plugin", None):
        return register_spec(cfg.plugin)
    return get_plugin(cfg.name)


def make_env(cfg: Any) -> Any:
    """A fresh, not-yet-reset environment for `cfg` (an `EnvConfig`)."""
    return plugin_for(cfg).make_env(cfg)


NAME_CHECKS.append(check_registered)
