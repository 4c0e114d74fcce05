"""A string-key learned index with per-group linear models, delta buffers and background retraining (pure).

Layout (SIndex-like): the sorted keys are cut into groups of consecutive keys; a group covers the key
range from its pivot (its first key at build time) to the next group's pivot. Each group holds

* its sorted main array (keys and values) and a linear model over the characters after the group's
  common prefix (the prefix every key in its range shares), trained by QR (:mod:`.train`), with an
  error bound: a lookup predicts a position and binary-searches only ``[pos - err, pos + err]``;
* a sorted delta buffer that takes inserts and is searched on every lookup that misses the main array;
* while a retrain is in flight, a frozen buffer (the inserts being merged) searched as well.

When a group's buffer reaches ``threshold`` keys and no retrain of that group is in flight, the buffer
is frozen, merged with the main array, and the retrain is submitted (to the FPGA board's queue, or
run inline). The host keeps serving meanwhile and installs the new array and model when the retrain
completes. A buffer that reaches ``cap`` keys while its group's retrain is still in flight stalls the
insert until that retrain completes (write back-pressure): slow retrains cost throughput through
stalls and through larger buffers (bigger merges).
"""
from __future__ import annotations

import bisect
import concurrent.futures
import importlib
import time
from dataclasses import dataclass, field
from operator import mul
from typing import Any, Callable

import numpy as np

from mlsys_flows.devices.fpga import build_image

from . import train

KERNELS = {"full_retrain": "mlsys_flows.systems.sia.train:retrain_full",
           "sia": "mlsys_flows.systems.sia.train:retrain_sia"}


def image() -> bytes:
    """The retrain accelerator's image: its manifest declares the kernels the board may run."""
    return build_image([*KERNELS.values(), *(f"{k}_shared" for k in KERNELS.values()),
                        "mlsys_flows.systems.sia.train:warm_up"])


Submit = Callable[..., concurrent.futures.Future]


