"""Expert placements: MoETuner's two ILPs and the two baselines.

A placement is ``gpu_of[l, e]``: the GPU holding expert ``e`` of MoE layer ``l``; every placement here
puts exactly ``E / G`` experts of each layer on each GPU (the memory-balance constraint of the paper).

- ``contiguous``: expert e on GPU e // (E/G) (what expert-parallel frameworks do by default);
- ``greedy``: load-only longest-processing-time packing of the profiled token loads;
- ``moetuner``: ILP 1 per layer groups experts into G clusters of E/G minimizing the largest cluster
  load; ILP 2 maps each layer's clusters onto GPUs minimizing, summed over consecutive-layer
  transitions, the worst GPU-pair traffic weighted by the pair's inverse bandwidth.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
from scipy import sparse
from scipy.optimize import linear_sum_assignment

from mlsys_flows.systems.common.milp import solve_min
from .trace import Profile


class PlanError(AssertionError):
    """A plan broke one of its constraints."""


def check_placement(gpu_of: np.ndarray, num_gpus: int) -> None:
    """Every expert of every layer on exactly one GPU (shape), ids in range, equal experts per GPU."""
    gpu_of = np.asarray(gpu_of)
    layers, experts = gpu_of.shape
    if experts % num_gpus:
        raise PlanError(f"{experts} experts do not split evenly over {num_gpus} GPUs")
    if gpu_of.min() < 0 or gpu_of.max() >= num_gpus:
        raise PlanError("GPU id out of range")
    for l in range(layers):
        counts = np.bincount(gpu_of[l], minlength=num_gpus)
        if (counts != experts // num_gpus).any():
            raise PlanError(f"layer {l}: experts per GPU {counts.tolist()} are not all {experts // num_gpus}")


def contiguous(layers: int, experts: int, num_gpus: int) -> np.ndarray:
    return np.tile(np.arange(experts) // (experts // num_gpus), (layers, 1))


def greedy_layer(load: np.ndarray, num_gpus: int) -> np.ndarray:
    """Heaviest expert first onto the least-loaded GPU that still has a free slot."""
    per = len(load) // num_gpus
    placed, total, out = np.zeros(num_gpus, int), np.zeros(num_gpus), np.empty(len(load), int)
    for e in np.argsort(-load, kind="stable"):
        g = min((g for g in range(num_gpus) if placed[g] < per), key=lambda g: (total[g], g))
        out[e], placed[g], total[g] = g, placed[g] + 1, total[g] + load[e]
    return out


def greedy(prof: Profile, num_gpus: int) -> np.ndarray:
    return np.stack([greedy_layer(load, num_gpus) for load in prof.load])


def max_cluster_load(load: np.ndarray, cluster_of: np.ndarray, num_clusters: int) -> float:
    return float(np.bincount(cluster_of, weights=load, minlength=num_clusters).max())


# ----------------------------------------------------------------------------------------------- ILP 1
@dataclass(frozen=True)
class ClusterResult:
    cluster_of: np.ndarray  # (E,) cluster of each expert
    max_load: float
    bound: float
    gap: float
    status: str
    seconds: float
    affinity_gap: float = 0.0


def _clustering_rows(load: np.ndarray, g: int, cap_col: int | None, cap: float):
    """Rows shared by both phases: each expert in one cluster, E/G experts per cluster, cluster load
    <= z (column ``cap_col``) or <= ``cap``."""
    n = len(load)
    x = np.arange(n * g).reshape(n, g)
    r, c, v, lo, hi = [], [], [], [], []
    for cols, vals, rlo, rhi in ([(x[e], np.ones(g), 1, 1) for e in range(n)]
                                 + [(x[:, k], np.ones(n), n // g, n // g) for k in range(g)]):
        r.append(np.full(len(cols), len(lo))), c.append(cols), v.append(vals), lo.append(rlo), hi.append(rhi)
    for k in range(g):
        cols, vals = (x[:, k], load) if cap_col is None else (np.append(x[:, k], cap_col), np.append(load, -1.0))
        r.append(np.full(len(cols), len(lo))), c.append(cols), v.append(vals), lo.append(-np.inf)
        hi.append(cap if cap_col is None else 0.0)
    ncol = n * g + (cap_col is not None)
    a = sparse.coo_matrix((np.concatenate(v), (np.concatenate(r), np.concatenate(c))), shape=(len(lo), ncol))
    return x, a, np.array(lo, float), np.array(hi, float)


def _read_clusters(xs: np.ndarray, n: int, g: int) -> np.ndarray:
    assign = xs[:n * g].reshape(n, g).round().astype(int)
    if (assign.sum(1) != 1).any() or (assign.sum(0) != n // g).any():
        raise PlanError("ILP 1 returned clusters that break its constraints")
    return assign.argmax(1)


def ilp1_clusters(load: np.ndarray, num_clusters: int, *, time_limit_s: float, seed: int = 0,
                  start: np.ndarray | None = None, affinity: np.ndarray | None = None,
                  load_slack: float = 0.0) -> ClusterResult:
    """Phase 1: min z  s.t.  sum_c x[e,c] = 1,  sum_e x[e,c] = E/G,  sum_e load[e] x[e,c] <= z,  x binary.
    Clusters are interchangeable, so the k-th heaviest expert may only open clusters 0..k (symmetry
    breaking that keeps an optimum). ``start``: a balanced clustering to warm-start from.
    Phase 2 (with ``affinity[c, e]``, tokens that cluster c of the previous layer sends to expert e):
    among clusterings whose largest load stays within (1 + load_slack) of phase 1's, maximize the
    tokens that stay in step (cluster c -> cluster c), so that ILP 2 can keep them on one GPU."""
    load = np.asarray(load, float)
    n, g = len(load), num_clusters
    order = np.argsort(-load, kind="stable")
    rank = np.empty(n, int)
    rank[order] = np.arange(n)
    z = n * g
    x, a, lo, hi = _clustering_rows(load, g, z, 0.0)
    col_hi = np.ones(n * g + 1)
    col_hi[z] = np.inf
    col_hi[:n * g] = (np.arange(g)[None, :] <= rank[:, None]).ravel()
    integer = np.ones(n * g + 1, bool)
    integer[z] = False
    x0 = None
    if start is not None:
        canon = canonical_clusters(np.asarray(start), order)
        x0 = np.zeros(n * g + 1)
        x0[x[np.arange(n), canon]] = 1
        x0[z] = max_cluster_load(load, canon, g)
    obj = np.zeros(n * g + 1)
    obj[z] = 1.0
    res = solve_min(obj, a, lo, hi, np.zeros(n * g + 1), col_hi, integer, time_limit_s=time_limit_s, seed=seed, start=x0)
    cluster_of = _read_clusters(res.x, n, g)
    best = max_cluster_load(load, cluster_of, g)
    out = ClusterResult(cluster_of, best, res.bound, res.gap, res.status, res.seconds)
    if affinity is None:
        return out
    # phase 2; warm start: phase 1's clusters relabelled to follow the previous layer's best
    aff = np.asarray(affinity, float)
    per_cluster = np.stack([aff[:, cluster_of == k].sum(1) for k in range(g)], 1)  # [prev c, new k]
    rows, cols = linear_sum_assignment(-per_cluster)
    relabel = np.empty(g, int)
    relabel[cols] = rows
    start2 = relabel[cluster_of]
    x, a, lo, hi = _clustering_rows(load, g, None, best * (1 + load_slack) + 1e-9)
    x0 = np.zeros(n * g)
    x0[x[np.arange(n), start2]] = 1
    res2 = solve_min(-aff.T.ravel(), a, lo, hi, np.zeros(n * g), np.ones(n * g), np.ones(n * g, bool),
                     time_limit_s=time_limit_s, seed=seed, start=x0, floor=-float(aff.sum()))
    cluster_of = _read_clusters(res2.x, n, g)
    gap2 = (res2.objective - res2.bound) / max(abs(res2.objective), 1e-12)
    return ClusterResult(cluster_of, max_cluster_load(load, cluster_of, g), res.bound, res.gap, res.status,
                         res.seconds + res2.seconds, float(gap2))


def canonical_clusters(cluster_of: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Relabel clusters in the order the experts of ``order`` first open them."""
    relabel: dict[int, int] = {}
    for e in order:
        relabel.setdefault(int(cluster_of[e]), len(relabel))
    return np.array([relabel[int(c)] for c in cluster_of])


