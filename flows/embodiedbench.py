"""EmbodiedBench flow: the fixed seeded test set of both levels (high: household, low: grid navigation and
manipulation; six capability subsets each), every agent variant with and without environment feedback,
episodes in parallel Dask chunks; counted success per level and subset, invalid plans and their reasons."""
from __future__ import annotations

import numpy as np

from mlsys_flows.flows.common import RunContext, SystemResult, system_flow
from mlsys_flows.systems.common.report import Curve
from mlsys_flows.systems.embodiedbench import LEVELS, SUBSETS, agent_kinds, reason_counts, success_by_round, summarize
from mlsys_flows.tasks import embodiedbench as t


@system_flow("embodiedbench")
def embodiedbench(ctx: RunContext) -> SystemResult:
    p = ctx.params
    n = p.per_subset * len(SUBSETS)
    futures = []
    for level in LEVELS:
        bounds = np.linspace(0, n, min(p.chunks, n) + 1).astype(int)
        futures += [t.run_episodes.submit(p, ctx.storage, level, int(a), int(b), ctx.key(f"episodes_{level}_{i}.json"))
                    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])) if b > a]
    parts = [f.result() for f in futures]
    episodes: dict[str, list[dict]] = {}
    for part in parts:
        for variant, eps in part["episodes"].items():
            episodes.setdefault(variant, []).extend(eps)
    variants = summarize(episodes)
    kinds = {m: "counted" for ms in variants.values() for m in ms}
    reasons = reason_counts(episodes)
    llm_requests = sum(part["llm"]["requests"] for part in parts if part["llm"])

    names = [v for v in agent_kinds(p)]
    curves = [
        Curve(title="success rate per capability subset", x_label="subset (" + ", ".join(
            f"{i}={s}" for i, s in enumerate(SUBSETS)) + ")", y_label="success rate",
            series={f"{v}_{lv}": (list(range(len(SUBSETS))), [variants[f"{v}_{lv}"].get(f"success_{s}", 0.0)
                                                                for s in SUBSETS])
                    for v in names for lv in LEVELS}),
        Curve(title="success within r plans (closed loop)", x_label="plans allowed (r)", y_label="success rate",
              series={f"with_feedback_{lv}": (list(range(1, p.max_rounds + 1)),
                                              success_by_round([e for e in episodes["with_feedback"] if e["level"] == lv],
                                                               p.max_rounds)) for lv in LEVELS}),
    ]
    v = variants
    agent = ("the offline scripted keyword planner (no feedback: plans once from the first observation; with "
             "feedback: its replanning variant, which reads the feedback on each plan)" if p.agent == "scripted" else
             f"the LLM {p.llm_model} at {p.llm_base_url} (OpenAI-compatible chat, temperature 0; {llm_requests} "
             "requests; endpoint errors and malformed replies count as invalid plans)")
    notes = [
        f"Test set: {p.per_subset} tasks per subset x {len(SUBSETS)} subsets x {len(LEVELS)} levels = {2 * n} "
        f"episodes per variant, generated from seed {p.seed} (fixed: same seed, same tasks). Agent: {agent}. "
        f"With feedback an episode allows up to {p.max_rounds} plans; every episode has a step budget "
        "(high 16, long-horizon 36; low 40, long-horizon 110) and an invalid action ends the current plan.",
        "Every metric is counted. Success: "
        + "; ".join(f"{lv} level {v['no_feedback_' + lv]['success_rate']:.3f} without feedback vs "
                    f"{v['with_feedback_' + lv]['success_rate']:.3f} with" for lv in LEVELS)
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
    ]
    return SystemResult(variants=variants, kinds=kinds, curves=curves, notes=notes)
