"""The index structures a user would pick instead of a learned string index, served on the same
operation stream (pure): a sorted container (``sortedcontainers.SortedDict``), a B-tree
(``BTrees.OOBTree``, ZODB's C B-tree) and a published learned index, the PGM-index (``pygm``, the
authors' C++ PGM-index behind a Python API).

None is tuned on the evaluated stream: the containers have no knobs that matter here; the PGM-index
keeps its package default ``epsilon`` and a delta buffer of ``pgm_buffer`` keys fixed in the
parameters.

PyGM indexes numbers, and its lists are static (adding keys builds a new index). So string keys are
mapped to an order-preserving 64-bit number: the 8 bytes after the loaded keys' common prefix,
big-endian, zero padded, at most 2^64-2 (a key outside that prefix maps to 0 or 2^64-2); keys that share the number
form a run the PGM-index locates (``bisect_left``/``bisect_right``), and a binary search over the
sorted key list inside that run finishes the lookup. Inserts go to a sorted delta buffer
(``SortedDict``) searched after the main array; when it holds ``pgm_buffer`` keys it is merged into
the main array and the PGM-index is rebuilt, inline (``rebuilds``, counted).
"""
from __future__ import annotations

import bisect
import time

import numpy as np

from .index import RunStats, common_prefix

INDEXES = ("sorteddict", "btree", "pgm")
# PGM-index keeps the largest 64-bit value as its sentinel (a key equal to it fails the build): numbers
# are clamped one below, which keeps their order (ties are resolved by the key search)
TOP = (1 << 64) - 2
REQUIREMENTS = {"sorteddict": "sortedcontainers>=2", "btree": "BTrees>=6", "pgm": "pygm>=1.0"}


def _need(name: str):
    try:
        if name == "sorteddict":
            from sortedcontainers import SortedDict
            return SortedDict
        if name == "btree":
            from BTrees.OOBTree import OOBTree
            return OOBTree
        import pygm
        return pygm.SortedList
    except ImportError as e:
        raise ImportError(f"the {name!r} baseline needs the package {REQUIREMENTS[name]!r} ({e})") from None


class SortedDictIndex:
    """``sortedcontainers.SortedDict``: a hash map for point lookups plus a sorted key list (B+-tree-like
    list of lists) kept in order on every insert, as a user of an ordered map gets."""

    def __init__(self, keys: list, values: list):
        self.d = _need("sorteddict")(zip(keys, values))
        self.lookup, self.insert = self.d.get, self.d.__setitem__


class BTreeIndex:
    """``BTrees.OOBTree.OOBTree``: a C B-tree of Python objects (bytes keys, int values)."""

    def __init__(self, keys: list, values: list):
        self.t = _need("btree")()
        self.t.update(dict(zip(keys, values)))
        self.lookup, self.insert = self.t.get, self.t.__setitem__


class PgmIndex:
    """The PGM-index over the keys' 64-bit prefix numbers, with a sorted delta buffer (module docstring)."""

    def __init__(self, keys: np.ndarray, values: np.ndarray, buffer: int):
        if buffer < 1:
            raise ValueError(f"pgm_buffer must be >= 1 (got {buffer})")
        self._sorted_list, self._dict = _need("pgm"), _need("sorteddict")
        order = np.argsort(keys, kind="stable")
        self.arr, self.varr = keys[order], np.asarray(values, dtype=np.int64)[order]
        lo, hi = bytes(self.arr[0]), bytes(self.arr[-1])
        self.off = common_prefix(lo, hi)
        self.prefix = lo[: self.off]
        self.buffer_keys = buffer
        self.buf = self._dict()
        self.rebuilds = 0
        self._build()

    def number(self, key: bytes) -> int:
        o = self.off
        if key[:o] != self.prefix:
            return 0 if key < self.prefix else TOP
        return min(int.from_bytes(key[o:o + 8].ljust(8, b"\0"), "big"), TOP)

    def _numbers(self, arr: np.ndarray) -> np.ndarray:
        width = arr.dtype.itemsize
        u8 = arr.view(np.uint8).reshape(len(arr), width)
        take = np.zeros((len(arr), 8), np.uint8)
        n = max(0, min(8, width - self.off))
        take[:, :n] = u8[:, self.off:self.off + n]
        nums = np.minimum(take.view(">u8").ravel().astype(np.uint64), np.uint64(TOP))
        if self.off:  # keys outside the common prefix (inserted later) clamp to the ends, keeping order
            pre = np.frombuffer(self.prefix, np.uint8)
            outside = np.any(u8[:, : self.off] != pre, axis=1)
            if outside.any():
                below = arr[outside] < np.bytes_(self.prefix)
                nums[np.flatnonzero(outside)] = np.where(below, np.uint64(0), np.uint64(TOP))
        return nums

    def _build(self) -> None:
        self.pgm = self._sorted_list(self._numbers(self.arr), typecode="Q")
        self.keys, self.vals = self.arr.tolist(), self.varr.tolist()
        self.rebuilds += 1

    def lookup(self, key: bytes):
        x = self.number(key)
        pgm, keys = self.pgm, self.keys
        lo, hi = pgm.bisect_left(x), pgm.bisect_right(x)
        if lo < hi:
            i = bisect.bisect_left(keys, key, lo, hi)
            if i < hi and keys[i] == key:
                return self.vals[i]
        return self.buf.get(key)

    def insert(self, key: bytes, value: int) -> None:
        self.buf[key] = value
        if len(self.buf) >= self.buffer_keys:
            self.merge()

    def merge(self) -> None:
        """Fold the delta buffer into the main array and rebuild the PGM-index."""
        if not self.buf:
            return
        new = np.array(list(self.buf.keys()), dtype=self.arr.dtype)
        idx = np.searchsorted(self.arr, new)
        self.arr = np.insert(self.arr, idx, new)
        self.varr = np.insert(self.varr, idx, np.fromiter(self.buf.values(), np.int64, len(new)))
        self.buf = self._dict()
        self._build()


class DictFloor:
    """Not a baseline: a Python ``dict`` (a hash map, no order) driven by :func:`serve`, the cheapest C
    lookup and insert a Python loop can call. Its ops/s bounds what any index served through that
    loop can reach; the learned index's loop is compiled and does not pay it (issue 50)."""

    def __init__(self, keys: list, values: list):
        self.d = dict(zip(keys, values))
        self.lookup, self.insert = self.d.get, self.d.__setitem__


def build(name: str, keys: np.ndarray, values: np.ndarray, pgm_buffer: int):
    """The baseline index ``name`` loaded with ``keys`` (fixed-width bytes) and ``values``."""
    if name == "pgm":
        return PgmIndex(keys, values, pgm_buffer)
    if name not in INDEXES:
        raise ValueError(f"unknown baseline index {name!r}; known: {', '.join(INDEXES)}")
    cls = SortedDictIndex if name == "sorteddict" else BTreeIndex
    return cls(keys.tolist(), np.asarray(values).tolist())


def serve(index, keys: list, is_insert: list, target: list) -> RunStats:
    """Serve the stream on ``index`` (``lookup``/``insert``), timed like :meth:`.index.Server.run`."""
    st = RunStats()
    lookup, insert, lat = index.lookup, index.insert, st.lookup_ns
    clock = time.perf_counter_ns
    misses = 0
    t0 = time.perf_counter()
    for ins, t in zip(is_insert, target):
        if ins:
            insert(keys[t], t)
        else:
            s = clock()
            v = lookup(keys[t])
            lat.append(clock() - s)
            if v != t:
                misses += 1
    st.elapsed_s = time.perf_counter() - t0
    st.ops, st.misses = len(target), misses
    return st
