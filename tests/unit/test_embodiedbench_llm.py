"""The LLM agent's HTTP path against a small local server that speaks the OpenAI chat API (http.server
on 127.0.0.1, a free port, stopped here). The fake model answers with the scripted planner's plan for
the prompt it receives; other modes send malformed replies, which must be counted as invalid plans
with their reason and never crash the run."""
from __future__ import annotations

import pytest
from openai_fake import FakeModel, serve

from mlsys_flows.systems.common.llm import LLMConfig, OpenAICompatibleClient
from mlsys_flows.systems.embodied import make_env, make_tasks
from mlsys_flows.systems.embodied.agents import AgentInput, LLMAgent, ScriptedPlanner, run_episode
from mlsys_flows.systems.embodiedbench import Params, reason_kind, run_chunk, summarize

KEY = "sk-embodied-test-key"


def fake_model(prompt: str) -> str:
    """The scripted planner reading the prompt the LLM agent sends (instruction + observation)."""
    instruction = prompt.split("Instruction: ", 1)[1].split("\n", 1)[0]
    observation = prompt.split("Observation:\n", 1)[1].split("\nFeedback on your previous plan:", 1)[0]
    level = "low" if "room; cells are" in observation else "high"
    planner = ScriptedPlanner()
    planner.reset(None)
    return planner.act(AgentInput(level, instruction, observation, None, 0, ()))


class _Handler(FakeModel):
    mode = "ok"   # ok | prose | bad_ids | http500 | nochoices | alternate
    seen: list = []

    def do_POST(self):
        body = self.read_json()
        type(self).seen.append((self.path, self.headers.get("Authorization"), body))
        mode = type(self).mode
        if mode == "alternate":
            mode = ("ok", "prose")[len(type(self).seen) % 2]
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            return self.send_json(401, {"error": "bad key"})
        if mode == "http500":
            return self.send_json(500, {})
        if mode == "nochoices":
            return self.send_json(200, {"choices": []})
        prompt = body["messages"][-1]["content"]
        content = {"ok": "```json\n" + fake_model(prompt) + "\n```",
                   "prose": "First I will find the mug, then put it away.",
                   "bad_ids": '{"plan": [0, 999]}'}[mode]
        self.send_json(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})


@pytest.fixture()
def endpoint():
    _Handler.mode, _Handler.seen = "ok", []
    with serve(_Handler) as url:
        yield url


def _client(url):
    return OpenAICompatibleClient(LLMConfig(base_url=url, model="tiny-planner", api_key=KEY, timeout_s=10, max_retries=0))


def test_llm_agent_over_http_matches_the_planner_it_serves(endpoint):
    tasks = make_tasks("high", 1, 0) + make_tasks("low", 1, 0)
    with _client(endpoint) as client:
        agent = LLMAgent(client)
        via_http = [run_episode(make_env(t), agent, feedback=False) for t in tasks]
    direct = [run_episode(make_env(t), ScriptedPlanner(), feedback=False) for t in tasks]
    assert [r.success for r in via_http] == [r.success for r in direct]
    assert all(r.invalid_plans == 0 for r in via_http) and agent.requests == len(tasks) == len(_Handler.seen)
    path, auth, body = _Handler.seen[0]
    assert path == "/v1/chat/completions" and auth == f"Bearer {KEY}" and body["model"] == "tiny-planner"
    assert body["messages"][0]["role"] == "system" and tasks[0].instruction in body["messages"][-1]["content"]


@pytest.mark.parametrize("mode, kind", [("prose", "invalid_json"), ("bad_ids", "invalid_action_id"),
                                        ("http500", "endpoint_error"), ("nochoices", "endpoint_error")])
def test_malformed_replies_are_counted_failures(endpoint, mode, kind):
    _Handler.mode = mode
    task = make_tasks("high", 1, 0)[0]
    with _client(endpoint) as client:
        agent = LLMAgent(client)
        res = run_episode(make_env(task), agent, feedback=True, max_rounds=2)
    assert not res.success and res.invalid_plans == 2 and res.rounds == 2
    assert all(reason_kind(r) == kind for r in res.reasons)
    if mode in ("http500", "nochoices"):
        assert agent.errors == 2 and "LLMError" in res.reasons[0]


def test_feedback_rounds_recover_from_a_malformed_reply(endpoint):
    _Handler.mode = "alternate"   # replies alternate: prose (invalid), then the planner's real plan
    p = Params.for_scale("smoke", per_subset=1, agent="llm", llm_base_url=endpoint, expert=False)
    tasks = make_tasks("high", 1, 0)[:2]
    with _client(endpoint) as client:
        eps = run_chunk(p, "high", 0, 2, client)
    s = summarize(eps)
    direct = run_episode(make_env(tasks[1]), ScriptedPlanner(), feedback=False)
    # open loop: the first task got prose (a counted failure), the second a real plan
    assert [e["invalid_plans"] for e in eps["no_feedback"]] == [1, 0]
    assert s["no_feedback"]["success_rate"] == direct.success / 2
    # closed loop: the model is told its reply was not a plan and answers again with a real one
    assert s["with_feedback"]["invalid_plans"] >= 1
    retried = [b for _, _, b in _Handler.seen if "not a valid plan" in b["messages"][-1]["content"]]
    assert retried and all(e["rounds"] >= 2 for e in eps["with_feedback"] if e["invalid_plans"])
