"""Per-layer operator scheduling on one accelerator: an ILP (HiGHS) that orders the operators on each
unit (tensor, vector, net) under the graph's dependencies and minimizes the layer's makespan, plus two
heuristics (list scheduling and an active schedule; the better one is the ILP's warm start) and a brute force
over unit orders (for tests)."""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from mlsys_flows.errors import MlsysError
from mlsys_flows.systems.common.milp import solve_min

from .ops import Op


class ScheduleError(MlsysError, ValueError):
    pass


@dataclass(frozen=True)
class Schedule:
    makespan: float
    start: dict[str, float]
    gap: float = 0.0
    status: str = "Optimal"
    seconds: float = 0.0


def _check_graph(ops: list[Op]) -> dict[str, int]:
    idx = {o.name: i for i, o in enumerate(ops)}
    if len(idx) != len(ops):
        raise ScheduleError("duplicate operator names")
    for o in ops:
        for d in o.deps:
            if d not in idx or idx[d] >= idx[o.name]:
                raise ScheduleError(f"operator {o.name}: dependency {d!r} missing or not before it")
        if o.duration < 0:
            raise ScheduleError(f"operator {o.name}: negative duration")
    return idx


def ancestors(ops: list[Op]) -> list[set[int]]:
    idx = _check_graph(ops)
    anc: list[set[int]] = []
    for o in ops:
        s: set[int] = set()
        for d in o.deps:
            s |= {idx[d]} | anc[idx[d]]
        anc.append(s)
    return anc


def validate(ops: list[Op], start: dict[str, float], tol: float = 1e-9) -> float:
    """Independent check of a schedule: dependencies respected, no two ops of a unit overlap;
    returns the makespan."""
    end = {o.name: start[o.name] + o.duration for o in ops}
    for o in ops:
        if start[o.name] < -tol:
            raise ScheduleError(f"{o.name} starts before 0")
        for d in o.deps:
            if start[o.name] < end[d] - tol * max(1.0, end[d]):
                raise ScheduleError(f"{o.name} starts before its dependency {d} ends")
    by_unit: dict[str, list[Op]] = {}
    for o in ops:
        by_unit.setdefault(o.unit, []).append(o)
    for unit, us in by_unit.items():
        us = sorted((x for x in us if x.duration > 0), key=lambda x: start[x.name])
        for a, b in zip(us, us[1:]):
            if start[b.name] < end[a.name] - tol * max(1.0, end[a.name]):
                raise ScheduleError(f"{a.name} and {b.name} overlap on the {unit} unit")
    return max(end.values(), default=0.0)


def heads_tails(ops: list[Op]) -> tuple[dict[str, float], dict[str, float]]:
    """Longest path into each op (its earliest start) and from it to the end, its own duration included."""
    _check_graph(ops)
    dur = {o.name: o.duration for o in ops}
    head: dict[str, float] = {}
    for o in ops:
        head[o.name] = max((head[d] + dur[d] for d in o.deps), default=0.0)
    succ: dict[str, list[str]] = {o.name: [] for o in ops}
    for o in ops:
        for d in o.deps:
            succ[d].append(o.name)
    tail: dict[str, float] = {}
    for o in reversed(ops):
        tail[o.name] = o.duration + max((tail[x] for x in succ[o.name]), default=0.0)
    return head, tail


def lower_bound(ops: list[Op]) -> float:
    """max(critical path, for each unit: earliest any of its ops can start + its total work + the
    shortest work that must follow its last op): no schedule is shorter."""
    head, tail = heads_tails(ops)
    bound = max((head[o.name] + tail[o.name] for o in ops), default=0.0)
    for unit in {o.unit for o in ops}:
        us = [o for o in ops if o.unit == unit]
        bound = max(bound, jackson_preemptive([(head[o.name], o.duration, tail[o.name] - o.duration) for o in us]))
    return bound


def jackson_preemptive(jobs: list[tuple[float, float, float]]) -> float:
    """Makespan of Jackson's preemptive schedule for one machine with release times r, durations d and
    tails q (work that must follow): always run the released job with the longest tail. It is optimal
    for the preemptive problem, hence a lower bound for the non-preemptive one."""
    pending = sorted(jobs)                      # by release time
    ready: list[list[float]] = []               # [-q, remaining]

    t, i, best = 0.0, 0, 0.0
    while i < len(pending) or ready:
        if not ready:
            t = max(t, pending[i][0])
        while i < len(pending) and pending[i][0] <= t:
            r, d, q = pending[i]
            heapq.heappush(ready, [-q, d])
            i += 1
        negq, rem = heapq.heappop(ready)
        nxt = pending[i][0] if i < len(pending) else float("inf")
        run = min(rem, nxt - t)
        t += run
        if run < rem:
            heapq.heappush(ready, [negq, rem - run])
        else:
            best = max(best, t - negq)
    return best


