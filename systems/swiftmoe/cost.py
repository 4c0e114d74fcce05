"""Iteration-time model built from REAL measured compute (pure torch + numpy).

``measure`` times, on this machine, one expert FFN forward+backward for a grid of row counts and
the dense part (attention, router, head) forward+backward for one worker's micro-batch. The
time of a simulated iteration is then

    dense + sum over MoE layers (slowest worker's expert calls + 4 all-to-all passes)
          + every communication phase of the iteration (dense all-reduce, expert gradient sync,
            weight all-gather, migration),

where a phase with a byte matrix B[src, dst] takes max over workers of max(bytes out, bytes in)
divided by the link bandwidth (every worker has one full-duplex link). Byte counts come from
the real tensors the policies moved (``policies.IterationWork``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from mlsys_flows.systems.moe.model import ExpertLayout, MoEConfig, TinyMoE, expert_ffn, lm_loss

from . import PRECISION_BYTES
from .policies import IterationWork


@dataclass
class Profile:
    rows: list[int]          # row counts measured
    expert_s: list[float]    # fastest fwd+bwd seconds of one expert call on that many rows
    call_s: float            # fitted fixed cost of one expert call (seconds)
    row_s: float             # fitted cost per row (seconds)
    dense_s: float           # fastest fwd+bwd seconds of the dense part for one worker's micro-batch
    dense_bytes: int         # bytes of the dense parameters (data-parallel all-reduce)
    device: str

    def expert_time(self, n: float) -> float:
        return self.call_s + self.row_s * n if n > 0 else 0.0


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _clock(fn, device: str) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def measure(cfg: MoEConfig, micro_batch: int, max_rows: int, repeats: int, device: str, seed: int) -> Profile:
    """Time expert calls and the dense part on ``device``, sizes interleaved so noise hits all alike."""
    layout = ExpertLayout(cfg.d_model, cfg.d_ff)
    gen = torch.Generator().manual_seed(seed)
    w = layout.init(gen).to(device).requires_grad_(True)
    rows = sorted({1, 8, 32, *[int(x) for x in np.geomspace(64, max(64, max_rows), 6)]})
    xs = {n: torch.randn(n, cfg.d_model, generator=gen).to(device).requires_grad_(True) for n in rows}

    def expert_call(n: int) -> None:
        expert_ffn(xs[n], w, layout).sum().backward()

    model = TinyMoE(cfg, seed).to(device)
    tokens = torch.randint(0, cfg.vocab, (micro_batch, cfg.seq_len + 1), generator=gen).to(device)

    def dense_call() -> None:
        logits, _ = model(tokens[:, :-1], None)
        lm_loss(logits, tokens[:, 1:]).backward()

    for n in rows:  # warm-up
        expert_call(n)
    dense_call()
    samples: dict[object, list[float]] = {n: [] for n in [*rows, "dense"]}
    for _ in range(repeats):
        for n in rows:
            samples[n].append(_clock(lambda: expert_call(n), device))
        samples["dense"].append(_clock(dense_call, device))
    # the least-disturbed sample: on a shared machine other jobs only ever add time, so the minimum
    # is the stable estimate of the work's own cost (the median drifts with the machine's load)
    expert_s = [min(samples[n]) for n in rows]
    call_s, row_s = fit_linear(rows, expert_s)
    dense_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return Profile(rows=rows, expert_s=expert_s, call_s=call_s, row_s=row_s, dense_s=min(samples["dense"]),
                   dense_bytes=dense_bytes, device=device)


def fit_linear(rows: list[int], seconds: list[float]) -> tuple[float, float]:
    """time = call + per_row * rows, least squares on relative error (a GEMM's cost is affine in
    its rows; the fit keeps one noisy timing on a shared machine from bending the model)."""
    x, y = np.asarray(rows, dtype=float), np.asarray(seconds, dtype=float)
    w = 1.0 / np.maximum(y, 1e-9)
    a = np.stack([np.ones_like(x), x], 1) * w[:, None]
    (call, per_row), *_ = np.linalg.lstsq(a, y * w, rcond=None)
    if per_row <= 0:  # flat timings: all cost is per call
        return float(np.average(y, weights=w)), 0.0
    if call < 0:
        return 0.0, float((x * y).sum() / (x * x).sum())
    return float(call), float(per_row)


def phase_seconds(bytes_matrix: np.ndarray, link_bytes_per_s: float) -> float:
    m = np.array(bytes_matrix, dtype=float)
    np.fill_diagonal(m, 0.0)
    return float(max(m.sum(1).max(), m.sum(0).max()) / link_bytes_per_s)


# Communication phases whose bytes are expert weights, gradients or optimizer state: they grow
# with the expert's size (``state_scale``); the all-to-all and the dense all-reduce do not.
EXPERT_STATE_PHASES = ("grad_allreduce", "grad_reduce_scatter", "weight_all_gather", "migration")


@dataclass
class TimeModel:
    profile: Profile
    link_gbps: float
    d_model: int
    workers: int
    state_scale: float = 1.0  # multiplies the bytes of EXPERT_STATE_PHASES (what-if: larger experts)
    precision: str = "fp32"   # bytes of an activation (all-to-all) and of a dense gradient (dense all-reduce)

    @property
    def link_bytes_per_s(self) -> float:
        return self.link_gbps * 1e9 / 8

    def iteration(self, work: IterationWork) -> dict[str, float]:
        """Seconds of one iteration, broken down by part."""
        bw = self.link_bytes_per_s
        size = PRECISION_BYTES[self.precision]
        compute = 0.0
        a2a = 0.0
        for calls, rows in zip(work.compute, work.a2a_rows):
            per_worker = np.zeros(self.workers)
            for worker, n in calls:
                per_worker[worker] += self.profile.expert_time(n)
            compute += float(per_worker.max())
            a2a += 4 * phase_seconds(rows * self.d_model * size["act"], bw)  # dispatch + combine, fwd + bwd
        w = self.workers
        # profile.dense_bytes counts the fp32 parameters; their gradients travel at the precision's size
        dense_sync = 2 * (w - 1) / w * self.profile.dense_bytes * size["grad"] / 4 / bw if w > 1 else 0.0
        out = {"dense": self.profile.dense_s, "dense_allreduce": dense_sync, "expert_compute": compute, "all_to_all": a2a}
        for phase, m in work.comm.items():
            out[phase] = phase_seconds(m, bw) * (self.state_scale if phase in EXPERT_STATE_PHASES else 1.0)
        out["total"] = sum(out.values())
        return out


def reprice(traces: list[dict], profile: Profile, link_gbps: float, d_model: int, workers: int,
            state_scale: float = 1.0, precision: str = "fp32") -> list[float]:
    """Simulated seconds of each recorded iteration (``IterationWork.to_trace``) under another link
    bandwidth or expert-state size: the work (rows, calls, bytes) is what training really did, so
    no retraining is needed; only the clock changes."""
    model = TimeModel(profile, link_gbps, d_model, workers, state_scale, precision)
    return [model.iteration(IterationWork.from_trace(t))["total"] for t in traces]


def time_to_target(iter_times: list[float], iterations_to_target: int) -> float:
    """The simulated clock at the end of iteration ``iterations_to_target`` (1-based)."""
    if not 1 <= iterations_to_target <= len(iter_times):
        raise ValueError(f"iterations_to_target {iterations_to_target} outside 1..{len(iter_times)}")
    return float(sum(iter_times[:iterations_to_target]))


def sweep_flexmoe_ratio(flex: dict, swift: dict, profile: Profile, d_model: int, workers: int,
                        links_gbps: list[float], state_scales: list[float],
                        precision: str = "fp32") -> dict[float, list[float]]:
    """FlexMoE / SwiftMoE simulated time to target for each expert-state scale (key) and link
    bandwidth (list entry), re-pricing each run's recorded trace. ``flex``/``swift``: ``{"trace":
    [...], "iterations_to_target": n}``. Above 1: SwiftMoE reaches the target sooner."""
    out: dict[float, list[float]] = {}
    for s in state_scales:
        out[s] = [time_to_target(reprice(flex["trace"], profile, g, d_model, workers, s, precision),
                                 int(flex["iterations_to_target"]))
                  / time_to_target(reprice(swift["trace"], profile, g, d_model, workers, s, precision),
                                   int(swift["iterations_to_target"]))
                  for g in links_gbps]
    return out
