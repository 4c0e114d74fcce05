"""Expert placements: MoETuner's two ILPs and the two baselines.

A placement is ``gpu_of[l, e]``: the GPU holding expert ``e`` of MoE layer ``l``; every placement here
puts exactly ``E / G`` experts of each layer on each GPU (the memory-balance constraint of the paper).

- ``contiguous``: expert e on GPU e // (E/G) (what expert-parallel frameworks do by default);
- ``greedy``: load-only longest-processing-time packing of the profiled token loads;
- ``moetuner``: ILP 1 per layer groups experts into G clusters of E/G minimizing the largest cluster
  load; ILP 2 maps each layer's clusters onto GPUs minimizing, summed over consecutive-layer
  transitions, the worst GPU-pair traffic weighted by the pair's inverse bandwidth (start: the best
  simple mapping; then exact one-layer sweeps; then HiGHS windows, in the co-location formulation for
  node-uniform links, else the RLT one). The ``moetuner_ilp1`` ablation keeps ILP 1's clusters and
  labels each layer's clusters by their smallest expert id (cluster with the lowest id on GPU 0, ...), a
  labelling that reads neither the loads nor the routing: no routing-aware cluster -> GPU step at all.
  ``moetuner_rank_aligned`` keeps ILP 1's own labels (the k-th heaviest expert opens a cluster <= k, so
  cluster k tends to hold the k-th heaviest expert in every layer): a load-rank heuristic mapping, which
  on a trace whose successors follow popularity already reads the routing by proxy.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
from scipy import sparse
from scipy.optimize import linear_sum_assignment

from mlsys_flows.errors import MlsysError
from mlsys_flows.systems.common.milp import solve_min
from .trace import Profile


class PlanError(MlsysError, AssertionError):
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


def bottleneck_assignment(cost: np.ndarray, allowed: np.ndarray | None = None) -> np.ndarray | None:
    """A permutation ``perm`` (row r -> column perm[r]) minimizing ``max_r cost[r, perm[r]]`` over the
    ``allowed`` entries (exact: the smallest threshold that still admits a perfect matching), ties
    broken by the sum; None when the allowed entries admit no perfect matching."""
    g = cost.shape[0]
    ok = np.ones(cost.shape, bool) if allowed is None else allowed
    big = 1 + g * (abs(cost).max() + 1)

    def matches(mask: np.ndarray):
        r, c = linear_sum_assignment(~mask)  # 0 on usable entries
        return (r, c) if mask[r, c].all() else None

    if matches(ok) is None:
        return None
    levels = np.unique(cost[ok])
    lo, hi = 0, len(levels) - 1
    while lo < hi:  # smallest threshold that still admits a perfect matching
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if matches(ok & (cost <= levels[mid])) is not None else (mid + 1, hi)
    r, c = linear_sum_assignment(np.where(ok & (cost <= levels[lo]), cost, big))
    perm = np.empty(g, int)
    perm[r] = c
    return perm


def inflow_cost(cc_t: np.ndarray, weight: np.ndarray, perm_prev: np.ndarray) -> np.ndarray:
    """[c', j]: the worst weighted pair into GPU j if cluster c' of the next layer sits there (the
    previous layer mapped by ``perm_prev``)."""
    inflow = cc_t[np.argsort(perm_prev)]                                  # [GPU i, cluster c']
    return (inflow[:, :, None] * weight[:, None, :]).max(axis=0)


def outflow_cost(cc_t: np.ndarray, weight: np.ndarray, perm_next: np.ndarray) -> np.ndarray:
    """[c, i]: the worst weighted pair out of GPU i if cluster c sits there (next layer fixed)."""
    return inflow_cost(cc_t.T, weight.T, perm_next)


def sequential_mapping(cc: np.ndarray, weight: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Layer by layer, given layer l's mapping, place layer l+1's clusters by an exact bottleneck
    assignment (cost of cluster c' on GPU j = worst traffic into j), ties broken by the sum."""
    perms = [np.asarray(first)]
    for t in range(len(cc)):
        perms.append(bottleneck_assignment(inflow_cost(cc[t], weight, perms[-1])))
    return np.stack(perms)


def best_simple_mapping(cc: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """The better of the identity mapping (cluster k on GPU k in every layer) and ``sequential_mapping``
    (which already reads the routing transitions): ILP 2's incumbent before the sweeps and windows."""
    g, layers = cc.shape[1], cc.shape[0] + 1
    candidates = [sequential_mapping(cc, weight, np.arange(g)), np.tile(np.arange(g), (layers, 1))]
    return min(candidates, key=lambda p: mapping_cost(cc, weight, p))


def best_layer_mapping(cin: np.ndarray | None, cout: np.ndarray | None,
                       allowed: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """Exact best mapping of one layer with both neighbours fixed: minimize
    ``max_c cin[c, perm c] + max_c cout[c, perm c]`` (the two transitions the layer touches;
    ``inflow_cost``/``outflow_cost``, None at the first/last layer). Enumerates the threshold of the
    incoming term (at most G^2 values) and solves the outgoing term by bottleneck assignment.
    ``allowed[c, j]``: cluster c may go on GPU j (default: anywhere)."""
    if cin is None or cout is None:
        one = cout if cin is None else cin
        perm = bottleneck_assignment(one, allowed)
        return perm, float(one[np.arange(len(perm)), perm].max())
    best, best_val = None, np.inf
    floor_out = float(cout.min(axis=1).max())  # no mapping does better on the outgoing term
    for theta in np.unique(cin):
        if theta + floor_out >= best_val - 1e-12:
            break
        perm = bottleneck_assignment(cout, (cin <= theta) if allowed is None else (cin <= theta) & allowed)
        if perm is None:
            continue
        idx = np.arange(len(perm))
        val = float(cin[idx, perm].max() + cout[idx, perm].max())
        if val < best_val - 1e-12:
            best, best_val = perm, val
    return best, best_val


def layer_sweeps(cc: np.ndarray, weight: np.ndarray, perms: np.ndarray, first_free: int = 1,
                 max_passes: int = 20) -> tuple[np.ndarray, int]:
    """Block-coordinate descent with one-layer blocks solved exactly (``best_layer_mapping``): re-map
    each layer given its neighbours while that lowers the total; a superset of every pairwise swap.
    A free layer 0 keeps cluster 0 on GPU 0 (as ILP 2 does; no loss on GPU-transitive topologies).
    Returns the mapping and the passes run."""
    perms = perms.copy()
    layers, g = perms.shape
    pin = np.ones((g, g), bool)
    pin[0, :], pin[:, 0], pin[0, 0] = False, False, True

    def cost(t: int) -> float:
        return transition_cost(cc[t], weight, perms[t], perms[t + 1]) if 0 <= t < len(cc) else 0.0

    passes = 0
    for passes in range(1, max_passes + 1):
        improved = False
        for l in range(first_free, layers):
            cin = inflow_cost(cc[l - 1], weight, perms[l - 1]) if l > 0 else None
            cout = outflow_cost(cc[l], weight, perms[l + 1]) if l + 1 < layers else None
            perm, val = best_layer_mapping(cin, cout, pin if l == 0 else None)
            if val < cost(l - 1) + cost(l) - 1e-9 * max(1.0, val):
                perms[l], improved = perm, True
        if not improved:
            break
    return perms, passes


@dataclass
class WindowSolve:
    """One ILP 2 window: free layers [first, last), the objective of its transitions at the warm
    start, HiGHS's incumbent and proven bound (profiled, counted), status and solve time."""
    first: int
    last: int
    warm: float
    incumbent: float
    bound: float
    status: str
    seconds: float


@dataclass
class MappingResult:
    perms: np.ndarray  # (layers, G): GPU of each cluster
    cost: float
    bound: float
    gap: float
    seconds: float
    statuses: list[str] = field(default_factory=list)
    heuristic_cost: float = 0.0     # the better of identity / layer-by-layer mapping, before search and ILP
    sweep_cost: float = 0.0         # after the exact one-layer sweeps, before the ILP windows
    windows: list[WindowSolve] = field(default_factory=list)
    sweep_passes: int = 0


def _window_columns(ncol: int, ny: int, y: np.ndarray, z: np.ndarray, cc: np.ndarray, weight: np.ndarray,
                    start: np.ndarray | None, fix_first: bool, fix_last: bool):
    """Column bounds and integrality shared by both ILP-2 window formulations: assignment columns
    ``y[layer, cluster, gpu]`` are binary (fixed end layers pinned to ``start``), each transition
    cost ``z[t]`` is at least its co-location bound; an unfixed first layer breaks the GPU symmetry
    with cluster 0 on GPU 0."""
    nt, g = len(z), y.shape[1]
    col_lo, col_hi = np.zeros(ncol), np.ones(ncol)
    col_hi[z] = np.inf
    col_lo[z] = [colocation_bound(cc[t], weight) for t in range(nt)]
    for layer, fixed in ((0, fix_first), (nt, fix_last)):
        if fixed:
            col_hi[y[layer].ravel()] = 0
            col_lo[y[layer][np.arange(g), start[layer]]] = col_hi[y[layer][np.arange(g), start[layer]]] = 1
    if not fix_first:
        if start is not None and start[0, 0] != 0:
            raise ValueError("an unfixed first layer must start with cluster 0 on GPU 0")
        col_lo[y[0, 0, 0]] = 1
    integer = np.zeros(ncol, bool)
    integer[:ny] = True
    return col_lo, col_hi, integer


def ilp2_window(cc: np.ndarray, weight: np.ndarray, start: np.ndarray | None, *, fix_first: bool,
                fix_last: bool, time_limit_s: float, seed: int = 0):
    """Joint mapping of ``len(cc) + 1`` consecutive layers. The product y[l,c,i] * y[l+1,c',j] of the
    assignment variables is linearized exactly by w[t,c,i,c',j] >= 0 with the four RLT equalities
    (sum over j, over c', over i, over c); z_t >= weight[i,j] * sum_{c,c'} cc[t,c,c'] w[t,c,i,c',j].
    Minimizes sum_t z_t. ``fix_first``/``fix_last``: that layer keeps its mapping from ``start``.
    An unfixed first layer gets cluster 0 -> GPU 0 (valid for GPU-transitive topologies, e.g. one node
    or equal nodes). ``start`` (a full mapping) is the warm start; None solves from a cold start (no
    layer may then be fixed)."""
    nt, g = cc.shape[0], cc.shape[1]
    if start is None and (fix_first or fix_last):
        raise ValueError("a fixed layer needs its mapping in start")
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
    col_lo, col_hi, integer = _window_columns(ncol, ny, y, z, cc, weight, start, fix_first, fix_last)
    x0 = None
    if start is not None:
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


def two_level_links(weight: np.ndarray) -> tuple[np.ndarray, float, float] | None:
    """(node of each GPU, intra-node pair weight, inter-node pair weight) when ``weight`` is a
    node-uniform topology (0 on the diagonal, one value inside a node, a larger one across nodes);
    None otherwise."""
    g = weight.shape[0]
    off = ~np.eye(g, dtype=bool)
    if (np.diag(weight) != 0).any() or (weight[off] <= 0).any():
        return None
    intra = float(weight[off].min())
    same = (weight <= intra * (1 + 1e-9)) | ~off
    node = np.unique(np.argmax(same, axis=1), return_inverse=True)[1].ravel()  # numbered by first GPU
    if not (same == (node[:, None] == node[None, :])).all():
        return None
    inter = weight[node[:, None] != node[None, :]]
    if inter.size and not np.allclose(inter, inter.max(), rtol=1e-9, atol=0.0):
        return None
    return node, intra, float(inter.max()) if inter.size else intra


def ilp2_window_colocation(cc: np.ndarray, weight: np.ndarray, start: np.ndarray | None, *, fix_first: bool,
                           fix_last: bool, time_limit_s: float, seed: int = 0):
    """``ilp2_window`` for node-uniform links (``two_level_links``), without products of assignment
    variables. In a node-uniform topology GPU pair (i, j) costs 0, ``intra`` or ``inter`` by whether i
    and j are one GPU, one node or neither, so per transition only two facts about a cluster pair
    (c, c') matter: s[t,c,c'] (same GPU) and m[t,c,c'] (same node), continuous in [0, 1] and bounded
    from above by the assignments: s <= 1 - y[l,c,i] + y[l+1,c',i] for every GPU i,
    m <= 1 - n[l,c,k] + n[l+1,c',k] for every node k (n: the node's sum of y), s <= m, and at most
    one (resp. gpus_per_node) partners per cluster. Then z_t >= intra * cc[c,c'] (1 - s) and
    z_t >= inter * cc[c,c'] (1 - m): exact at integer y, with G^3 + G^2 rows per transition instead
    of the RLT's G^4 columns."""
    nt, g = cc.shape[0], cc.shape[1]
    if start is None and (fix_first or fix_last):
        raise ValueError("a fixed layer needs its mapping in start")
    node, intra, inter = two_level_links(weight)
    nodes = int(node.max()) + 1
    ny, ns = (nt + 1) * g * g, nt * g * g
    y = np.arange(ny).reshape(nt + 1, g, g)
    s_ = ny + np.arange(ns).reshape(nt, g, g)
    m_ = ny + ns + np.arange(ns).reshape(nt, g, g) if nodes > 1 else None
    z = ny + ns * (1 + (nodes > 1)) + np.arange(nt)
    ncol = int(z[-1]) + 1
    r_, c_, v_, lo, hi = [], [], [], [], []

    def row(cols, vals, rlo, rhi):
        r_.append(np.full(len(cols), len(lo))), c_.append(np.asarray(cols)), v_.append(np.asarray(vals, float))
        lo.append(rlo), hi.append(rhi)

    for l in range(nt + 1):
        for k in range(g):
            row(y[l, k], np.ones(g), 1, 1)      # cluster k on one GPU
            row(y[l, :, k], np.ones(g), 1, 1)   # GPU k holds one cluster
    members = [np.flatnonzero(node == k) for k in range(nodes)]
    per_node = g // nodes
    for t in range(nt):
        for c in range(g):
            row(s_[t, c], np.ones(g), -np.inf, 1)      # one same-GPU partner per cluster
            row(s_[t, :, c], np.ones(g), -np.inf, 1)
            if m_ is not None:
                row(m_[t, c], np.ones(g), -np.inf, per_node)
                row(m_[t, :, c], np.ones(g), -np.inf, per_node)
            for c2 in range(g):
                for i in range(g):  # s <= 1 - y[t,c,i] + y[t+1,c2,i]
                    row([s_[t, c, c2], y[t, c, i], y[t + 1, c2, i]], [1, 1, -1], -np.inf, 1)
                if m_ is not None:
                    row([s_[t, c, c2], m_[t, c, c2]], [1, -1], -np.inf, 0)
                    for k, mem in enumerate(members):
                        row(np.concatenate([[m_[t, c, c2]], y[t, c, mem], y[t + 1, c2, mem]]),
                            np.concatenate([[1], np.ones(len(mem)), -np.ones(len(mem))]), -np.inf, 1)
                f = cc[t, c, c2]
                if f > 0:  # z >= intra f (1 - s), z >= inter f (1 - m)
                    row([z[t], s_[t, c, c2]], [1, intra * f], intra * f, np.inf)
                    if m_ is not None:
                        row([z[t], m_[t, c, c2]], [1, inter * f], inter * f, np.inf)
    a = sparse.coo_matrix((np.concatenate(v_), (np.concatenate(r_), np.concatenate(c_))), shape=(len(lo), ncol))
    col_lo, col_hi, integer = _window_columns(ncol, ny, y, z, cc, weight, start, fix_first, fix_last)
    x0 = None
    if start is not None:
        x0 = np.zeros(ncol)
        x0[:ny] = np.eye(g)[start].ravel()
        for t in range(nt):
            x0[s_[t]] = start[t][:, None] == start[t + 1][None, :]
            if m_ is not None:
                x0[m_[t]] = node[start[t]][:, None] == node[start[t + 1]][None, :]
            x0[z[t]] = transition_cost(cc[t], weight, start[t], start[t + 1])
    obj = np.zeros(ncol)
    obj[z] = 1.0
    res = solve_min(obj, a, np.array(lo, float), np.array(hi, float), col_lo, col_hi, integer,
                    time_limit_s=time_limit_s, seed=seed, start=x0)
    assign = res.x[:ny].reshape(nt + 1, g, g).round().astype(int)
    if (assign.sum(2) != 1).any() or (assign.sum(1) != 1).any():
        raise PlanError("ILP 2 returned a cluster->GPU mapping that is not a bijection")
    return assign.argmax(2), res


def ilp2_mapping(cc: np.ndarray, weight: np.ndarray, *, window: int, time_limit_s: float, seed: int = 0,
                 symmetric: bool, max_rounds: int = 8) -> MappingResult:
    """Map every layer's clusters to GPUs. Incumbent: ``best_simple_mapping``, improved by
    ``layer_sweeps`` (each layer re-mapped exactly given its neighbours, until no layer improves).
    Then block-coordinate ILP: windows of ``window`` free layers (``window >= layers``: one ILP over
    all layers), each solved jointly with its neighbouring layers fixed, so every window sees all the
    transitions it changes and the total never gets worse; after a round in which a window improved,
    the sweeps run again and the next round shifts the windows by half a window (at most
    ``max_rounds`` rounds, until a shifted round improves nothing or ``time_limit_s`` is spent; each
    window may use ``time_limit_s`` / windows per round).
    Node-uniform links use ``ilp2_window_colocation``, any other weights the RLT ``ilp2_window``. In
    one node (``symmetric``) layer 0 is fixed to the identity; with several nodes only its cluster
    0 -> GPU 0. The gap is against the best proven bound: HiGHS's when one window spans every layer,
    else the sum of per-transition co-location bounds, or the simple mapping's own cost with uniform
    links (one node), where the layer-by-layer mapping is optimal; no window is solved once the
    incumbent meets the bound."""
    g, layers = cc.shape[1], cc.shape[0] + 1
    perms = best_simple_mapping(cc, weight)
    warm_cost = mapping_cost(cc, weight, perms)
    first_free = 1 if symmetric else 0
    perms, passes = layer_sweeps(cc, weight, perms, first_free)
    searched_cost = mapping_cost(cc, weight, perms)
    bound = float(sum(colocation_bound(c, weight) for c in cc))
    links = two_level_links(weight)
    if links is not None and links[0].max() == 0:
        # uniform links: a transition's cost depends only on which clusters share a GPU, any sequence of
        # such matchings is realizable, and sequential_mapping picks each one exactly: optimal
        bound = max(bound, warm_cost)
    seconds, statuses, windows = 0.0, [], []
    blocks = [(s, min(s + window, layers)) for s in range(first_free, layers, window)]
    if searched_cost - bound <= 1e-9 * max(searched_cost, 1.0):
        blocks = []  # proven optimal already
    solve = ilp2_window_colocation if links is not None else ilp2_window
    shift = (window + 1) // 2
    for rnd in range(max_rounds if len(blocks) > 1 else 1):
        if rnd:  # the next round's windows straddle this round's window edges
            off = first_free + (shift if rnd % 2 else 0)
            blocks = ([(first_free, off)] if off > first_free else []) + [
                (s, min(s + window, layers)) for s in range(off, layers, window)]
        improved = False
        for s, e in blocks:  # free layers s..e-1
            lo, hi = max(s - 1, 0), min(e, layers - 1)
            warm = mapping_cost(cc[lo:hi], weight, perms[lo:hi + 1])
            got, res = solve(cc[lo:hi], weight, perms[lo:hi + 1], fix_first=s > 0, fix_last=e < layers,
                             time_limit_s=time_limit_s / len(blocks), seed=seed)
            perms[lo:hi + 1] = got
            seconds += res.seconds
            statuses.append(res.status)
            windows.append(WindowSolve(s, e, warm, res.objective, res.bound, res.status, res.seconds))
            improved |= res.objective < warm - 1e-9 * max(1.0, warm)
            if len(blocks) == 1 and s == first_free and e == layers:
                bound = max(bound, res.bound)
        if improved:
            perms, more = layer_sweeps(cc, weight, perms, first_free)
            passes += more
        if seconds >= time_limit_s or (not improved and rnd > 0):
            break
    cost = mapping_cost(cc, weight, perms)
    gap = 0.0 if cost - bound <= 1e-9 * max(cost, 1.0) else (cost - bound) / cost
    return MappingResult(perms, cost, bound, gap, seconds, statuses, warm_cost, searched_cost, windows, passes)


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
    ilp1_only: np.ndarray | None = None  # ILP 1's clusters labelled by smallest expert id (no ILP 2 stage)
    rank_aligned: np.ndarray | None = None  # ILP 1's clusters on ILP 1's own (load-rank) labels
    clusters: np.ndarray | None = None   # ILP 1's cluster of every (layer, expert)


def map_clusters(prof: Profile, cluster_of: np.ndarray, weight: np.ndarray, *, ilp2_time_limit_s: float,
                 ilp2_window: int, symmetric: bool, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ILP 2 stage alone for fixed ILP 1 clusters and pair weights ``weight``: (MoETuner's expert ->
    GPU placement, the ablation's placement: the same clusters labelled by smallest expert id, the
    rank-aligned placement: the same clusters on ILP 1's own labels). ILP 1 balances load and does not see
    the links, so a sweep over link speeds re-runs only this stage (neither other placement sees the links)."""
    g = weight.shape[0]
    cc = cluster_transitions(prof, cluster_of, g)
    m = ilp2_mapping(cc, weight, window=ilp2_window, time_limit_s=ilp2_time_limit_s, seed=seed, symmetric=symmetric)
    gpu_of = np.take_along_axis(m.perms, cluster_of, axis=1)
    check_placement(gpu_of, g)
    return gpu_of, min_id_placement(cluster_of), identity_placement(cluster_of)


def identity_placement(cluster_of: np.ndarray) -> np.ndarray:
    """ILP 1's clusters on ILP 1's own labels: cluster k of every layer on GPU k (``moetuner_rank_aligned``).
    Those labels are not blind: the symmetry breaking of ``ilp1_clusters`` lets the k-th heaviest expert
    open only clusters 0..k, so cluster k tends to hold the k-th heaviest expert and the mapping lines the
    clusters up by load rank in every layer (with ``ilp1_follow_routing``, by the previous layer's routing)."""
    out = np.asarray(cluster_of).copy()
    check_placement(out, int(out.max()) + 1)
    return out


def min_id_placement(cluster_of: np.ndarray) -> np.ndarray:
    """ILP 1's clusters labelled by their smallest expert id: in every layer the cluster holding the lowest
    expert id goes on GPU 0, the cluster holding the lowest id among the rest on GPU 1, ... (the
    ``moetuner_ilp1`` ablation). It reads only the cluster membership, neither the loads nor the routing
    transitions nor the links, so only the routing-aware cluster -> GPU step is removed."""
    cluster_of = np.asarray(cluster_of)
    ids = np.arange(cluster_of.shape[1])
    out = np.stack([canonical_clusters(row, ids) for row in cluster_of])
    check_placement(out, int(out.max()) + 1)
    return out


def moetuner(prof: Profile, weight: np.ndarray, *, ilp1_time_limit_s: float, ilp2_time_limit_s: float,
             ilp2_window: int, symmetric: bool, seed: int = 0, follow_routing: bool = False,
             load_slack: float = 0.0) -> TunerPlan:
    """ILP 1 on every layer (warm-started from the better baseline; with ``follow_routing`` its second
    phase aligns each layer's clusters with the previous layer's), then the ILP 2 stage over the
    layers. ``ilp1_only``: the same clusters labelled by smallest expert id, i.e. without the ILP 2 stage
    (the routing-aware cluster -> GPU placement) and without its best-simple-mapping start;
    ``rank_aligned``: the same clusters on ILP 1's own (load-rank) labels."""
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
    ablation = min_id_placement(cluster_of)
    m = ilp2_mapping(cc, weight, window=ilp2_window, time_limit_s=ilp2_time_limit_s, seed=seed, symmetric=symmetric)
    gpu_of = np.take_along_axis(m.perms, cluster_of, axis=1)
    check_placement(gpu_of, g)
    improved = [w for w in m.windows if w.incumbent < w.warm - 1e-9 * max(1.0, w.warm)]
    top2 = -np.sort(-prof.transitions, axis=2)[..., :2].sum()
    stats = {"successor_top2_share": float(top2 / max(prof.transitions.sum(), 1.0)),
             "ilp1_max_gap": float(max(gaps)), "ilp1_affinity_max_gap": float(max(aff_gaps)), "ilp1_solve_s": secs,
             "ilp2_gap": m.gap, "ilp2_solve_s": m.seconds,
             "ilp2_identity_objective": mapping_cost(cc, weight, np.tile(np.arange(g), (layers, 1))),
             "ilp2_objective": m.cost, "ilp2_bound": m.bound, "ilp2_heuristic_objective": m.heuristic_cost,
             "ilp2_sweep_objective": m.sweep_cost, "ilp2_sweep_passes": float(m.sweep_passes),
             "ilp2_windows": float(len(m.windows)), "ilp2_windows_improved": float(len(improved)),
             "ilp2_window_gain": float(sum(w.warm - w.incumbent for w in improved)),
             "ilp2_time_limited_windows": float(sum(s != "Optimal" for s in m.statuses))}
    return TunerPlan(gpu_of, stats, ablation, identity_placement(cluster_of), cluster_of)