def list_schedule(ops: list[Op]) -> Schedule:
    """Critical-path-first list scheduling: among ready ops, the one with the longest remaining path
    starts first on its unit."""
    idx = _check_graph(ops)
    succ: dict[str, list[str]] = {o.name: [] for o in ops}
    for o in ops:
        for d in o.deps:
            succ[d].append(o.name)
    tail: dict[str, float] = {}
    for o in reversed(ops):
        tail[o.name] = o.duration + max((tail[s] for s in succ[o.name]), default=0.0)
    free = {o.unit: 0.0 for o in ops}
    end: dict[str, float] = {}
    start: dict[str, float] = {}
    remaining = list(ops)
    while remaining:
        ready = [o for o in remaining if all(d in end for d in o.deps)]
        est = {o.name: max([free[o.unit]] + [end[d] for d in o.deps]) for o in ready}
        o = min(ready, key=lambda x: (est[x.name], -tail[x.name], idx[x.name]))
        start[o.name] = est[o.name]
        end[o.name] = est[o.name] + o.duration
        free[o.unit] = end[o.name]
        remaining.remove(o)
    return Schedule(max(end.values(), default=0.0), start, status="heuristic")


def active_schedule(ops: list[Op]) -> Schedule:
    """Giffler-Thompson active schedule, longest-tail priority: take the ready op that could end first;
    among the ops of its unit that could start before that end, start the one with the longest path
    to the layer's end. Unlike list scheduling it may leave a unit idle for a critical op about to be
    ready, instead of filling it with a weight gradient that nothing waits on."""
    idx = _check_graph(ops)
    _, tail = heads_tails(ops)
    free = {o.unit: 0.0 for o in ops}
    end: dict[str, float] = {}
    start: dict[str, float] = {}
    remaining = list(ops)
    while remaining:
        ready = [o for o in remaining if all(d in end for d in o.deps)]
        est = {o.name: max([free[o.unit]] + [end[d] for d in o.deps]) for o in ready}
        first = min(ready, key=lambda x: (est[x.name] + x.duration, idx[x.name]))
        limit = est[first.name] + first.duration
        conflict = [o for o in ready if o.unit == first.unit and (est[o.name] < limit or o is first)]
        o = max(conflict, key=lambda x: (tail[x.name], -est[x.name], -idx[x.name]))
        start[o.name] = est[o.name]
        end[o.name] = est[o.name] + o.duration
        free[o.unit] = end[o.name]
        remaining.remove(o)
    return Schedule(max(end.values(), default=0.0), start, status="heuristic")


def warm_start(ops: list[Op]) -> Schedule:
    """The better of the two heuristics (the ILP's incumbent to start from)."""
    return min((list_schedule(ops), active_schedule(ops)), key=lambda s: s.makespan)


