"""Conditional-independence tests (partial correlation, Fisher z) on telemetry: the data validation
that prunes synthesized edges, and the PC algorithm (the data-driven baseline), both pure numpy."""
from __future__ import annotations

import math
from itertools import combinations

import numpy as np
from scipy.special import erfc


def corr(data: np.ndarray) -> np.ndarray:
    C = np.corrcoef(data, rowvar=False)
    return np.nan_to_num(C, nan=0.0)


def partial_corr(C: np.ndarray, i: int, j: int, S=()) -> float:
    """Partial correlation of i and j given S from the correlation matrix C."""
    idx = [i, j, *S]
    P = np.linalg.pinv(C[np.ix_(idx, idx)])
    d = P[0, 0] * P[1, 1]
    return float(-P[0, 1] / math.sqrt(d)) if d > 0 else 0.0


def _batched_partial_corr(C: np.ndarray, i: int, j: int, S: np.ndarray) -> np.ndarray:
    """Partial correlations of i and j given each row of S ([m, d] conditioning sets) at once."""
    idx = np.concatenate([np.broadcast_to([i, j], (len(S), 2)), S], axis=1)
    sub = C[idx[:, :, None], idx[:, None, :]] + 1e-9 * np.eye(idx.shape[1])
    P = np.linalg.inv(sub)
    d = P[:, 0, 0] * P[:, 1, 1]
    return np.where(d > 0, -P[:, 0, 1] / np.sqrt(np.where(d > 0, d, 1.0)), 0.0)


def fisher_p(r: float | np.ndarray, n: int, k: int):
    """Two-sided p-value of H0: partial correlation 0, from r on n samples given k variables."""
    r = np.clip(r, -0.9999999, 0.9999999)
    z = np.abs(np.arctanh(r)) * math.sqrt(max(n - k - 3, 1))
    return erfc(z / math.sqrt(2)) if np.ndim(z) else float(erfc(float(z) / math.sqrt(2)))


def validate(A: np.ndarray, candidates: list[tuple[int, int]], data: np.ndarray, alpha: float
             ) -> tuple[np.ndarray, dict[tuple[int, int], float]]:
    """Prune the candidate edges i -> j of graph A that the data contradicts: i independent of j given
    j's other parents in A (Fisher z p-value > alpha). All tests use the proposed graph's parent sets
    (order-independent). Returns the pruned graph and every candidate's p-value."""
    C, n = corr(data), len(data)
    out, pvals = A.copy(), {}
    for i, j in candidates:
        S = [k for k in np.flatnonzero(A[:, j]) if k != i]
        p = fisher_p(partial_corr(C, i, j, S), n, len(S))
        pvals[(i, j)] = float(p)
        if p > alpha:
            out[i, j] = False
    return out, pvals


