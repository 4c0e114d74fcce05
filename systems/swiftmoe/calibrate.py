"""Calibrate the simulated clock against a real 2-rank expert-parallel run (pure torch).

``calibration_job(p)`` takes one small configuration (the run's model, 2 workers), trains each compared
policy (``CALIBRATED``: DeepSpeed, FlexMoE, SwiftMoE and the decoupling's ablation) for ``ITERATIONS``
iterations in one process to record each iteration's work (``IterationWork``:
expert calls per worker, rows moved, bytes of every phase) and measures the compute profile for
that configuration. Then 2 torch.distributed ranks (``replay_rank``; the flow starts them as Dask
tasks on 2 workers of the run's cluster with ``ctx.ranks``, gloo on CPU) really execute those
iterations: each rank runs the dense forward+backward of its micro-batch, all-reduces the dense
gradients and steps Adam, and per MoE layer sends its routed rows to their replicas with
``all_to_all_single`` (dispatch and combine, forward and backward), runs its own expert calls
forward+backward, then ships every recorded communication phase with its byte counts: SwiftMoE's
reduce-scatter to the shard owners (Adam on its shards) and all-gather; DeepSpeed's and FlexMoE's
gradient all-reduce (Adam on every replica the rank holds) and FlexMoE's migrations. The policies are
replayed in turn inside each timed round, so the machine's noise hits them alike. The ranks also
measure the loopback link (one large all-to-all). The simulator prices the same trace with that
profile and link bandwidth (``summarize``); ``calibration_error`` = measured / simulated seconds
per iteration, for each policy. The replay moves fp32 tensors, so the calibration's configuration is
charged at fp32 (``precision="fp32"``) whatever the run's precision.
"""
from __future__ import annotations

import time
from dataclasses import asdict

import numpy as np
import torch

from . import CALIBRATED

WORLD = 2
ITERATIONS = 3  # recorded iterations, replayed in each timed window
LINK_PROBE_FLOATS = 1 << 20  # 4 MiB each way for the link measurement


def gloo_available() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_gloo_available()


