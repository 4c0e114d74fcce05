"""The paper's exact dynamic program for contiguous splits (Tarnawski et al., NeurIPS 2020).

A contiguous split orders the used devices and gives device j the difference I_j \\ I_{j-1} of two nested
downsets (ideals) of the forward graph; in training graphs every backward node goes with the forward
node of its colocation class. ``dp[c][a][I]`` is the least max-load of placing the ideal I on ``a``
accelerators and ``c`` CPU cores:
``dp[c][a][I] = min over ideals J <= I of min(max(dp[c][a-1][J], acc(I \\ J)), max(dp[c-1][a][J], cpu(I \\ J)))``
with acc = compute + communication (infinite over memory or with an unsupported node) and cpu = compute.

Colocation classes are contracted first (and strongly connected groups of classes, which a contiguous
split cannot separate); ideals are then enumerated over the contracted DAG. A zero-latency forward unit
with a single neighbour is merged into it (the authors' "trivial node optimisation"): moving it there
never raises a load, only the memory of that device, so the merged DP is exact whenever the same DP with
the memory limit raised by the merged bytes gives the same value; that certificate is checked, and the
DP reruns without merging when it fails.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from mlsys_flows.errors import MlsysError

from .graph import Graph

DEFAULT_MAX_IDEALS = 60_000
DEFAULT_MAX_PAIRS = 40_000_000


class TooManyIdeals(MlsysError, ValueError):
    """The graph has more downsets (or downset pairs) than the cap: the exact DP would not finish."""


@dataclass
class Units:
    unit_of: np.ndarray      # original node -> unit
    count: int
    preds: list              # unit -> bitmask of predecessor units (forward edges, plus chain edges)
    merged_bytes: float      # bytes of trivially merged units (0 when none)
    merged: int


class _UF:
    def __init__(self, n):
        self.p = list(range(n))

    def find(self, a):
        while self.p[a] != a:
            self.p[a] = self.p[self.p[a]]
            a = self.p[a]
        return a

    def union(self, a, b):
        a, b = self.find(a), self.find(b)
        if a != b:
            self.p[a] = b


def _fw_edges(g: Graph):
    return [(s, d) for s, d in g.edges if not g.backward[s] and not g.backward[d]]


def free_sources(g: Graph) -> set:
    """Forward source nodes that cost nothing anywhere (no latency, no bytes, no output cost, supported,
    alone in their class). They constrain no split: each goes to the earliest stage of its successors."""
    members = np.bincount(g.color)
    return {v for v in range(g.n) if not g.pred[v] and not g.backward[v] and g.fpga[v] == 0 and g.cpu[v] == 0
            and g.size[v] == 0 and g.out_cost[v] == 0 and g.supported[v] and members[g.color[v]] == 1}


def build_units(g: Graph, groups=(), merge_trivial: bool = True, chain: bool = False) -> Units:
    """Contract colocation classes, the node groups in ``groups`` and strongly connected unit groups;
    optionally merge trivial units and add a chain through a topological order (linearisation)."""
    import networkx as nx

    uf = _UF(g.n)
    floating = free_sources(g)
    first = {}
    for v in range(g.n):
        c = int(g.color[v])
        if c in first:
            uf.union(v, first[c])
        else:
            first[c] = v
    for grp in groups:
        grp = list(grp)
        for v in grp[1:]:
            uf.union(grp[0], v)
    fw = [(s, d) for s, d in _fw_edges(g) if s not in floating]
    while True:  # contract strongly connected groups of units (cycles made by the contraction)
        dg = nx.DiGraph()
        dg.add_nodes_from({uf.find(v) for v in range(g.n) if not g.backward[v] and v not in floating})
        dg.add_edges_from((uf.find(s), uf.find(d)) for s, d in fw if uf.find(s) != uf.find(d))
        sccs = [c for c in nx.strongly_connected_components(dg) if len(c) > 1]
        if not sccs:
            break
        for c in sccs:
            c = list(c)
            for v in c[1:]:
                uf.union(c[0], v)
    merged_bytes, merged = 0.0, 0
    if merge_trivial:
        bw_touch = set()
        for s, d in g.edges:
            if g.backward[s] != g.backward[d]:
                bw_touch.update((uf.find(s), uf.find(d)))
        changed = True
        while changed:
            changed = False
            members = {}
            for v in range(g.n):
                if v in floating:
                    continue
                members.setdefault(uf.find(v), []).append(v)
            nbrs = {r: set() for r in members}
            for s, d in fw:
                a, b = uf.find(s), uf.find(d)
                if a != b:
                    nbrs[a].add(b)
                    nbrs[b].add(a)
            for r, vs in members.items():
                if (len(nbrs[r]) == 1 and r not in bw_touch and not g.backward[vs].any()
                        and g.fpga[vs].sum() <= 0 and g.cpu[vs].sum() <= 0 and g.supported[vs].all()):
                    (m,) = nbrs[r]
                    merged_bytes += float(g.size[vs].sum())
                    merged += 1
                    uf.union(r, m)
                    bw_touch = {uf.find(x) for x in bw_touch}
                    changed = True
                    break
    roots = sorted({uf.find(v) for v in range(g.n) if v not in floating})
    dg = nx.DiGraph()
    dg.add_nodes_from(roots)
    dg.add_edges_from((uf.find(s), uf.find(d)) for s, d in fw if uf.find(s) != uf.find(d))
    order = list(nx.lexicographical_topological_sort(dg))
    index = {r: i for i, r in enumerate(order)}
    unit_of = np.array([-1 if v in floating else index[uf.find(v)] for v in range(g.n)], dtype=np.int64)
    preds = [0] * len(order)
    for a, b in dg.edges:
        preds[index[b]] |= 1 << index[a]
    if chain:
        for i in range(1, len(order)):
            preds[i] |= 1 << (i - 1)
    return Units(unit_of, len(order), preds, merged_bytes, merged)


def enumerate_ideals(units: Units, max_ideals: int = DEFAULT_MAX_IDEALS) -> np.ndarray:
    """All downsets of the unit DAG as a bool matrix (ideals x units), ordered by size (the empty one
    first, the full one last). Raises TooManyIdeals above ``max_ideals``."""
    u = units.count
    level, out = [0], [0]
    seen = {0}
    while level:
        nxt = []
        for ideal in level:
            for v in range(u):
                if not (ideal >> v) & 1 and units.preds[v] & ~ideal == 0:
                    j = ideal | (1 << v)
                    if j not in seen:
                        seen.add(j)
                        nxt.append(j)
                        if len(seen) > max_ideals:
                            raise TooManyIdeals(
                                f"more than {max_ideals} downsets over {u} contracted nodes: the exact DP would not "
                                "finish; raise max_ideals, add colocation classes, or use the ip variant")
        out.extend(nxt)
        level = nxt
    nbytes = (u + 7) // 8
    raw = np.frombuffer(b"".join(i.to_bytes(nbytes, "little") for i in out), dtype=np.uint8).reshape(len(out), nbytes)
    return np.unpackbits(raw, axis=1, bitorder="little")[:, :u].astype(bool)


@dataclass
class DPResult:
    max_load: float
    device: np.ndarray       # original node -> device (0..k-1 accelerators, k.. CPUs)
    ideals: int
    pairs: int
    seconds: float
    exact: bool              # optimal over contiguous splits (merging certificate held)
    merged: int
    one_accelerator: tuple | None = None   # (value, device) of the best split on 1 accelerator + the CPUs


def _pair_tables(g: Graph, units: Units, ideals: np.ndarray, memory: float, max_pairs: int):
    """For every ideal I: the ideals J <= I and the accelerator / CPU cost of I \\ J."""
    u = units.count
    uo = units.unit_of
    m = ideals.astype(np.float64)
    on = uo >= 0
    ufpga = np.bincount(uo[on], g.fpga[on], u)
    ucpu = np.bincount(uo[on], g.cpu[on], u)
    usize = np.bincount(uo[on], g.size[on], u)
    uuns = np.bincount(uo[on], (~g.supported[on]).astype(float), u)
    f_i, c_i, s_i, x_i = m @ ufpga, m @ ucpu, m @ usize, m @ uuns
    senders = [v for v in range(g.n) if g.out_cost[v] > 0 and g.succ[v] and uo[v] >= 0]
    su = np.zeros((u, len(senders)), dtype=np.float64)
    for j, v in enumerate(senders):
        for w in g.succ[v]:
            if uo[w] != uo[v]:
                su[uo[w], j] = 1.0
    tot = su.sum(axis=0)
    own = uo[senders] if senders else np.zeros(0, dtype=np.int64)
    cost = g.out_cost[senders].astype(np.float64)
    # for nested ideals J <= I the difference is linear: |succ units of v in I \\ J| = h[I] - h[J]
    h_all = m @ su
    in_all = ideals[:, own]
    tables, pairs = [], 0
    packed = np.packbits(ideals, axis=1, bitorder="little")
    pad = (-packed.shape[1]) % 8
    packed = np.ascontiguousarray(np.pad(packed, ((0, 0), (0, pad)))).view(np.uint64)
    for i in range(len(ideals)):
        js = np.flatnonzero(~((packed & ~packed[i]) != 0).any(axis=1))
        pairs += len(js)
        if pairs > max_pairs:
            raise TooManyIdeals(f"more than {max_pairs} pairs of nested downsets: the exact DP would not finish")
        cols = np.flatnonzero(in_all[i] | (h_all[i] > 0.5)) if senders else []
        if len(cols):
            h = h_all[i, cols] - h_all[np.ix_(js, cols)]
            ins = in_all[i, cols] & ~in_all[np.ix_(js, cols)]
            pay = np.where(ins, h < tot[cols] - 0.5, h > 0.5)
            comm = pay @ cost[cols]
        else:
            comm = np.zeros(len(js))
        acc = f_i[i] - f_i[js] + comm
        bad = (x_i[i] - x_i[js] > 0.5) | (s_i[i] - s_i[js] > memory * (1 + 1e-12))
        acc[bad] = math.inf
        tables.append((js, acc, c_i[i] - c_i[js]))
    return tables, pairs


def _run(g: Graph, units: Units, ideals: np.ndarray, k: int, l: int, memory: float, max_pairs: int,
         targets=None):
    """The DP; for each (cpus, accelerators) in ``targets`` (default: all of them) the optimal value and split."""
    tables, pairs = _pair_tables(g, units, ideals, memory, max_pairs)
    n_id = len(ideals)
    dp = np.full((l + 1, k + 1, n_id), math.inf)
    dp[:, :, 0] = 0.0
    bt_kind = np.zeros((l + 1, k + 1, n_id), dtype=np.int8)
    bt_j = np.zeros((l + 1, k + 1, n_id), dtype=np.int64)
    for i in range(1, n_id):
        js, acc, cpu = tables[i]
        for c in range(l + 1):
            for a in range(k + 1):
                best, kind, arg = math.inf, 0, 0
                if a > 0:
                    vals = np.maximum(dp[c, a - 1, js], acc)
                    t = int(np.argmin(vals))
                    if vals[t] < best:
                        best, kind, arg = vals[t], 1, js[t]
                if c > 0:
                    vals = np.maximum(dp[c - 1, a, js], cpu)
                    t = int(np.argmin(vals))
                    if vals[t] < best:
                        best, kind, arg = vals[t], 2, js[t]
                dp[c, a, i], bt_kind[c, a, i], bt_j[c, a, i] = best, kind, arg
    full = n_id - 1
    out = []
    for tc, ta in targets or [(l, k)]:
        value = float(dp[tc, ta, full])
        device_of_unit = np.full(units.count, -1, dtype=np.int64)
        stage_of_unit = np.full(units.count, -1, dtype=np.int64)
        if math.isfinite(value):
            i, c, a = full, tc, ta
            nacc, ncpu, nstage = 0, 0, 0
            while i != 0:
                kind, j = int(bt_kind[c, a, i]), int(bt_j[c, a, i])
                stage = ideals[i] & ~ideals[j]
                if stage.any():
                    stage_of_unit[stage] = -nstage  # stages are found last to first
                    nstage += 1
                    if kind == 1:
                        device_of_unit[stage] = nacc
                        nacc += 1
                    else:
                        device_of_unit[stage] = k + ncpu
                        ncpu += 1
                if kind == 1:
                    a -= 1
                else:
                    c -= 1
                i = j
        out.append((value, place_floating(g, units, device_of_unit, stage_of_unit)))
    return out, pairs


def place_floating(g: Graph, units: Units, device_of_unit: np.ndarray, stage_of_unit: np.ndarray) -> np.ndarray:
    """Node -> device; a free source goes to the earliest stage among its successors' stages."""
    uo = units.unit_of
    device = np.where(uo >= 0, device_of_unit[np.maximum(uo, 0)], -1)
    for v in np.flatnonzero(uo < 0):
        succ_units = [uo[w] for w in g.succ[v] if uo[w] >= 0]
        if succ_units:
            device[v] = device_of_unit[min(succ_units, key=lambda x: stage_of_unit[x])]
        else:
            device[v] = device[np.flatnonzero(uo >= 0)[0]] if (uo >= 0).any() else 0
    return device


