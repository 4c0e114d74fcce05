"""One cell of the ERA experiment: one level, one seed, the three variants on the same tasks.

- ``prior_only``: stage 1 only (behaviour cloning on scripted-expert trajectories + grounding);
- ``rl_scratch``: stage 2 only (turn-level PPO with the shaped reward) from a random initialization;
- ``prior_rl``: stage 1, then stage 2 with the same budget of environment steps as ``rl_scratch``.

rl_scratch starts from the very weights prior learning starts from, and both RL runs draw their
training episodes from the same generator state, so the variants differ only in the stage-1 prior.

The regime (``p.regime_rl_steps``): each RL run's policy is also evaluated on the test tasks after the
update that reaches each smaller budget (training does not depend on the budget, so that policy is the
one a run with that budget ends with); budget 0 is the starting policy (the prior, or the initial weights).
"""
from __future__ import annotations

import copy
import time
from collections.abc import Iterable

import numpy as np
import torch

from ..embodied.api import make_env
from .episodes import Shaping, dims, evaluate, expert_demos, task_sets
from .policy import Encoder, PolicyNet, make_policy
from .ppo import PPOConfig, ppo_train
from .prior import learn_prior

VARIANTS = ("rl_scratch", "prior_only", "prior_rl")


def cell_seed(base: int, level: str, seed_index: int) -> int:
    return (base * 1_000_003 + seed_index * 7_919 + (0 if level == "high" else 104_729)) % (2**31 - 1)


def ppo_config(p, variant: str, lr: float | None = None) -> PPOConfig:
    """The PPO settings of ``rl_scratch`` or ``prior_rl``: shared ones, plus each variant's learning rate
    (``lr``: the calibration's choice; None: the parameter) and entropy bonus, and the critic warm-up of
    RL from the prior."""
    scratch = variant == "rl_scratch"
    if lr is None:
        lr = p.lr_scratch if scratch else p.lr_prior_rl
    return PPOConfig(lr=lr, env_steps=p.rl_env_steps, n_envs=p.n_envs,
                     rollout_steps=p.rollout_steps, epochs=p.ppo_epochs, minibatch=p.minibatch, clip=p.clip,
                     gamma=p.gamma, gae_lambda=p.gae_lambda,
                     entropy_coef=p.entropy_scratch if scratch else p.entropy_prior_rl, value_coef=p.value_coef,
                     value_only_updates=0 if scratch else p.critic_warmup_updates)


def shaping(p) -> Shaping:
    return Shaping(p.success_reward, p.subgoal_coef, p.distance_coef, p.invalid_penalty)


def run_cell(p, level: str, seed_index: int, variants: tuple[str, ...] = VARIANTS,
             lrs: dict[str, float] | None = None, regime: bool = True) -> dict:
    """Train and evaluate ``variants`` on ``level`` with seed ``seed_index``; test tasks are the fixed
    seeded test set (the same for every seed), training tasks a disjoint set. ``lrs``: each RL variant's
    learning rate (the calibration's choice for this level; a variant not in it takes its parameter);
    ``regime``: also evaluate at the regime's smaller budgets. Deterministic for given parameters (one
    torch thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    started = time.process_time()
    try:
        out = _run_cell(p, level, seed_index, variants, dict(lrs or {}), regime)
        out["cpu_s"] = time.process_time() - started
        return out
    finally:
        torch.set_num_threads(threads)


def train_policies(p, level: str, seed_index: int = 0, variants: tuple[str, ...] = VARIANTS,
                   lrs: dict[str, float] | None = None, exclude: Iterable[tuple] = (),
                   evaluate: bool = True) -> tuple[dict[str, PolicyNet], dict]:
    """The trained networks of ``variants`` (the same training as ``run_cell``), and the cell's output.
    ``exclude``: ``task_signature``s of further test tasks (another benchmark's: EmbodiedBench's) that the
    training tasks must not match, dropped as the cell's own test tasks are; ``evaluate=False`` skips the
    greedy evaluation on the cell's test set (the output then holds the training counts only)."""
    nets: dict[str, PolicyNet] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = _run_cell(p, level, seed_index, variants, dict(lrs or {}), False, keep=nets, exclude=exclude,
                        with_eval=evaluate)
    finally:
        torch.set_num_threads(threads)
    return nets, out


