"""Baselines a careful user would run instead of the exact DP (each returns node -> device).

- ``pipedream``: PipeDream's partitioner (Narayanan et al., SOSP 2019) handles only layer chains; as in the
  paper's comparison, branches are fused first (every biconnected component's edge tails become one
  layer; input and broadcast nodes with no compute are left out of that, as PipeDream's profiler does
  not see them as layers), the result is linearised in topological order, and the chain is split
  optimally over the same devices by the same DP (no stage replication).
- ``greedy``: walk the nodes in topological order and fill accelerators one after another up to a target
  load (compute / k times a factor, tuned over a grid and scored with the cost model), spilling to the
  next device on memory; unsupported nodes go to a CPU.
- ``local_search``: the paper's local search: start from a random assignment of colocation classes to
  accelerators (and from the greedy split), repeatedly apply the best single-class move (to any
  device), until no move lowers (max load, sum of squared loads); restarts within a time budget.
- ``one_accelerator``: no model parallelism: the best split over one accelerator and the CPU cores.
"""
from __future__ import annotations

import math
import time

import numpy as np

from .dp import build_units, solve_dp
from .graph import Graph


def _topo(g: Graph) -> list:
    indeg = [len(p) for p in g.pred]
    ready = [v for v in range(g.n) if indeg[v] == 0]
    out = []
    while ready:
        ready.sort(reverse=True)
        v = ready.pop()
        out.append(v)
        for w in g.succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    return out


def pipedream_groups(g: Graph) -> list:
    """Node groups PipeDream would see as one layer: the tails of each biconnected component's edges."""
    import networkx as nx

    skip = {v for v in range(g.n) if g.fpga[v] == 0 and (not g.pred[v] or len(g.succ[v]) >= 3)}
    ug = nx.Graph()
    ug.add_nodes_from(v for v in range(g.n) if not g.backward[v])
    directed = set()
    for s, d in g.edges:
        if g.backward[s] or g.backward[d] or s in skip:
            continue
        ug.add_edge(s, d)
        directed.add((s, d))
    groups = []
    for comp in nx.biconnected_component_edges(ug):
        tails = {a if (a, b) in directed else b for a, b in comp}
        if len(tails) > 1:
            groups.append(sorted(tails))
    return groups


def pipedream(g: Graph, k: int, l: int, memory: float, max_ideals: int = 60_000):
    units = build_units(g, groups=pipedream_groups(g), merge_trivial=False, chain=True)
    return solve_dp(g, k, l, memory, units=units, max_ideals=max_ideals)


def dp_chain(g: Graph, k: int, l: int, memory: float, max_ideals: int = 60_000):
    """The ablation of the DP's mechanism: the same exact DP over the prefixes of one topological order
    of the contracted graph (a chain through it, no fusion), not over all of its downsets."""
    return solve_dp(g, k, l, memory, units=build_units(g, merge_trivial=False, chain=True), max_ideals=max_ideals)


def _unit_order(g: Graph):
    """Contracted units (colocation classes, cycles fused) as node lists in topological order, and the
    free sources, which follow their earliest successor."""
    units = build_units(g, merge_trivial=False)
    members = [[] for _ in range(units.count)]
    for v in range(g.n):
        if units.unit_of[v] >= 0:
            members[units.unit_of[v]].append(v)
    return [np.array(m) for m in members], units


def _with_floating(g: Graph, units, device: np.ndarray) -> np.ndarray:
    """Free sources go to the device of their successor that comes first in unit order."""
    for v in np.flatnonzero(units.unit_of < 0):
        succ = [w for w in g.succ[v] if units.unit_of[w] >= 0]
        device[v] = device[min(succ, key=lambda w: units.unit_of[w])] if succ else 0
    return device


def contiguous_dag(g: Graph, device: np.ndarray, src_fw: np.ndarray, dst_fw: np.ndarray, devices: int) -> bool:
    """Whether the device graph of forward edges is acyclic (the split is contiguous)."""
    a, b = device[src_fw], device[dst_fw]
    cut = a != b
    adj = np.zeros((devices, devices), dtype=bool)
    adj[a[cut], b[cut]] = True
    reach = adj.copy()
    for _ in range(max(1, devices.bit_length())):
        reach = reach | ((reach.astype(np.int32) @ reach.astype(np.int32)) > 0)
    return not reach.diagonal().any()


