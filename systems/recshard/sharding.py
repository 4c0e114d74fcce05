"""Sharding plans: RecShard's MILP and the greedy TorchRec-style baselines.

A plan puts every table on one GPU and keeps its ``hot_rows`` hottest rows (by training-trace
frequency) in that GPU's HBM; the other rows live in UVM (host memory reached over PCIe). The cost
of a GPU per batch is its tables' HBM accesses x HBM cost + UVM accesses x UVM cost; a batch takes
as long as its slowest GPU (model-parallel embeddings: every GPU looks up its tables for the whole
batch).

- ``greedy``: tables sorted by size, by lookups or by size x lookups, each onto the least-loaded GPU
  in that measure; a table lives wholly in HBM if it fits the GPU's remaining HBM, else in UVM.
- ``recshard``: MILP (RecShard, Sethi et al., ASPLOS 2022): binary table->GPU assignment, per
  (table, GPU) share of the table's touched rows kept in HBM, per-GPU HBM capacity, the access CDF
  over rows as a concave piecewise-linear function (one upper-bounding line per segment), objective
  the maximum per-GPU cost. Solved by HiGHS, warm-started with the best greedy plan. The MILP's
  fractional hot-row shares are rounded down to whole rows and the plan is repaired (``repair``): the
  HBM left free on each GPU is filled with the next hottest rows of its tables (``fill_spare_hbm``),
  and while the most expensive GPU can hand a table to another GPU so that both end up cheaper than
  it was, the best such move is made (``move_tables``). If the result still costs more on the
  training profile than the warm start, the warm start is returned and ``MilpStats.fell_back`` says so.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse

from mlsys_flows.errors import MlsysError
from mlsys_flows.systems.common.milp import solve_min

from . import GREEDY_KEYS
from .workload import Profile


class PlanError(MlsysError, AssertionError):
    """A plan broke one of its constraints."""


@dataclass(frozen=True)
class Costs:
    """Seconds per row access of each table in each tier (they depend on the table's row width)."""

    hbm: np.ndarray  # [T]
    uvm: np.ndarray  # [T]

    @classmethod
    def per_dim(cls, dims: np.ndarray, hbm: dict[int, float], uvm: dict[int, float]) -> "Costs":
        return cls(np.array([hbm[int(d)] for d in dims]), np.array([uvm[int(d)] for d in dims]))

    @classmethod
    def from_bandwidth(cls, dims: np.ndarray, hbm_gb_s: float, uvm_gb_s: float) -> "Costs":
        row_bytes = 4.0 * np.asarray(dims, float)
        return cls(row_bytes / (hbm_gb_s * 1e9), row_bytes / (uvm_gb_s * 1e9))


@dataclass(frozen=True)
class Plan:
    gpu: np.ndarray       # int64 [T]: the GPU of each table
    hot_rows: np.ndarray  # int64 [T]: rows in HBM, the hottest first

    def hbm_bytes(self, prof: Profile, gpus: int) -> np.ndarray:
        return np.bincount(self.gpu, weights=self.hot_rows * prof.row_bytes, minlength=gpus)


def check_plan(plan: Plan, prof: Profile, gpus: int, capacity: float) -> None:
    if plan.gpu.shape != (prof.num_tables,) or plan.hot_rows.shape != (prof.num_tables,):
        raise PlanError("a plan needs one GPU and one hot-row count per table")
    if plan.gpu.min() < 0 or plan.gpu.max() >= gpus:
        raise PlanError("GPU id out of range")
    if (plan.hot_rows < 0).any() or (plan.hot_rows > prof.rows).any():
        raise PlanError("hot rows outside [0, rows]")
    used = plan.hbm_bytes(prof, gpus)
    if (used > capacity * (1 + 1e-9)).any():
        raise PlanError(f"HBM over capacity: {used.max():.4g} > {capacity:.4g} bytes")


def _per_gpu(gpu: np.ndarray, per_table: np.ndarray, gpus: int | None) -> np.ndarray:
    return np.bincount(gpu, weights=per_table, minlength=gpus or int(gpu.max()) + 1)


def greedy(prof: Profile, gpus: int, capacity: float, key: str) -> Plan:
    """Sort tables by ``key`` (size, lookup or size_lookup), heaviest first; each goes to the GPU with
    the least of that measure so far, in HBM when it fits that GPU's remaining HBM, else in UVM."""
    size = prof.rows * prof.row_bytes.astype(float)
    lookups = prof.lookups_per_sample * prof.row_bytes  # bytes looked up per sample
    weight = {"size": size, "lookup": lookups, "size_lookup": size * lookups}[key]
    load, free = np.zeros(gpus), np.full(gpus, float(capacity))
    gpu, hot = np.zeros(prof.num_tables, np.int64), np.zeros(prof.num_tables, np.int64)
    for j in np.argsort(-weight, kind="stable"):
        d = int(np.argmin(load))
        gpu[j], load[d] = d, load[d] + weight[j]
        if size[j] <= free[d]:
            hot[j], free[d] = prof.rows[j], free[d] - size[j]
    return Plan(gpu, hot)


def cheapest(plans: dict[str, Plan], prof: Profile, costs: Costs, batch: int, gpus: int) -> str:
    """The name of the plan with the lowest max per-GPU cost on the TRAINING profile under ``costs``
    (ties: the first in ``plans``' order)."""
    names = list(plans)
    return min(names, key=lambda n: (float(plan_costs(plans[n], prof, costs, batch, gpus).max()), names.index(n)))


def best_greedy(prof: Profile, gpus: int, capacity: float, costs: Costs, batch: int) -> tuple[str, dict[str, Plan]]:
    """All greedy plans and the name of the one with the lowest max per-GPU cost on the TRAINING profile."""
    plans = {k: greedy(prof, gpus, capacity, k) for k in GREEDY_KEYS}
    return cheapest(plans, prof, costs, batch, gpus), plans


def _table_costs(plan: Plan, prof: Profile, costs: Costs, batch: int) -> np.ndarray:
    share = np.array([prof.hbm_share(j, k) for j, k in enumerate(plan.hot_rows)])
    return batch * prof.lookups_per_sample * (share * costs.hbm + (1 - share) * costs.uvm)


def plan_costs(plan: Plan, prof: Profile, costs: Costs, batch: int, gpus: int) -> np.ndarray:
    """Per-GPU cost of one batch on the training profile (exact access CDF), seconds."""
    return _per_gpu(plan.gpu, _table_costs(plan, prof, costs, batch), gpus)


# ------------------------------------------------------------------------------------------ the MILP
def cdf_segments(cdf: np.ndarray, touched: int, segments: int) -> tuple[np.ndarray, np.ndarray]:
    """Lines (slope a, intercept c) whose minimum is the piecewise-linear access CDF over x = the share
    of the table's touched rows in HBM: breakpoints at geometrically spaced row counts (the CDF is
    steepest in its first rows), plus the flat line 1. The CDF is concave (rows sorted hottest first),
    so min over the lines equals the interpolation, which lies below the true CDF: the MILP never
    overestimates HBM hits."""
    ks = np.unique(np.concatenate([[0], np.round(np.geomspace(1, touched, segments)).astype(np.int64)]))
    xs, fs = ks / touched, cdf[ks]
    a = np.diff(fs) / np.diff(xs)
    c = fs[:-1] - a * xs[:-1]
    return np.append(a, 0.0), np.append(c, 1.0)


@dataclass(frozen=True)
class MilpStats:
    max_cost_s: float    # max per-GPU cost per batch under the piecewise-linear CDF
    objective_s: float   # the solver's objective: max_cost_s + a 1e-4/G-weighted total cost (tie-break)
    bound_s: float       # HiGHS's proven lower bound of objective_s
    gap: float
    status: str
    solve_s: float
    optimal: bool        # proven within the asked gap (then the plan is reproducible)
    start_objective_s: float
    filled_rows: int = 0     # hot rows added after rounding, into HBM the rounded plan left free
    moved_tables: int = 0    # tables moved off the most expensive GPU after rounding
    fell_back: bool = False  # the rounded, filled plan cost more than ``start`` on the training profile: start returned


def recshard(prof: Profile, gpus: int, capacity: float, costs: Costs, batch: int, *, segments: int,
             time_limit_s: float, mip_gap: float, seed: int = 0, start: Plan | None = None) -> tuple[Plan, MilpStats]:
    """Solve RecShard's MILP; ``start``: a feasible plan handed to HiGHS as the first incumbent."""
    t, g = prof.num_tables, gpus
    touched, row_bytes = prof.touched, prof.row_bytes.astype(float)
    lookups = batch * prof.lookups_per_sample
    u, h_ = lookups * costs.uvm, lookups * costs.hbm  # cost per batch of a table wholly in UVM / HBM
    scale = max(u.sum() / g, 1e-30)  # costs in units of an even share of all-UVM cost: z is O(1)
    u, h_ = u / scale, h_ / scale
    P, X, H, Z = 0, t * g, 2 * t * g, 3 * t * g
    idx = np.arange(t * g).reshape(t, g)
    rows, cols, vals, lo, hi = [], [], [], [], []

    def row(c, v, rlo, rhi):
        rows.append(np.full(len(c), len(lo))), cols.append(np.asarray(c)), vals.append(np.asarray(v, float))
        lo.append(rlo), hi.append(rhi)

    for j in range(t):  # every table on exactly one GPU
        row(P + idx[j], np.ones(g), 1.0, 1.0)
    for d in range(g):  # HBM capacity (touched rows only: untouched rows stay in UVM for free)
        row(X + idx[:, d], row_bytes * touched / capacity, -np.inf, 1.0)
        # cost of GPU d <= z
        row(np.concatenate([P + idx[:, d], H + idx[:, d], [Z]]), np.concatenate([u, -(u - h_), [-1.0]]), -np.inf, 0.0)
    lines = []
    for j in range(t):
        a, c = cdf_segments(prof.cdf(j), int(touched[j]), segments) if touched[j] else (np.zeros(1), np.zeros(1))
        lines.append((a, c))
        for d in range(g):
            row([X + idx[j, d], P + idx[j, d]], [1.0, -1.0], -np.inf, 0.0)  # HBM rows only where placed
            for aa, cc in zip(a, c):  # HBM hit share h <= a x + c p on every segment line
                row([H + idx[j, d], X + idx[j, d], P + idx[j, d]], [1.0, -aa, -cc], -np.inf, 0.0)
    a_mat = sparse.coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                              shape=(len(lo), Z + 1))
    # objective: the max cost, plus a tiny pull towards less total cost, so GPUs below the max still
    # use their spare HBM for hot rows
    eps = 1e-4 / g
    obj = np.zeros(Z + 1)
    obj[Z] = 1.0
    obj[P:X] = eps * np.repeat(u, g)
    obj[H:Z] = -eps * np.repeat(u - h_, g)
    # GPUs are identical: the i-th most expensive table may only open GPUs 0..i (keeps an optimum)
    order = np.argsort(-u, kind="stable")
    rank = np.empty(t, np.int64)
    rank[order] = np.arange(t)
    col_hi = np.ones(Z + 1)
    col_hi[P:X] = (np.arange(g)[None, :] <= rank[:, None]).ravel()
    col_hi[Z] = np.inf
    integer = np.zeros(Z + 1, bool)
    integer[P:X] = True
    x0 = start_objective = None
    if start is not None:
        x0 = _start_point(start, order, touched, lines, u, h_, t, g)
        start_objective = float(obj @ x0) * scale
    res = solve_min(obj, a_mat, np.array(lo), np.array(hi), np.zeros(Z + 1), col_hi, integer,
                    time_limit_s=time_limit_s, seed=seed, start=x0, mip_rel_gap=mip_gap)
    p = res.x[P:X].reshape(t, g).round()
    if (p.sum(1) != 1).any():
        raise PlanError("MILP returned a table on other than one GPU")
    gpu = p.argmax(1).astype(np.int64)
    share = res.x[X:H].reshape(t, g)[np.arange(t), gpu].clip(0, 1)
    hot = np.minimum(np.floor(share * touched + 1e-6).astype(np.int64), touched)
    plan, filled, moved = repair(_fit(Plan(gpu, hot), prof, g, capacity), prof, g, capacity, costs)
    fell_back = False
    if start is not None and plan_costs(start, prof, costs, batch, g).max() < plan_costs(plan, prof, costs, batch, g).max():
        plan, fell_back = start, True  # reported (MilpStats.fell_back, the flow's milp_fell_back metric)
    stats = MilpStats(max_cost_s=float(res.x[Z]) * scale, objective_s=res.objective * scale,
                      bound_s=float(res.bound) * scale, gap=res.gap, status=res.status,
                      solve_s=res.seconds, optimal=res.status == "Optimal",
                      start_objective_s=float("nan") if start_objective is None else float(start_objective),
                      filled_rows=filled, moved_tables=moved, fell_back=fell_back)
    return plan, stats


