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

Two serving paths: :class:`Server` (pure Python, the reference) and :class:`CompiledServer` (the loop,
lookups and inserts compiled by :mod:`.compiled`; what the benchmark runs), held to the same results
operation by operation by the tests. Both wait for the retrains still in flight when a stream ends
before their clock stops.
"""
from __future__ import annotations

import bisect
import concurrent.futures
import functools
import importlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from mlsys_flows.devices.fpga import build_image

from . import train

KERNELS = {"full_retrain": "mlsys_flows.systems.sia.train:retrain_full",
           "sia": "mlsys_flows.systems.sia.train:retrain_sia",
           # the mechanism's ablation: SIA's kernel, arguments and solve, with R factorised from scratch
           "sia_nomemo": "mlsys_flows.systems.sia.train:retrain_sia_nomemo"}
# schemes that ship SIA's arguments (the merged group, the new keys, the memoised R)
SIA_ARGS = ("sia", "sia_nomemo")


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

    def set_model(self, w: np.ndarray, err: int, r: np.ndarray, lists: bool = True) -> None:
        """Install a trained model; ``lists``: also the Python lists the reference lookup searches
        (the compiled path searches the arrays and refreshes the lists after its clock stops)."""
        self.w, self.err, self.r = w, int(err) + 1, r
        self.wl = [float(x) / 256.0 for x in w[:-1]]
        self.bias = float(w[-1])
        if lists:
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
            acc = 0.0   # left to right, as the compiled path sums (sum() of floats compensates on 3.12+)
            for w, c in zip(g.wl, key[o:o + g.nf]):
                acc += w * c
            pos = int(g.bias + acc + 0.5)
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
    elapsed_s: float = 0.0     # the stream and the retrains it left in flight (waited for inside the clock)
    lookup_ns: Any = field(default_factory=list)
    misses: int = 0
    retrains: int = 0
    kernel_s: list = field(default_factory=list)       # each retrain's compute time, measured in the kernel
    turnaround_s: list = field(default_factory=list)   # submit -> result seen by the host
    qr_rows: int = 0                                   # rows factorised by QR, all retrains
    stalls: int = 0
    stall_s: float = 0.0       # inserts waiting for their group's in-flight retrain (back-pressure), and the
                               # wait for the retrains still in flight when the stream ends (drain_s)
    submit_bytes: int = 0      # bytes of array arguments submitted (merged group, new keys, R)
    merged_rows: int = 0       # rows of the merged groups submitted (each retrain's A^T y and error-bound pass)
    submit_s: float = 0.0      # the host blocked inside a submission (copying the arguments to shared memory
                               # and writing to the board's pipe; inline: the whole retrain), counted as stall
    drain_s: float = 0.0       # the wait, inside the clock, for the retrains in flight when the stream ended
    inflight_at_end: int = 0   # retrains in flight when the stream ended (charged: waited for and installed)

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
                "drain_ms": self.drain_s * 1e3, "inflight_at_end": float(self.inflight_at_end),
                "misses": float(self.misses)}


def submit_retrain(stats: RunStats, scheme: str, submit: Submit, g: Group, merged: np.ndarray,
                   new: np.ndarray) -> concurrent.futures.Future:
    """Submit ``g``'s retrain on ``merged`` (its sorted keys, the ``new`` ones included) with ``scheme``'s
    kernel and arguments; the host's time inside the call is counted (``submit_s``)."""
    width = merged.dtype.itemsize
    u = merged.view(np.uint8).reshape(len(merged), width)
    t0 = time.perf_counter()
    if scheme in SIA_ARGS:
        fut = submit(KERNELS[scheme], u, new.view(np.uint8).reshape(len(new), width), g.r, g.offset, g.nf, g.lam)
    else:
        fut = submit(KERNELS["full_retrain"], u, g.offset, g.nf, g.lam)
    stats.submit_s += time.perf_counter() - t0
    stats.submit_bytes += u.nbytes + (new.nbytes + g.r.nbytes if scheme in SIA_ARGS else 0)
    stats.merged_rows += len(merged)
    return fut


