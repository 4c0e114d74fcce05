"""The sharded lookup itself, run end to end: each plan's per-device embedding lookups over held-out
batches, with torch, timed.

For every plan and every device (GPU of the plan) the rows its tables need are materialized in two
tiers:

- the **fast tier** (HBM): one in-memory float32 tensor per device, on ``device`` (CUDA memory on a
  GPU worker, host memory on a CPU one), holding the rows the plan keeps in HBM;
- the **slow tier** (UVM): the rows the plan leaves in UVM, reached through a slower path.
  ``memmap``: one file per device on local disk (``lookup_dir``), opened read-only with
  ``np.memmap`` and read with fancy indexing (``np.take``) into a staging buffer (pinned on CUDA,
  then copied to the device). The file was just written, so its pages normally sit in the OS page
  cache: the path is a page-cache-backed mapped-file gather plus a copy (and a host-to-device copy on
  CUDA), not a disk read; no cache is dropped. ``host``: the slow rows in a host tensor (pinned on
  CUDA), gathered with ``index_select`` into the staging buffer (the host side of a UVM lookup).

Only rows the sampled batches touch are materialized (ids mapped to compact indices), so the memory
is bounded by the trace, not by the tables. Row values are a hash of (seed, table, row, column), in
multiples of 1/8 in [-1, 1): float32 sums of them are exact in any order, so the split lookup
returns exactly (bit for bit) the pooled embeddings of a plain full-table lookup.

A lookup of table j in a batch is a DLRM's sum-pooled EmbeddingBag: one bag per sample, the sample's
ids of that table. Split by tier: fast ids pooled from the fast tensor, slow ids gathered from the slow
tier and pooled, the two sums added.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from .sharding import Plan

SlowTier = Literal["memmap", "host"]
_CHUNK = 1 << 16  # rows per row_values chunk (bounds the uint64 temporaries)


# ------------------------------------------------------------------------------------------- values
def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def row_values(seed: int, table: int, ids: np.ndarray, dim: int) -> np.ndarray:
    """float32 [len(ids), dim]: the embedding rows ``ids`` of table ``table``, generated lazily from a
    hash, each value a multiple of 1/8 in [-1, 1) (so any sum of up to 2**20 of them is exact): one
    64-bit hash per 16 values of a row, a value per 4 bits."""
    ids = np.asarray(ids, np.int64)
    words = -(-dim // 16)
    out = np.empty((len(ids), dim), np.float32)
    key = _mix(np.array([seed * 0x9E3779B1 + table + 1], np.uint64))
    salt = np.arange(1, words + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    for s in range(0, len(ids), _CHUNK):
        h = _mix(ids[s: s + _CHUNK].astype(np.uint64) ^ key)
        raw = np.ascontiguousarray(_mix(h[:, None] + salt[None, :])).view(np.uint8).reshape(len(h), 8 * words)
        nibbles = np.empty((len(h), 16 * words), np.uint8)
        nibbles[:, 0::2], nibbles[:, 1::2] = raw & 15, raw >> 4
        block = out[s: s + len(h)]
        block[:] = nibbles[:, :dim]  # 0..15
        block -= 8
        block *= 0.125
    return out


def full_table_lookup(seed: int, table: int, rows: int, dim: int, ids: np.ndarray, lengths: np.ndarray) -> torch.Tensor:
    """The reference: the whole table materialized, one sum-pooled EmbeddingBag over the global ids."""
    weight = torch.from_numpy(row_values(seed, table, np.arange(rows), dim))
    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64))
    return F.embedding_bag(torch.from_numpy(np.asarray(ids, np.int64)), weight, offsets, mode="sum")


# -------------------------------------------------------------------------------- the sampled trace
@dataclass(frozen=True)
class TableTrace:
    """One table's lookups in the sampled batches, in compact form."""

    table: int
    dim: int
    batch: int
    ids: np.ndarray     # int64 [U] the distinct rows touched, sorted
    rank: np.ndarray    # int64 [U] each one's hotness rank in the TRAINING profile (0 = hottest)
    pos: np.ndarray     # int32 [N] each lookup's index into ``ids``
    sample: np.ndarray  # int32 [N] each lookup's sample within its batch
    bounds: np.ndarray  # int64 [batches + 1] the lookups of batch b are pos[bounds[b]:bounds[b+1]]

    @property
    def batches(self) -> int:
        return len(self.bounds) - 1


