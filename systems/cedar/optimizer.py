"""cedar's profiler and optimizer (pure).

The profiler runs a sample of the source through the operators and records, per operator, its
latency, selectivity (outputs per input) and input/output sizes, plus the cost of serializing its
outputs. The optimizer rewrites the plan from that profile with a cost model in seconds per epoch:

1. reorder  - within runs of operators that commute (declared fields do not conflict), choose the
              order of least expected cost sum(latency_i * prod(selectivity_j, j<i)): cheap,
              size-reducing filters move ahead of expensive maps;
2. fuse     - runs of per-sample operators between barriers (batch, shuffle, order-sensitive ops)
              become one stage: no per-operator iterator hand-off per sample;
3. cache    - the deterministic prefix of the first stage is written to a cache (local disk or
              ObjectStorage) in the first epoch and read afterwards, at the cut where
              (epochs-1) * (recompute - read) - write is largest (read and write are measured);
4. offload  - a stage runs in local worker processes or on remote (Dask) workers when it pays:
              an Amdahl model per executor from the profile (measured transfer and round-trip
              costs) must predict at least ``min_speedup``, and then a measured trial of each
              executor that passes decides: the stage's real chunk job runs on the same chunks
              inline and on the (warmed-up) workers, and the epoch time calibrated by that
              measured factor must also beat inline by ``min_speedup`` (``expected_offload_s``,
              ``offload_pays``); the fastest expected executor is taken. Local workers return
              large arrays through shared memory (``transfer.py``); the decision records the
              executor, the transfer and, from the trial, how many results used it;
5. prefetch - a bounded buffer filled by a background thread when a consumer step time is given.

Every decision is recorded with its estimated gain; ``explain()`` prints plan and decisions.
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import os
import pickle
import time
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

import numpy as np

from mlsys_flows.systems.cedar import transfer as shm
from mlsys_flows.systems.cedar.pipeline import (WARMUP_CHUNK, Cache, ChunkJob, Decision, Op, Plan, Source, Stage,
                                                _batches, _parallel, _run_chunk, _shuffled, _warm_chunk, apply_op,
                                                as_store, call_op, deterministic_prefix, dumps, store_label)


def nbytes(x: Any) -> int:
    """Approximate in-memory payload size of a sample."""
    if isinstance(x, np.ndarray):
        return int(x.nbytes)
    if isinstance(x, (bytes, bytearray, str)):
        return len(x)
    if isinstance(x, dict):
        return sum(nbytes(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(nbytes(v) for v in x)
    return 8


@dataclass(frozen=True)
class OpProfile:
    name: str
    kind: str
    calls: int
    outputs: int
    seconds: float
    in_bytes: float   # mean per input
    out_bytes: float  # mean per output
    ser_s: float      # pickle dumps+loads per output

    @property
    def latency_s(self) -> float:
        return self.seconds / max(self.calls, 1)

    @property
    def selectivity(self) -> float:
        return self.outputs / max(self.calls, 1)


@dataclass(frozen=True)
class Profile:
    sampled: int          # source items run
    n_source: int
    ops: tuple[OpProfile, ...]
    source_ser_s: float   # serializing one source reference
    samples_at: tuple     # the profiled items after each op (for cache probes and trials)
    source_keys: tuple    # the source indices profiled

    def by_name(self) -> dict[str, OpProfile]:
        return {p.name: p for p in self.ops}

    def table(self) -> str:
        rows = [f"{'operator':<24}{'latency':>12}{'select.':>9}{'in B':>10}{'out B':>10}"]
        for p in self.ops:
            rows.append(f"{p.name:<24}{p.latency_s * 1e6:>10.1f}us{p.selectivity:>9.2f}{p.in_bytes:>10.0f}{p.out_bytes:>10.0f}")
        return "\n".join(rows)


def _ser_cost(items: list) -> float:
    if not items:
        return 0.0
    t0 = time.perf_counter()
    pickle.loads(dumps(items))
    return (time.perf_counter() - t0) / len(items)


def _shm_cost(items: list) -> float:
    """Measured seconds per item of returning ``items`` the way a worker process does with shared
    memory: pack (large arrays written to a segment), pickle what crosses the pipe, receive (map
    the segment, rebuild). A result too small for shared memory costs what pickling it costs."""
    if not items:
        return 0.0
    prefix = shm.new_prefix()
    t0 = time.perf_counter()
    try:
        shm.receive(pickle.loads(dumps(shm.pack(items, prefix))))
    finally:
        shm.remove_leftovers(prefix)  # only if receiving failed
    return (time.perf_counter() - t0) / len(items)


def _thin(items: list, k: int) -> list:
    return items if len(items) <= k else [items[i] for i in np.linspace(0, len(items) - 1, k).astype(int)]


def profile(source: Source, ops: Sequence[Op], seed: int, sample: int = 32) -> Profile:
    """Run about ``sample`` samples through ``ops`` in order. Source items are taken spread over
    the source, only as many as the first operator needs to produce ``sample`` outputs (a
    row-group reader yields hundreds per item); each later operator sees at most ``sample``
    inputs, so profiling costs about ``sample`` samples whatever the fan-out."""
    n = len(source.refs)
    if n == 0:
        raise ValueError("cannot profile an empty source")
    order = list(dict.fromkeys(np.linspace(0, n - 1, min(sample, n)).astype(int).tolist()))
    # untimed warm-up: one item through the operators, so that first calls (lazy imports, caches
    # filled on first use) are not charged to the per-sample latency every later estimate scales
    warm = [((order[0],), source.refs[order[0]])]
    for op in ops:
        if not warm:
            break
        if op.kind in ("map", "filter", "flat_map"):
            warm = list(itertools.islice(apply_op(op, warm, seed, 0), 1))
    items = [((i,), source.refs[i]) for i in order]
    stats, snaps = [], []
    for pos, op in enumerate(ops):
        t0 = time.perf_counter()
        if op.kind == "batch":
            nxt = list(_batches(op, iter(items)))
        elif op.kind == "shuffle":
            nxt = list(_shuffled(op, iter(items), seed, 0))
        elif pos == 0:  # pull source items only until the first operator has produced enough
            taken, nxt = [], []
            for it in items:
                taken.append(it)
                nxt += apply_op(op, [it], seed, 0)
                if len(nxt) >= sample:
                    break
            items = taken
        else:
            nxt = list(apply_op(op, items, seed, 0))
        dt = time.perf_counter() - t0
        if pos == 0:
            order = order[:len(items)]
        stats.append(OpProfile(op.name, op.kind, len(items), len(nxt), dt,
                               float(np.mean([nbytes(x) for _, x in items])) if items else 0.0,
                               float(np.mean([nbytes(x) for _, x in nxt])) if nxt else 0.0,
                               _ser_cost(nxt[:sample])))
        items = nxt if op.kind == "batch" else _thin(nxt, sample)
        snaps.append(items)
    src_ser = _ser_cost([((i,), source.refs[i]) for i in order])
    return Profile(len(order), n, tuple(stats), src_ser, tuple(snaps), tuple(order))


# ----- reordering -------------------------------------------------------------------------------

def _order_cost(ops: Sequence[Op], prof: dict[str, OpProfile]) -> float:
    cost, surv = 0.0, 1.0
    for op in ops:
        cost += prof[op.name].latency_s * surv
        surv *= prof[op.name].selectivity
    return cost


def _legal(order: Sequence[Op], original: Sequence[Op]) -> bool:
    """Every pair that does not commute keeps its original relative order."""
    pos = {op.name: i for i, op in enumerate(original)}
    for i, a in enumerate(order):
        for b in order[i + 1:]:
            if pos[a.name] > pos[b.name] and not a.commutes(b):
                return False
    return True


def best_order(ops: Sequence[Op], prof: dict[str, OpProfile]) -> tuple[Op, ...]:
    """Cheapest legal permutation of a run of reorderable operators (exhaustive up to 7 ops,
    otherwise greedy: repeatedly take the legal next op with the best rank)."""
    ops = tuple(ops)
    if len(ops) <= 7:
        best, best_cost = ops, _order_cost(ops, prof)
        for perm in itertools.permutations(ops):
            if _legal(perm, ops):
                c = _order_cost(perm, prof)
                if c < best_cost * (1 - 1e-3):
                    best, best_cost = perm, c
        return best
    rest, chosen = list(ops), []
    while rest:
        ready = [o for o in rest if all(o.commutes(p) for p in rest[: rest.index(o)])]

        def rank(o: Op) -> float:
            p = prof[o.name]
            return p.latency_s / max(1e-12, 1 - p.selectivity) if p.selectivity < 1 else float("inf")

        nxt = min(ready, key=rank)
        chosen.append(nxt)
        rest.remove(nxt)
    return tuple(chosen)


def reorder(ops: Sequence[Op], prof: Profile) -> tuple[tuple[Op, ...], list[Decision]]:
    p = prof.by_name()
    out: list[Op] = []
    decisions: list[Decision] = []
    surv = 1.0  # items per source item entering the current position
    i = 0
    while i < len(ops):
        if not ops[i].reorderable:
            out.append(ops[i])
            surv *= p[ops[i].name].selectivity
            i += 1
            continue
        j = i
        while j < len(ops) and ops[j].reorderable:
            j += 1
        run = ops[i:j]
        best = best_order(run, p)
        before, after = _order_cost(run, p), _order_cost(best, p)
        gain = (before - after) * surv * prof.n_source
        run = tuple(run)
        if best != run:
            moved = [o.name for k, o in enumerate(best) if k < run.index(o)]
            decisions.append(Decision("reorder", True, f"{' -> '.join(o.name for o in run)} becomes "
                                      f"{' -> '.join(o.name for o in best)} (moved: {', '.join(moved)}; "
                                      f"cost {before * 1e6:.0f} -> {after * 1e6:.0f} us per sample)", gain))
        elif len(run) > 1:
            decisions.append(Decision("reorder", False, f"{' -> '.join(o.name for o in run)} is already the "
                                      f"cheapest legal order", 0.0))
        out.extend(best)
        for o in run:
            surv *= p[o.name].selectivity
        i = j
    if not any(o.reorderable for o in ops):
        decisions.append(Decision("reorder", False, "no operator declares reads/writes, nothing may move", 0.0))
    return tuple(out), decisions


# ----- cost model helpers ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _Costs:
    """Seconds per epoch of each operator (at its position) and items flowing into it."""

    op_s: dict[str, float]
    into: dict[str, float]      # items per epoch entering the op
    out: dict[str, float]       # items per epoch leaving the op


def _costs(ops: Sequence[Op], prof: Profile) -> _Costs:
    p = prof.by_name()
    op_s, into, out = {}, {}, {}
    flow = float(prof.n_source)
    for op in ops:
        into[op.name] = flow
        op_s[op.name] = p[op.name].latency_s * flow
        flow *= p[op.name].selectivity
        out[op.name] = flow
    return _Costs(op_s, into, out)


@functools.lru_cache(maxsize=1)
def _hop_cost(n: int = 5000) -> float:
    """Measured cost of handing one item through one extra iterator (what fusion removes); once
    per process."""
    items = [((i,), i) for i in range(n)]
    ident = Op("map", "_probe", lambda x: x)
    t0 = time.perf_counter()
    for _ in apply_op(ident, iter(items), 0, 0):
        pass
    t1 = time.perf_counter()
    for key, x in items:
        call_op(ident, key, x, 0, 0)
    t2 = time.perf_counter()
    return max(0.0, ((t1 - t0) - (t2 - t1)) / n)


def _probe_store(store: Any, prefix: str, items: list) -> tuple[float, float]:
    """Measured (write_s, read_s) per item of a cache shard holding ``items``."""
    key = f"{prefix}/probe-{os.getpid()}.pkl"
    t0 = time.perf_counter()
    store.write_bytes(key, dumps(items))
    t1 = time.perf_counter()
    pickle.loads(store.read_bytes(key))
    t2 = time.perf_counter()
    return (t1 - t0) / max(len(items), 1), (t2 - t1) / max(len(items), 1)


def _delete(store: Any, prefix: str) -> None:
    """Remove what the optimizer wrote under ``prefix`` (probes, trial shards), where the store can."""
    if callable(getattr(store, "delete", None)):
        try:
            store.delete(prefix)
        except Exception:  # noqa: BLE001 - leftovers under a cache prefix are harmless
            pass


def _fingerprint(source: Source, ops: Sequence[Op], seed: int) -> str:
    import cloudpickle

    h = hashlib.sha256(source.fingerprint().encode())
    h.update(cloudpickle.dumps([(o.name, o.kind, o.fn) for o in ops]))
    h.update(str(seed).encode())
    return h.hexdigest()[:16]


def _roundtrip(submit, n: int = 8, warm: int = 2, batches: int = 3) -> float:
    """Measured seconds of one no-op round trip to an executor: ``n`` submitted at once, per
    round trip, the fastest of ``batches`` such batches (a hiccup of a busy machine, or a pool
    process still starting, is not charged to every chunk); after ``warm`` concurrent warm-up
    calls, which start a process pool's workers."""
    for f in [submit(int, i) for i in range(warm)]:
        f.result()
    best = float("inf")
    for _ in range(batches):
        t0 = time.perf_counter()
        for f in [submit(int, i) for i in range(n)]:
            f.result()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