# ----------------------------------------------------------------------------------------------- ILP 2
def cluster_transitions(prof: Profile, cluster_of: np.ndarray, num_clusters: int) -> np.ndarray:
    """(layers-1, G, G) tokens moving from cluster c of layer l to cluster c' of layer l+1."""
    onehot = np.eye(num_clusters)[cluster_of]  # (L, E, G)
    return np.einsum("lec,lef,lfd->lcd", onehot[:-1], prof.transitions, onehot[1:])


def colocation_bound(cc_t: np.ndarray, weight: np.ndarray) -> float:
    """Lower bound on one transition's worst weighted pair traffic. Cluster c's flows to the next
    layer's clusters each ride a different pair out of c's GPU; the best case pairs the largest flow
    with the cheapest pair (its own GPU, free), the next with the next cheapest, and so on (e.g. in two
    nodes of 4 GPUs, at most 3 more flows stay inside the node). Same for flows into a cluster.
    Exact for uniform links, where the transitions decouple."""
    w_asc = np.sort(weight, axis=1).min(axis=0)  # cheapest k-th pair out of any GPU
    flows = lambda m: -np.sort(-m, axis=1)
    return float(max((flows(cc_t) * w_asc).max(), (flows(cc_t.T) * w_asc).max()))


def transition_cost(cc_t: np.ndarray, weight: np.ndarray, perm_a: np.ndarray, perm_b: np.ndarray) -> float:
    """Worst weighted GPU-pair traffic of one transition; perm[c] = GPU of cluster c."""
    return float((cc_t[np.argsort(perm_a)][:, np.argsort(perm_b)] * weight).max())  # argsort: GPU -> cluster