def compact_trace(table: int, dim: int, ids: np.ndarray, lengths: np.ndarray, batch: int, batches: int,
                  rank: np.ndarray) -> TableTrace:
    """The first ``batches`` batches of a (ids, lengths) trace of table ``table``; ``rank`` [rows] is the
    training profile's hotness rank of every row (``Profile.rank``)."""
    lengths = np.asarray(lengths[: batch * batches], np.int64)
    n = int(lengths.sum())
    ids = np.asarray(ids[:n], np.int64)
    uniq, pos = np.unique(ids, return_inverse=True)
    per_batch = lengths.reshape(batches, batch).sum(1)
    sample = np.repeat(np.tile(np.arange(batch, dtype=np.int32), batches), lengths)
    return TableTrace(table, int(dim), batch, uniq, np.asarray(rank)[uniq], pos.astype(np.int32), sample,
                      np.concatenate([[0], np.cumsum(per_batch)]))


# ------------------------------------------------------------------------------------------ layout
@dataclass
class _Part:
    """One table's lookups in one batch, on one tier: local row indices and per-sample bag offsets."""

    idx: torch.Tensor | np.ndarray
    offsets: torch.Tensor
    n: int


@dataclass
class DeviceShard:
    """The tables one device (GPU of the plan) holds, its two tiers, and its lookups per batch."""

    gpu: int
    tables: list[int]
    dims: dict[int, int]
    fast: torch.Tensor                         # 1-D float32 on the device: the HBM rows of all its tables
    fast_rows: dict[int, np.ndarray]           # table -> global row ids in the fast tier, in tensor order
    slow_rows: dict[int, np.ndarray]           # table -> global row ids in the slow tier, in tier order
    slow: np.ndarray | torch.Tensor | None     # 1-D float32: np.memmap (file) or a host tensor
    path: str | None                           # the slow tier's file (memmap)
    fast_at: dict[int, int] = field(default_factory=dict)  # table -> element offset in ``fast``
    slow_at: dict[int, int] = field(default_factory=dict)  # table -> element offset in ``slow``
    batches: list[dict[int, tuple[_Part, _Part]]] = field(default_factory=list)
    staging: torch.Tensor | None = None        # slow rows gathered here (pinned on CUDA)
    staging_at: list[dict[int, int]] = field(default_factory=list)  # batch -> table -> element offset
    positions: torch.Tensor | None = None      # 0..max slow lookups, on the device (identity indices)

    def fast_view(self, j: int) -> torch.Tensor:
        n, d = len(self.fast_rows[j]), self.dims[j]
        return self.fast[self.fast_at[j]: self.fast_at[j] + n * d].view(n, d)

    def slow_view(self, j: int):
        n, d = len(self.slow_rows[j]), self.dims[j]
        return self.slow[self.slow_at[j]: self.slow_at[j] + n * d].reshape(n, d)