def pc(data: np.ndarray, alpha: float, max_depth: int = 3, roots=(0,), required: np.ndarray | None = None) -> np.ndarray:
    """The PC algorithm (order-independent "stable" skeleton, Fisher z tests, v-structures, Meek rules
    1-3). ``roots`` are background knowledge: variables with no causes (exogenous traffic), their edges
    oriented outwards. ``required`` (optional, [V, V] bool) is background knowledge too: edges i -> j known
    to exist (e.g. the per-component metric template), kept in the skeleton and oriented i -> j before the
    v-structures and Meek's rules. Returns G with G[i, j] and not G[j, i] for i -> j, both for an unoriented
    edge."""
    n, V = data.shape
    C = corr(data)
    adj = ~np.eye(V, dtype=bool)
    sep: dict[tuple[int, int], tuple[int, ...]] = {}
    # depth 0, vectorized
    p0 = fisher_p(C, n, 0)
    drop = adj & (p0 > alpha)
    for i, j in zip(*np.nonzero(np.triu(drop))):
        sep[(i, j)] = sep[(j, i)] = ()
    adj &= ~drop
    # depth 1, vectorized over the conditioning variable
    if max_depth >= 1:
        snap = adj.copy()
        r_ik = C[:, None, :]
        r_jk = C[None, :, :]
        den = np.sqrt(np.clip((1 - r_ik ** 2) * (1 - r_jk ** 2), 1e-12, None))
        r1 = (C[:, :, None] - r_ik * r_jk) / den          # r_ij.k
        p1 = fisher_p(r1, n, 1)
        # k must be a neighbour of i or of j (not i or j themselves)
        allowed = (snap[:, None, :] | snap[None, :, :])
        allowed[np.arange(V), :, np.arange(V)] = False
        allowed[:, np.arange(V), np.arange(V)] = False
        indep = (p1 > alpha) & allowed
        hit = indep.any(axis=2) & snap
        first = indep.argmax(axis=2)
        for i, j in zip(*np.nonzero(np.triu(hit))):
            sep[(i, j)] = sep[(j, i)] = (int(first[i, j]),)
        adj &= ~hit
    for depth in range(2, max_depth + 1):
        snap = adj.copy()
        for i in range(V):
            for j in range(i + 1, V):
                if not adj[i, j]:
                    continue
                for base, other in ((i, j), (j, i)):
                    nb = [k for k in np.flatnonzero(snap[base]) if k != other]
                    if len(nb) < depth:
                        continue
                    S = np.array(list(combinations(nb, depth)), dtype=int)
                    hit = np.flatnonzero(fisher_p(_batched_partial_corr(C, i, j, S), n, depth) > alpha)
                    if len(hit):
                        adj[i, j] = adj[j, i] = False
                        sep[(i, j)] = sep[(j, i)] = tuple(int(x) for x in S[hit[0]])
                        break
        if not any(len(np.flatnonzero(adj[i])) > depth for i in range(V)):
            break
    if required is not None:   # known edges: in the skeleton whatever the tests said, and oriented
        req = required & ~np.eye(V, dtype=bool)
        adj |= req | req.T
    G = adj.copy()
    for r in roots:   # background knowledge: nothing causes the roots
        G[:, r] = False
    if required is not None:
        G[req.T & ~req] = False
    # v-structures i -> k <- j for non-adjacent i, j with k not in their separating set
    for k in range(V):
        nb = np.flatnonzero(adj[k])
        for a, b in combinations(nb, 2):
            if not adj[a, b] and k not in sep.get((a, b), ()):
                if G[a, k] and G[b, k] and k not in roots and \
                        (required is None or not (required[k, a] or required[k, b])):
                    G[k, a] = G[k, b] = False
    _meek(G, adj)
    return G


def _meek(G: np.ndarray, adj: np.ndarray) -> None:
    """Meek rules 1-3 in place until nothing changes. An orientation a -> b that would close a
    directed cycle (b already reaches a along directed edges) is refused and the edge stays
    undirected: on finite samples the v-structures can admit no DAG, and a cycle would make every
    node on it an ancestor of itself in the root-cause ranking."""
    V = len(G)
    directed = lambda a, b: G[a, b] and not G[b, a]  # noqa: E731
    undirected = lambda a, b: G[a, b] and G[b, a]  # noqa: E731

    def reaches(src: int, dst: int) -> bool:
        seen, stack = {src}, [src]
        while stack:
            u = stack.pop()
            for w in np.flatnonzero(G[u] & ~G[:, u]):   # u -> w, directed
                if w == dst:
                    return True
                if w not in seen:
                    seen.add(int(w))
                    stack.append(int(w))
        return False
    changed = True
    while changed:
        changed = False
        for a in range(V):
            for b in np.flatnonzero(G[a]):
                if not undirected(a, b):
                    continue
                # R1: c -> a - b, c and b non-adjacent => a -> b
                r1 = any(directed(c, a) and not adj[c, b] for c in np.flatnonzero(G[:, a]) if c != b)
                # R2: a -> c -> b and a - b => a -> b
                r2 = any(directed(a, c) and directed(c, b) for c in np.flatnonzero(G[a]) if c != b)
                # R3: a - c -> b, a - d -> b, c and d non-adjacent => a -> b
                cs = [c for c in np.flatnonzero(G[a]) if c != b and undirected(a, c) and directed(c, b)]
                r3 = any(not adj[c, d] for c, d in combinations(cs, 2))
                if (r1 or r2 or r3) and not reaches(b, a):
                    G[b, a] = False
                    changed = True
