"""The ERA run's SystemResult, assembled from the (level, seed) cells' outputs (pure: the flow only submits)."""
from __future__ import annotations

import math
import statistics

from mlsys_flows.systems.common.report import Curve, RegimeSample, SystemResult

from . import LEVEL_NAMES, VARIANTS


def _mean_curve(curves: list[tuple[list[int], list[float]]]) -> tuple[list[float], list[float]]:
    """Mean over seeds of the training-episode success per update (updates without a finished episode skipped)."""
    xs, ys = [], []
    for i, x in enumerate(curves[0][0]):
        vals = [c[1][i] for c in curves if i < len(c[1]) and not math.isnan(c[1][i])]
        if vals:
            xs.append(float(x))
            ys.append(float(statistics.fmean(vals)))
    return xs, ys


def build_result(p, cells: dict[tuple[str, int], dict]) -> SystemResult:
    """``cells``: (level, seed index) -> that cell's trained and evaluated variants."""
    samples: dict[str, dict[str, list[float]]] = {v: {} for v in VARIANTS}
    variants: dict[str, dict[str, float]] = {v: {} for v in VARIANTS}
    for v in VARIANTS:
        per_level = {lvl: [cells[lvl, s]["variants"][v]["success_rate"] for s in range(p.seeds)] for lvl in LEVEL_NAMES}
        both = [statistics.fmean(per_level[lvl][s] for lvl in LEVEL_NAMES) for s in range(p.seeds)]
        samples[v] = {"success_rate": both, "failure_rate": [1.0 - x for x in both], **{f"success_rate_{lvl}": per_level[lvl] for lvl in LEVEL_NAMES},
                      "train_s": [sum(cells[lvl, s]["variants"][v]["train_s"] for lvl in LEVEL_NAMES)
                                  for s in range(p.seeds)]}
        m = variants[v]
        m["success_rate_seed_mean"] = statistics.fmean(both)
        m["success_rate_seed_min"], m["success_rate_seed_max"] = min(both), max(both)
        subsets = cells[LEVEL_NAMES[0], 0]["variants"][v]["per_subset"]
        for sub in subsets:
            m[f"success_{sub}"] = statistics.fmean(cells[lvl, s]["variants"][v]["per_subset"].get(sub, 0.0)
                                                   for lvl in LEVEL_NAMES for s in range(p.seeds))
        m["rl_env_steps"] = float(sum(cells[lvl, 0]["variants"][v]["rl_env_steps"] for lvl in LEVEL_NAMES))
        m["prior_demo_steps"] = float(sum(cells[lvl, 0]["prior"]["demo_steps"] for lvl in LEVEL_NAMES)) \
            if v != "rl_scratch" else 0.0
        m["test_episodes"] = float(sum(cells[lvl, s]["variants"][v]["test_episodes"]
                                       for lvl in LEVEL_NAMES for s in range(p.seeds)))
        m["test_invalid_actions"] = float(sum(cells[lvl, s]["variants"][v]["test_invalid_actions"]
                                              for lvl in LEVEL_NAMES for s in range(p.seeds)))
    # the regime: failure on the test tasks at each RL budget, one sample per seed (mean of both levels)
    regime = [RegimeSample(value=float(b), kind="counted", samples={
        v: [1.0 - statistics.fmean(cells[lvl, s]["variants"][v]["success_at_rl_steps"][str(b)] for lvl in LEVEL_NAMES)
            for s in range(p.seeds)] for v in VARIANTS}) for b in sorted(p.regime_rl_steps)]

    curves = [
        Curve(title=f"RL stage, {lvl} level: training episodes solved (mean of {p.seeds} seeds)",
              x_label="RL environment steps", y_label="success of the rollout's finished episodes",
              series={v: _mean_curve([cells[lvl, s]["curves"][v] for s in range(p.seeds)])
                      for v in ("rl_scratch", "prior_rl")})
        for lvl in LEVEL_NAMES
    ]
    first = {lvl: cells[lvl, 0] for lvl in LEVEL_NAMES}
    cpu = sum(c["cpu_s"] for c in cells.values())
    prior = {lvl: [cells[lvl, s]["prior"] for s in range(p.seeds)] for lvl in LEVEL_NAMES}
    notes = [
        "The headline is what online RL adds to the embodied prior: prior_rl vs prior_only on failure_rate = 1 - "
        "success_rate (lower is better; a ratio of success rates would be infinite against RL from scratch, which "
        "may solve no test task at this budget). The mechanism's ablation is rl_scratch: the same RL without the "
        "prior. "
        f"success_rate is, per seed, the mean of the high- and low-level success on the held-out test tasks "
        f"({p.test_per_subset} per capability subset and level, greedy actions); the report's value is the median "
        f"over the {p.seeds} seeds (samples), success_rate_seed_mean/min/max give the mean and spread. "
        "success_rate_high and success_rate_low are the levels alone (also per seed). All are counted.",
        f"Equal budget: rl_scratch and prior_rl each took exactly {p.rl_env_steps} environment steps per level and "
        f"seed in the RL stage (rl_env_steps sums both levels). The prior stage's data is counted apart: "
        + ", ".join(f"{lvl} {prior[lvl][0]['demo_steps']} expert steps from {prior[lvl][0]['demo_episodes']} "
                    f"demonstrations ({prior[lvl][0]['expert_successes']} solved by the expert)" for lvl in LEVEL_NAMES)
        + "; prior_only and prior_rl both use them (prior_demo_steps).",
        "Training tasks and test tasks are disjoint: "
        + ", ".join(f"{lvl} {first[lvl]['train_tasks']} training tasks ({first[lvl]['overlaps_dropped']} dropped "
                    f"as copies of a test task), {first[lvl]['test_tasks']} test tasks" for lvl in LEVEL_NAMES) + ".",
        "Behaviour-cloning accuracy on the demonstrations after prior learning (per seed): "
        + "; ".join(f"{lvl} " + ", ".join(f"{x['bc_accuracy']:.2f}" for x in prior[lvl]) for lvl in LEVEL_NAMES)
        + f". PPO: learning rate {p.lr_scratch:g} and entropy bonus {p.entropy_scratch:g} from scratch, "
        f"{p.lr_prior_rl:g} and {p.entropy_prior_rl:g} from the prior after {p.critic_warmup_updates} value-only "
        "update(s) (each variant's choice from the learning-rate sweep in docs/era.md, on validation tasks at this "
        f"budget); clip {p.clip}, {p.ppo_epochs} epochs of {p.minibatch}-turn minibatches per {p.rollout_steps}-turn "
        f"rollout over {p.n_envs} environments, gamma {p.gamma} and GAE lambda {p.gae_lambda} per turn; shaped reward: success {p.success_reward}, subgoal {p.subgoal_coef} per goal "
        f"share, progress {p.distance_coef} per expert step closer, invalid action -{p.invalid_penalty}.",
        "train_s (measured, wall clock of one worker process sharing 2 cores) is the prior stage for prior_only, "
        "prior stage + RL for prior_rl, RL alone for rl_scratch, summed over both levels per seed. The "
        f"{len(cells)} cells used {cpu:.0f} CPU-seconds in all (evaluation included).",
        "The paper fine-tunes a 3B vision-language model on trajectories augmented with reasoning, environment-"
        "anchored and external knowledge, then runs turn-level PPO on EB-ALFRED and EB-Manipulation; here a small "
        "MLP policy learns from a scripted expert on procedurally generated stand-ins, so only the direction of "
        "the comparison (prior + RL vs RL from scratch vs prior only) is reproduced, not the paper's numbers.",
        f"Regime (RL budget per level and seed: {', '.join(map(str, sorted(p.regime_rl_steps)))} steps): the same RL "
        "runs' policies evaluated on the test tasks after the update that reaches each budget (no extra training; "
        "at 0 steps prior_rl is the prior and rl_scratch the initial weights); failure per seed, mean of both levels: "
        + "; ".join(f"{int(g.value)}: " + ", ".join(f"{v} {statistics.fmean(xs):.3f}" for v, xs in g.samples.items())
                    for g in regime) + " (means over the seeds).",
    ]
    return SystemResult(variants=variants, samples=samples, curves=curves, notes=notes, regime=regime,
                        regime_headline_value=float(p.rl_env_steps))
