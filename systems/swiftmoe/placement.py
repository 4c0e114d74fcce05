"""Replica planning shared by SwiftMoE and FlexMoE: how many replicas each expert gets and
which worker holds each (pure numpy)."""
from __future__ import annotations

import numpy as np


def replica_counts(load: np.ndarray, slots: int, max_per_expert: int) -> np.ndarray:
    """At least one replica per expert; each further slot goes to the expert with the highest
    load per replica (minimises the worst per-replica load), at most ``max_per_expert`` each."""
    load = np.asarray(load, dtype=float)
    e = len(load)
    if slots < e:
        raise ValueError(f"{slots} replica slots cannot hold {e} experts")
    r = np.ones(e, dtype=int)
    for _ in range(min(slots, e * max_per_expert) - e):
        share = np.where(r < max_per_expert, load / r, -1.0)
        r[int(np.argmax(share))] += 1
    return r


def assign_workers(load: np.ndarray, counts: np.ndarray, workers: int, slots_per_worker: int,
                   previous: list[set[int]] | None = None, stickiness: float = 0.25) -> list[list[int]]:
    """Experts held by each worker. Longest-processing-time first: each replica (load/count)
    goes to the least-loaded worker with a free slot that does not hold that expert yet. With
    ``previous`` (FlexMoE), a worker that already holds the expert wins when its load is within
    ``stickiness`` x that replica's load of the least-loaded one, which avoids needless moves.
    Where that greedy order strands an expert's last replicas (its free slots all on workers that
    hold it already), the replicas are placed by ``_most_free_first``, which never strands one."""
    counts = np.asarray(counts, dtype=int)
    if counts.max(initial=0) > workers or counts.sum() > workers * slots_per_worker:
        raise ValueError(f"{int(counts.sum())} replicas (at most {int(counts.max(initial=0))} of one expert) do not "
                         f"fit {workers} workers x {slots_per_worker} slots")
    per = np.asarray(load, dtype=float) / counts
    items = sorted(((per[e], e) for e in range(len(counts)) for _ in range(counts[e])), reverse=True)
    held: list[list[int]] = [[] for _ in range(workers)]
    busy = np.zeros(workers)
    for w_load, e in items:
        ok = [w for w in range(workers) if len(held[w]) < slots_per_worker and e not in held[w]]
        if not ok:
            return _most_free_first(per, counts, workers, slots_per_worker)
        best = min(ok, key=lambda w: (busy[w], w))
        if previous is not None:
            keep = [w for w in ok if e in previous[w] and busy[w] <= busy[best] + stickiness * w_load]
            if keep:
                best = min(keep, key=lambda w: (busy[w], w))
        held[best].append(e)
        busy[best] += w_load
    return held


def _most_free_first(per: np.ndarray, counts: np.ndarray, workers: int, slots_per_worker: int) -> list[list[int]]:
    """Experts in decreasing replica count, each expert's replicas on the workers with the most free
    slots (the least loaded among equals): Ryser's construction, which places every replica whenever
    each count is at most ``workers`` and their sum at most the slots."""
    held: list[list[int]] = [[] for _ in range(workers)]
    busy = np.zeros(workers)
    for e in sorted(range(len(counts)), key=lambda e: (-counts[e], -per[e], e)):
        for w in sorted(range(workers), key=lambda w: (len(held[w]), busy[w], w))[:counts[e]]:
            held[w].append(e)
            busy[w] += per[e]
    return held


def split_rows(idx: np.ndarray, holders: list[int]) -> list[tuple[int, np.ndarray]]:
    """Split an expert's routed rows (in source-worker order) into contiguous, near-equal chunks
    over its replicas, lowest worker first (keeps some tokens local)."""
    return list(zip(sorted(holders), np.array_split(idx, len(holders))))
