"""String keys and read/insert operation streams (pure numpy).

* ``ycsb``: YCSB's key format, ``"user"`` followed by the decimal digits of a 64-bit hash (FNV-1a of
  the record number, as YCSB's ``hashed`` insert order does), so lengths vary (up to 24 bytes).
* ``twitter``: keys shaped like the Twitter cache traces' (Yang et al., OSDI 2020): a namespace, an
  entity type, a numeric id with a skewed (Zipf-like) length and a field, joined by ``:``.

An operation stream has a fixed read share: each insert adds a key not in the index; each read asks
for a key inserted before it (loaded or inserted earlier), uniformly, so every read hits.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WORKLOADS = ("ycsb", "twitter")
KEY_WIDTH = {"ycsb": 24, "twitter": 40}

_FNV_OFFSET, _FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3
_NAMESPACES = (b"tw", b"tl", b"ads", b"graph", b"media")
_ENTITIES = (b"user", b"tweet", b"timeline", b"list", b"dm")
_FIELDS = (b"profile", b"counts", b"meta", b"v2", b"flags", b"geo")


def fnv1a64(values: np.ndarray) -> np.ndarray:
    """YCSB's ``fnvhash64`` of each record number (over its 8 little-endian bytes), as uint64."""
    values = np.asarray(values, dtype=np.uint64)
    h = np.full(values.shape, _FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(8):
            octet = (values >> np.uint64(8 * i)) & np.uint64(0xFF)
            h = (h ^ octet) * np.uint64(_FNV_PRIME)
    return h


def _ycsb(count: int, rng: np.random.Generator) -> list[bytes]:
    ids = rng.choice(np.uint64(1) << np.uint64(40), size=count, replace=False).astype(np.uint64)
    # YCSB drops the sign bit of the hash (Math.abs of a long); keep 63 bits
    h = fnv1a64(ids) & np.uint64((1 << 63) - 1)
    return [b"user%d" % int(x) for x in h]


def _twitter(count: int, rng: np.random.Generator) -> list[bytes]:
    ns = rng.choice(len(_NAMESPACES), size=count, p=[0.4, 0.25, 0.15, 0.12, 0.08])
    ent = rng.choice(len(_ENTITIES), size=count, p=[0.35, 0.3, 0.15, 0.12, 0.08])
    field = rng.integers(0, len(_FIELDS), size=count)
    digits = np.minimum(6 + rng.zipf(1.6, size=count), 19)  # most ids short, a long tail of long ones
    ids = (rng.random(count) * 10.0 ** digits).astype(np.uint64)
    return [b"%s:%s:%d:%s" % (_NAMESPACES[a], _ENTITIES[b], int(c), _FIELDS[d])
            for a, b, c, d in zip(ns, ent, ids, field)]


def make_keys(workload: str, count: int, seed: int) -> np.ndarray:
    """``count`` distinct keys of ``workload`` in random order, as a fixed-width bytes array."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")
    rng = np.random.default_rng([seed, WORKLOADS.index(workload)])
    gen = _ycsb if workload == "ycsb" else _twitter
    out: list[bytes] = []
    seen: set[bytes] = set()
    while len(out) < count:
        for k in gen(int((count - len(out)) * 1.1) + 16, rng):
            if k not in seen:
                seen.add(k)
                out.append(k)
    keys = np.array(out[:count], dtype=f"S{KEY_WIDTH[workload]}")
    return keys[rng.permutation(count)]


@dataclass
class OpStream:
    """The index is loaded with ``keys[:loaded]``; operation ``i`` inserts ``keys[next]`` when
    ``is_insert[i]``, else reads ``keys[target[i]]``. A key's value is its index in ``keys``."""

    keys: np.ndarray         # fixed-width bytes, loaded keys first, then the inserted ones in order
    loaded: int
    is_insert: np.ndarray    # bool, one per operation
    target: np.ndarray       # int64: the key index each operation reads or inserts

    @property
    def ops(self) -> int:
        return len(self.is_insert)

    @property
    def inserts(self) -> int:
        return int(self.is_insert.sum())


def op_stream(keys: np.ndarray, loaded: int, ops: int, read_share: float, seed: int) -> OpStream:
    """A stream of ``ops`` reads and inserts (reads with probability ``read_share``), uniform reads
    over the keys present at each point."""
    rng = np.random.default_rng([seed, 7])
    is_insert = rng.random(ops) >= read_share
    inserted_before = np.cumsum(is_insert) - is_insert
    if loaded + int(is_insert.sum()) > len(keys):
        raise ValueError(f"{int(is_insert.sum())} inserts need more than the {len(keys) - loaded} spare keys")
    present = loaded + inserted_before
    target = np.where(is_insert, loaded + inserted_before, (rng.random(ops) * present).astype(np.int64))
    return OpStream(keys=keys, loaded=loaded, is_insert=is_insert, target=target.astype(np.int64))