TRIAL_WORK_S = 0.15  # inline seconds of stage work a trial aims at
TRIAL_ROUNDS = 3  # at least this many rounds of one chunk per worker
TRIAL_MAX_SHARE = 0.5  # never more than this share of the source items


def _submit_chunk(submit) -> Callable:
    return lambda *a: submit(_run_chunk, *a)


def _trial(submit, job: ChunkJob, chunks: list, workers: int, warm: bool,
           threshold: float) -> tuple[float, float, float]:
    """Measured seconds of running ``chunks`` through ``job`` inline and on ``workers`` workers,
    the way execution runs them: the same ChunkJob (cache writes in a cold phase, shard reads in
    a warm one), at most 2 chunks per worker in flight, results received by this process.

    Returns (inline_s, parallel_s, fill_s). ``parallel_s`` is the steady-state rate, scaled to
    the trial's chunks: the time from the end of the first round (one chunk per worker) to the
    last result. An epoch of many chunks runs at that rate; filling the workers and draining
    them happens once per epoch, and ``fill_s`` (the first round's excess over a steady round)
    is that one-time cost. Measuring it all in a few rounds would charge it to every round.

    Every worker has loaded the stage before the clock starts (2 warm-up chunks per worker,
    each holding its worker briefly so the next goes to another), so one-time costs of a fresh
    process (unpickling the stage, first calls, copy-on-write page faults), which a run pays
    once and not per trial, are not charged either. When the measured speedup lies near
    ``threshold``, both sides are measured again and the faster time of each counts."""
    import cloudpickle

    blob = cloudpickle.dumps(job)
    blob_id = hashlib.sha1(blob).hexdigest()
    # a cold warm-up writes a spare shard (chunk id WARMUP_CHUNK); a warm one reads shard 0
    cid, first = (0, None) if warm else (WARMUP_CHUNK, chunks[0][:1])
    for f in [submit(_warm_chunk, blob_id, blob, cid, first, warm) for _ in range(2 * workers)]:
        f.result()
    n, w = len(chunks), workers

    def inline() -> float:
        t0 = time.perf_counter()
        for i, items in enumerate(chunks):
            job.run(i, items, 0, warm)
        return time.perf_counter() - t0

    def parallel() -> tuple[float, float]:
        arrived = []
        t0 = time.perf_counter()
        for _ in _parallel(_submit_chunk(submit), ((blob_id, blob, i, items, 0, warm) for i, items in enumerate(chunks)),
                           2 * w, "trial"):
            arrived.append(time.perf_counter() - t0)
        if n < 2 * w:  # too few chunks for a steady state: all of it counts
            return arrived[-1], 0.0
        steady = (arrived[-1] - arrived[w - 1]) * n / (n - w)
        return steady, max(0.0, arrived[w - 1] - steady * w / n)

    t_in, (t_par, fill) = inline(), parallel()
    if 0.8 < (t_in / max(t_par, 1e-9)) / threshold < 1.25:  # too close to call from one measurement
        t_in = min(t_in, inline())
        again = parallel()
        if again[0] < t_par:
            t_par, fill = again
    return t_in, t_par, fill


