"""Replay held-out lookups against a plan: exact bytes per iteration and a link-level time model.

Forward, each device fetches every looked-up row it holds no copy of from the copy the plan
names (its node's copy for NODE rows); backward, the gradients go the same way back. With
``dedup`` a device fetches each distinct row once per iteration; without it (the default, as
sequence features are materialized per position) every lookup moves one row. Replicated rows
touched in the iteration are then all-reduced among their copies (see plan.py).

Time model: a phase takes as long as its busiest device link, where every device has one intra-node
and one inter-node link per direction (full duplex, used concurrently). An iteration is the forward
all-to-all, the backward all-to-all, then the replicas' intra-node and inter-node reduction steps.
"""
from __future__ import annotations

import numpy as np

from .plan import FULL, NODE, SHARD, Plan, Topology

FIELDS = ("lookups", "fetched_rows", "alltoall_intra_bytes", "alltoall_inter_bytes", "sync_intra_bytes",
          "sync_inter_bytes", "modeled_comm_latency_s")


def link_time(m: np.ndarray, topo: Topology) -> np.ndarray:
    """Seconds of each phase given its byte matrices ``m[..., src, dst]``: the busiest link."""
    node = np.arange(topo.devices) // topo.per_node
    same = node[:, None] == node[None, :]
    worst = []
    for mask, gb_s in ((same, topo.intra_gb_s), (~same, topo.inter_gb_s)):
        part = np.where(mask, m, 0.0)
        worst.append(np.maximum(part.sum(-1).max(-1), part.sum(-2).max(-1)) / (gb_s * 1e9))
    return np.maximum(*worst)


def sync_matrices(full_rows: np.ndarray, node_rows: np.ndarray, topo: Topology) -> tuple[np.ndarray, np.ndarray]:
    """Byte matrices [iterations, D, D] of the replicas' gradient all-reduce, intra-node and
    inter-node steps. ``full_rows[i]``: FULL rows touched in iteration i; ``node_rows[i, g]``: NODE
    rows with local owner g touched in iteration i."""
    n, g, d, b = topo.nodes, topo.per_node, topo.devices, topo.row_bytes
    it = len(full_rows)
    intra, inter = np.zeros((it, d, d)), np.zeros((it, d, d))
    dev = np.arange(d)
    node, local = dev // g, dev % g
    peers = (node[:, None] == node[None, :]) & (dev[:, None] != dev[None, :])
    # FULL: reduce-scatter + all-gather in the node (2(G-1)/G of the rows per device, spread over
    # its G-1 peers), then a ring all-reduce of each device's 1/G share across the nodes
    intra += peers[None] * (2.0 * full_rows * b / g)[:, None, None]
    if n > 1:
        ring = ((node + 1) % n) * g + local  # the next node's device with the same local index
        inter[:, dev, ring] += (2.0 * (n - 1) / n * full_rows * b / g)[:, None]
        # NODE: the n copies of a row (local index g on every node) all-reduce in a ring
        inter[:, dev, ring] += 2.0 * (n - 1) / n * node_rows[:, local] * b
    return intra, inter


def fetch_stream(ids: np.ndarray, counts: np.ndarray, total_rows: int, dedup: bool = False) -> tuple[np.ndarray, ...]:
    """The requests of one held-out chunk, independent of the plan: (rows, requesting device,
    iteration) of every lookup, or with ``dedup`` of every distinct (iteration, device, row), and the
    lookups per iteration. Shared by every plan replayed in the same setting."""
    it, _, d = counts.shape
    dev = np.repeat(np.tile(np.arange(d), counts.shape[0] * counts.shape[1]), counts.ravel())
    itr = np.repeat(np.arange(it), counts.sum(axis=(1, 2)))
    lookups = np.bincount(itr, minlength=it)
    if dedup:  # each device fetches a row once per iteration
        key = np.unique((itr * d + dev) * total_rows + ids)
        ids, rest = key % total_rows, key // total_rows
        dev, itr = rest % d, rest // d
    return ids, dev, itr, lookups


def replay(plan: Plan, ids: np.ndarray, counts: np.ndarray, topo: Topology, total_rows: int,
           dedup: bool = False, stream: tuple[np.ndarray, ...] | None = None) -> dict[str, np.ndarray]:
    """Per-iteration metrics (arrays over the chunk's iterations, see FIELDS) of ``plan`` on one
    held-out chunk (``ids`` ordered by (iteration, table, device), ``counts[iteration, table, device]``).
    ``stream``: ``fetch_stream(ids, counts, total_rows, dedup)`` when already computed."""
    it, _, d = counts.shape
    g, b = topo.per_node, topo.row_bytes
    ids, dev, itr, lookups = stream if stream is not None else fetch_stream(ids, counts, total_rows, dedup)
    tier, own = plan.tier[ids], plan.owner[ids]
    src = np.where(tier == SHARD, own, np.where(tier == NODE, (dev // g) * g + own, dev))
    remote = src != dev
    fetch = np.bincount((itr * d + src) * d + dev, weights=remote, minlength=it * d * d).reshape(it, d, d) * b
    # replicated rows touched by any device in the iteration
    rep = tier != SHARD
    touched = np.unique(itr[rep] * total_rows + ids[rep])
    t_it, t_row = touched // total_rows, touched % total_rows
    is_full = plan.tier[t_row] == FULL
    full_rows = np.bincount(t_it[is_full], minlength=it).astype(np.float64)
    node_rows = np.bincount(t_it[~is_full] * g + plan.owner[t_row[~is_full]], minlength=it * g).reshape(it, g).astype(np.float64)
    s_intra, s_inter = sync_matrices(full_rows, node_rows, topo)
    node = np.arange(d) // g
    cross = node[:, None] != node[None, :]
    a2a_inter = 2 * (fetch * cross).sum(axis=(1, 2))  # forward rows + backward gradients
    return {
        "lookups": lookups.astype(np.float64),
        "fetched_rows": np.bincount(itr, weights=remote, minlength=it),
        "alltoall_intra_bytes": 2 * fetch.sum(axis=(1, 2)) - a2a_inter,
        "alltoall_inter_bytes": a2a_inter,
        "sync_intra_bytes": s_intra.sum(axis=(1, 2)),
        "sync_inter_bytes": s_inter.sum(axis=(1, 2)),
        "modeled_comm_latency_s": 2 * link_time(fetch, topo) + link_time(s_intra, topo) + link_time(s_inter, topo),
    }