def solve_dp(g: Graph, k: int | None = None, l: int | None = None, memory: float | None = None, *,
             max_ideals: int = DEFAULT_MAX_IDEALS, max_pairs: int = DEFAULT_MAX_PAIRS,
             units: Units | None = None, merge_trivial: bool = True) -> DPResult:
    """Optimal contiguous split of ``g`` over ``k`` accelerators and ``l`` CPU cores (exact; see module doc).
    ``units`` replaces the contraction (the PipeDream baseline passes its own coarser, linearised one)."""
    k = g.accelerators if k is None else k
    l = g.cpus if l is None else l
    memory = g.memory if memory is None else memory
    t0 = time.perf_counter()
    own_units = units is None
    if own_units:
        units = build_units(g, merge_trivial=merge_trivial)
    ideals = enumerate_ideals(units, max_ideals)
    targets = [(l, k), (l, 1)] if k > 1 else [(l, k), (l, k)]
    sols, pairs = _run(g, units, ideals, k, l, memory, max_pairs, targets)
    exact = True
    if own_units and units.merged and math.isfinite(memory):
        relaxed, _ = _run(g, units, ideals, k, l, memory + units.merged_bytes, max_pairs, targets)
        if any(r[0] < s_[0] - 1e-12 * max(1.0, s_[0]) for r, s_ in zip(relaxed, sols)):
            plain = build_units(g, merge_trivial=False)
            try:
                ideals = enumerate_ideals(plain, max_ideals)
                sols, pairs = _run(g, plain, ideals, k, l, memory, max_pairs, targets)
                units = plain
            except TooManyIdeals:
                exact = False
    (value, device), one = sols
    return DPResult(value, device, len(ideals), pairs, time.perf_counter() - t0, exact, units.merged, one)