def record_install(stats: RunStats, out: dict, submitted_at: float) -> None:
    stats.turnaround_s.append(time.perf_counter() - submitted_at)
    stats.kernel_s.append(out["kernel_s"])
    stats.qr_rows += int(out["qr_rows"])
    stats.retrains += 1


def _check_server(scheme: str, threshold: int, cap: int) -> None:
    if scheme not in KERNELS:
        raise ValueError(f"unknown retraining scheme {scheme!r}")
    if cap < threshold:
        raise ValueError("cap must be >= threshold")


class Server:
    """The reference (pure Python) serving path: serves an operation stream on ``index``; retrains with
    ``scheme`` ('full_retrain', 'sia' or 'sia_nomemo') through ``submit`` (a board's ``run_async`` wrapped
    by :class:`.shared.SharedSubmit`, or :func:`inline_submit`). The benchmark serves with
    :class:`CompiledServer`, which the tests hold to this one's results operation by operation."""

    def __init__(self, index: LearnedIndex, scheme: str, submit: Submit, threshold: int, cap: int,
                 poll_every: int = 16):
        _check_server(scheme, threshold, cap)
        self.index, self.scheme, self.submit = index, scheme, submit
        self.threshold, self.cap, self.poll_every = threshold, cap, poll_every
        self.inflight: list[Group] = []
        self.stats = RunStats()
        self.results: list = []

    # --- retraining ---------------------------------------------------------------------------
    def _trigger(self, g: Group) -> None:
        g.frz_k, g.frz_v, g.buf_k, g.buf_v = g.buf_k, g.buf_v, [], []
        new = np.array(g.frz_k, dtype=g.arr.dtype)
        idx = np.searchsorted(g.arr, new)
        merged = np.insert(g.arr, idx, new)
        mvals = np.insert(g.varr, idx, np.asarray(g.frz_v, dtype=np.int64))
        fut = submit_retrain(self.stats, self.scheme, self.submit, g, merged, new)
        g.pending = (fut, merged, mvals, time.perf_counter())
        self.inflight.append(g)

    def _install(self, g: Group) -> None:
        fut, merged, mvals, t0 = g.pending
        out = fut.result()
        record_install(self.stats, out, t0)
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

    def run(self, keys: list, is_insert: list, target: list, record: bool = False,
            clock: Callable[[], float] = time.perf_counter) -> RunStats:
        """Serve the operations (keys as a list of bytes, per-op insert flags and key indexes) and
        time them; the retrains still in flight when the stream ends are waited for and installed
        before the clock stops (charged). ``record``: keep each lookup's value in ``results``."""
        st = self.stats
        lookup, insert, poll, every = self.index.lookup, self.insert, self.poll, self.poll_every
        lat = st.lookup_ns
        ns = time.perf_counter_ns
        misses = 0
        results = self.results
        t0 = clock()
        for i, (ins, t) in enumerate(zip(is_insert, target)):
            if i % every == 0 and self.inflight:
                poll()
            if ins:
                insert(keys[t], t)
            else:
                s = ns()
                v = lookup(keys[t])
                lat.append(ns() - s)
                if record:
                    results.append(v)
                if v != t:
                    misses += 1
        _finish(self, st, t0, clock)
        st.ops += len(target)
        st.misses += misses
        return st


def _finish(server, st: RunStats, t0: float, clock: Callable[[], float]) -> None:
    """The stream has ended: wait for the retrains it left in flight, install them, then stop the clock."""
    t1 = clock()
    st.inflight_at_end = len(server.inflight)
    server.drain()
    t2 = clock()
    st.drain_s = t2 - t1
    st.stall_s += st.drain_s
    st.elapsed_s = t2 - t0


