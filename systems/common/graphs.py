"""Small directed-graph helpers shared by systems (pure)."""
from __future__ import annotations

from typing import Iterable


def is_acyclic(edges: Iterable[tuple[int, int]], n: int) -> bool:
    """True when the directed graph on nodes ``0..n-1`` has no cycle (Kahn's algorithm)."""
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for u, v in edges:
        succ[u].append(v)
        indeg[v] += 1
    ready = [i for i in range(n) if indeg[i] == 0]
    seen = 0
    while ready:
        u = ready.pop()
        seen += 1
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    return seen == n