def calibration_params(p, iterations: int = ITERATIONS):
    """The run's model at 2 workers (replicas possible: more slots than experts/2), ``iterations`` long."""
    e = p.n_experts
    # model_copy: the iteration count is below the training minimum, every other field stays valid;
    # FlexMoE re-places within the recorded window, so its migration is priced and replayed too
    return p.model_copy(update={"workers": WORLD, "slots_per_worker": min(e, e // WORLD + 1),
                                "iterations": iterations, "batch": max(WORLD, p.batch - p.batch % WORLD),
                                "replace_every": min(p.replace_every, iterations), "precision": "fp32"})


def record_trace(cp, policy: str = "swiftmoe") -> list[dict]:
    """Train ``policy`` for ``cp.iterations`` iterations at ``cp.workers`` workers; each iteration's work."""
    from mlsys_flows.systems.moe.model import TinyMoE, initial_experts, lm_loss

    from .policies import make_policy
    from .train import build_workload

    torch.manual_seed(cp.seed)
    cfg = cp.moe_config()
    wl = build_workload(cp)
    model = TinyMoE(cfg, cp.seed)
    opt = torch.optim.Adam(model.parameters(), lr=cp.lr)
    pol = make_policy(policy, cfg, initial_experts(cfg, cp.seed), cp.workers, cp.slots_per_worker, cp.lr,
                      cp.capacity_factor, cp.replace_every, cp.precision)
    trace = []
    for it in range(cp.iterations):
        batch = torch.as_tensor(wl.train[it])
        (lm_loss(model(batch[:, :-1], pol)[0], batch[:, 1:]) + cp.aux_loss_coef * model.aux_loss).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        trace.append(pol.step().to_trace())
    return trace


def calibration_job(p, repeats: int, iterations: int = ITERATIONS, policies: tuple[str, ...] = CALIBRATED) -> dict:
    """Record each policy's work at 2 workers and measure the compute profile of that configuration:
    ``job`` is what every rank replays (``replay_rank``), the rest is what ``summarize`` needs."""
    from .train import measure_profile

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cp = calibration_params(p, iterations)
        traces = {name: record_trace(cp, name) for name in policies}
        profile = measure_profile(cp, "cpu")
    finally:
        torch.set_num_threads(threads)
    cfg = cp.moe_config()
    return {"job": {"cfg": asdict(cfg), "micro_batch": cp.batch // WORLD, "traces": traces, "lr": cp.lr,
                    "seed": cp.seed, "repeats": repeats},
            "profile": asdict(profile), "slots_per_worker": cp.slots_per_worker, "batch": cp.batch,
            "iterations": cp.iterations}


def summarize(prepared: dict, rank0: dict, ranks_wall_s: float) -> dict[str, dict]:
    """Per policy: measured (rank 0's timed windows) vs simulated seconds per iteration of the same trace."""
    return {name: _summarize_one(prepared, trace, rank0["iter_s"][name], rank0["link_bytes_per_s"], ranks_wall_s)
            for name, trace in prepared["job"]["traces"].items()}


def _summarize_one(prepared: dict, trace: list[dict], iter_s: list[float], link_bytes_per_s: float,
                   ranks_wall_s: float) -> dict:
    from mlsys_flows.systems.moe.model import MoEConfig

    from .cost import Profile, TimeModel
    from .policies import IterationWork

    cfg = MoEConfig(**prepared["job"]["cfg"])
    profile = Profile(**prepared["profile"])
    link_gbps = link_bytes_per_s * 8 / 1e9
    model = TimeModel(profile, link_gbps, cfg.d_model, WORLD)  # fp32, as the replay moves
    parts = [model.iteration(IterationWork.from_trace(t)) for t in trace]
    simulated = float(np.mean([t["total"] for t in parts]))
    keys = sorted({k for t in parts for k in t})
    return {"measured_iter_s": iter_s, "simulated_iter_s": simulated,
            "error": [m / simulated for m in iter_s], "link_gbps": link_gbps,
            "breakdown_s": {k: float(np.mean([t.get(k, 0.0) for t in parts])) for k in keys},
            "profile": prepared["profile"], "workers": WORLD, "slots_per_worker": prepared["slots_per_worker"],
            "batch": prepared["batch"], "iterations": prepared["iterations"], "ranks_wall_s": ranks_wall_s}


# ---- one rank ------------------------------------------------------------------------------------
def _a2a(dist, send_counts: np.ndarray, recv_counts: np.ndarray, width: int, send: torch.Tensor | None = None):
    """all_to_all_single of ``send_counts[d]`` rows of ``width`` floats to each rank d."""
    s = [int(c) * width for c in send_counts]
    r = [int(c) * width for c in recv_counts]
    inp = send if send is not None else torch.randn(sum(s))
    out = torch.empty(sum(r))
    dist.all_to_all_single(out, inp.reshape(-1)[:sum(s)].contiguous(), output_split_sizes=r, input_split_sizes=s)
    return out


def _replay(dist, rank: int, job: dict, model, opt, tokens, states, full) -> None:
    """Execute one recorded iteration for real on this rank."""
    from mlsys_flows.systems.moe.model import ExpertLayout, expert_ffn, lm_loss

    from .policies import IterationWork

    work = IterationWork.from_trace(job["_t"])
    cfg = job["cfg"]
    d = cfg["d_model"]
    layout = ExpertLayout(d, cfg["d_ff"])
    # dense part: forward + backward of this rank's micro-batch, gradient all-reduce, Adam
    logits, _ = model(tokens[:, :-1], None)
    lm_loss(logits, tokens[:, 1:]).backward()
    flat = torch.cat([q.grad.reshape(-1) for q in model.parameters() if q.grad is not None])
    dist.all_reduce(flat)
    opt.step()
    opt.zero_grad(set_to_none=True)
    for layer in range(work.layers):
        rows = work.a2a_rows[layer]
        x = _a2a(dist, rows[rank], rows[:, rank], d).view(-1, d)  # dispatch
        calls = [n for w, n in work.compute[layer] if w == rank]
        outs, ins = [], []
        for i, n in enumerate(calls):
            xi = torch.randn(n, d, requires_grad=True) if len(x) < sum(calls) else x[sum(calls[:i]):sum(calls[:i]) + n].clone().requires_grad_(True)
            wt = job["_w"][layer][i % len(job["_w"][layer])]
            ins.append(xi)
            outs.append(expert_ffn(xi, wt, layout))
        y = torch.cat([o.detach() for o in outs]) if outs else torch.empty(0, d)
        _a2a(dist, rows[:, rank], rows[rank], d, y)  # combine
        gy = _a2a(dist, rows[rank], rows[:, rank], d)  # combine, backward
        for o in outs:
            o.backward(torch.ones_like(o))
        _a2a(dist, rows[:, rank], rows[rank], d, torch.cat([xi.grad for xi in ins]) if ins else gy)  # dispatch, backward
    # expert state: reduce-scatter gradients to the shard owners, Adam on own shards, all-gather weights
    # (DeepSpeed, FlexMoE: all-reduce the replicas' gradients, Adam on every replica this rank holds)
    own_calls = sum(1 for cs in work.compute for w, _ in cs if w == rank)
    for phase in ("grad_reduce_scatter", "weight_all_gather", *sorted(set(work.comm) - {"grad_reduce_scatter", "weight_all_gather"})):
        if phase not in work.comm:
            continue
        m = np.ceil(work.comm[phase] / 4)  # fp32 elements
        _a2a(dist, m[rank], m[:, rank], 1)
        if phase == "grad_reduce_scatter":
            for st, g in states:
                st.update(job["_shard"], g, job["lr"])
        if phase == "grad_allreduce":
            st, g = full
            for _ in range(own_calls):
                st.update(job["_full"], g, job["lr"])


def replay_rank(info, job: dict) -> dict:
    """One rank (of ``WORLD``, in a process group its launcher opened: ``platform.ranks.run_ranks``)
    replaying the recorded iterations: a warm-up window, then ``job["repeats"]`` timed windows.
    Returns seconds per iteration of each timed window and the link measured by a large all-to-all."""
    import torch.distributed as dist

    from mlsys_flows.systems.moe.model import ExpertLayout, MoEConfig, TinyMoE

    from .policies import AdamState

    if info.world_size != WORLD:
        raise ValueError(f"world_size: the calibration replays {WORLD} ranks (got {info.world_size})")
    rank, job = info.rank, dict(job)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core per rank, as a worker process gets
    try:
        cfg = MoEConfig(**job["cfg"])
        gen = torch.Generator().manual_seed(job["seed"] + rank)
        layout = ExpertLayout(cfg.d_model, cfg.d_ff)
        n_calls = max(len(c) for tr in job["traces"].values() for t in tr for c in t["compute"])
        job["_w"] = [[layout.init(gen).requires_grad_(True) for _ in range(max(1, n_calls))] for _ in range(cfg.n_layers)]
        shard = -(-layout.numel // WORLD)
        job["_shard"] = torch.zeros(shard)
        states = [(AdamState.zeros_like(job["_shard"]), torch.randn(shard, generator=gen))
                  for _ in range(cfg.n_layers * cfg.n_experts)]
        job["_full"] = torch.zeros(layout.numel)
        full = (AdamState.zeros_like(job["_full"]), torch.randn(layout.numel, generator=gen))
        model = TinyMoE(cfg, job["seed"])
        opt = torch.optim.Adam(model.parameters(), lr=job["lr"])
        tokens = torch.randint(0, cfg.vocab, (job["micro_batch"], cfg.seq_len + 1), generator=gen)
        # the link: one large all-to-all, each rank sending LINK_PROBE_FLOATS floats to the other
        probe = torch.randn(WORLD * LINK_PROBE_FLOATS)
        link = []
        for _ in range(5):
            out = torch.empty_like(probe)
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_to_all_single(out, probe)
            link.append(time.perf_counter() - t0)
        bytes_per_s = LINK_PROBE_FLOATS * 4 / min(link)

        def window(trace: list[dict]) -> float:
            dist.barrier()
            t0 = time.perf_counter()
            for t in trace:
                job["_t"] = t
                _replay(dist, rank, job, model, opt, tokens, states, full)
            dist.barrier()
            return (time.perf_counter() - t0) / len(trace)

        names = list(job["traces"])
        for name in names:  # warm-up
            window(job["traces"][name])
        iter_s: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(job["repeats"]):  # the policies take turns inside each round
            for name in names:
                iter_s[name].append(window(job["traces"][name]))
        return {"iter_s": iter_s, "link_bytes_per_s": bytes_per_s}
    finally:
        torch.set_num_threads(threads)
