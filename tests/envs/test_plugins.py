"""The public environment interface (`envs.api`) and its registry (`envs.registry`): built-ins and
plugins resolve by name, by "package.module:Factory" and through `AGENTRL_ENV_PLUGINS`; bad specs
and unknown names are clear errors; `env.options` reach the plugin; a free-form plugin without a
tracker gets the standard prompt, unconstrained decoding and the generic tracker."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from envs import registry
from envs.api import PromptPieces, TaskSpec, standard_prompt
from envs.config import EnvConfig
from envs.pool import EnvPool
from envs.tasks import eval_tasks, sample_tasks

ECHO = "tests.envs.echo_plugin:EchoPlugin"


@pytest.fixture
def clean_registry(monkeypatch):
    """The registry as a fresh process sees it (plugins registered by a test do not leak)."""
    monkeypatch.setattr(registry, "_loaded", {})
    monkeypatch.setenv(registry.PLUGINS_ENV, "")  # restored (removed) after the test


def test_builtins_register_through_the_interface(clean_registry):
    from envs.alfworld.plugin import AlfworldPlugin
    from envs.webshop.plugin import WebShopPlugin

    assert {"alfworld", "webshop"} <= set(registry.registered_names())
    assert isinstance(registry.get_plugin("alfworld"), AlfworldPlugin)
    assert isinstance(registry.get_plugin("webshop"), WebShopPlugin)
    assert EnvConfig(name="webshop").max_steps == 15 and EnvConfig().max_steps == 50  # each plugin's default


@pytest.mark.parametrize(("spec", "message"), [
    ("no_colon", "must look like 'package.module:Factory'"),
    ("nosuchpackage.mod:Factory", "cannot import 'nosuchpackage.mod'"),
    ("tests.envs.echo_plugin:Nope", "has no attribute 'Nope'"),
    ("tests.envs.echo_plugin:NotAPlugin", "without prompt, make_env"),
])
def test_a_bad_plugin_spec_is_a_clear_config_error(clean_registry, spec, message):
    with pytest.raises(ValidationError, match=message):
        EnvConfig(plugin=spec)


def test_an_unknown_name_names_the_registered_ones_and_the_ways_to_add_one(clean_registry):
    with pytest.raises(ValidationError, match=r"env.name='minecraft' is not a registered environment "
                                              r"\(registered: alfworld, .*webshop\); give env.plugin"):
        EnvConfig(name="minecraft")
    with pytest.raises(ValidationError, match="is not a registered environment"):
        TaskSpec(env="minecraft", task_id="t", task_type="x", split="train", instruction="i", seed=0)


def test_a_plugin_by_spec_registers_its_name_options_and_tasks(clean_registry):
    cfg = EnvConfig(plugin=ECHO, options={"words": ["polly", "hello", "cracker"]}, max_steps=3)
    assert cfg.name == "echo" and cfg.backend == "embedded" and "echo" in registry.registered_names()
    assert [t.task_type for t in eval_tasks(cfg, "valid_unseen", 2)] == ["polly", "hello"]
    assert sorted(t.task_id for t in sample_tasks(cfg, "train", 3, seed=1)) == ["train/0", "train/1", "train/2"]
    # actors in other processes find it by name through the environment the driver passes on
    assert json.loads(registry.plugin_env_vars()[registry.PLUGINS_ENV]) == {"echo": ECHO}
    with pytest.raises(ValidationError, match="env.name='parrot' but env.plugin=.* gives env 'echo'"):
        EnvConfig(name="parrot", plugin=ECHO)


def test_a_name_passed_on_by_the_driver_resolves_in_a_fresh_process(clean_registry, monkeypatch):
    monkeypatch.setenv(registry.PLUGINS_ENV, json.dumps({"echo": ECHO}))
    assert registry.get_plugin("echo").name == "echo"
    assert TaskSpec(env="echo", task_id="t", task_type="hi", split="train", instruction="say hi", seed=0).env == "echo"


def test_a_plugin_env_runs_in_the_pool_and_reports_the_success_signal(clean_registry):
    cfg = EnvConfig(plugin=ECHO, max_steps=2)
    pool = EnvPool(cfg, 2)
    tasks = eval_tasks(cfg, "train", 2)
    first = pool.reset([0, 1], tasks)
    assert first[0].observation.startswith("A parrot") and first[0].admissible_actions == ()  # free-form
    won, lost = pool.step([0, 1], ["hello", "squawk"])
    assert (won.won, won.done, won.reward) == (True, True, 10.0)
    assert (lost.won, lost.done) == (False, False)


def test_a_free_form_env_gets_the_standard_prompt_and_no_constraint(clean_registry):
    from rollout_workers.env_profiles import rollout_profile

    EnvConfig(plugin=ECHO)
    profile = rollout_profile("echo")
    text = profile.render_message(task="say hello", current_observation="A parrot looks at you.",
                                  admissible_actions=[], history=[("obs 1", "squawk")], history_length=2,
                                  use_think=False, skill_text="Parrots like crackers.", teacher_context="[guide]")
    assert text.startswith("\nYou are talking to a parrot {in a cage}.\nYour task is to: say hello\n")
    assert "[Observation 1: 'obs 1', Action 1: 'squawk']" in text
    assert text.index("[guide]") < text.index("You are now at step 2") < text.index("<skill>")
    assert "admissible actions of the current situation are: [any command the environment understands]" in text
    assert profile.constrained_choices([], "say hello") == []  # unconstrained for this turn
    assert profile.task_text(eval_tasks(EnvConfig(plugin=ECHO), "train", 1)[0], "no task line") == "say hello"


def test_prompt_pieces_need_the_lines_the_teacher_and_skill_blocks_go_before():
    good = standard_prompt("You play.")
    with pytest.raises(ValueError, match="must hold the line 'Your current observation is: '"):
        PromptPieces(first_template="Observe: {current_observation}", history_template=good.history_template)
