"""Row-level sharding plans: the row-wise mod baseline, the same baseline with a replicated cache
of hot rows in the memory FlexShard uses, and FlexShard's tiered plan.

A plan gives every (global) row a tier and an owner:

- ``SHARD``: one copy, on device ``owner`` (0..D-1);
- ``NODE``: one copy per node, on local device ``owner`` (0..G-1) of each node: a device fetches the
  row from its own node, over the fast intra-node links;
- ``FULL``: a copy on every device: never fetched.

Replicas keep their gradients in sync: the rows of a replicated tier touched in an iteration are
all-reduced among their copies (hierarchically for FULL: reduce-scatter in the node, all-reduce
across nodes, all-gather in the node; a ring across the node copies for NODE).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

SHARD, NODE, FULL = 0, 1, 2


@dataclass(frozen=True)
class Topology:
    nodes: int
    per_node: int  # G devices per node
    intra_gb_s: float  # per device and direction, inside a node
    inter_gb_s: float  # per device and direction, across nodes
    row_bytes: int  # bytes of one embedding row (and of its gradient)

    @property
    def devices(self) -> int:
        return self.nodes * self.per_node

    @property
    def w_intra(self) -> float:  # seconds per byte on one intra-node link
        return 1.0 / (self.intra_gb_s * 1e9)

    @property
    def w_inter(self) -> float:
        return 1.0 / (self.inter_gb_s * 1e9)

    def copies(self) -> np.ndarray:
        """Memory (row copies) of one row in each tier."""
        return np.array([1, self.nodes, self.devices], np.int64)


@dataclass
class Plan:
    name: str
    tier: np.ndarray  # int8 [rows]
    owner: np.ndarray  # int32 [rows]
    capacity_rows: int  # per-device memory both plans were given, in rows
    stats: dict = field(default_factory=dict)

    def rows_per_device(self, topo: Topology) -> np.ndarray:
        """Row copies each device holds."""
        d, g = topo.devices, topo.per_node
        shard = np.bincount(self.owner[self.tier == SHARD], minlength=d)[:d]
        node = np.bincount(self.owner[self.tier == NODE], minlength=g)[:g]
        return shard + np.tile(node, topo.nodes) + int(np.count_nonzero(self.tier == FULL))


def baseline_capacity(offsets: np.ndarray, devices: int) -> int:
    """Rows per device of row-wise mod sharding: the most any device holds."""
    return int(sum(math.ceil(int(n) / devices) for n in np.diff(offsets)))


def rowwise(offsets: np.ndarray, topo: Topology) -> Plan:
    """Baseline: row r of each table on device r % D, no replication."""
    local = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], np.diff(offsets))
    owner = (local % topo.devices).astype(np.int32)
    return Plan("rowwise", np.zeros(int(offsets[-1]), np.int8), owner, baseline_capacity(offsets, topo.devices))


def rowwise_cache(offsets: np.ndarray, topo: Topology, counts: np.ndarray, per_device_rows: int,
                  name: str = "rowwise_cache") -> Plan:
    """Row-wise mod sharding plus a cache of hot rows on every device, in ``per_device_rows`` row
    copies per device (the memory FlexShard's plan holds: equal memory).

    The cache holds the rows most often looked up in the training trace (``counts``; ties by row
    id), replicated on every device: a ``FULL`` row that is never fetched and whose gradient is
    all-reduced among its copies like one of FlexShard's replicas (trainable rows; a cache that
    skipped the sync would serve stale rows). A cached row's owner needs no second copy, so it
    leaves its shard. The cache takes the most rows whose copies still fit: the footprint (the
    busiest device's row copies) grows by 0 or 1 row per cached row, so it meets ``per_device_rows``
    exactly whenever that is at least the row-wise footprint; below it the cache stays empty."""
    base = rowwise(offsets, topo)
    d = topo.devices
    order = np.argsort(-np.asarray(counts), kind="stable")
    shards = np.bincount(base.owner, minlength=d)

    def footprint(k: int) -> int:
        return k + int((shards - np.bincount(base.owner[order[:k]], minlength=d)).max())

    lo, hi = 0, len(order)  # the largest k with footprint(k) <= per_device_rows (footprint is monotone)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if footprint(mid) <= per_device_rows else (lo, mid - 1)
    tier = base.tier.copy()
    tier[order[:lo]] = FULL
    plan = Plan(name, tier, base.owner, int(per_device_rows))
    plan.stats = {"rows_cached": lo}
    return plan


def access_estimates(counts: np.ndarray, offsets: np.ndarray, iterations: int, devices: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """From training counts: per row, the expected lookups by one device in one iteration (lam),
    the probability that one device touches it in an iteration, q = 1-(1-p)^(B*L), and that any
    device does, u = 1-(1-p)^(D*B*L), with p the row's share of its table's lookups and B*L the
    lookups of one device into that table per iteration."""
    per_table = np.add.reduceat(counts, offsets[:-1]).astype(np.float64)
    n = per_table / (iterations * devices)  # lookups per device and iteration, per table
    p = counts / np.maximum(np.repeat(per_table, np.diff(offsets)), 1.0)
    log1m = np.log1p(-np.minimum(p, 1 - 1e-16))
    n_row = np.repeat(n, np.diff(offsets))
    return counts / (iterations * devices), -np.expm1(n_row * log1m), -np.expm1(devices * n_row * log1m)


def tier_costs(demand: np.ndarray, u: np.ndarray, topo: Topology) -> np.ndarray:
    """Expected communication seconds per iteration of each row in each tier [rows, 3], summed
    over links (the planner's proxy for time, weighting inter-node bytes by their slower links).
    ``demand`` is what one device fetches of the row per iteration: expected lookups, or the touch
    probability when lookups are deduplicated; fetches go forward (rows) and back (gradients)."""
    n, g, d = topo.nodes, topo.per_node, topo.devices
    wa, we, b = topo.w_intra, topo.w_inter, topo.row_bytes
    shard = 2 * demand * ((g - 1) * wa + (d - g) * we)
    node = 2 * demand * n * (g - 1) * wa + u * 2 * (n - 1) * we
    full = u * (2 * n * (g - 1) * wa + 2 * (n - 1) * we)
    return b * np.stack([shard, node, full], axis=1)


def flexshard(demand: np.ndarray, u: np.ndarray, offsets: np.ndarray, topo: Topology, headroom: float,
              tiered: bool = True) -> Plan:
    """FlexShard tiering under the per-device memory of ``(1 + headroom)`` x the baseline's.

    Greedy by saving per byte: each row starts sharded; its upgrades (SHARD->NODE, NODE->FULL, or
    SHARD->FULL where the NODE step is not on the row's convex hull) are ranked by the expected
    communication time they save per extra row copy, and the best are taken while the extra copies
    fit. The rest stays sharded, spread round-robin in order of demand so hot rows land on
    different devices (balanced links). ``tiered=False`` (the mechanism's ablation) drops the per-node
    tier: a row is either sharded or replicated on every device."""
    rows, d, g = int(offsets[-1]), topo.devices, topo.per_node
    capacity = int(baseline_capacity(offsets, d) * (1 + headroom))
    # per-device rounding of round-robin tiers costs at most 2 rows per device (NODE and SHARD)
    budget = max(0, d * (capacity - 2) - rows)
    cost, mem = tier_costs(demand, u, topo), topo.copies()
    # one node: NODE is SHARD; one device per node: NODE is FULL
    levels = [SHARD, FULL] if topo.nodes == 1 or g == 1 or not tiered else [SHARD, NODE, FULL]
    # convex hull per row: NODE is skipped where going straight to FULL saves more per copy
    step1 = (cost[:, SHARD] - cost[:, levels[1]]) / (mem[levels[1]] - mem[SHARD])
    if len(levels) == 3:
        direct = (cost[:, SHARD] - cost[:, FULL]) / (mem[FULL] - mem[SHARD])
        via_node = step1 >= direct
        step2 = np.where(via_node, (cost[:, NODE] - cost[:, FULL]) / (mem[FULL] - mem[NODE]), -np.inf)
        first = np.where(via_node, NODE, FULL)
        step1 = np.where(via_node, step1, direct)
    else:
        step2, first = np.full(rows, -np.inf), np.full(rows, FULL)
    # candidate upgrades: (gain per copy, row, to-tier, copies); within a row step1 >= step2
    gain = np.concatenate([step1, step2])
    row = np.concatenate([np.arange(rows), np.arange(rows)])
    to = np.concatenate([first, np.full(rows, FULL)])
    extra = np.concatenate([mem[first] - mem[SHARD], np.full(rows, mem[FULL] - mem[NODE])])
    keep = gain > 0
    gain, row, to, extra, second = gain[keep], row[keep], to[keep], extra[keep], np.arange(2 * rows)[keep] >= rows
    order = np.lexsort((second, -gain))  # best first; a row's first step before its second
    taken = order[: int(np.searchsorted(np.cumsum(extra[order]), budget, side="right"))]
    tier = np.zeros(rows, np.int8)
    np.maximum.at(tier, row[taken], to[taken].astype(np.int8))  # a taken second step implies its first
    owner = np.zeros(rows, np.int32)
    hot_first = np.argsort(-demand, kind="stable")
    for t, spread in ((SHARD, d), (NODE, g)):
        members = hot_first[tier[hot_first] == t]
        owner[members] = np.arange(len(members)) % spread
    plan = Plan("flexshard", tier, owner, capacity)
    counts = np.bincount(tier, minlength=3)
    plan.stats = {"rows_full": int(counts[FULL]), "rows_node": int(counts[NODE]), "rows_shard": int(counts[SHARD]),
                  "expected_comm_s": float(cost[np.arange(rows), tier].sum())}
    return plan