def ilp_schedule(ops: list[Op], time_limit_s: float = 10.0, seed: int = 0, mip_rel_gap: float = 1e-4) -> Schedule:
    """Disjunctive ILP: start times s_i, makespan C, one binary per pair of ops that share a unit and
    are not ordered by the graph (y=1: i before j). min C s.t. s_j >= s_i + d_i for every edge,
    C >= s_i + d_i, and the big-M disjunction for every such pair. Times in microseconds inside."""
    n = len(ops)
    if n == 0:
        return Schedule(0.0, {})
    anc = ancestors(ops)
    idx = {o.name: i for i, o in enumerate(ops)}
    d = np.array([o.duration for o in ops]) * 1e6
    head_s, tail_s = heads_tails(ops)
    head = np.array([head_s[o.name] for o in ops]) * 1e6
    tail = np.array([tail_s[o.name] for o in ops]) * 1e6
    warm = warm_start(ops)
    lower = lower_bound(ops) * 1e6
    if warm.makespan * 1e6 <= lower * (1 + 1e-9) + 1e-9:   # the warm start meets the bound: optimal
        return Schedule(warm.makespan, warm.start, gap=0.0, status="Optimal (bound met)")
    horizon = warm.makespan * 1e6 * (1 + 1e-9) + 1e-6     # an optimal schedule ends no later
    latest = horizon - tail                                # latest start of each op
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)
             if ops[i].unit == ops[j].unit and d[i] > 0 and d[j] > 0 and i not in anc[j] and j not in anc[i]]
    # symmetry breaking: two ops with the same unit, duration, dependencies and successors are
    # interchangeable, so some optimal schedule runs the earlier-listed one first
    succ = {o.name: frozenset(x.name for x in ops if o.name in x.deps) for o in ops}
    twins = {(i, j) for i, j in pairs if d[i] == d[j] and set(ops[i].deps) == set(ops[j].deps)
             and succ[ops[i].name] == succ[ops[j].name]}
    nv = n + 1 + len(pairs)
    rows, cols, vals, lo, hi = [], [], [], [], []

    def row(entries, lower, upper):
        r = len(lo)
        for c, v in entries:
            rows.append(r); cols.append(c); vals.append(v)
        lo.append(lower); hi.append(upper)

    for j, o in enumerate(ops):
        for dep in o.deps:
            i = idx[dep]
            row([(j, 1.0), (i, -1.0)], d[i], np.inf)
        row([(n, 1.0), (j, -1.0)], d[j], np.inf)
    for p, (i, j) in enumerate(pairs):
        y = n + 1 + p
        m_ij = latest[i] + d[i] - head[j]                  # the most s_i + d_i - s_j can be
        m_ji = latest[j] + d[j] - head[i]
        row([(i, 1.0), (j, -1.0), (y, m_ij)], -np.inf, m_ij - d[i])    # y=1: s_i + d_i <= s_j
        row([(j, 1.0), (i, -1.0), (y, -m_ji)], -np.inf, -d[j])         # y=0: s_j + d_j <= s_i
    a = sparse.csc_matrix((vals, (rows, cols)), shape=(len(lo), nv))
    c = np.zeros(nv); c[n] = 1.0
    col_lo = np.concatenate([head, [lower], np.zeros(len(pairs))])
    col_hi = np.concatenate([np.maximum(latest, head), [horizon], np.ones(len(pairs))])
    for p, pair in enumerate(pairs):
        if pair in twins:
            col_lo[n + 1 + p] = 1.0
    integer = np.zeros(nv, bool); integer[n + 1:] = True
    start = np.zeros(nv)
    start[:n] = [warm.start[o.name] * 1e6 for o in ops]
    start[n] = warm.makespan * 1e6
    # twins are interchangeable: give the earlier-listed one the earlier start, as the ILP requires
    for _ in range(len(twins)):
        for i, j in sorted(twins):
            if start[i] > start[j]:
                start[i], start[j] = start[j], start[i]
    for p, (i, j) in enumerate(pairs):
        start[n + 1 + p] = 1.0 if start[i] + d[i] <= start[j] + 1e-6 else 0.0
    res = solve_min(c, a, np.array(lo), np.array(hi), col_lo, col_hi, integer, time_limit_s=time_limit_s,
                    seed=seed, start=start, floor=lower, mip_rel_gap=mip_rel_gap)
    s = {o.name: float(res.x[i]) / 1e6 for i, o in enumerate(ops)}
    # the makespan is the latest end of the returned starts (C may carry solver slack)
    try:
        makespan = validate(ops, s, tol=1e-6)
    except ScheduleError:   # beyond the solver's tolerances: keep the (valid) warm start
        return Schedule(warm.makespan, warm.start, gap=(warm.makespan * 1e6 - res.bound) / (warm.makespan * 1e6),
                        status=f"{res.status} (warm start kept)", seconds=res.seconds)
    if makespan > warm.makespan:
        return Schedule(warm.makespan, warm.start, gap=res.gap, status=res.status, seconds=res.seconds)
    return Schedule(makespan, s, gap=res.gap, status=res.status, seconds=res.seconds)


def earliest_starts(ops: list[Op], order: dict[str, list[str]]) -> dict[str, float] | None:
    """Earliest start times given a total order of the ops on each unit (None: the orders contradict
    the graph). The semi-active schedule of an order; some order's is optimal."""
    preds: dict[str, set[str]] = {o.name: set(o.deps) for o in ops}
    for seq in order.values():
        for a, b in zip(seq, seq[1:]):
            preds[b].add(a)
    dur = {o.name: o.duration for o in ops}
    start: dict[str, float] = {}
    pending = set(preds)
    while pending:
        ready = [x for x in pending if preds[x] <= start.keys()]
        if not ready:
            return None
        for x in ready:
            start[x] = max((start[p] + dur[p] for p in preds[x]), default=0.0)
            pending.discard(x)
    return start


def brute_force(ops: list[Op]) -> float:
    """Optimal makespan by trying every order of the ops on every unit (tiny graphs only)."""
    _check_graph(ops)
    units: dict[str, list[str]] = {}
    for o in ops:
        units.setdefault(o.unit, []).append(o.name)
    if sum(len(v) for v in units.values()) > 12:
        raise ScheduleError("brute force is for tiny graphs")
    best = np.inf
    names = list(units)
    for combo in itertools.product(*(itertools.permutations(units[u]) for u in names)):
        st = earliest_starts(ops, dict(zip(names, map(list, combo))))
        if st is not None:
            best = min(best, max(st[o.name] + o.duration for o in ops))
    return float(best)