def _trial_chunks(prof: Profile, source: Source, ops: Sequence[Op], stage_ops: tuple[Op, ...], first: bool,
                  chunk: int, n_chunks: int, workers: int) -> list[list]:
    """Inputs of a trial of a stage, in chunks of the plan's size: for a first stage, source
    items spread over the source (``n_chunks`` chunks, a multiple of ``workers`` so that no
    round leaves a worker idle, at most TRIAL_MAX_SHARE of the source); otherwise the profiled
    samples entering it."""
    if first:
        fit = max(workers, int(prof.n_source * TRIAL_MAX_SHARE) // chunk // workers * workers)
        n = min(min(n_chunks, fit) * chunk, prof.n_source)
        keys = list(dict.fromkeys(np.linspace(0, prof.n_source - 1, max(1, n)).astype(int).tolist()))
        items = [((i,), source.refs[i]) for i in keys]
    else:
        items = list(prof.samples_at[ops.index(stage_ops[0]) - 1])
    return [items[i:i + chunk] for i in range(0, len(items), chunk)] or [[]]


def expected_offload_s(stage_s: float, main_s: float, ipc_main_s: float, trial_inline_s: float,
                       trial_parallel_s: float, workers: int, cores: int | None, fill_s: float = 0.0) -> float:
    """Epoch time with a stage offloaded, calibrated by a measured trial: the stage's inline
    time ``stage_s`` shrinks by the measured steady-state factor inline/parallel (which includes
    IPC, contention and the per-chunk round trips), plus ``fill_s`` once per epoch (filling and
    draining the workers). The main process's own work (``main_s``: batching, the operators
    outside the stage) overlaps with the workers only when a core is left for it (``workers <
    cores``, or remote workers); otherwise it is added in full."""
    stage_off = stage_s * trial_parallel_s / max(trial_inline_s, 1e-12) + fill_s
    if cores is not None and workers >= cores:
        return stage_off + main_s
    return max(main_s + ipc_main_s, stage_off)


def offload_pays(serial_s: float, model_s: float, expected_s: float | None, min_speedup: float) -> bool:
    """The offload rule: the Amdahl model must predict at least ``min_speedup`` (else no trial
    is run), and so must the estimate calibrated by the measured trial (``expected_s``)."""
    if model_s <= 0 or serial_s / model_s < min_speedup:
        return False
    return expected_s is not None and expected_s > 0 and serial_s / expected_s >= min_speedup


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _amdahl(stage_s: float, main_s: float, ipc_main_s: float, ipc_worker_s: float, workers: int,
            cores: int | None) -> float:
    """Epoch time with a stage on ``workers`` processes: the main process's serial part, the
    workers' share, and (when they share ``cores`` with the main process) the total CPU work."""
    bounds = [main_s + ipc_main_s, (stage_s + ipc_worker_s) / workers]
    if cores is not None:
        bounds.append((main_s + ipc_main_s + stage_s + ipc_worker_s) / cores)
    return max(bounds)


# ----- optimize -------------------------------------------------------------------------------------

Mode = Literal["cost", "always"]


def optimize(pipeline, *, epochs: int = 1, sample: int = 32, cache: Any = None, workers: int | None = None,
             remote: Any = None, remote_workers: int = 0, consumer_s: float = 0.0, chunk: int = 0,
             min_speedup: float = 1.2, mode: Mode = "cost", shared_memory: bool = True):
    """Profile ``pipeline`` and return a copy with an optimized plan.

    epochs: how many passes the consumer will make (caching pays only when > 1).
    cache: folder path or ObjectStorage-like store for the deterministic prefix (None: no caching).
    workers: local worker processes for offloading (default: the cores this process may use).
    remote, remote_workers: an executor with ``submit(fn, *args)`` (a distributed.Client) and its
        worker count, for offloading to Dask workers.
    consumer_s: the consumer's time per output item (a training step), enables prefetching.
    chunk: source items per unit of work and cache shard (0: ~25 ms of work, >= 4 per worker).
    mode: "cost" applies a rewrite when the cost model says it pays; "always" applies every legal
        rewrite (for testing and debugging; it offloads when workers > 1 or remote is given).
    shared_memory: results of stages on local worker processes bring their large arrays back
        through shared memory (where the machine has it); False pickles them through the pool's
        pipes. The model's IPC cost, the trial and the decision all use the chosen transfer.
    """
    from mlsys_flows.systems.cedar.api import Pipeline

    if epochs < 1 or sample < 1 or chunk < 0:
        raise ValueError(f"epochs and sample must be >= 1, chunk >= 0 (got {epochs}, {sample}, {chunk})")
    if remote is not None and not callable(getattr(remote, "submit", None)):
        raise TypeError(f"remote must have submit(fn, *args) (a distributed.Client); got {type(remote).__name__}")
    cores = _cores()
    workers = workers or cores
    transfer = "shared_memory" if shared_memory and shm.available() else "pickle"
    source, seed = pipeline.source, pipeline.seed
    first = profile(source, pipeline.ops, seed, sample)
    ops, decisions = reorder(pipeline.ops, first)
    prof = profile(source, ops, seed, sample) if ops != pipeline.ops else first  # costs at new positions
    p = prof.by_name()
    cost = _costs(ops, prof)

    # fuse: maximal runs of per-sample operators between barriers
    groups: list[list[Op] | Op] = []
    for op in ops:
        if op.per_sample and groups and isinstance(groups[-1], list):
            groups[-1].append(op)
        elif op.per_sample:
            groups.append([op])
        else:
            groups.append(op)
    hop = _hop_cost()
    for g in groups:
        if isinstance(g, list) and len(g) > 1:
            hops = sum(cost.out[o.name] for o in g[:-1])
            decisions.append(Decision("fuse", True, f"{' + '.join(o.name for o in g)} into one stage "
                                      f"({hop * 1e6:.2f} us per removed hand-off)", hops * hop))

    # cache: the deterministic prefix of the first stage
    cache_ops, cache_obj, cache_read_s = 0, None, 0.0
    if groups and isinstance(groups[0], list):
        det = groups[0][:deterministic_prefix(groups[0])]
        if cache is None:
            decisions.append(Decision("cache", False, "no cache location given", 0.0))
        elif not det:
            decisions.append(Decision("cache", False, "the first operator is not deterministic", 0.0))
        elif epochs <= 1 and mode == "cost":
            decisions.append(Decision("cache", False, "a single epoch never re-reads a cache", 0.0))
        else:
            store = as_store(cache)
            fp = _fingerprint(source, det, seed)
            prefix = f"cedar-cache/{fp}"
            best = None
            for k in range(1, len(det) + 1):
                recompute = sum(cost.op_s[o.name] for o in det[:k])
                w, r = _probe_store(store, prefix, list(prof.samples_at[ops.index(det[k - 1])]))
                w, r = w * cost.out[det[k - 1].name], r * cost.out[det[k - 1].name]
                gain = ((epochs - 1) * (recompute - r) - w) / epochs
                if best is None or gain > best[0] or mode == "always":
                    best = (gain, k, recompute, r, w)
            gain, k, recompute, r, w = best
            _delete(store, f"{prefix}/probe-{os.getpid()}.pkl")
            where = f"after {det[k - 1].name!r} on {store_label(store)}"
            if gain > 0 or mode == "always":
                cache_ops, cache_read_s = k, r
                cache_obj = Cache(store, f"cedar-cache/{_fingerprint(source, det[:k], seed)}")
                decisions.append(Decision("cache", True, f"{where}: recompute {recompute * 1e3:.0f} ms vs read "
                                          f"{r * 1e3:.0f} ms per epoch, write {w * 1e3:.0f} ms once, {epochs} epochs",
                                          max(gain, 0.0)))
            else:
                decisions.append(Decision("cache", False, f"{where} would not pay: recompute {recompute * 1e3:.0f} ms "
                                          f"vs read {r * 1e3:.0f} ms per epoch", 0.0))

    # chunks: ~25 ms of work each, at least 4 per worker per epoch, so workers stay busy
    if chunk == 0:
        per_item = sum(cost.op_s.values()) / prof.n_source
        chunk = int(min(max(1, 0.025 / max(per_item, 1e-9)), max(1, prof.n_source // (4 * workers)), 1024))

    # offload: per stage and phase (cold: first epoch; warm: cache complete), an Amdahl model from
    # the profile gates each executor (local processes, remote workers), a measured trial of each
    # that passes decides (expected_offload_s, offload_pays); the fastest expected one is taken
    use_remote = remote is not None and remote_workers > 0
    rt = {"process": None, "remote": None}  # measured round trips, once each, when a model needs them
    total_s = sum(cost.op_s.values())
    steps: list[Stage | Op] = []
    trial_prefixes: list[tuple[Any, str]] = []
    via = {"process": ("results through shared memory" if transfer == "shared_memory"
                       else "results pickled through the pool's pipes"),
           "remote": "results through the remote executor's own serialization"}
    how = {"process": transfer, "remote": "remote"}
    for gi, g in enumerate(groups):
        if not isinstance(g, list):
            steps.append(g)
            continue
        stage_ops = tuple(g)
        cached = cache_ops if gi == 0 else 0
        cold_s = sum(cost.op_s[o.name] for o in stage_ops)
        warm_s = cold_s - sum(cost.op_s[o.name] for o in stage_ops[:cached]) + cache_read_s
        main_s = total_s - cold_s  # everything outside this stage runs in the main process
        last = p[stage_ops[-1].name]
        out_items = cost.out[stage_ops[-1].name]
        in_ser = (prof.source_ser_s if gi == 0 else p[ops[ops.index(stage_ops[0]) - 1].name].ser_s) * cost.into[stage_ops[0].name]
        ipc = {"remote": in_ser + last.ser_s * out_items}  # both sides pay about half of dumps+loads
        n_chunks = cost.into[stage_ops[0].name] / chunk
        if workers > 1:  # results of a chunk's size, returned the way the pool returns them
            outs = list(prof.samples_at[ops.index(stage_ops[-1])])
            per_chunk = max(1, int(round(chunk * out_items / max(cost.into[stage_ops[0].name], 1e-9))))
            out_s = _shm_cost(outs[:per_chunk]) if transfer == "shared_memory" else last.ser_s
            ipc["process"] = in_ser + out_s * out_items
        # the trial's job is the stage's real job; a first stage with a cache writes/reads a trial cache
        trial_cache = None
        if cached:
            trial_cache = Cache(cache_obj.store, f"{cache_obj.prefix}-trial-{os.getpid()}-{time.monotonic_ns()}")
            trial_prefixes.append((cache_obj.store, trial_cache.prefix))
        job = ChunkJob(stage_ops, seed, trial_cache, cached)
        per_chunk_s = cold_s / max(n_chunks, 1e-9)
        trial_inputs: dict[int, list] = {}

        def trial_chunks(n: int) -> list:
            """Inputs of a trial on ``n`` workers: whole rounds, about TRIAL_WORK_S of work."""
            if n not in trial_inputs:
                rounds = max(TRIAL_ROUNDS, int(np.ceil(TRIAL_WORK_S / max(per_chunk_s, 1e-9) / n)))
                trial_inputs[n] = _trial_chunks(prof, source, ops, stage_ops, gi == 0, chunk, n * rounds, n)
            return trial_inputs[n]

        shards_written = 0  # the trial cache's shards (chunk ids 0..), which a warm trial reads
        choice = {}
        for phase, stage_s in (("cold", cold_s), ("warm", warm_s)):
            if phase == "warm" and not cached:
                choice["warm"] = choice["cold"]
                continue
            options = {"inline": (stage_s + main_s, "")}
            if workers > 1:
                if rt["process"] is None:
                    rt["process"] = _roundtrip(pipeline.runtime.pool(workers).submit, warm=workers)
                t = _amdahl(stage_s, main_s, ipc["process"] / 2 + n_chunks * rt["process"], ipc["process"] / 2,
                            workers, cores)
                options["process"] = (t, f"{workers} local processes")
            if use_remote:
                def remote_model(round_trip: float) -> float:
                    return _amdahl(stage_s, main_s, ipc["remote"] / 2 + n_chunks * round_trip / remote_workers,
                                   ipc["remote"] / 2, remote_workers, None)

                t = remote_model(0.0)  # an upper bound on the speedup: round trips only add
                if rt["remote"] is None and (mode == "always" or (t > 0 and (stage_s + main_s) / t >= min_speedup)):
                    rt["remote"] = _roundtrip(remote.submit)
                if rt["remote"] is not None:
                    t = remote_model(rt["remote"])
                options["remote"] = (t, f"{remote_workers} remote worker{'s' * (remote_workers != 1)}")
            serial = options["inline"][0]
            offers = sorted((k for k in options if k != "inline"), key=lambda k: options[k][0])
            label = f"{phase} stage [{' + '.join(o.name for o in stage_ops)}]"

            def model(k: str) -> str:
                x = serial / options[k][0] if options[k][0] > 0 else 1.0
                return (f"Amdahl model {x:.2f}x (stage {stage_s * 1e3:.0f} ms, main process {main_s * 1e3:.0f} ms, "
                        f"IPC {ipc[k] * 1e3:.0f} ms per epoch, {via[k]})")

            def models() -> str:
                return "; ".join(f"{options[k][1]}: {model(k)}" for k in offers)

            if mode == "always" and offers:  # prefer remote, then local processes
                best = "remote" if "remote" in options else "process"
                choice[phase] = best
                decisions.append(Decision("offload", True, f"{label} to {options[best][1]} (mode='always'); "
                                          f"{model(best)}", max(serial - options[best][0], 0.0), how[best]))
                continue
            if not offers:
                choice[phase] = "inline"
                decisions.append(Decision("offload", False, f"{label} stays in the main process: workers=1 and no "
                                          f"remote executor", 0.0))
                continue
            tried = [k for k in offers if options[k][0] > 0 and serial / options[k][0] >= min_speedup]
            if not tried:
                choice[phase] = "inline"
                why = ("every offload option is modelled slower" if all(options[k][0] >= serial for k in offers)
                       else f"below {min_speedup}x, no trial")
                decisions.append(Decision("offload", False, f"{label} stays in the main process: {why}; {models()}",
                                          0.0))
                continue
            if phase == "warm" and cached == len(stage_ops):
                choice[phase] = "inline"
                decisions.append(Decision("offload", False, f"{label} stays in the main process: only cache "
                                          f"reads remain", 0.0))
                continue
            if not trial_chunks(workers if tried[0] == "process" else remote_workers)[0]:
                choice[phase] = "inline"
                decisions.append(Decision("offload", False, f"{label} stays in the main process: no inputs "
                                          f"to try it on", 0.0))
                continue
            # the model cannot see contention, IPC through pipes or a busy machine: measure each option
            results = {}
            for k in tried:
                n = workers if k == "process" else remote_workers
                trial_in = trial_chunks(n)
                submit = pipeline.runtime.process_submit(workers, transfer) if k == "process" else remote.submit
                before = pipeline.runtime.channel.stats.copy()
                if phase == "warm":
                    for i in range(shards_written, len(trial_in)):  # an inline cold run writes missing shards
                        job.run(i, trial_in[i], 0, False)
                    shards_written = max(shards_written, len(trial_in))
                    t_in, t_par, fill = _trial(submit, job, [None] * len(trial_in), n, True, min_speedup)
                else:
                    t_in, t_par, fill = _trial(submit, job, trial_in, n, False, min_speedup)
                    if cached:
                        shards_written = max(shards_written, len(trial_in))
                got = pipeline.runtime.channel.stats.since(before)
                expected = expected_offload_s(stage_s, main_s, ipc[k] / 2, t_in, t_par, n,
                                              cores if k == "process" else None, fill)
                counted = f"; counted: {got.text()}" if k == "process" and (got.shared or got.pickled) else ""
                trial = (f"trial on {len(trial_in)} chunks of {chunk} ({sum(len(c) for c in trial_in)} inputs): "
                         f"inline {t_in * 1e3:.0f} ms, on {n} workers {t_par * 1e3:.0f} ms at the steady rate "
                         f"({t_in / max(t_par, 1e-9):.2f}x) + {fill * 1e3:.0f} ms to fill them; "
                         f"expected epoch speedup {serial / expected:.2f}x{counted}")
                results[k] = (expected, offload_pays(serial, options[k][0], expected, min_speedup),
                              f"{options[k][1]}: {model(k)}; {trial}")
            paying = [k for k in tried if results[k][1]]
            untried = "".join(f"; not tried, {options[k][1]}: {model(k)} < {min_speedup}x" for k in offers
                              if k not in tried)
            if paying:
                best = min(paying, key=lambda k: results[k][0])
                choice[phase] = best
                others = "".join(f"; also tried {results[k][2]}" for k in tried if k != best)
                decisions.append(Decision("offload", True, f"{label} to {results[best][2]}{others}{untried}",
                                          serial - results[best][0], how[best]))
            else:
                choice[phase] = "inline"
                decisions.append(Decision("offload", False, f"{label} stays in the main process: "
                                          + "; ".join(results[k][2] for k in tried) + f" < {min_speedup}x{untried}",
                                          0.0))
        steps.append(Stage(stage_ops, cold=choice["cold"], warm=choice["warm"], cache_ops=cached))
    for store, prefix in trial_prefixes:
        _delete(store, prefix)
    if rt["process"] is not None and not any(isinstance(s, Stage) and "process" in (s.cold, s.warm) for s in steps):
        pipeline.runtime.close()

    # prefetch: overlap the pipeline with the consumer
    prefetch = 0
    out_total = cost.out[ops[-1].name] if ops else float(prof.n_source)
    if consumer_s > 0 or mode == "always":
        prefetch = max(2, 2 * workers)
        gain = min(consumer_s * out_total, total_s)
        decisions.append(Decision("prefetch", True, f"bounded buffer of {prefetch} outputs filled by a background "
                                  f"thread while the consumer works", gain))
    else:
        decisions.append(Decision("prefetch", False, "no consumer step time given: nothing to overlap "
                                  "(offloaded stages already keep 2 chunks per worker in flight)", 0.0))

    plan = Plan(tuple(steps), cache=cache_obj, prefetch=prefetch, chunk=chunk, workers=workers,
                remote_workers=remote_workers, decisions=tuple(decisions), optimized=True, transfer=transfer)
    new = Pipeline(source, ops, seed, plan=plan, remote=remote)
    new.runtime.adopt(pipeline.runtime)  # the pool started for measuring moves along
    new.profile_result = prof
    return new


def explain(pipeline) -> str:
    plan: Plan = pipeline.plan
    lines = [f"cedar plan ({'optimized' if plan.optimized else 'as written'}): source {pipeline.source.description}"]
    for step in plan.steps:
        if isinstance(step, Op):
            lines.append(f"  {step.label()}" + ("  (in order, main process)" if step.per_sample is False
                                                 and step.kind not in ("batch", "shuffle") else ""))
            continue
        if not step.fused:
            lines.append(f"  {step.ops[0].label()}")
            continue
        where = step.cold if step.cold == step.warm else f"cold: {step.cold}, warm: {step.warm}"
        if "process" in (step.cold, step.warm):
            where += (", large arrays back through shared memory" if plan.transfer == "shared_memory"
                      else ", results pickled back")
        lines.append(f"  stage [{where}, chunks of {plan.chunk}]:")
        for k, op in enumerate(step.ops):
            lines.append(f"    {op.label()}")
            if plan.cache is not None and k + 1 == step.cache_ops:
                lines.append(f"    == cache ({store_label(plan.cache.store)}) ==")
    if plan.prefetch:
        lines.append(f"  prefetch({plan.prefetch})")
    if plan.decisions:
        lines.append("decisions:")
        lines += [f"  {d.line()}" for d in plan.decisions]
    return "\n".join(lines)


__all__ = ["profile", "optimize", "explain", "Profile", "OpProfile", "best_order", "reorder", "nbytes"]
