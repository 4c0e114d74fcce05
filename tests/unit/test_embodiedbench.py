"""EmbodiedBench system and the shared agent interface: plan parsing (malformed replies rejected with a
reason), episodes that count invalid plans instead of crashing, the open-loop and feedback planners,
parameters, and the counted summary."""
from __future__ import annotations

import pytest

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.embodied import make_env, make_tasks
from mlsys_flows.systems.embodied.agents import (AgentInput, ExpertAgent, FeedbackReplanner, ObservationReplanner,
                                                 PlanError, ScriptedPlanner, parse_plan, read_goals, run_episode)
from mlsys_flows.systems.embodiedbench import (SPEC, Params, eval_seeds, per_seed, reason_kind, run_chunk, success_by_round,
                                               summarize, sweep_rounds)


@pytest.mark.parametrize("reply, plan", [
    ('{"plan": [1, 2, 3]}', [1, 2, 3]),
    ("[4, 0]", [4, 0]),
    ('Sure!\n```json\n{"plan": [5]}\n```', [5]),
    ('{"reasoning": "x", "executable_plan": [{"action_id": 2, "action_name": "find"}]}', [2]),
])
def test_parse_plan_accepts_the_usual_shapes(reply, plan):
    assert parse_plan(reply, 6) == plan


@pytest.mark.parametrize("reply, reason", [
    ("I will go to the fridge.", "no JSON"),
    ('{"plan": [1, 2', "invalid JSON"),
    ('{"steps": [1]}', "without a 'plan'"),
    ('{"plan": []}', "empty plan"),
    ('{"plan": [1, 6]}', "out of range"),
    ('{"plan": [1, "up"]}', "not an integer"),
    ('{"plan": [true]}', "not an integer"),
    ('{"plan": 3}', "not a list"),
    (None, "not text"),
])
def test_parse_plan_rejects_malformed_replies_with_a_reason(reply, reason):
    with pytest.raises(PlanError, match=reason):
        parse_plan(reply, 6)


class _Garbage:
    name, uses_feedback = "garbage", True

    def __init__(self, replies):
        self.replies, self.seen = list(replies), []

    def reset(self, env):
        pass

    def act(self, inp: AgentInput):
        self.seen.append(inp)
        r = self.replies.pop(0)
        if isinstance(r, Exception):
            raise r
        return r


def test_malformed_replies_and_agent_errors_are_counted_not_raised():
    env = make_env(make_tasks("high", 1, 0)[0])
    agent = _Garbage(["no json here", RuntimeError("boom"), '{"plan": [99]}'])
    res = run_episode(env, agent, feedback=True, max_rounds=3)
    assert not res.success and res.invalid_plans == 3 and res.rounds == 3 and env.steps == 0
    assert [reason_kind(r) for r in res.reasons] == ["invalid_json", "other_invalid_plan", "invalid_action_id"]
    assert "boom" in res.reasons[1]
    # with feedback the agent is told why its reply was rejected; without it, it plans once
    assert agent.seen[0].feedback is None and "not a valid plan" in agent.seen[1].feedback
    res = run_episode(make_env(make_tasks("high", 1, 0)[0]), _Garbage(["nope", "[]"]), feedback=False)
    assert res.rounds == 1 and res.invalid_plans == 1


def test_an_invalid_action_ends_the_plan_and_is_fed_back():
    env = make_env(make_tasks("high", 1, 0)[0])
    bad = next(a for a in range(50) if not env.valid_mask()[a])
    agent = _Garbage([f'{{"plan": [{bad}, 0, 1]}}', '{"plan": [0]}'])
    res = run_episode(env, agent, feedback=True, max_rounds=2)
    assert res.invalid_actions == 1 and "INVALID" in agent.seen[1].feedback
    assert "remaining 2 actions" in agent.seen[1].feedback and reason_kind(res.reasons[0]) == "invalid_action"


def test_goal_reading_is_keyword_based():
    pairs, listing, closes = read_goals("Put the red mug in the fridge, the blue book on the shelf "
                                        "and the green pen in the drawer, then close the fridge.", "high")
    assert listing and [d for _, d in pairs] == ["fridge", "shelf", "drawer"] and closes == ["fridge"]
    pairs, listing, _ = read_goals("I was going to ask you to put the red mug in the sink, but forget that; "
                                   "put the blue book on the table.", "high")
    assert not listing and pairs[0] == (("red", "mug"), "sink")   # the distractor first: its weakness
    pairs, listing, _ = read_goals("Move the red cube to the green pad, then the blue ball to the red pad.", "low")
    assert listing and pairs == [(("red", "cube"), "green"), (("blue", "ball"), "red")]


def test_feedback_replanner_fixes_what_the_open_loop_planner_gets_wrong():
    tasks = make_tasks("high", 4, 0) + make_tasks("low", 4, 0)
    open_loop = [run_episode(make_env(t), ScriptedPlanner(), False) for t in tasks]
    closed = [run_episode(make_env(t), FeedbackReplanner(), True, 10) for t in tasks]
    expert = [run_episode(make_env(t), ExpertAgent(), False) for t in tasks]
    assert all(r.success for r in expert)
    assert all(r.rounds == 1 for r in open_loop) and all(r.invalid_plans == 0 for r in open_loop + closed)
    assert all(c.success for o, c in zip(open_loop, closed) if o.success)   # never loses a solved task
    assert sum(c.success for c in closed) > sum(o.success for o in open_loop)
    assert any(c.rounds > 1 for c in closed if c.success)


class _StayReplanner(ScriptedPlanner):
    """Replans from each observation but keeps its first reading (the alternative ObservationReplanner rejects)."""


