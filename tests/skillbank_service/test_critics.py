"""Critics: rule-based cases, the LLM critic against a real local HTTP server (good JSON, bad
JSON, timeouts, 5xx then success), and the policy-as-critic interface."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from skillbank_service.config import LLMCriticConfig
from skillbank_service.critics import (
    CriticUnavailable,
    LLMCritic,
    PolicyCritic,
    RuleCritic,
    build_critic,
    missed_winning_action,
    parse_verdict,
    refused_text_verdict,
    render_prompt,
)
from skillbank_service.types import CriticRequest, TrajectoryEvidence

TRAJ = """Your task is to: put a hot apple in the fridge.
> go to countertop 1
On the countertop 1, you see a apple 1.
> take apple 1 from countertop 1
> go to microwave 1
> heat apple 1 with microwave 1
You heat the apple 1 using the microwave 1.
> go to fridge 1
> open fridge 1
> move apple 1 to fridge 1"""
RETRIEVED = "To heat an object, take it to the microwave and heat it with the microwave."


def req(op="add", text="Heat the apple with the microwave before you move it to the fridge.", retrieved=None, **kw):
    return CriticRequest(candidate_id="c1", op=op, task_type="pick_heat_then_place_in_recep", text=text,
                         source_trajectory=TRAJ, retrieved_skill_text=retrieved, **kw)


@pytest.mark.parametrize(("request_", "op_ok", "content_ok", "why"), [
    (req(), True, True, ""),
    (req(op="update", text="Heat the object with the microwave, then open the fridge before moving it in.",
         retrieved=RETRIEVED), True, True, ""),
    (req(op="update", retrieved=None), False, True, "without a retrieved skill"),
    (req(op="update", text=RETRIEVED, retrieved=RETRIEVED), False, True, "unchanged"),
    (req(op="add", text="To heat an object, take it to the microwave and heat it with the microwave!",
         retrieved=RETRIEVED), False, True, "near-duplicates"),
    (req(text="Take the apple from countertop 1 and heat it in microwave 1."), True, False, "instance-specific"),
    (req(text="Buy product B07XYZ1234 when the colour matches the request."), True, False, "instance-specific"),
    (req(text="Always negotiate shipping insurance and verify warranty paperwork thoroughly."), True, False,
     "content words occur"),
    (req(text="先用微波炉加热苹果，然后放进冰箱里。"), True, False, "CJK"),
    (req(op="no_edit", text=""), True, True, ""),
    # the environment's own vocabulary (its plugin's SkillVocabulary.instance_pattern) replaces the default
    (req(text="Heat the apple in the microwave, then move the apple to the fridge (step 4).",
         instance_pattern=r"\bstep \d+\b"), True, False, "instance-specific 'step 4'"),
    (req(text="Take the apple from countertop 1 and heat it in microwave 1.", instance_pattern=r"\bstep \d+\b"),
     True, True, ""),
])
def test_rule_critic(request_, op_ok, content_ok, why):
    v = RuleCritic().judge(request_)
    assert (v.op_reasonable, v.content_supported, v.passed) == (op_ok, content_ok, op_ok and content_ok), v
    assert why in v.reason and v.critic == "rule" and not v.failed


LOST = TrajectoryEvidence(won=False, actions=("go to countertop 1", "take apple 1 from countertop 1",
                                             "go to fridge 1", "open fridge 1"))
WON = TrajectoryEvidence(won=True, actions=("go to countertop 1", "take apple 1 from countertop 1",
                                            "go to microwave 1", "heat apple 1 with microwave 1"))


@pytest.mark.parametrize(("source", "reference", "retrieved", "op_ok", "why"), [
    # the failed source never heated the apple, the action that won the reference: a lesson to write
    (LOST, WON, None, False, "'heat apple 1 with microwave 1'"),
    # ... unless the retrieved skill already names its content words (heat, apple, microwave)
    (LOST, WON, "Heat the apple with the microwave before anything else.", True, ""),
    # a retrieved skill that misses one of them ("apple") does not cover it
    (LOST, WON, RETRIEVED, False, "never took"),
    # the source took the winning action too (case and spacing aside): no distinct winning action
    (LOST.model_copy(update={"actions": (*LOST.actions, "Heat apple 1  with microwave 1")}), WON, None, True, ""),
    # the source won: NO_SKILL is reasonable (nothing was lost)
    (WON, LOST, None, True, ""),
    # evidence not given (older callers): no rule about NO_SKILL applies
    (None, None, None, True, ""),
    (LOST, None, None, True, ""),
    # a "won" reference without a valid action has no winning action to point at
    (LOST, TrajectoryEvidence(won=True), None, True, ""),
])
def test_rule_critic_no_skill(source, reference, retrieved, op_ok, why):
    v = RuleCritic().judge(req(op="no_edit", text="", retrieved=retrieved, source=source, reference=reference))
    assert (v.op_reasonable, v.content_supported, v.passed) == (op_ok, True, op_ok), v
    assert why in v.reason


def test_the_no_skill_rule_leaves_add_and_update_alone():
    for op, text in (("add", "Heat the apple with the microwave before you move it to the fridge."),
                     ("update", "Heat the object with the microwave, then open the fridge before moving it in.")):
        v = RuleCritic().judge(req(op=op, text=text, retrieved=RETRIEVED, source=LOST, reference=WON))
        assert v.passed, v


def test_missed_winning_action_by_hand():
    assert missed_winning_action(LOST, WON, None) == "heat apple 1 with microwave 1"
    assert missed_winning_action(WON, LOST, None) is None
    assert missed_winning_action(LOST, LOST.model_copy(update={"won": True}), None) is None  # source took it


def test_refused_text_keeps_the_op_judgement():
    ok = RuleCritic().judge(req())
    refused = refused_text_verdict(ok, "markup tag </action>")
    assert (refused.op_reasonable, refused.content_supported, refused.passed, refused.critic) == (True, False, False, "rule")
    assert refused.reason == "content: invalid skill text: markup tag </action>"
    bad_op = RuleCritic().judge(req(op="update", retrieved=None))
    refused = refused_text_verdict(bad_op, "too short")
    assert (refused.op_reasonable, refused.content_supported, refused.passed) == (False, False, False)
    assert refused.reason.startswith("op: UPDATE without a retrieved skill; content: invalid skill text: too short")


def test_llm_prompt_shows_the_reference():
    prompt = render_prompt(req(op="no_edit", text="", reference_trajectory="Outcome: SUCCESS after 4 step(s)."))
    assert "OPPOSITE-OUTCOME TRAJECTORY OF THE SAME TASK\nOutcome: SUCCESS after 4 step(s).\n" in prompt
    assert "OPPOSITE-OUTCOME TRAJECTORY OF THE SAME TASK\n(none)\n" in render_prompt(req())


def test_parse_verdict_finds_the_json_object_in_chatter():
    v = parse_verdict('Sure.\n```json\n{"op_reasonable": true, "content_supported": false, "reason": "x"}\n```', "llm")
    assert (v.op_reasonable, v.content_supported, v.passed, v.reason) == (True, False, False, "x")
    with pytest.raises(ValueError, match="no JSON verdict"):
        parse_verdict('{"op_reasonable": "yes", "content_supported": true}', "llm")


class Endpoint:
    """A tiny OpenAI-compatible server whose replies follow a script of modes."""

    def __init__(self, modes):
        self.modes = list(modes)
        self.requests = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, self.headers.get("Authorization"), body))
                mode = outer.modes.pop(0) if outer.modes else "good"
                if mode == "slow":
                    time.sleep(1.0)
                if mode == "500":
                    self.send_response(500)
                    self.end_headers()
                    return
                content = {"good": '{"op_reasonable": true, "content_supported": true, "reason": "grounded"}',
                           "reject": '{"op_reasonable": false, "content_supported": true, "reason": "use UPDATE"}',
                           "bad": "I think it is fine", "slow": "{}"}[mode]
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def critic(url, retries=1):
    return LLMCritic(LLMCriticConfig(base_url=url, model="judge", timeout_s=0.3, max_retries=retries,
                                     backoff_s=0.01, api_key_env="TEST_CRITIC_KEY"))


def test_llm_critic_good_and_rejecting_json():
    with Endpoint(["good", "reject"]) as url:
        c = critic(url)
        ok, no = c.judge(req()), c.judge(req())
    assert ok.passed and ok.reason == "grounded" and ok.critic == "llm"
    assert not no.passed and not no.op_reasonable and not no.failed
    assert c.failures == {}


def test_llm_critic_request_carries_model_key_and_delimited_data(monkeypatch):
    monkeypatch.setenv("TEST_CRITIC_KEY", "sekret")
    ep = Endpoint(["good"])
    with ep as url:
        critic(url).judge(req(text="Heat the apple with the microwave first, then cool nothing."))
    path, auth, body = ep.requests[0]
    assert path == "/v1/chat/completions" and auth == "Bearer sekret" and body["model"] == "judge"
    prompt = body["messages"][0]["content"]
    assert "<<<PROPOSED SKILL\nHeat the apple" in prompt and "heat apple 1 with microwave 1" in prompt


@pytest.mark.parametrize(("modes", "tag"), [(["bad", "bad"], "bad_json"), (["slow", "slow"], "timeout")])
def test_llm_critic_failures_are_counted_and_not_passed(modes, tag):
    with Endpoint(modes) as url:
        c = critic(url, retries=1)
        v = c.judge(req())
    assert v.failed and not v.passed and v.reason.startswith(f"critic_{tag}") and "2 attempt" in v.reason
    assert c.failures == {tag: 1}


def test_llm_critic_retries_then_succeeds():
    ep = Endpoint(["500", "bad", "good"])
    with ep as url:
        c = critic(url, retries=2)
        v = c.judge(req())
    assert v.passed and len(ep.requests) == 3 and c.failures == {}


def test_llm_critic_unreachable_endpoint_fails_cleanly():
    c = critic("http://127.0.0.1:9/v1", retries=0)
    v = c.judge(req())
    assert v.failed and not v.passed and c.failures == {"unreachable": 1}


def test_policy_critic_parses_the_policy_reply_and_counts_failures():
    prompts = []

    def generate(prompt):
        prompts.append(prompt)
        return ['{"op_reasonable": true, "content_supported": true}', "no idea", ""][len(prompts) - 1]

    c = build_critic("policy", generate=generate)
    assert isinstance(c, PolicyCritic)
    assert c.judge(req()).passed
    bad = c.judge(req())
    assert bad.failed and not bad.passed and bad.critic == "policy"
    assert c.judge(req()).failed and c.failures == {"bad_json": 2}
    assert "heat apple 1 with microwave 1" in prompts[0]

    def boom(prompt):
        raise RuntimeError("engine down")

    v = PolicyCritic(boom).judge(req())
    assert v.failed and "engine down" in v.reason


def test_build_critic_names_bad_choices():
    assert isinstance(build_critic("rule"), RuleCritic)
    with pytest.raises(ValueError, match="generate"):
        build_critic("policy")
    with pytest.raises(ValueError, match="rule, llm or policy"):
        build_critic("gpt")


def test_unreachable_llm_critic_fails_fast_at_build_naming_the_endpoint():
    import socket

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    cfg = LLMCriticConfig(base_url=dead, timeout_s=0.5)
    with pytest.raises(CriticUnavailable, match=rf"{dead}.*allow_unavailable=true"):
        build_critic("llm", llm=cfg)
    lenient = build_critic("llm", llm=cfg.model_copy(update={"allow_unavailable": True}))
    verdict = lenient.judge(req())
    assert verdict.failed and "critic_unreachable" in verdict.reason


def test_live_llm_critic_passes_the_start_up_check():
    with Endpoint(["good"]) as url:  # GET /models is answered 501 by the script server: reachable
        c = build_critic("llm", llm=LLMCriticConfig(base_url=url, timeout_s=0.5))
        assert c.judge(req()).passed