def _start_point(plan: Plan, order: np.ndarray, touched: np.ndarray, lines, u, h_, t: int, g: int) -> np.ndarray:
    """``plan`` as a MILP point, its GPUs relabelled in order of first use along ``order`` (so it meets
    the symmetry-breaking bounds)."""
    relabel: dict[int, int] = {}
    for j in order:
        relabel.setdefault(int(plan.gpu[j]), len(relabel))
    x = np.zeros(3 * t * g + 1)
    cost = np.zeros(g)
    for j in range(t):
        d = relabel[int(plan.gpu[j])]
        share = min(1.0, plan.hot_rows[j] / touched[j]) if touched[j] else 0.0
        a, c = lines[j]
        hit = float(np.clip(np.min(a * share + c), 0.0, 1.0)) if touched[j] else 0.0
        x[j * g + d], x[t * g + j * g + d], x[2 * t * g + j * g + d] = 1.0, share, hit
        cost[d] += u[j] - (u[j] - h_[j]) * hit
    x[-1] = cost.max()
    return x


def _fit(plan: Plan, prof: Profile, gpus: int, capacity: float) -> Plan:
    """Rounding guard: drop hot rows of a GPU's widest table until its HBM use fits (never needed
    unless the solver's tolerance let the capacity row slip by a row)."""
    hot = plan.hot_rows.copy()
    used = Plan(plan.gpu, hot).hbm_bytes(prof, gpus)
    for d in np.flatnonzero(used > capacity):
        tables = np.flatnonzero((plan.gpu == d) & (hot > 0))
        j = tables[np.argmax(prof.row_bytes[tables])]
        hot[j] = max(0, hot[j] - int(np.ceil((used[d] - capacity) / prof.row_bytes[j])))
    return Plan(plan.gpu, hot)