def inline_submit(kernel: str, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
    """Run ``kernel`` here and now (the host does the retrain itself); an already-completed Future."""
    module, _, name = kernel.partition(":")
    fut: concurrent.futures.Future = concurrent.futures.Future()
    try:
        fut.set_result(getattr(importlib.import_module(module), name)(*args, **kwargs))
    except BaseException as e:  # noqa: BLE001 - surfaces at install time, like a device error
        fut.set_exception(e)
    return fut


def common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Group:
    pivot: bytes
    offset: int                  # common prefix length of the group's key range: features start here
    lam: float                   # ridge weight, fixed at build time
    nf: int                      # feature characters (n_feat, or fewer where the key width ends first)
    arr: np.ndarray              # main keys, fixed-width bytes, sorted
    varr: np.ndarray             # their values
    w: np.ndarray                # model weights (n_feat characters, then the bias)
    err: int                     # error bound of the main array (+1 for host float rounding)
    r: np.ndarray                # R of the last training (SIA's memo)
    keys: list = field(default_factory=list)
    vals: list = field(default_factory=list)
    wl: list = field(default_factory=list)     # weights / 256 as floats, for host-side prediction
    bias: float = 0.0
    buf_k: list = field(default_factory=list)
    buf_v: list = field(default_factory=list)
    frz_k: list = field(default_factory=list)
    frz_v: list = field(default_factory=list)
    pending: Any = None          # (future, merged keys, merged values, submitted at)

    def set_model(self, w: np.ndarray, err: int, r: np.ndarray) -> None:
        self.w, self.err, self.r = w, int(err) + 1, r
        self.wl = [float(x) / 256.0 for x in w[:-1]]
        self.bias = float(w[-1])
        self.keys, self.vals = self.arr.tolist(), self.varr.tolist()

    def uint8(self) -> np.ndarray:
        return self.arr.view(np.uint8).reshape(len(self.arr), self.arr.dtype.itemsize)


class LearnedIndex:
    """Groups of ``group_size`` keys built from ``keys`` (fixed-width bytes) and ``values``; every
    group trained by a full QR (the starting state both retraining schemes share)."""

    def __init__(self, keys: np.ndarray, values: np.ndarray, group_size: int, n_feat: int, ridge: float):
        order = np.argsort(keys, kind="stable")
        keys, values = keys[order], np.asarray(values, dtype=np.int64)[order]
        if len(keys) and np.any(keys[1:] == keys[:-1]):
            raise ValueError("keys must be distinct")
        self.dtype, self.n_feat, self.ridge = keys.dtype, n_feat, ridge
        starts = list(range(0, len(keys), group_size)) or [0]
        self.groups: list[Group] = []
        for j, s in enumerate(starts):
            e = starts[j + 1] if j + 1 < len(starts) else len(keys)
            hi = keys[e] if e < len(keys) else keys[e - 1]
            offset = common_prefix(bytes(keys[s]), bytes(hi)) if e > s else 0
            lam = ridge * max(e - s, 1)
            nf = max(1, min(n_feat, keys.dtype.itemsize - offset))
            arr, varr = keys[s:e].copy(), values[s:e].copy()
            g = Group(pivot=bytes(keys[s]) if e > s else b"", offset=offset, lam=lam, nf=nf, arr=arr, varr=varr,
                      w=np.zeros(nf + 1), err=0, r=train.ridge_rows(nf + 1, lam))
            out = train.retrain_full(g.uint8(), offset, nf, lam)
            g.set_model(out["w"], out["err"], out["r"])
            self.groups.append(g)
        self.pivots = [g.pivot for g in self.groups]

    def group_of(self, key: bytes) -> Group:
        return self.groups[max(bisect.bisect_right(self.pivots, key) - 1, 0)]

    def lookup(self, key: bytes):
        """The value of ``key``, or None: the model's window of the main array, then the buffers."""
        g = self.groups[max(bisect.bisect_right(self.pivots, key) - 1, 0)]
        keys = g.keys
        m = len(keys)
        if m:
            o = g.offset
            pos = int(g.bias + sum(map(mul, g.wl, key[o:o + g.nf])) + 0.5)
            pos = 0 if pos < 0 else (m - 1 if pos >= m else pos)
            lo, hi = max(pos - g.err, 0), min(pos + g.err + 1, m)
            i = bisect.bisect_left(keys, key, lo, hi)
            if i < hi and keys[i] == key:
                return g.vals[i]
        for bk, bv in ((g.buf_k, g.buf_v), (g.frz_k, g.frz_v)):
            if bk:
                i = bisect.bisect_left(bk, key)
                if i < len(bk) and bk[i] == key:
                    return bv[i]
        return None

    def all_items(self) -> tuple[list, list]:
        ks, vs = [], []
        for g in self.groups:
            pairs = sorted(zip(g.keys + g.frz_k + g.buf_k, g.vals + g.frz_v + g.buf_v))
            ks += [k for k, _ in pairs]
            vs += [v for _, v in pairs]
        return ks, vs


@dataclass
class RunStats:
    ops: int = 0
    elapsed_s: float = 0.0
    lookup_ns: list = field(default_factory=list)
    misses: int = 0
    retrains: int = 0
    kernel_s: list = field(default_factory=list)       # each retrain's compute time, measured in the kernel
    turnaround_s: list = field(default_factory=list)   # submit -> result seen by the host
    qr_rows: int = 0                                   # rows factorised by QR, all retrains
    stalls: int = 0
    stall_s: float = 0.0       # inserts waiting for their group's in-flight retrain (back-pressure)
    submit_bytes: int = 0      # bytes of array arguments submitted (merged group, new keys, R)
    merged_rows: int = 0       # rows of the merged groups submitted (each retrain's A^T y and error-bound pass)
    submit_s: float = 0.0      # the host blocked inside a submission (copying the arguments to shared memory
                               # and writing to the board's pipe; inline: the whole retrain), counted as stall

    def summary(self) -> dict:
        lat = np.asarray(self.lookup_ns, dtype=np.float64) / 1e3
        return {"ops_per_s": self.ops / self.elapsed_s if self.elapsed_s else 0.0,
                "lookup_p50_us": float(np.percentile(lat, 50)) if len(lat) else 0.0,
                "lookup_p99_us": float(np.percentile(lat, 99)) if len(lat) else 0.0,
                "retrain_ms": float(np.median(self.kernel_s)) * 1e3 if self.kernel_s else 0.0,
                "retrain_turnaround_ms": float(np.median(self.turnaround_s)) * 1e3 if self.turnaround_s else 0.0,
                "retrains": float(self.retrains), "qr_rows": float(self.qr_rows), "stalls": float(self.stalls),
                "stall_share": (self.stall_s + self.submit_s) / self.elapsed_s if self.elapsed_s else 0.0,
                "submit_share": self.submit_s / self.elapsed_s if self.elapsed_s else 0.0,
                "submit_mb": self.submit_bytes / 1e6, "merged_rows": float(self.merged_rows),
                "misses": float(self.misses)}


class Server:
    """Serves an operation stream on ``index``; retrains with ``scheme`` ('full_retrain' or 'sia')
    through ``submit`` (a board's ``run_async`` wrapped by :class:`.shared.SharedSubmit`, or
    :func:`inline_submit`)."""

    def __init__(self, index: LearnedIndex, scheme: str, submit: Submit, threshold: int, cap: int,
                 poll_every: int = 16):
        if scheme not in KERNELS:
            raise ValueError(f"unknown retraining scheme {scheme!r}")
        if cap < threshold:
            raise ValueError("cap must be >= threshold")
        self.index, self.scheme, self.submit = index, scheme, submit
        self.threshold, self.cap, self.poll_every = threshold, cap, poll_every
        self.inflight: list[Group] = []
        self.stats = RunStats()

    # --- retraining ---------------------------------------------------------------------------
    def _trigger(self, g: Group) -> None:
        g.frz_k, g.frz_v, g.buf_k, g.buf_v = g.buf_k, g.buf_v, [], []
        new = np.array(g.frz_k, dtype=g.arr.dtype)
        idx = np.searchsorted(g.arr, new)
        merged = np.insert(g.arr, idx, new)
        mvals = np.insert(g.varr, idx, np.asarray(g.frz_v, dtype=np.int64))
        width = merged.dtype.itemsize
        u = merged.view(np.uint8).reshape(len(merged), width)
        nf = g.nf
        t0 = time.perf_counter()
        if self.scheme == "sia":
            fut = self.submit(KERNELS["sia"], u, new.view(np.uint8).reshape(len(new), width), g.r, g.offset, nf, g.lam)
        else:
            fut = self.submit(KERNELS["full_retrain"], u, g.offset, nf, g.lam)
        self.stats.submit_s += time.perf_counter() - t0
        self.stats.submit_bytes += u.nbytes + (new.nbytes + g.r.nbytes if self.scheme == "sia" else 0)
        self.stats.merged_rows += len(merged)
        g.pending = (fut, merged, mvals, time.perf_counter())
        self.inflight.append(g)

    def _install(self, g: Group) -> None:
        fut, merged, mvals, t0 = g.pending
        out = fut.result()
        st = self.stats
        st.turnaround_s.append(time.perf_counter() - t0)
        st.kernel_s.append(out["kernel_s"])
        st.qr_rows += int(out["qr_rows"])
        st.retrains += 1
        g.arr, g.varr = merged, mvals
        g.set_model(out["w"], out["err"], out["r"])
        g.frz_k, g.frz_v, g.pending = [], [], None
        self.inflight.remove(g)

    def poll(self) -> None:
        for g in [g for g in self.inflight if g.pending[0].done()]:
            self._install(g)
            if len(g.buf_k) >= self.threshold:
                self._trigger(g)

    def drain(self) -> None:
        while self.inflight:
            g = self.inflight[0]
            g.pending[0].result()
            self._install(g)

    # --- operations ---------------------------------------------------------------------------
    def insert(self, key: bytes, value: int) -> None:
        g = self.index.group_of(key)
        i = bisect.bisect_left(g.buf_k, key)
        g.buf_k.insert(i, key)
        g.buf_v.insert(i, value)
        n = len(g.buf_k)
        if n >= self.threshold:
            if g.pending is None:
                self._trigger(g)
            elif n >= self.cap:  # back-pressure: wait for this group's retrain, then start the next
                t0 = time.perf_counter()
                g.pending[0].result()
                self._install(g)
                self.stats.stalls += 1
                self.stats.stall_s += time.perf_counter() - t0
                self._trigger(g)  # its submission is counted in submit_s

    def run(self, keys: list, is_insert: list, target: list) -> RunStats:
        """Serve the operations (keys as a list of bytes, per-op insert flags and key indexes) and
        time them; in-flight retrains are drained after the clock stops."""
        st = self.stats
        lookup, insert, poll, every = self.index.lookup, self.insert, self.poll, self.poll_every
        lat = st.lookup_ns
        clock = time.perf_counter_ns
        misses = 0
        t0 = time.perf_counter()
        for i, (ins, t) in enumerate(zip(is_insert, target)):
            if i % every == 0 and self.inflight:
                poll()
            if ins:
                insert(keys[t], t)
            else:
                s = clock()
                v = lookup(keys[t])
                lat.append(clock() - s)
                if v != t:
                    misses += 1
        st.elapsed_s = time.perf_counter() - t0
        st.ops += len(target)
        st.misses += misses
        self.drain()
        return st