class ShardedLookup:
    """A plan's embedding tables laid out over its devices' fast and slow tiers, for the sampled
    batches of ``traces``; ``lookup(b, d)`` runs device d's lookups of batch b for real."""

    def __init__(self, plan: Plan, traces: dict[int, TableTrace], gpus: int, *, seed: int, device: str = "cpu",
                 slow_tier: SlowTier = "memmap", workdir: str | os.PathLike | None = None, name: str = "plan",
                 values: dict[int, np.ndarray] | None = None):
        if slow_tier == "memmap" and workdir is None:
            raise ValueError("the memmap slow tier needs a workdir for its files")
        self.device, self.slow_tier, self.gpus = device, slow_tier, gpus
        self.cuda = device.startswith("cuda")
        self.batch = next(iter(traces.values())).batch
        self.num_batches = next(iter(traces.values())).batches
        self.hot = {j: tr.rank < plan.hot_rows[j] for j, tr in traces.items()}  # per touched row: in HBM?
        self.shards: list[DeviceShard] = []
        for d in range(gpus):
            tables = [j for j in sorted(traces) if plan.gpu[j] == d]
            dims = {j: traces[j].dim for j in tables}
            fast_rows = {j: traces[j].ids[self.hot[j]] for j in tables}
            slow_rows = {j: traces[j].ids[~self.hot[j]] for j in tables}
            fast_at, slow_at = _offsets(fast_rows, dims), _offsets(slow_rows, dims)
            n_fast = sum(len(fast_rows[j]) * dims[j] for j in tables)
            n_slow = sum(len(slow_rows[j]) * dims[j] for j in tables)
            fast = torch.empty(n_fast, dtype=torch.float32)
            path, slow = None, None
            if slow_tier == "memmap":
                path = str(Path(workdir) / f"{name}-gpu{d}.f32")
                slow = np.memmap(path, np.float32, "w+", shape=(max(n_slow, 1),))
            else:
                slow = torch.empty(max(n_slow, 1), dtype=torch.float32)
            for j in tables:
                vals = values[j] if values is not None else row_values(seed, j, traces[j].ids, dims[j])
                f, s = vals[self.hot[j]], vals[~self.hot[j]]
                fast[fast_at[j]: fast_at[j] + f.size] = torch.from_numpy(np.ascontiguousarray(f).reshape(-1))
                if s.size:
                    target = slow[slow_at[j]: slow_at[j] + s.size]
                    target[:] = s.reshape(-1) if slow_tier == "memmap" else torch.from_numpy(np.ascontiguousarray(s).reshape(-1))
            if slow_tier == "memmap":
                slow.flush()
                del slow
                slow = np.memmap(path, np.float32, "r", shape=(max(n_slow, 1),))  # read-only from here on
            elif self.cuda:
                slow = slow.pin_memory()
            self.shards.append(DeviceShard(d, tables, dims, fast.to(device), fast_rows, slow_rows, slow, path,
                                           fast_at, slow_at))
        self._index(traces)

    def _index(self, traces: dict[int, TableTrace]) -> None:
        """Per device, batch and table: the fast and slow lookups as local indices and bag offsets (not timed)."""
        dev = self.device
        for sh in self.shards:
            most = 0
            # each touched row's index within its own tier
            local_of = {j: np.where(self.hot[j], np.cumsum(self.hot[j]) - 1, np.cumsum(~self.hot[j]) - 1).astype(np.int32)
                        for j in sh.tables}
            for b in range(self.num_batches):
                parts, at, used = {}, {}, 0
                for j in sh.tables:
                    tr = traces[j]
                    lo, hi = tr.bounds[b], tr.bounds[b + 1]
                    pos, sample = tr.pos[lo:hi], tr.sample[lo:hi]
                    local, is_fast = local_of[j][pos], self.hot[j][pos]
                    fast_idx, slow_idx = local[is_fast], local[~is_fast]
                    fast = _Part(torch.from_numpy(fast_idx).to(dev), _bag_offsets(sample[is_fast], self.batch, dev),
                                 len(fast_idx))
                    slow_idx_host = slow_idx if self.slow_tier == "memmap" else torch.from_numpy(slow_idx)
                    slow = _Part(slow_idx_host, _bag_offsets(sample[~is_fast], self.batch, dev), len(slow_idx))
                    parts[j], at[j] = (fast, slow), used
                    used += len(slow_idx) * sh.dims[j]
                    most = max(most, len(slow_idx))
                sh.batches.append(parts)
                sh.staging_at.append(at)
                sh.staging = sh.staging if sh.staging is not None and sh.staging.numel() >= used else \
                    torch.empty(max(used, 1), dtype=torch.float32)
            if self.cuda:
                sh.staging = sh.staging.pin_memory()
            sh.positions = torch.arange(max(most, 1), dtype=torch.int32, device=dev)

    # ----------------------------------------------------------------------------------- the lookup
    def lookup(self, b: int, d: int) -> dict[int, torch.Tensor]:
        """Device d's sum-pooled lookups of batch b: table -> [batch, dim] on the device. This is the
        code that is timed."""
        sh = self.shards[d]
        out = {}
        if self.cuda:  # the staging buffer is reused: no copy out of it may still be in flight
            torch.cuda.current_stream().synchronize()
        staging = sh.staging
        host = staging.numpy()
        for j in sh.tables:
            fast, slow = sh.batches[b][j]
            dim = sh.dims[j]
            pooled = F.embedding_bag(fast.idx, sh.fast_view(j), fast.offsets, mode="sum")
            if slow.n:
                at = sh.staging_at[b][j]
                if self.slow_tier == "memmap":  # read the mapped file's rows
                    np.take(sh.slow_view(j), slow.idx, axis=0, out=host[at: at + slow.n * dim].reshape(slow.n, dim),
                            mode="clip")
                else:
                    torch.index_select(sh.slow_view(j), 0, slow.idx, out=staging[at: at + slow.n * dim].view(slow.n, dim))
                rows = staging[at: at + slow.n * dim].view(slow.n, dim)
                if self.cuda:
                    rows = rows.to(self.device, non_blocking=True)
                pooled = pooled + F.embedding_bag(sh.positions[: slow.n], rows, slow.offsets, mode="sum")
            out[j] = pooled
        return out

    def time_batch(self, b: int) -> np.ndarray:
        """Seconds each device spends on its lookups of batch b, devices run one after another: [gpus]."""
        out = np.zeros(self.gpus)
        for d in range(self.gpus):
            if self.cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            self.lookup(b, d)
            if self.cuda:
                torch.cuda.synchronize()
            out[d] = time.perf_counter() - t0
        return out

    def time_all(self) -> np.ndarray:
        """Seconds per batch and device over all sampled batches: [batches, gpus]."""
        return np.stack([self.time_batch(b) for b in range(self.num_batches)])

    # ---------------------------------------------------------------------------------- what it holds
    def slow_accesses(self) -> int:
        return sum(s.n for sh in self.shards for parts in sh.batches for _, s in parts.values())

    def fast_accesses(self) -> int:
        return sum(f.n for sh in self.shards for parts in sh.batches for f, _ in parts.values())

    def tier_bytes(self) -> tuple[int, int]:
        """Bytes materialized in the fast and in the slow tier, over all devices."""
        fast = sum(len(r) * sh.dims[j] * 4 for sh in self.shards for j, r in sh.fast_rows.items())
        slow = sum(len(r) * sh.dims[j] * 4 for sh in self.shards for j, r in sh.slow_rows.items())
        return fast, slow

    def close(self) -> None:
        """Unmap and delete the slow tier's files."""
        for sh in self.shards:
            sh.slow = None
            if sh.path and os.path.exists(sh.path):
                os.remove(sh.path)