def _run_cell(p, level: str, seed_index: int, variants: tuple[str, ...], lrs: dict[str, float],
              with_regime: bool, keep: dict | None = None, exclude: Iterable[tuple] = (),
              with_eval: bool = True) -> dict:
    seed = cell_seed(p.seed, level, seed_index)
    obs_dim, n_actions = dims(level)
    encoder = Encoder(obs_dim)
    sets = task_sets(level, p.train_per_subset, p.test_per_subset, p.seed, exclude)
    torch.manual_seed(seed)
    init = make_policy(level, obs_dim, n_actions, p.hidden, p.architecture)
    out: dict = {"level": level, "seed_index": seed_index, "train_tasks": len(sets.train), "test_tasks": len(sets.test),
                 "overlaps_dropped": sets.overlaps_dropped, "variants": {}, "curves": {}, "returns": {},
                 "lr": {v: ppo_config(p, v, lrs.get(v)).lr for v in variants if v != "prior_only"}}
    regime_steps = p.regime_rl_steps if with_regime else [p.rl_env_steps]

    def rl(net: PolicyNet, variant: str) -> tuple[dict, float]:
        budgets = {b for b in regime_steps if b < p.rl_env_steps}
        at: dict[int, float] = {}
        if 0 in budgets:
            at[0] = evaluate(net, sets.test, encoder, n_actions)["success_rate"]

        def checkpoint(steps: int) -> None:
            if steps in budgets:
                at[steps] = evaluate(net, sets.test, encoder, n_actions)["success_rate"]
        started = time.perf_counter()
        log = ppo_train(net, sets.train, encoder, n_actions, ppo_config(p, variant, lrs.get(variant)), shaping(p),
                        np.random.default_rng(seed + 1), torch.Generator().manual_seed(seed + 2), on_update=checkpoint)
        log["at_budget"] = at
        return log, time.perf_counter() - started

    def result(net: PolicyNet, train_s: float, rl_log: dict | None, variant: str = "") -> dict:
        if keep is not None:
            keep[variant] = net
        counts = {"train_s": train_s, "rl_env_steps": rl_log["env_steps"] if rl_log else 0,
                  "rl_episodes": rl_log["episodes"] if rl_log else 0, "rl_updates": rl_log["updates"] if rl_log else 0}
        if not with_eval:
            return counts
        ev = evaluate(net, sets.test, encoder, n_actions)
        at = dict(rl_log["at_budget"]) if rl_log else {}
        # success on the test tasks at each RL budget of the regime (the prior alone takes no RL steps)
        regime = {str(b): (ev["success_rate"] if rl_log is None or b >= p.rl_env_steps else at[b])
                  for b in regime_steps}
        return {"success_rate": ev["success_rate"], "per_subset": ev["per_subset"], "test_episodes": ev["episodes"],
                "success_at_rl_steps": regime,
                "test_invalid_actions": ev["invalid"], "test_steps": ev["steps"], **counts}

    if "prior_only" in variants or "prior_rl" in variants:
        started = time.perf_counter()
        demos = expert_demos(sets.train, encoder, n_actions)
        prior = copy.deepcopy(init)
        losses = learn_prior(prior, demos, epochs=p.prior_epochs, lr=p.prior_lr, batch=p.prior_batch,
                             grounding_weight=p.grounding_weight, max_steps=_max_steps(sets.train),
                             generator=torch.Generator().manual_seed(seed + 3))
        prior_s = time.perf_counter() - started
        out["prior"] = {"demo_steps": int(len(demos["action"])), "demo_episodes": int(demos["episodes"]),
                        "expert_successes": int(demos["expert_successes"]), "prior_s": prior_s, **losses}
        if "prior_only" in variants:
            out["variants"]["prior_only"] = result(prior, prior_s, None, "prior_only")
        if "prior_rl" in variants:
            net = copy.deepcopy(prior)
            log, rl_s = rl(net, "prior_rl")
            out["variants"]["prior_rl"] = result(net, prior_s + rl_s, log, "prior_rl")
            out["curves"]["prior_rl"] = (log["curve_steps"], log["curve_success"])
            out["returns"]["prior_rl"] = log["curve_return"]
    if "rl_scratch" in variants:
        net = copy.deepcopy(init)
        log, rl_s = rl(net, "rl_scratch")
        out["variants"]["rl_scratch"] = result(net, rl_s, log, "rl_scratch")
        out["curves"]["rl_scratch"] = (log["curve_steps"], log["curve_success"])
        out["returns"]["rl_scratch"] = log["curve_return"]
    return out


def _max_steps(tasks: list) -> int:
    return max(make_env(t).max_steps for t in tasks[:1]) if tasks else 1