def fill_spare_hbm(plan: Plan, prof: Profile, gpus: int, capacity: float, costs: Costs) -> tuple[Plan, int]:
    """Repair after rounding: put the next hottest (touched) rows of each GPU's tables into the HBM the
    plan leaves free on that GPU, the rows that save the most cost per byte first, while they fit.
    Rows only move from UVM to HBM, so no GPU's cost grows and HBM capacity holds. Returns the plan
    and the number of rows added."""
    hot = plan.hot_rows.copy()
    used = plan.hbm_bytes(prof, gpus)
    touched, row_bytes = prof.touched, prof.row_bytes.astype(float)
    saving = (costs.uvm - costs.hbm) / row_bytes  # per access, per byte of HBM
    added = 0
    for d in range(gpus):
        spare = capacity - used[d]
        tables = [j for j in np.flatnonzero(plan.gpu == d) if hot[j] < touched[j] and row_bytes[j] <= spare]
        if not tables:
            continue
        # candidates: each table's next rows in hotness order (at most what the spare HBM could hold)
        cand_t, cand_v = [], []
        for j in tables:
            k = min(int(touched[j]) - int(hot[j]), int(spare // row_bytes[j]))
            counts = np.sort(prof.counts[j])[::-1][hot[j]: hot[j] + k].astype(float)
            cand_t.append(np.full(k, j)), cand_v.append(counts * saving[j])
        tab, value = np.concatenate(cand_t), np.concatenate(cand_v)
        order = np.lexsort((np.arange(len(tab)), -value))  # a table's own rows stay in hotness order
        tab = tab[order]
        while len(tab):
            cum = np.cumsum(row_bytes[tab])
            n = int(np.searchsorted(cum, spare, side="right"))
            if n:
                np.add.at(hot, tab[:n], 1)
                added, spare, tab = added + n, spare - cum[n - 1], tab[n:]
            tab = tab[row_bytes[tab] <= spare]  # a table whose next row no longer fits is done
    return Plan(plan.gpu, hot), added


def move_tables(plan: Plan, prof: Profile, gpus: int, capacity: float, costs: Costs,
                max_moves: int | None = None) -> tuple[Plan, int, int]:
    """Repair after rounding, by moves: while the most expensive GPU (exact training cost) can hand one
    of its tables to another GPU -- with as many of the table's hottest touched rows in HBM as fit
    there -- so that both GPUs end up cheaper than it was, make the best such move and refill the
    spare HBM. Each move lowers the largest cost or the number of GPUs at it, so this ends. Returns
    the plan, the tables moved and the rows filled."""
    gpu, hot = plan.gpu.copy(), plan.hot_rows.copy()
    touched, row_bytes, lookups = prof.touched, prof.row_bytes.astype(float), prof.lookups_per_sample
    cdfs: dict[int, np.ndarray] = {}

    def cost(j: int, k: int) -> float:
        if j not in cdfs:
            cdfs[j] = prof.cdf(j)
        share = cdfs[j][min(int(k), len(cdfs[j]) - 1)]
        return float(lookups[j] * (share * costs.hbm[j] + (1 - share) * costs.uvm[j]))

    moved = filled = 0
    for _ in range(max_moves if max_moves is not None else 4 * prof.num_tables):
        load = np.bincount(gpu, weights=[cost(j, hot[j]) for j in range(len(gpu))], minlength=gpus)
        used = np.bincount(gpu, weights=hot * row_bytes, minlength=gpus)
        d = int(np.argmax(load))
        best = None
        for j in np.flatnonzero(gpu == d):
            rest = load[d] - cost(j, hot[j])
            for e in range(gpus):
                if e == d:
                    continue
                k = int(min(touched[j], max(0.0, capacity - used[e]) // row_bytes[j]))
                peak = max(rest, load[e] + cost(j, k))
                if peak < load[d] * (1 - 1e-9) and (best is None or peak < best[0]):
                    best = (peak, int(j), e, k)
        if best is None:
            break
        _, j, e, k = best
        gpu[j], hot[j] = e, k
        moved += 1
        refilled, n = fill_spare_hbm(Plan(gpu, hot), prof, gpus, capacity, costs)
        hot, filled = refilled.hot_rows.copy(), filled + n
    return Plan(gpu, hot), moved, filled


def greedy_hot_rows(prof: Profile, gpus: int, capacity: float, costs: Costs, batch: int) -> tuple[str, Plan]:
    """RecShard's mechanism ablation: no MILP, but row-level tiering added to the greedy sharders. Each
    greedy placement (by size, lookup, size x lookup) keeps its table -> GPU assignment, and each GPU's
    HBM is filled with the hottest profiled rows of its tables, the rows that save the most cost per
    byte first (``fill_spare_hbm`` from an empty HBM). Returns the greedy key whose plan costs least on
    the TRAINING profile under ``costs``, and that plan."""
    plans = {}
    for key in GREEDY_KEYS:
        placed = greedy(prof, gpus, capacity, key)
        plans[key], _ = fill_spare_hbm(Plan(placed.gpu, np.zeros_like(placed.hot_rows)), prof, gpus, capacity, costs)
    best = cheapest(plans, prof, costs, batch, gpus)
    return best, plans[best]


def repair(plan: Plan, prof: Profile, gpus: int, capacity: float, costs: Costs) -> tuple[Plan, int, int]:
    """A rounded MILP plan, repaired: spare HBM filled, then tables moved off the most expensive GPU
    while that helps (``move_tables``). Returns the plan, the rows filled and the tables moved."""
    plan, filled = fill_spare_hbm(plan, prof, gpus, capacity, costs)
    plan, moved, more = move_tables(plan, prof, gpus, capacity, costs)
    return plan, filled + more, moved
