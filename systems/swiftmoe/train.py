"""Train the tiny MoE for real under one policy and account simulated time (pure torch)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from mlsys_flows.systems.moe.model import TinyMoE, initial_experts, lm_loss

from .cost import Profile, TimeModel, measure
from .policies import make_policy
from .workload import Workload, make_workload


def build_workload(p) -> Workload:
    return make_workload(p.vocab, p.regimes, p.branching, p.skew, p.drift_period, p.iterations, p.batch,
                         p.seq_len, p.segment_len, p.n_eval, p.seed)


def measure_profile(p, device: str = "cpu") -> Profile:
    """Real per-expert and dense compute times for this configuration on ``device``."""
    return measure(p.moe_config(), p.batch // p.workers, p.batch * p.seq_len * p.top_k, p.profile_repeats, device, p.seed)


@dataclass
class PolicyRun:
    name: str
    metrics: dict[str, float]
    iter_time_s: list[float]          # simulated seconds of each iteration
    train_loss: list[float]
    dropped_frac: list[float]
    eval_iters: list[int]
    eval_loss: list[float]
    eval_clock_s: list[float]         # simulated clock at each evaluation
    breakdown_s: dict[str, float] = field(default_factory=dict)  # mean seconds per iteration by part
    trace: list[dict] = field(default_factory=list)  # per iteration IterationWork.to_trace() (when recorded)


def _evaluate(model: TinyMoE, policy, tokens: torch.Tensor) -> float:
    """Held-out loss with the policy's own expert execution (DeepSpeed applies its capacity)."""
    with torch.no_grad(), policy.evaluating():
        return lm_loss(model(tokens[:, :-1], policy)[0], tokens[:, 1:]).item()


def train_policy(name: str, p, wl: Workload, profile: Profile, device: str = "cpu",
                 log=None, policy: str | None = None, capacity_factor: float | None = None,
                 record: bool = False) -> PolicyRun:
    """Train variant ``name`` with ``policy`` (default: ``name``) and DeepSpeed capacity factor
    ``capacity_factor`` (default: ``p.capacity_factor``); ``record`` keeps every iteration's work."""
    torch.manual_seed(p.seed)
    cfg = p.moe_config()
    model = TinyMoE(cfg, p.seed).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=p.lr)
    weights = [[w.to(device) for w in layer] for layer in initial_experts(cfg, p.seed)]
    cf = p.capacity_factor if capacity_factor is None else capacity_factor
    backend = make_policy(policy or name, cfg, weights, p.workers, p.slots_per_worker, p.lr, cf, p.replace_every,
                          p.precision)
    clock = TimeModel(profile, p.link_gbps, cfg.d_model, p.workers, precision=p.precision)
    ev = torch.as_tensor(wl.eval, device=device)
    target = wl.bayes_loss + p.target_gap

    iter_time, train_loss, dropped, trace = [], [], [], []
    eval_iters, eval_loss, eval_clock = [], [], []
    parts: dict[str, float] = {}
    bytes_moved: dict[str, float] = {}
    now, reached_at, reached_iter, routed, n_dropped = 0.0, None, None, 0, 0
    started = time.perf_counter()
    for it in range(p.iterations):
        batch = torch.as_tensor(wl.train[it], device=device)
        logits, _ = model(batch[:, :-1], backend)
        loss = lm_loss(logits, batch[:, 1:])
        # the router's auxiliary load-balancing loss, for every policy (the reported loss is the LM loss)
        (loss + p.aux_loss_coef * model.aux_loss).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        work = backend.step()
        if record:
            trace.append(work.to_trace())
        t = clock.iteration(work)
        now += t["total"]
        for k, v in t.items():
            parts[k] = parts.get(k, 0.0) + v
        for phase, m in work.comm.items():
            bytes_moved[phase] = bytes_moved.get(phase, 0.0) + float(m.sum())
        iter_time.append(t["total"])
        train_loss.append(loss.item())
        dropped.append(work.dropped / max(1, work.routed))
        routed, n_dropped = routed + work.routed, n_dropped + work.dropped
        if (it + 1) % p.eval_every == 0 or it + 1 == p.iterations:
            el = _evaluate(model, backend, ev)
            eval_iters.append(it + 1)
            eval_loss.append(el)
            eval_clock.append(now)
            if reached_at is None and el <= target:
                reached_at, reached_iter = now, it + 1
            if log:
                log(f"{name}: iter {it + 1}/{p.iterations} eval loss {el:.3f} (target {target:.3f}) sim clock {now:.2f}s")
    n = p.iterations
    metrics = {
        "time_to_target_s": reached_at if reached_at is not None else now,
        "reached_target": float(reached_at is not None),
        "iterations_to_target": float(reached_iter if reached_iter is not None else n),
        "target_loss": target,
        "final_eval_loss": eval_loss[-1],
        "best_eval_loss": min(eval_loss),
        "mean_iter_time_s": now / n,
        "total_time_s": now,
        "tokens_dropped_frac": n_dropped / max(1, routed),
        "expert_bytes_moved_per_iter": sum(bytes_moved.values()) / n,
        "migration_bytes_total": bytes_moved.get("migration", 0.0),
        "expert_state_bytes_per_worker": float(backend.expert_state_bytes()),
        "train_wall_s": time.perf_counter() - started,
    }
    return PolicyRun(name=name, metrics=metrics, iter_time_s=iter_time, train_loss=train_loss, dropped_frac=dropped,
                     eval_iters=eval_iters, eval_loss=eval_loss, eval_clock_s=eval_clock,
                     breakdown_s={k: v / n for k, v in parts.items()}, trace=trace)


def time_to_loss(eval_clock_s: list[float], eval_loss: list[float], target: float) -> float | None:
    """The simulated clock at the first evaluation whose held-out loss is at or below ``target``; None
    when no evaluation reached it."""
    return next((c for c, loss in zip(eval_clock_s, eval_loss) if loss <= target), None)
