"""The EmbodiedBench run's SystemResult, assembled from the episode chunks' outputs (pure: the flow only
submits)."""
from __future__ import annotations

import numpy as np

from mlsys_flows.systems.common.report import Curve, RegimeSample, SystemResult

from .protocol import (LEVELS, SUBSETS, agent_kinds, eval_seeds, per_seed, reason_counts, success_by_round, summarize,
                       sweep_rounds)


def build_result(p, parts: list[dict]) -> SystemResult:
    """``parts``: every episode chunk's output (each variant's episodes, the LLM's request count)."""
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
    llm_requests = sum(part["llm"]["requests"] for part in parts if part["llm"])

    names = [v for v in agent_kinds(p)]
    sweep_note = ("Regime (round budget r, counted on the same episodes: the agents do not know the budget, so success "
                  "within r plans is what a budget of r plans gives): " + "; ".join(
                      f"r={r}: " + ", ".join(f"{name} {np.median(xs):.3f}" for name, xs in by.items())
                      for r, by in sweep.items()) + " (medians over the test sets).")
    curves = [
        Curve(title="success rate per capability subset", x_label="subset (" + ", ".join(
            f"{i}={s}" for i, s in enumerate(SUBSETS)) + ")", y_label="success rate",
            series={f"{v}_{lv}": (list(range(len(SUBSETS))), [variants[f"{v}_{lv}"].get(f"success_{s}", 0.0)
                                                                for s in SUBSETS])
                    for v in names for lv in LEVELS}),
        Curve(title="success within r plans (closed loop, with and without feedback)", x_label="plans allowed (r)",
              y_label="success rate",
              series={f"{name}_{lv}": (list(range(1, p.max_rounds + 1)),
                                       success_by_round([e for e in episodes[name] if e["level"] == lv], p.max_rounds))
                      for name in ("with_feedback", "replan_no_feedback") for lv in LEVELS}),
    ]
    v = variants
    agent = ("the offline scripted keyword planner (no_feedback: plans once from the first observation; "
             "with_feedback: its replanning variant, which reads the feedback on each plan; replan_no_feedback: the "
             "same reading replanned from each new observation alone, moving to its next reading after every plan)"
             if p.agent == "scripted" else
             f"the LLM {p.llm_model} at {p.llm_base_url} (OpenAI-compatible chat, temperature 0; {llm_requests} "
             "requests; endpoint errors and malformed replies count as invalid plans)")
    notes = [
        f"Test sets: {p.seeds} (seeds {', '.join(map(str, seeds))}), each {p.per_subset} tasks per subset x "
        f"{len(SUBSETS)} subsets x {len(LEVELS)} levels = {2 * n} episodes per variant (fixed: same seed, same tasks). "
        f"Agent: {agent}. with_feedback and replan_no_feedback may make up to {p.max_rounds} plans per episode (the "
        "first told the feedback on every executed action, the second only the new observation); no_feedback plans "
        "once. Every episode has a step budget (high 16, long-horizon 36; low 40, long-horizon 110) and an invalid "
        "action ends the current plan.",
        f"Every metric is counted. success_rate of the variants is the median over the {p.seeds} test sets (their "
        "range is the headline's); the other metrics pool every episode. Pooled success: "
        + "; ".join(f"{lv} level {v['no_feedback_' + lv]['success_rate']:.3f} with one plan, "
                    f"{v['replan_no_feedback_' + lv]['success_rate']:.3f} replanning without feedback, "
                    f"{v['with_feedback_' + lv]['success_rate']:.3f} with feedback" for lv in LEVELS)
        + (f"; the full-state expert solves {v['expert']['success_rate']:.3f} (upper bound)." if "expert" in v else "."),
        "Invalid plans (reply not JSON, no plan, or an action id out of range; counted, never fatal): "
        + ", ".join(f"{name} {int(v[name]['invalid_plans'])}" for name in names)
        + ". Failure reasons: " + "; ".join(f"{name}: " + (", ".join(f"{k} {c}" for k, c in sorted(r.items())) or "none")
                                             for name, r in reasons.items()) + ".",
        "The paper measures 24 multimodal LLMs on 1,128 tasks in four simulators (ALFRED, Habitat, navigation, "
        "manipulation); here two procedurally generated text environments of the two levels carry the six "
        "subsets, and the agents are offline unless an endpoint is configured, so the absolute success rates "
        "measure these agents on these tasks, not GPT-4o's; the comparisons (feedback vs none, high vs low level, "
        "which subsets are hard) are the reproduced part. See docs/embodiedbench.md.",
        sweep_note,
    ]
    return SystemResult(variants=variants, samples=samples, curves=curves, notes=notes, regime=regime,
                        regime_headline_value=float(p.max_rounds))