def _offsets(rows: dict[int, np.ndarray], dims: dict[int, int]) -> dict[int, int]:
    at, out = 0, {}
    for j, r in rows.items():
        out[j], at = at, at + len(r) * dims[j]
    return out


def _bag_offsets(sample: np.ndarray, batch: int, device: str) -> torch.Tensor:
    """EmbeddingBag offsets (int32, as the indices) of one bag per sample from the (sorted) sample of
    each lookup."""
    counts = np.bincount(sample, minlength=batch)
    return torch.from_numpy(np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)).to(device)


def samples_per_s(times: np.ndarray, batch: int) -> tuple[float, float]:
    """From measured seconds [batches, gpus]: (samples / sum over batches of the slowest device's time
    -- devices run concurrently, as GPUs do --, samples / the total time of all devices one after
    another)."""
    samples = batch * times.shape[0]
    return samples / float(times.max(1).sum()), samples / float(times.sum())


def describe(device: str, slow_tier: SlowTier, workdir: str | None) -> str:
    where = "GPU memory" if device.startswith("cuda") else "host memory"
    if slow_tier == "memmap":
        slow = (f"a read-only np.memmap of a file per device in {workdir} (just written, so normally served from the "
                "OS page cache; no cache is dropped), read with np.take fancy indexing into a "
                + ("pinned staging buffer, then copied to the GPU" if device.startswith("cuda") else "staging buffer"))
    else:
        slow = "a host tensor " + ("(pinned) gathered with index_select, then copied to the GPU"
                                   if device.startswith("cuda") else "gathered with index_select")
    return (f"fast tier: one float32 tensor per device in {where} ({device}), sum-pooled with EmbeddingBag; slow "
            f"tier: {slow}, then pooled")


def measure_plans(plans: dict[str, Plan], traces: dict[int, TableTrace], gpus: int, *, seed: int, device: str,
                  slow_tier: SlowTier, workdir: str | os.PathLike | None, repeats: int) -> dict[str, dict]:
    """Lay out every plan (the rows' values generated once, shared), run one untimed pass of each, then
    time each plan's lookups of all sampled batches ``repeats`` times, plans interleaved (the order
    rotated every repeat). Returns per plan: ``times`` (one [batches, gpus] array of seconds per
    repeat) and what it held: fast/slow accesses and bytes. The slow tier's files are deleted."""
    values = {j: row_values(seed, j, tr.ids, tr.dim) for j, tr in traces.items()}
    built: dict[str, ShardedLookup] = {}
    try:
        for name, plan in plans.items():
            built[name] = ShardedLookup(plan, traces, gpus, seed=seed, device=device, slow_tier=slow_tier,
                                        workdir=workdir, name=name, values=values)
        del values
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # one core per worker: the other worker process keeps the second
        try:
            for lk in built.values():
                lk.time_all()  # warm-up: faults the mapped pages in, warms the allocator
            names = list(built)
            times: dict[str, list[np.ndarray]] = {n: [] for n in names}
            for r in range(repeats):
                k = r % len(names)
                for n in names[k:] + names[:k]:
                    times[n].append(built[n].time_all())
        finally:
            torch.set_num_threads(threads)
        out = {}
        for n, lk in built.items():
            fast_b, slow_b = lk.tier_bytes()
            out[n] = {"times": times[n], "fast_accesses": lk.fast_accesses(), "slow_accesses": lk.slow_accesses(),
                      "fast_bytes": fast_b, "slow_bytes": slow_b}
        return out
    finally:
        for lk in built.values():
            lk.close()