class CompiledServer:
    """:class:`Server` with the serving loop, lookups and inserts compiled (:mod:`.compiled`): the
    groups' main arrays, models and delta buffers live in numpy arrays the loop reads; retrains are
    triggered, submitted and installed by the host's Python as in :class:`Server`. After ``run`` the
    index's groups hold the same state as the reference leaves (its ``lookup`` and ``all_items`` work)."""

    def __init__(self, index: LearnedIndex, scheme: str, submit: Submit, threshold: int, cap: int,
                 poll_every: int = 16):
        from numba import typed

        _check_server(scheme, threshold, cap)
        if any(g.pending is not None for g in index.groups):
            raise ValueError("the index has a retrain in flight: serve it with the server that started it")
        self.index, self.scheme, self.submit = index, scheme, submit
        self.threshold, self.cap, self.poll_every = threshold, cap, poll_every
        self.stats = RunStats()
        groups = index.groups
        n_g, width = len(groups), index.dtype.itemsize
        rows = cap + 1
        if 2 * n_g * rows * width > 2 << 30:
            raise ValueError(f"buffer_cap ({cap}) x {n_g} groups x {width}-byte keys needs more than 2 GiB of buffers")
        self.pivots = np.zeros((n_g, width), np.uint8)
        for j, g in enumerate(groups):
            self.pivots[j, :len(g.pivot)] = np.frombuffer(g.pivot, np.uint8)
        self.mk, self.mv = typed.List(), typed.List()
        nf = max(g.nf for g in groups)
        self.wl, self.bias = np.zeros((n_g, nf)), np.zeros(n_g)
        self.offs, self.nfs, self.errs = (np.zeros(n_g, np.int64) for _ in range(3))
        self.bk, self.fk = np.zeros((n_g, rows, width), np.uint8), np.zeros((n_g, rows, width), np.uint8)
        self.bv, self.fv = np.zeros((n_g, rows), np.int64), np.zeros((n_g, rows), np.int64)
        self.bn, self.fn = np.zeros(n_g, np.int64), np.zeros(n_g, np.int64)
        self.pending = np.zeros(n_g, np.int8)
        self.ndone = np.zeros(1, np.int64)     # completed retrains not yet installed (the futures' callbacks)
        self._flag = [False] * n_g
        self._seq = [0] * n_g
        self._lock = threading.Lock()
        self._futs: list = [None] * n_g
        self.inflight: list[int] = []
        for j, g in enumerate(groups):
            self.mk.append(np.ascontiguousarray(g.uint8()))
            self.mv.append(np.ascontiguousarray(g.varr, dtype=np.int64))
            self._model(j, g)
            if len(g.buf_k) > cap or g.frz_k:
                raise ValueError(f"group {j} holds {len(g.buf_k)} buffered keys, more than buffer_cap ({cap})")
            if g.buf_k:
                n = len(g.buf_k)
                self.bk[j, :n] = np.array(g.buf_k, dtype=index.dtype).view(np.uint8).reshape(n, width)
                self.bv[j, :n] = g.buf_v
                self.bn[j] = n
        self.results = np.zeros(0, np.int64)

    def _model(self, j: int, g: Group) -> None:
        self.wl[j, :g.nf] = g.w[:-1] / 256.0
        self.bias[j] = float(g.w[-1])
        self.offs[j], self.nfs[j], self.errs[j] = g.offset, g.nf, g.err

    # --- retraining (the host's Python, once per retrain) --------------------------------------
    def _done(self, j: int, seq: int, _fut) -> None:  # any thread: the board's reader, or here (inline)
        with self._lock:
            if self._seq[j] == seq and self.pending[j] and not self._flag[j]:
                self._flag[j] = True
                self.ndone[0] += 1

    def _trigger(self, j: int) -> None:
        g = self.index.groups[j]
        n = int(self.bn[j])
        self.fk[j, :n], self.fv[j, :n], self.fn[j] = self.bk[j, :n], self.bv[j, :n], n
        self.bn[j] = 0
        new = self.fk[j, :n].copy().view(g.arr.dtype).reshape(n)
        idx = np.searchsorted(g.arr, new)
        merged = np.insert(g.arr, idx, new)
        mvals = np.insert(g.varr, idx, self.fv[j, :n])
        fut = submit_retrain(self.stats, self.scheme, self.submit, g, merged, new)
        self._futs[j] = (fut, merged, mvals, time.perf_counter())
        self.pending[j] = 1
        self.inflight.append(j)
        fut.add_done_callback(functools.partial(self._done, j, self._seq[j]))

    def _install(self, j: int) -> None:
        fut, merged, mvals, t0 = self._futs[j]
        out = fut.result()
        record_install(self.stats, out, t0)
        g = self.index.groups[j]
        g.arr, g.varr = merged, mvals
        g.set_model(out["w"], out["err"], out["r"], lists=False)
        self.mk[j] = merged.view(np.uint8).reshape(len(merged), merged.dtype.itemsize)
        self.mv[j] = mvals
        self._model(j, g)
        with self._lock:
            if self._flag[j]:
                self._flag[j] = False
                self.ndone[0] -= 1
            self._seq[j] += 1
            self.pending[j] = 0
        self.fn[j] = 0
        self._futs[j] = None
        self.inflight.remove(j)

    def poll(self) -> None:
        for j in [j for j in self.inflight if self._futs[j][0].done()]:
            self._install(j)
            if self.bn[j] >= self.threshold:
                self._trigger(j)

    def drain(self) -> None:
        while self.inflight:
            j = self.inflight[0]
            self._futs[j][0].result()
            self._install(j)

    def _stall(self, j: int) -> None:
        t0 = time.perf_counter()
        self._futs[j][0].result()
        self._install(j)
        self.stats.stalls += 1
        self.stats.stall_s += time.perf_counter() - t0
        self._trigger(j)

    # --- operations ---------------------------------------------------------------------------
    def run(self, keys: np.ndarray, is_insert, target, clock: Callable[[], float] = time.perf_counter) -> RunStats:
        """Serve the stream (``keys``: every key as a ``uint8`` row of the index's width; per-op insert
        flags and key indexes) in compiled code, timed like :meth:`Server.run` (the retrains in flight
        when the stream ends are waited for inside the clock). ``results``: each lookup's value
        (``compiled.NOT_FOUND`` when absent; inserts keep ``-2``). The groups' Python lists are
        refreshed after the clock stops."""
        from . import compiled as c

        keys = np.ascontiguousarray(keys, dtype=np.uint8)
        if keys.ndim != 2 or keys.shape[1] != self.pivots.shape[1]:
            raise ValueError(f"keys must be uint8 rows of width {self.pivots.shape[1]} (got shape {keys.shape})")
        is_insert = np.ascontiguousarray(is_insert, dtype=np.bool_)
        target = np.ascontiguousarray(target, dtype=np.int64)
        ops = len(target)
        st = self.stats
        results = np.full(ops, -2, np.int64)
        lat = np.zeros(ops - int(is_insert.sum()), np.int64)
        counters = np.zeros(2, np.int64)
        state = (self.pivots, self.mk, self.mv, self.wl, self.bias, self.offs, self.nfs, self.errs, self.bk, self.bv,
                 self.bn, self.fk, self.fv, self.fn, self.pending, self.ndone, keys, is_insert, target)
        i, skip = 0, -1
        t0 = clock()
        while True:
            i, event, j = c.serve(*state, i, skip, self.poll_every, self.threshold, self.cap, results, lat,
                                  counters)
            skip = -1
            if event == c.DONE:
                break
            if event == c.TRIGGER:
                self._trigger(j)
            elif event == c.STALL:
                self._stall(j)
            else:   # POLL: a retrain completed; install, then serve operation i without polling again
                self.poll()
                skip = i
        _finish(self, st, t0, clock)
        st.ops += ops
        st.misses += int(counters[0])
        st.lookup_ns = lat[: counters[1]]
        self.results = results
        self.sync()
        return st

    def sync(self) -> None:
        """Write the compiled state back into the index's groups (main lists, buffers)."""
        for j, g in enumerate(self.index.groups):
            g.keys, g.vals = g.arr.tolist(), g.varr.tolist()
            for rows, vals, n, kname, vname in ((self.bk, self.bv, self.bn, "buf_k", "buf_v"),
                                                (self.fk, self.fv, self.fn, "frz_k", "frz_v")):
                k = int(n[j])
                setattr(g, kname, rows[j, :k].copy().view(g.arr.dtype).reshape(k).tolist())
                setattr(g, vname, vals[j, :k].tolist())
