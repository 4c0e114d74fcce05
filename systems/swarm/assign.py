"""Task assignment: the backend's global optimum (Hungarian, scipy), its greedy alternative, a brute-force
check of optimality for small instances, and the cost of an assignment (pure, numpy/scipy only)."""
from __future__ import annotations

import itertools

import numpy as np


def travel_cost(drone_xy: np.ndarray, task_xy: np.ndarray, speed_m_s: float) -> np.ndarray:
    """Seconds each drone (row) needs to reach each task (column): straight-line distance / speed."""
    d = np.sqrt(((drone_xy[:, None, :] - task_xy[None, :, :]) ** 2).sum(-1))
    return d / speed_m_s


def hungarian(cost: np.ndarray) -> list[tuple[int, int]]:
    """The assignment of minimum total cost (rectangular: min(rows, cols) pairs), as (row, col) pairs."""
    from scipy.optimize import linear_sum_assignment

    if cost.size == 0:
        return []
    rows, cols = linear_sum_assignment(cost)
    return list(zip(rows.tolist(), cols.tolist()))


def greedy_nearest(cost: np.ndarray) -> list[tuple[int, int]]:
    """Greedy matching: repeatedly the cheapest (row, col) pair whose row and column are both free."""
    if cost.size == 0:
        return []
    n_r, n_c = cost.shape
    want = min(n_r, n_c)
    if n_r == 1 or n_c == 1:   # one drone or one task: the nearest
        i = int(np.argmin(cost))
        return [divmod(i, n_c)]
    used_r, used_c = np.zeros(n_r, dtype=bool), np.zeros(n_c, dtype=bool)
    out = []
    for i in np.argsort(cost, axis=None, kind="stable"):
        r, c = divmod(int(i), n_c)
        if used_r[r] or used_c[c]:
            continue
        used_r[r] = used_c[c] = True
        out.append((r, c))
        if len(out) == want:
            break
    return out


def assignment_cost(cost: np.ndarray, pairs: list[tuple[int, int]]) -> float:
    """Total cost of ``pairs``; raises ValueError if a row or a column is used twice or the
    assignment is not maximal (fewer than min(rows, cols) pairs)."""
    rows = [r for r, _ in pairs]
    cols = [c for _, c in pairs]
    if len(set(rows)) != len(rows) or len(set(cols)) != len(cols):
        raise ValueError("a drone or a task is assigned twice")
    if len(pairs) != min(cost.shape):
        raise ValueError(f"{len(pairs)} pairs; a maximal assignment has {min(cost.shape)}")
    return float(sum(cost[r, c] for r, c in pairs))


def brute_force_optimum(cost: np.ndarray) -> float:
    """Minimum total cost over every maximal assignment, by enumeration (small instances only)."""
    n_r, n_c = cost.shape
    if n_r * n_c == 0:
        return 0.0
    if max(n_r, n_c) > 8:
        raise ValueError("brute force is for instances of at most 8 x 8")
    if n_r >= n_c:
        return min(sum(cost[r, c] for c, r in enumerate(perm)) for perm in itertools.permutations(range(n_r), n_c))
    return min(sum(cost[r, c] for r, c in enumerate(perm)) for perm in itertools.permutations(range(n_c), n_r))


def check_optimal(cost: np.ndarray, pairs: list[tuple[int, int]], tol: float = 1e-9) -> None:
    """Raises ValueError unless ``pairs`` is a valid maximal assignment of minimum total cost."""
    got, best = assignment_cost(cost, pairs), brute_force_optimum(cost)
    if got > best + tol * max(1.0, abs(best)):
        raise ValueError(f"assignment costs {got:.6g}, the optimum is {best:.6g}")