def fast_loads(g: Graph, device: np.ndarray, k: int, l: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Per-device loads (the cost model, vectorised; the independent scorer is graph.score)."""
    loads = np.bincount(device, np.where(device < k, g.fpga, g.cpu), k + l)
    ds, dd = device[src], device[dst]
    cut = ds != dd
    if cut.any():
        pairs = np.unique(np.stack([src[cut], dd[cut]]), axis=1)
        c = g.out_cost[pairs[0]]
        loads += np.bincount(pairs[1], c, k + l) * (np.arange(k + l) < k)
        senders = np.unique(pairs[0])
        sd = device[senders]
        loads += np.bincount(sd, g.out_cost[senders] * (sd < k), k + l)
    return loads


def _mem_ok(g, device, k, memory):
    acc = device < k
    return (np.bincount(device[acc], g.size[acc], k) <= memory * (1 + 1e-12)).all() and g.supported[acc].all()


def greedy(g: Graph, k: int, l: int, memory: float) -> np.ndarray:
    order, units = _unit_order(g)
    src = np.array([s for s, _ in g.edges], dtype=np.int64)
    dst = np.array([d for _, d in g.edges], dtype=np.int64)
    total = float(g.fpga[g.supported].sum())
    best, best_val = None, math.inf
    for factor in np.linspace(0.8, 1.6, 33):
        target = total / k * factor
        device = np.zeros(g.n, dtype=np.int64)
        cur, load, mem = 0, 0.0, 0.0
        cpu_next = k
        for cls in order:
            if not g.supported[cls].all():
                if l == 0:
                    break
                device[cls] = cpu_next  # stays contiguous only while CPU stages come last; checked below
                continue
            f, s = float(g.fpga[cls].sum()), float(g.size[cls].sum())
            if cur < k - 1 and load > 0 and (load + f > target or mem + s > memory):
                cur, load, mem = cur + 1, 0.0, 0.0
            device[cls] = cur
            load, mem = load + f, mem + s
        device = _with_floating(g, units, device)
        if not _mem_ok(g, device, k, memory):
            continue
        val = float(fast_loads(g, device, k, l, src, dst).max())
        if val < best_val:
            best, best_val = device, val
    if best is None:  # nothing fits greedily: fall back to the best single-accelerator split
        return one_accelerator(g, k, l, memory)[1]
    return best


def local_search(g: Graph, k: int, l: int, memory: float, *, seconds: float, seed: int = 0,
                 start: np.ndarray | None = None) -> np.ndarray:
    """Best-improvement single-unit moves over contiguous, feasible splits (the DP's search space),
    from ``start`` and then from random contiguous splits, until ``seconds`` run out."""
    rng = np.random.default_rng(seed)
    classes, units = _unit_order(g)
    src = np.array([s for s, _ in g.edges], dtype=np.int64)
    dst = np.array([d for _, d in g.edges], dtype=np.int64)
    fw = np.array([not g.backward[s] and not g.backward[d] for s, d in g.edges], dtype=bool)
    src_fw, dst_fw = src[fw], dst[fw]
    devices = k + l
    allowed = [list(range(devices)) if g.supported[c].all() else list(range(k, devices)) for c in classes]
    if any(not a for a in allowed):
        raise ValueError("a node unsupported on accelerators needs at least one CPU core")

    def objective(device):
        device = _with_floating(g, units, device)
        if not _mem_ok(g, device, k, memory) or not contiguous_dag(g, device, src_fw, dst_fw, devices):
            return (math.inf, math.inf)
        loads = fast_loads(g, device, k, l, src, dst)
        return (float(loads.max()), float((loads ** 2).sum()))

    def random_split():
        device = np.zeros(g.n, dtype=np.int64)
        cuts = np.sort(rng.choice(np.arange(1, len(classes)), size=min(k - 1, len(classes) - 1), replace=False))
        perm = rng.permutation(k)
        stage = 0
        for i, c in enumerate(classes):
            while stage < len(cuts) and i >= cuts[stage]:
                stage += 1
            device[c] = perm[stage] if g.supported[c].all() else k
        return device

    deadline = time.perf_counter() + seconds
    best, best_obj = None, (math.inf, math.inf)
    first = True
    while time.perf_counter() < deadline:
        device = start.copy() if (first and start is not None) else random_split()
        first = False
        obj = objective(device)
        while time.perf_counter() < deadline:
            move, move_obj = None, obj
            for ci, c in enumerate(classes):
                old = device[c[0]]
                for d in allowed[ci]:
                    if d == old:
                        continue
                    device[c] = d
                    o = objective(device)
                    if o < move_obj:
                        move, move_obj = (ci, d), o
                device[c] = old
            if move is None:
                break
            device[classes[move[0]]] = move[1]
            obj = move_obj
        if obj < best_obj:
            best, best_obj = _with_floating(g, units, device.copy()), obj
    if best is None:
        return start
    return best


def one_accelerator(g: Graph, k: int, l: int, memory: float, dp=None) -> tuple:
    """(max load, node -> device) of the best split over one accelerator and the CPU cores, devices in
    the k+l layout; read from a DP result over (k, l) when given (the DP fills that state anyway)."""
    if dp is not None and dp.one_accelerator is not None:
        return dp.one_accelerator
    r = solve_dp(g, 1, l, memory)
    return r.max_load, np.where(r.device >= 1, r.device - 1 + k, r.device)