def test_replanning_without_feedback_has_the_budget_but_never_sees_feedback():
    tasks = make_tasks("high", 4, 0) + make_tasks("low", 4, 0)
    open_loop = [run_episode(make_env(t), ScriptedPlanner(), False) for t in tasks]
    seen: list[AgentInput] = []

    class Spy(ObservationReplanner):
        def act(self, inp):
            seen.append(inp)
            return super().act(inp)

    blind = [run_episode(make_env(t), Spy(), False, 10, replan=True) for t in tasks]
    assert seen and all(inp.feedback is None for inp in seen) and any(inp.round > 0 for inp in seen)
    assert any(r.rounds > 1 for r in blind) and max(r.rounds for r in blind) <= 10
    # its first plan is the open-loop plan, so it keeps every task the open loop solves (in the first round)
    assert all(b.success and b.success_round == 0 for o, b in zip(open_loop, blind) if o.success)
    assert sum(b.success for b in blind) > sum(o.success for o in open_loop)
    # moving to the next reading after each plan beats replanning the same reading
    stay = [run_episode(make_env(t), _StayReplanner(), False, 10, replan=True) for t in
            make_tasks("high", 10, 1) + make_tasks("low", 10, 1)]
    moved = [run_episode(make_env(t), ObservationReplanner(), False, 10, replan=True) for t in
             make_tasks("high", 10, 1) + make_tasks("low", 10, 1)]
    assert sum(m.success for m in moved) > sum(s.success for s in stay)


def test_round_budget_sweep_reads_success_within_r_plans_per_test_set():
    p = Params.for_scale("smoke", per_subset=1, seeds=2, expert=False, max_rounds=10, regime_rounds=[1, 3, 10])
    eps: dict[str, list[dict]] = {}
    for seed in eval_seeds(p):
        for level in ("high", "low"):
            for v, e in run_chunk(p, level, 0, 6, seed=seed).items():
                eps.setdefault(v, []).extend(e)
    sweep = sweep_rounds(eps, eval_seeds(p), [10, 1, 3])
    assert list(sweep) == [1, 3, 10] and set(sweep[1]) == {"with_feedback", "replan_no_feedback", "no_feedback"}
    # one plan: the three protocols coincide (every first plan is the open-loop plan)
    assert sweep[1]["with_feedback"] == sweep[1]["replan_no_feedback"] == sweep[1]["no_feedback"]
    for v in ("with_feedback", "replan_no_feedback"):
        assert all(a <= b <= c for a, b, c in zip(sweep[1][v], sweep[3][v], sweep[10][v]))
    # at the full budget the sweep is the run itself, one sample per test set
    assert sweep[10]["with_feedback"] == per_seed(eps, eval_seeds(p))["with_feedback"]["success_rate"]
    assert sweep[10]["no_feedback"] == sweep[1]["no_feedback"]


def test_the_headline_compares_feedback_at_an_equal_plan_budget():
    h = SPEC.headline
    assert (h.baseline, h.technique) == ("replan_no_feedback", "with_feedback")
    assert SPEC.mechanism.ablation == "replan_no_feedback" and SPEC.contract_v3
    assert SPEC.regime.parameter in Params.model_fields


def test_params_fail_on_bad_values_naming_the_field():
    with pytest.raises(ParamsError, match="per_subset"):
        Params.for_scale("smoke", per_subset=0)
    with pytest.raises(ParamsError, match="llm_base_url"):
        Params.for_scale("smoke", agent="llm")
    with pytest.raises(ParamsError, match="agent"):
        Params.for_scale("smoke", agent="gpt")
    with pytest.raises(ParamsError, match="regime_rounds"):
        Params.for_scale("smoke", max_rounds=5, regime_rounds=[1, 10])


def test_summary_counts_per_level_and_subset():
    p = Params.for_scale("smoke", per_subset=1, expert=True)
    eps = {}
    for level in ("high", "low"):
        for v, e in run_chunk(p, level, 0, 6).items():
            eps.setdefault(v, []).extend(e)
    s = summarize(eps)
    assert set(s) == {f"{v}{x}" for v in ("no_feedback", "with_feedback", "replan_no_feedback", "expert",
                                          "scripted_no_feedback", "scripted_with_feedback",
                                          "scripted_replan_no_feedback", "random_plan", "random_valid")
                      for x in ("", "_high", "_low")}
    # agent=scripted: the headline's protocols are the scripted planners at the plan budget; the reference's
    # closed loops replan until the step budget, so they make at least as many plans and solve at least as much
    assert s["no_feedback"] == s["scripted_no_feedback"]
    assert s["scripted_with_feedback"]["plans_per_episode"] >= s["with_feedback"]["plans_per_episode"]
    assert s["scripted_with_feedback"]["success_rate"] >= s["with_feedback"]["success_rate"]
    assert s["expert"]["success_rate"] == 1.0 and s["no_feedback"]["episodes"] == 12.0
    assert s["no_feedback"]["success_rate"] == pytest.approx(
        (s["no_feedback_high"]["success_rate"] + s["no_feedback_low"]["success_rate"]) / 2)
    hi = [e for e in eps["with_feedback"] if e["level"] == "high"]
    assert s["with_feedback_high"]["success_base"] == float(hi[0]["success"])
    curve = success_by_round(eps["with_feedback"], 10)
    assert curve == sorted(curve) and curve[-1] == s["with_feedback"]["success_rate"]


def test_the_spec_declares_every_subset_metrics_kind():
    """The spec writes the six subsets out (it loads without numpy): they must be the environments' own."""
    from mlsys_flows.systems.embodied.core import SUBSETS
    from mlsys_flows.systems.embodiedbench import SUBSET_METRICS

    assert SUBSET_METRICS == tuple(f"success_{s}" for s in SUBSETS)
    assert all(SPEC.kinds[m] == "counted" for m in SUBSET_METRICS)