def mapping_cost(cc: np.ndarray, weight: np.ndarray, perms: np.ndarray) -> float:
    """Sum over transitions of the worst pair's weighted traffic; perms[l, c] = GPU of cluster c."""
    return sum(transition_cost(cc[t], weight, perms[t], perms[t + 1]) for t in range(len(cc)))


def sequential_mapping(cc: np.ndarray, weight: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Layer by layer, given layer l's mapping, place layer l+1's clusters by an exact bottleneck
    assignment (cost of cluster c' on GPU j = worst traffic into j), ties broken by the sum."""
    g = cc.shape[1]
    perms = [np.asarray(first)]
    for t in range(len(cc)):
        inflow = cc[t][np.argsort(perms[-1])]                           # [GPU i, cluster c']
        cost = (inflow[:, :, None] * weight[:, None, :]).max(axis=0)     # [c', j]
        levels = np.unique(cost)
        lo, hi = 0, len(levels) - 1
        while lo < hi:  # smallest threshold that still admits a perfect matching
            mid = (lo + hi) // 2
            r, c = linear_sum_assignment(cost > levels[mid])
            lo, hi = (lo, mid) if not (cost[r, c] > levels[mid]).any() else (mid + 1, hi)
        r, c = linear_sum_assignment(np.where(cost <= levels[lo], cost, cost.max() * g + 1))
        perm = np.empty(g, int)
        perm[r] = c
        perms.append(perm)
    return np.stack(perms)


@dataclass
class MappingResult:
    perms: np.ndarray  # (layers, G): GPU of each cluster
    cost: float
    bound: float
    gap: float
    seconds: float
    statuses: list[str] = field(default_factory=list)
    heuristic_cost: float = 0.0     # the better of identity / layer-by-layer mapping, before search and ILP
    local_search_cost: float = 0.0  # after local search, before the ILP windows


def ilp2_window(cc: np.ndarray, weight: np.ndarray, start: np.ndarray, *, fix_first: bool, fix_last: bool,
                time_limit_s: float, seed: int = 0):
    """Joint mapping of ``len(cc) + 1`` consecutive layers. The product y[l,c,i] * y[l+1,c',j] of the
    assignment variables is linearized exactly by w[t,c,i,c',j] >= 0 with the four RLT equalities
    (sum over j, over c', over i, over c); z_t >= weight[i,j] * sum_{c,c'} cc[t,c,c'] w[t,c,i,c',j].
    Minimizes sum_t z_t. ``fix_first``/``fix_last``: that layer keeps its mapping from ``start``.
    An unfixed first layer gets cluster 0 -> GPU 0 (valid for GPU-transitive topologies, e.g. one node
    or equal nodes). ``start`` (a full mapping) is the warm start."""
    nt, g = cc.shape[0], cc.shape[1]
    ny, nw = (nt + 1) * g * g, nt * g ** 4
    y = np.arange(ny).reshape(nt + 1, g, g)
    w = ny + np.arange(nw).reshape(nt, g, g, g, g)  # [t, c, i, c', j]
    z = ny + nw + np.arange(nt)
    ncol = ny + nw + nt
    blocks_r, blocks_c, blocks_v, lo, hi = [], [], [], [], []

    def rows(cols: np.ndarray, vals: np.ndarray, rlo: float, rhi: float):
        """One row per leading index of ``cols`` (R, m) with coefficients ``vals`` (R, m)."""
        r0 = len(lo)
        blocks_r.append(np.repeat(np.arange(r0, r0 + cols.shape[0]), cols.shape[1]))
        blocks_c.append(cols.ravel()), blocks_v.append(np.broadcast_to(vals, cols.shape).ravel())
        lo.extend([rlo] * cols.shape[0]), hi.extend([rhi] * cols.shape[0])

    for t in range(nt + 1):
        rows(y[t], np.ones(g), 1, 1)          # each cluster on one GPU
        rows(y[t].T, np.ones(g), 1, 1)        # each GPU holds one cluster
    ones_minus = np.append(np.ones(g), -1.0)
    for t in range(nt):
        wt = w[t]
        a = np.concatenate([wt.reshape(-1, g), y[t].reshape(-1, 1).repeat(g, 0)], 1)                      # (c,i,c')
        rows(a, ones_minus, 0, 0)
        b = np.concatenate([wt.transpose(0, 1, 3, 2).reshape(-1, g), y[t].reshape(-1, 1).repeat(g, 0)], 1)  # (c,i,j)
        rows(b, ones_minus, 0, 0)
        cc_ = np.concatenate([wt.transpose(0, 2, 3, 1).reshape(-1, g),
                              np.tile(y[t + 1].reshape(-1), g).reshape(-1, 1)], 1)                         # (c,c',j)
        rows(cc_, ones_minus, 0, 0)
        d = np.concatenate([wt.transpose(1, 2, 3, 0).reshape(-1, g),
                            np.tile(y[t + 1].reshape(-1), g).reshape(-1, 1)], 1)                           # (i,c',j)
        rows(d, ones_minus, 0, 0)
        for i, j in zip(*np.nonzero(weight)):
            cols = np.append(wt[:, i, :, j].ravel(), z[t])
            rows(cols[None], np.append(weight[i, j] * cc[t].ravel(), -1.0)[None], -np.inf, 0)
    a = sparse.coo_matrix((np.concatenate(blocks_v), (np.concatenate(blocks_r), np.concatenate(blocks_c))),
                          shape=(len(lo), ncol))
    col_lo, col_hi = np.zeros(ncol), np.ones(ncol)
    col_hi[z] = np.inf
    col_lo[z] = [colocation_bound(cc[t], weight) for t in range(nt)]
    for layer, fixed in ((0, fix_first), (nt, fix_last)):
        if fixed:
            col_hi[y[layer].ravel()] = 0
            col_lo[y[layer][np.arange(g), start[layer]]] = col_hi[y[layer][np.arange(g), start[layer]]] = 1
    if not fix_first:
        if start[0, 0] != 0:
            raise ValueError("an unfixed first layer must start with cluster 0 on GPU 0")
        col_lo[y[0, 0, 0]] = 1
    integer = np.zeros(ncol, bool)
    integer[:ny] = True
    x0 = np.zeros(ncol)
    onehot = np.eye(g)[start]  # (L, c, i)
    x0[:ny] = onehot.ravel()
    prod = onehot[:-1, :, :, None, None] * onehot[1:, None, None, :, :]
    x0[ny:ny + nw] = prod.ravel()
    x0[z] = [transition_cost(cc[t], weight, start[t], start[t + 1]) for t in range(nt)]
    obj = np.zeros(ncol)
    obj[z] = 1.0
    res = solve_min(obj, a, np.array(lo), np.array(hi), col_lo, col_hi, integer,
                    time_limit_s=time_limit_s, seed=seed, start=x0)
    assign = res.x[:ny].reshape(nt + 1, g, g).round().astype(int)
    if (assign.sum(2) != 1).any() or (assign.sum(1) != 1).any():
        raise PlanError("ILP 2 returned a cluster->GPU mapping that is not a bijection")
    return assign.argmax(2), res


def local_search(cc: np.ndarray, weight: np.ndarray, perms: np.ndarray, first_free: int = 1,
                 max_passes: int = 10) -> np.ndarray:
    """Improve a mapping by swapping the GPUs of two clusters in one layer while that lowers the two
    adjacent transitions' cost (layers before ``first_free`` stay as they are)."""
    perms = perms.copy()
    layers, g = perms.shape

    def cost(t: int) -> float:
        return transition_cost(cc[t], weight, perms[t], perms[t + 1]) if 0 <= t < len(cc) else 0.0

    for _ in range(max_passes):
        improved = False
        for l in range(first_free, layers):
            cur = cost(l - 1) + cost(l)
            for a, b in itertools.combinations(range(g), 2):
                perms[l, [a, b]] = perms[l, [b, a]]
                new = cost(l - 1) + cost(l)
                if new < cur - 1e-9:
                    cur, improved = new, True
                else:
                    perms[l, [a, b]] = perms[l, [b, a]]
        if not improved:
            break
    return perms


def ilp2_mapping(cc: np.ndarray, weight: np.ndarray, *, window: int, time_limit_s: float, seed: int = 0,
                 symmetric: bool) -> MappingResult:
    """Map every layer's clusters to GPUs. Incumbent: the better of identity and ``sequential_mapping``,
    polished by ``local_search``. Then block-coordinate ILP: windows of ``window`` free layers, each
    solved jointly with its neighbouring layers fixed, so every window sees all the transitions it
    changes and the total never gets worse. In one node (``symmetric``) layer 0 is fixed to the
    identity; with several nodes only its cluster 0 -> GPU 0. The gap is against the best proven bound:
    HiGHS's when one window spans every layer, else the sum of per-transition co-location bounds."""
    g, layers = cc.shape[1], cc.shape[0] + 1
    candidates = [sequential_mapping(cc, weight, np.arange(g)), np.tile(np.arange(g), (layers, 1))]
    perms = min(candidates, key=lambda p: mapping_cost(cc, weight, p))
    warm_cost = mapping_cost(cc, weight, perms)
    perms = local_search(cc, weight, perms)
    searched_cost = mapping_cost(cc, weight, perms)
    first_free = 1 if symmetric else 0
    bound = float(sum(colocation_bound(c, weight) for c in cc))
    seconds, statuses = 0.0, []
    blocks = [(s, min(s + window, layers)) for s in range(first_free, layers, window)]
    for s, e in blocks:  # free layers s..e-1
        lo, hi = max(s - 1, 0), min(e, layers - 1)
        got, res = ilp2_window(cc[lo:hi], weight, perms[lo:hi + 1], fix_first=s > 0, fix_last=e < layers,
                               time_limit_s=time_limit_s / len(blocks), seed=seed)
        perms[lo:hi + 1] = got
        seconds += res.seconds
        statuses.append(res.status)
        if len(blocks) == 1 and s == 0 and e == layers:
            bound = max(bound, res.bound)
    cost = mapping_cost(cc, weight, perms)
    gap = 0.0 if cost - bound <= 1e-9 * max(cost, 1.0) else (cost - bound) / cost
    return MappingResult(perms, cost, bound, gap, seconds, statuses, warm_cost, searched_cost)


def brute_force_mapping(cc: np.ndarray, weight: np.ndarray) -> float:
    """Exhaustive minimum of ``mapping_cost`` (tiny instances only; tests)."""
    g = cc.shape[1]
    all_perms = [np.array(p) for p in itertools.permutations(range(g))]
    return min(mapping_cost(cc, weight, np.stack(ps)) for ps in itertools.product(all_perms, repeat=len(cc) + 1))


def brute_force_clusters(load: np.ndarray, num_clusters: int) -> float:
    """Exhaustive minimum of the largest cluster load over balanced clusterings (tests)."""
    n = len(load)
    best = np.inf
    for labels in itertools.product(range(num_clusters), repeat=n):
        lab = np.array(labels)
        if (np.bincount(lab, minlength=num_clusters) == n // num_clusters).all():
            best = min(best, max_cluster_load(load, lab, num_clusters))
    return float(best)


# --------------------------------------------------------------------------------------------- MoETuner
@dataclass
class TunerPlan:
    gpu_of: np.ndarray
    stats: dict[str, float]


def moetuner(prof: Profile, weight: np.ndarray, *, ilp1_time_limit_s: float, ilp2_time_limit_s: float,
             ilp2_window: int, symmetric: bool, seed: int = 0, follow_routing: bool = False,
             load_slack: float = 0.0) -> TunerPlan:
    """ILP 1 on every layer (warm-started from the better baseline; with ``follow_routing`` its second
    phase aligns each layer's clusters with the previous layer's), then ILP 2 over the layers."""
    layers, experts = prof.load.shape
    g = weight.shape[0]
    cont = contiguous(1, experts, g)[0]
    clusters, gaps, aff_gaps, secs = [], [], [], 0.0
    for l in range(layers):
        greedy_l = greedy_layer(prof.load[l], g)
        warm = min((cont, greedy_l), key=lambda c: max_cluster_load(prof.load[l], c, g))
        affinity = None
        if follow_routing and l > 0:  # tokens from each cluster of layer l-1 to each expert of layer l
            affinity = np.eye(g)[clusters[-1]].T @ prof.transitions[l - 1]
        r = ilp1_clusters(prof.load[l], g, time_limit_s=ilp1_time_limit_s, seed=seed, start=warm,
                          affinity=affinity, load_slack=load_slack)
        clusters.append(r.cluster_of)
        gaps.append(r.gap)
        aff_gaps.append(r.affinity_gap)
        secs += r.seconds
    cluster_of = np.stack(clusters)
    cc = cluster_transitions(prof, cluster_of, g)
    m = ilp2_mapping(cc, weight, window=ilp2_window, time_limit_s=ilp2_time_limit_s, seed=seed, symmetric=symmetric)
    gpu_of = np.take_along_axis(m.perms, cluster_of, axis=1)
    check_placement(gpu_of, g)
    stats = {"ilp1_max_gap": float(max(gaps)), "ilp1_affinity_max_gap": float(max(aff_gaps)), "ilp1_solve_s": secs, "ilp2_gap": m.gap, "ilp2_solve_s": m.seconds,
             "ilp2_objective": m.cost, "ilp2_bound": m.bound, "ilp2_heuristic_objective": m.heuristic_cost,
             "ilp2_local_search_objective": m.local_search_cost,
             "ilp2_time_limited_windows": float(sum(s != "Optimal" for s in m.statuses))}
    return TunerPlan(gpu_of, stats)
