"""The learned index's serving path compiled with numba (pure: numpy + numba).

Why: the index baselines (``BTrees.OOBTree``, ``SortedDict``, the PGM-index) look keys up and insert
them in C, so a learned index whose model, window search and delta buffers run in the interpreter
loses to them by the interpreter's cost, not the index's (issue 50). Here the serving loop itself,
each lookup (group by binary search over the pivots, the model's prediction, the binary search of the
error-bound window, then the delta buffer and the buffer being merged) and each insert (into the
group's sorted delta buffer) run as machine code, on fixed-width ``uint8`` key rows compared
lexicographically (zero padded, as ``numpy`` ``S`` strings compare).

What stays in Python is what happens once per retrain: freezing a buffer, merging it into the main
array, submitting the retrain (to the board or inline), installing its result. The compiled loop
returns to Python only for such an event: an insert that fills a buffer to ``threshold`` (a trigger)
or to ``cap`` while its group's retrain is still in flight (back-pressure), and a poll point
(every ``poll_every`` operations) at which some retrain has completed. A retrain's completion is
seen through a flag its future's done-callback sets (:class:`.index.CompiledServer`), so the loop
does not return to the interpreter every ``poll_every`` operations while a retrain is in flight.

The semantics are those of the Python reference (:meth:`.index.LearnedIndex.lookup`,
:meth:`.index.Server.insert`, :meth:`.index.Server.run`): same groups, same model arithmetic in the
same order (so the same predicted positions), same events at the same operations;
tests/unit/test_sia_compiled.py checks that both return the same value for every operation of a
stream and end in the same state. Each lookup is timed with the same monotonic clock the baselines'
loop reads (``clock_gettime(CLOCK_MONOTONIC)``, called from the compiled code). :func:`warm_up` compiles every
function on a tiny input; callers run it before any clock starts.
"""
from __future__ import annotations

import time

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

# event codes the serving loop returns with
DONE, TRIGGER, STALL, POLL = 0, 1, 2, 3
NOT_FOUND = -1   # a lookup's value when the key is absent (values are non-negative key indexes)

_MONOTONIC = int(getattr(time, "CLOCK_MONOTONIC", 1))


@intrinsic
def _now_ns(typingctx):
    """``clock_gettime(CLOCK_MONOTONIC)`` in nanoseconds, called from compiled code (the clock
    ``time.perf_counter_ns`` reads; a declared libc symbol, so the compiled functions can be cached)."""
    def codegen(context, builder, signature, args):
        i64, i32 = ir.IntType(64), ir.IntType(32)
        ts_t = ir.LiteralStructType([i64, i64])
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32, [i32, ts_t.as_pointer()]),
                                            "clock_gettime")
        ts = cgutils.alloca_once(builder, ts_t)
        builder.call(fn, [ir.Constant(i32, _MONOTONIC), ts])
        sec = builder.load(cgutils.gep_inbounds(builder, ts, 0, 0))
        nsec = builder.load(cgutils.gep_inbounds(builder, ts, 0, 1))
        return builder.add(builder.mul(sec, ir.Constant(i64, 1_000_000_000)), nsec)
    return types.int64(), codegen


@njit(nogil=True, cache=True)
def _cmp(a, b):
    """-1, 0, 1 as the zero-padded rows ``a`` and ``b`` compare (bytes order)."""
    for j in range(a.shape[0]):
        x, y = a[j], b[j]
        if x != y:
            return -1 if x < y else 1
    return 0


