"""The integer program for non-contiguous splits (Tarnawski et al., NeurIPS 2020), solved by HiGHS with a time limit.

Binary x[u, d]: colocation class u on device d. For every node v with an output cost and every
accelerator d: send[v, d] >= x[u(v), d] - x[u(w), d] and recv[v, d] >= x[u(w), d] - x[u(v), d] for each
successor w (v pays its cost once on its own device and once on each receiving device); CPUs pay no
communication. load_d = compute + communication <= T, memory per accelerator, unsupported classes off
accelerators; minimise T. Identical devices are made distinct by ordering (class j may only use the
first j+1 accelerators / CPU cores). The DP's contiguous split is handed over as the first incumbent,
so the IP's value is never above the DP's; with the time limit it reports the proven gap.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse

from mlsys_flows.systems.common.milp import solve_min

from .graph import Graph


@dataclass
class IPResult:
    max_load: float
    bound: float
    gap: float
    status: str
    seconds: float
    device: np.ndarray


def _canonical(device_of_class: np.ndarray, k: int) -> np.ndarray:
    """Relabel identical devices by first use, so the split satisfies the symmetry-breaking rows."""
    acc, cpu = {}, {}
    out = np.empty_like(device_of_class)
    for j, d in enumerate(device_of_class):
        table, base = (acc, 0) if d < k else (cpu, k)
        if d not in table:
            table[d] = base + len(table)
        out[j] = table[d]
    return out


def solve_ip(g: Graph, k: int, l: int, memory: float, *, time_limit_s: float, start: np.ndarray | None = None,
             seed: int = 0) -> IPResult:
    colors = np.unique(g.color)
    cls_of = np.searchsorted(colors, g.color)
    # classes in topological order of their first node, for the symmetry-breaking rows
    order = []
    seen = set()
    indeg = [len(p) for p in g.pred]
    ready = [v for v in range(g.n) if indeg[v] == 0]
    while ready:
        ready.sort(reverse=True)
        v = ready.pop()
        if cls_of[v] not in seen:
            seen.add(cls_of[v])
            order.append(cls_of[v])
        for w in g.succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    rank = np.empty(len(colors), dtype=np.int64)
    rank[order] = np.arange(len(order))
    cls_of = rank[cls_of]
    nc, dev = len(colors), k + l
    fpga = np.bincount(cls_of, g.fpga, nc)
    cpu = np.bincount(cls_of, g.cpu, nc)
    size = np.bincount(cls_of, g.size, nc)
    unsup = np.bincount(cls_of, (~g.supported).astype(float), nc) > 0
    senders = [v for v in range(g.n) if g.out_cost[v] > 0 and any(cls_of[w] != cls_of[v] for w in g.succ[v])]
    ns = len(senders)

    def xi(c, d):
        return c * dev + d
    nx_ = nc * dev
    si = lambda j, d: nx_ + j * k + d            # noqa: E731  send[v_j, d]
    ri = lambda j, d: nx_ + ns * k + j * k + d   # noqa: E731  recv[v_j, d]
    ti = nx_ + 2 * ns * k
    ncol = ti + 1
    rows, cols, vals, lo, hi = [], [], [], [], []
    r = 0

    def row(entries, a, b):
        nonlocal r
        for cidx, val in entries:
            rows.append(r)
            cols.append(cidx)
            vals.append(val)
        lo.append(a)
        hi.append(b)
        r += 1

    for c in range(nc):
        row([(xi(c, d), 1.0) for d in range(dev)], 1.0, 1.0)
    for j, v in enumerate(senders):
        cu = cls_of[v]
        for cw in {int(cls_of[w]) for w in g.succ[v]} - {int(cu)}:
            for d in range(k):
                row([(si(j, d), 1.0), (xi(cu, d), -1.0), (xi(cw, d), 1.0)], 0.0, np.inf)
                row([(ri(j, d), 1.0), (xi(cw, d), -1.0), (xi(cu, d), 1.0)], 0.0, np.inf)
    for d in range(k):
        e = [(xi(c, d), fpga[c]) for c in range(nc) if fpga[c]]
        e += [(si(j, d), g.out_cost[v]) for j, v in enumerate(senders)]
        e += [(ri(j, d), g.out_cost[v]) for j, v in enumerate(senders)]
        row(e + [(ti, -1.0)], -np.inf, 0.0)
        if np.isfinite(memory):
            row([(xi(c, d), size[c]) for c in range(nc) if size[c]], -np.inf, memory)
    for d in range(k, dev):
        row([(xi(c, d), cpu[c]) for c in range(nc) if cpu[c]] + [(ti, -1.0)], -np.inf, 0.0)
    # a valid floor of T: every class runs somewhere, on at most k + l devices
    cheapest = np.where(unsup, cpu, np.minimum(fpga, cpu)) if l > 0 else fpga
    floor = float(max(cheapest.sum() / dev, cheapest.max(initial=0.0)))
    col_lo = np.zeros(ncol)
    col_lo[ti] = floor
    col_hi = np.ones(ncol)
    col_hi[ti] = np.inf
    for c in range(nc):
        for d in range(dev):
            if (d < k and (unsup[c] or d > c)) or (d >= k and d - k > c):
                col_hi[xi(c, d)] = 0.0
    integer = np.zeros(ncol, dtype=bool)
    integer[:nx_] = True
    obj = np.zeros(ncol)
    obj[ti] = 1.0
    a = sparse.csr_matrix((vals, (rows, cols)), shape=(r, ncol))
    x0 = None
    if start is not None:
        dclass = np.empty(nc, dtype=np.int64)
        dclass[cls_of] = np.asarray(start)
        dclass = _canonical(dclass, k)
        x0 = np.zeros(ncol)
        x0[[xi(c, dclass[c]) for c in range(nc)]] = 1.0
        loads = np.zeros(dev)
        np.add.at(loads, dclass, np.where(dclass < k, fpga, cpu))
        for j, v in enumerate(senders):
            dv = dclass[cls_of[v]]
            recv = {int(dclass[cls_of[w]]) for w in g.succ[v]} - {int(dv)}
            if recv and dv < k:
                x0[si(j, dv)] = 1.0
                loads[dv] += g.out_cost[v]
            for d in recv:
                if d < k:
                    x0[ri(j, d)] = 1.0
                    loads[d] += g.out_cost[v]
        x0[ti] = loads.max()
    res = solve_min(obj, a, np.array(lo), np.array(hi), col_lo, col_hi, integer, time_limit_s=time_limit_s,
                    seed=seed, start=x0, floor=floor)
    xs = res.x[:nx_].reshape(nc, dev)
    dclass = xs.argmax(axis=1)
    return IPResult(float(res.objective), float(res.bound), float(res.gap), res.status, float(res.seconds),
                    dclass[cls_of])