@njit(nogil=True, cache=True)
def _bisect_left(rows, n, lo, hi, key):
    """First index in ``rows[lo:hi]`` (sorted, ``n`` valid) whose row is >= ``key``."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if _cmp(rows[mid], key) < 0:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(nogil=True, cache=True)
def _group_of(pivots, key):
    """``max(bisect_right(pivots, key) - 1, 0)``."""
    lo, hi = 0, pivots.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if _cmp(key, pivots[mid]) < 0:
            hi = mid
        else:
            lo = mid + 1
    return lo - 1 if lo > 0 else 0


@njit(nogil=True, cache=True)
def lookup(pivots, mk, mv, wl, bias, offs, nfs, errs, bk, bv, bn, fk, fv, fn, key):
    """The value of ``key`` (a ``uint8`` row), or ``NOT_FOUND``: the model's window of the main array,
    then the delta buffer, then the buffer being merged (:meth:`.index.LearnedIndex.lookup`)."""
    g = _group_of(pivots, key)
    keys = mk[g]
    m = keys.shape[0]
    if m:
        o = offs[g]
        acc = 0.0
        for j in range(nfs[g]):
            acc += wl[g, j] * key[o + j]
        pos = int(bias[g] + acc + 0.5)
        pos = 0 if pos < 0 else (m - 1 if pos >= m else pos)
        e = errs[g]
        lo = pos - e if pos - e > 0 else 0
        hi = pos + e + 1 if pos + e + 1 < m else m
        i = _bisect_left(keys, m, lo, hi, key)
        if i < hi and _cmp(keys[i], key) == 0:
            return mv[g][i]
    n = bn[g]
    if n:
        i = _bisect_left(bk[g], n, 0, n, key)
        if i < n and _cmp(bk[g, i], key) == 0:
            return bv[g, i]
    n = fn[g]
    if n:
        i = _bisect_left(fk[g], n, 0, n, key)
        if i < n and _cmp(fk[g, i], key) == 0:
            return fv[g, i]
    return NOT_FOUND


@njit(nogil=True, cache=True)
def insert(pivots, bk, bv, bn, key, value):
    """Put ``key`` into its group's sorted delta buffer; returns (group, buffer size after)."""
    g = _group_of(pivots, key)
    n = bn[g]
    i = _bisect_left(bk[g], n, 0, n, key)
    for j in range(n, i, -1):
        bk[g, j, :] = bk[g, j - 1, :]
        bv[g, j] = bv[g, j - 1]
    bk[g, i, :] = key
    bv[g, i] = value
    bn[g] = n + 1
    return g, n + 1


@njit(nogil=True, cache=True)
def serve(pivots, mk, mv, wl, bias, offs, nfs, errs, bk, bv, bn, fk, fv, fn, pending, ndone,
          keys, is_insert, target, start, skip_poll_at, poll_every, threshold, cap, results, lat, counters):
    """Serve operations ``start ..`` of the stream until it ends or an event needs the host's Python:
    returns (the next operation to serve, event, group). ``results[i]``: the value each lookup returned;
    ``lat``: each lookup's nanoseconds (``counters[1]`` of them so far); ``counters[0]``: lookups that
    missed their target. ``ndone[0]``: completed retrains not yet installed (set by the futures'
    callbacks on another thread: this function releases the GIL)."""
    nops = is_insert.shape[0]
    misses, nlat = counters[0], counters[1]
    i = start
    event, group = DONE, -1
    while i < nops:
        if i % poll_every == 0 and i != skip_poll_at and ndone[0] > 0:
            event = POLL
            break
        t = target[i]
        key = keys[t]
        if is_insert[i]:
            g, n = insert(pivots, bk, bv, bn, key, t)
            i += 1
            if n >= threshold:
                if pending[g] == 0:
                    event, group = TRIGGER, g
                    break
                if n >= cap:
                    event, group = STALL, g
                    break
        else:
            s = _now_ns()
            v = lookup(pivots, mk, mv, wl, bias, offs, nfs, errs, bk, bv, bn, fk, fv, fn, key)
            lat[nlat] = _now_ns() - s
            nlat += 1
            results[i] = v
            if v != t:
                misses += 1
            i += 1
    counters[0], counters[1] = misses, nlat
    return i, event, group


def warm_up() -> float:
    """Compile every function of the serving path (a tiny index, a tiny stream, retrains inline);
    returns the seconds it took. Run before any clock starts."""
    from .index import CompiledServer, LearnedIndex, inline_submit

    t0 = time.perf_counter()
    keys = np.array([b"k%04d" % i for i in range(0, 400, 2)] + [b"k%04d" % i for i in range(1, 200, 2)], dtype="S8")
    index = LearnedIndex(keys[:200], np.arange(200), 64, 4, 1e-8)
    ops = 200
    is_insert = np.zeros(ops, bool)
    is_insert[::2] = True
    target = np.where(is_insert, 200 + np.cumsum(is_insert) - 1, np.arange(ops) % 150)
    srv = CompiledServer(index, "sia", inline_submit, threshold=4, cap=8)
    srv.run(keys.view(np.uint8).reshape(len(keys), 8), is_insert, target)
    return time.perf_counter() - t0
