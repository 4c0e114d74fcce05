"""cedar pipelines: sources, operators, physical plans and their execution (pure).

A :class:`Pipeline` is an immutable description (a source plus operators) and an iterable: any
training loop can ``for batch in pipeline``. Every sample travels with a *key* (its source index,
extended by ``flat_map``), which names it in errors and seeds its random operators, so a sample's
augmentation does not depend on where or in which order it is computed. That is what lets the
optimizer reorder, fuse, cache and offload while yielding the same samples.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import queue
import threading
import zlib
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Literal, Sequence

import numpy as np

from mlsys_flows.errors import MlsysError
from mlsys_flows.systems.cedar.transfer import SharedMemoryChannel

Key = tuple[int, ...]
Item = tuple[Key, Any]
Kind = Literal["map", "filter", "flat_map", "batch", "shuffle"]


def fmt_key(key: Key) -> str:
    return "/".join(str(k) for k in key)


class OperatorError(MlsysError, RuntimeError):
    """A user's operator raised; names the operator and the sample (its key)."""

    def __init__(self, op: str, key: Key, cause: str):
        self.op, self.key, self.cause = op, tuple(key), cause
        super().__init__(f"operator {op!r} failed on sample {fmt_key(key)}: {cause}")

    def __reduce__(self):  # crosses process boundaries intact
        return (OperatorError, (self.op, self.key, self.cause))


class WorkerDied(MlsysError, RuntimeError):
    """A worker process running part of the pipeline died (killed, out of memory, crashed)."""


# ----- operators -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Op:
    """One operator. Marks: ``deterministic`` (output depends only on the input: cacheable);
    ``order_sensitive`` (depends on stream order or state: runs in order in the main process and
    nothing moves across it); ``reads``/``writes`` (the sample fields it uses; an operator that
    declares them may be reordered with any neighbour whose fields do not conflict)."""

    kind: Kind
    name: str
    fn: Callable | None = None
    deterministic: bool = True
    random: bool = False            # fn(x, rng) with a generator seeded by (seed, epoch, name, key)
    order_sensitive: bool = False
    reads: tuple[str, ...] | None = None
    writes: tuple[str, ...] | None = None
    size: int = 0                   # batch size or shuffle buffer
    drop_last: bool = False
    collate: Callable | None = None

    @property
    def per_sample(self) -> bool:
        """Runs on each sample independently: may be fused into a stage and offloaded."""
        return self.kind in ("map", "filter", "flat_map") and not self.order_sensitive

    @property
    def reorderable(self) -> bool:
        return (self.kind in ("map", "filter") and not self.order_sensitive
                and self.reads is not None and self.writes is not None)

    def commutes(self, other: "Op") -> bool:
        if not (self.reorderable and other.reorderable):
            return False
        a_r, a_w, b_r, b_w = set(self.reads), set(self.writes), set(other.reads), set(other.writes)
        return not (a_w & (b_r | b_w) or b_w & a_r)

    def label(self) -> str:
        if self.kind in ("batch", "shuffle"):
            return f"{self.kind}({self.size})"
        marks = [m for m, on in (("det", self.deterministic), ("rand", self.random),
                                 ("ordered", self.order_sensitive)) if on]
        return f"{self.kind} {self.name!r}" + (f" [{', '.join(marks)}]" if marks else "")


def deterministic_prefix(ops: Sequence[Op]) -> int:
    """How many leading operators are per-sample and deterministic: the prefix whose outputs are the
    same every epoch, so they may be computed once and cached (cedar's cache rule and the caching
    DataLoader baseline both cut here, before the first random or order-sensitive operator)."""
    n = 0
    for op in ops:
        if not (op.per_sample and op.deterministic and not op.random):
            break
        n += 1
    return n


def _rng(seed: int, epoch: int, name: str, key: Key) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, zlib.crc32(name.encode()), *key])


def call_op(op: Op, key: Key, x: Any, seed: int, epoch: int) -> Any:
    """Call the user's function, naming the operator and the sample if it raises."""
    try:
        return op.fn(x, _rng(seed, epoch, op.name, key)) if op.random else op.fn(x)
    except OperatorError:
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised with the operator and sample named
        raise OperatorError(op.name, key, f"{type(exc).__name__}: {exc}") from exc


def apply_op(op: Op, items: Iterable[Item], seed: int, epoch: int) -> Iterator[Item]:
    """Stream ``items`` through one per-sample operator (one iterator per operator)."""
    for key, x in items:
        out = call_op(op, key, x, seed, epoch)
        if op.kind == "map":
            yield key, out
        elif op.kind == "filter":
            if out:
                yield key, x
        else:  # flat_map: children get sub-keys
            for j, y in enumerate(out):
                yield (*key, j), y


def _run_one(ops: Sequence[Op], i: int, key: Key, x: Any, seed: int, epoch: int, out: list[Item]) -> None:
    while i < len(ops):
        op = ops[i]
        y = call_op(op, key, x, seed, epoch)
        if op.kind == "map":
            x = y
        elif op.kind == "filter":
            if not y:
                return
        else:
            for j, z in enumerate(y):
                _run_one(ops, i + 1, (*key, j), z, seed, epoch, out)
            return
        i += 1
    out.append((key, x))


def run_ops(ops: Sequence[Op], items: list[Item], seed: int, epoch: int) -> list[Item]:
    """A fused stage: each sample goes through all of ``ops`` in one loop, no iterator hand-offs."""
    out: list[Item] = []
    for key, x in items:
        _run_one(ops, 0, key, x, seed, epoch, out)
    return out


def default_collate(samples: list[Any]) -> Any:
    """Stack arrays (and numbers) into arrays; dicts field by field; anything else as a list."""
    first = samples[0]
    if isinstance(first, dict):
        return {k: default_collate([s[k] for s in samples]) for k in first}
    if isinstance(first, np.ndarray):
        return np.stack(samples)
    if isinstance(first, (int, float, np.number, bool)):
        return np.asarray(samples)
    return list(samples)


def _batches(op: Op, items: Iterator[Item]) -> Iterator[Item]:
    collate = op.collate or default_collate
    buf: list[Any] = []
    n = 0
    for _, x in items:
        buf.append(x)
        if len(buf) == op.size:
            yield (n,), collate(buf)
            n, buf = n + 1, []
    if buf and not op.drop_last:
        yield (n,), collate(buf)


def _shuffled(op: Op, items: Iterator[Item], seed: int, epoch: int) -> Iterator[Item]:
    rng = np.random.default_rng([seed, epoch, zlib.crc32(op.name.encode())])
    buf: list[Item] = []
    for it in items:
        buf.append(it)
        if len(buf) >= op.size:
            yield buf.pop(int(rng.integers(len(buf))))
    rng.shuffle(buf)
    yield from buf


# ----- sources -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Source:
    """Lightweight references (paths, keys, row-group numbers, or the samples themselves); reading
    is an operator, so it can be fused, cached and offloaded like any other."""

    refs: tuple[Any, ...]
    description: str

    def fingerprint(self) -> str:
        return hashlib.sha256(pickle.dumps((self.description, self.refs))).hexdigest()[:16]


def read_local_file(sample: dict) -> dict:
    with open(sample["path"], "rb") as fh:
        return {**sample, "data": fh.read()}


@dataclass(frozen=True)
class StorageReader:
    """Reads ``sample['key']`` from anything with ``read_bytes(key)`` (an ObjectStorage block)."""

    store: Any

    def __call__(self, sample: dict) -> dict:
        return {**sample, "data": self.store.read_bytes(sample["key"])}


@dataclass(frozen=True)
class ParquetRowGroups:
    """Expands a row-group number into that row group's rows (dicts)."""

    path: str
    store: Any = None
    columns: tuple[str, ...] | None = None

    def open(self):
        return self.store.open_input(self.path) if self.store is not None else open(self.path, "rb")

    def __call__(self, row_group: int) -> list[dict]:
        import pyarrow.parquet as pq

        with self.open() as fh:
            table = pq.ParquetFile(fh).read_row_group(row_group, columns=list(self.columns) if self.columns else None)
        return table.to_pylist()


# ----- caches --------------------------------------------------------------------------------

class DirStore:
    """A cache on local disk with the ObjectStorage byte interface (atomic writes)."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def write_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)

    def read_bytes(self, key: str) -> bytes:
        with open(self._path(key), "rb") as fh:
            return fh.read()

    def exists(self, key: str) -> bool:
        return os.path.exists(self._path(key))

    def delete(self, key_or_prefix: str) -> None:
        """Remove a key or everything under a prefix."""
        import shutil

        path = self._path(key_or_prefix.strip("/"))
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.exists(path):
            os.remove(path)

    def __repr__(self) -> str:
        return f"local disk {self.root}"


def as_store(cache: Any) -> Any:
    """A path -> DirStore; anything with write_bytes/read_bytes/exists (ObjectStorage) as is."""
    if isinstance(cache, (str, os.PathLike)):
        return DirStore(os.fspath(cache))
    for attr in ("write_bytes", "read_bytes", "exists"):
        if not callable(getattr(cache, attr, None)):
            raise TypeError(f"cache must be a folder path or have {attr}(); got {type(cache).__name__}")
    return cache


def store_label(store: Any) -> str:
    root = getattr(store, "root_url", None)
    return f"{type(store).__name__} {root}" if root else repr(store)


@dataclass(frozen=True)
class Cache:
    store: Any
    prefix: str  # includes the fingerprint of the source and the cached operators

    def shard(self, i: int) -> str:
        return f"{self.prefix}/shard-{i:06d}.pkl"

    @property
    def manifest(self) -> str:
        return f"{self.prefix}/complete"

    def complete(self) -> bool:
        return bool(self.store.exists(self.manifest))


def dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=5)


# ----- physical plan ---------------------------------------------------------------------------

Executor = Literal["inline", "process", "remote"]
Transfer = Literal["shared_memory", "pickle"]


@dataclass(frozen=True)
class Stage:
    """A run of per-sample operators executed together on chunks of samples.
    ``cache_ops`` leading operators of the first stage are cached (cold epoch: compute and write a
    shard per chunk; warm epochs: read the shard and run only the rest)."""

    ops: tuple[Op, ...]
    cold: Executor = "inline"
    warm: Executor = "inline"
    cache_ops: int = 0
    fused: bool = True  # False: one streaming iterator per operator (the unoptimized plan)

    def label(self) -> str:
        return " -> ".join(op.name for op in self.ops)


@dataclass(frozen=True)
class Decision:
    rule: str          # reorder | fuse | cache | offload | prefetch
    applied: bool
    detail: str
    est_gain_s: float  # estimated seconds saved per epoch (0 when not applied)
    transfer: str = ""  # offload: how results come back (shared_memory | pickle | remote executor)

    def line(self) -> str:
        mark = "+" if self.applied else "-"
        return f"{mark} {self.rule}: {self.detail} (est. gain {self.est_gain_s * 1e3:.0f} ms/epoch)"


@dataclass(frozen=True)
class Plan:
    steps: tuple[Stage | Op, ...]
    cache: Cache | None = None
    prefetch: int = 0
    chunk: int = 16
    workers: int = 1
    remote_workers: int = 0
    decisions: tuple[Decision, ...] = ()
    optimized: bool = False
    # how results of stages on local worker processes come back: large arrays through shared
    # memory (small results still pickled), or everything pickled through the pool's pipes
    transfer: Transfer = "shared_memory"

    @classmethod
    def naive(cls, ops: Sequence[Op]) -> "Plan":
        return cls(steps=tuple(Stage((op,), fused=False) if op.per_sample else op for op in ops))


# ----- remote/process execution -----------------------------------------------------------------

_STAGE_CACHE: dict[str, Any] = {}


@dataclass(frozen=True)
class ChunkJob:
    """What a worker needs to run one stage on one chunk (pickled once with cloudpickle)."""

    ops: tuple[Op, ...]
    seed: int
    cache: Cache | None
    cache_ops: int

    def run(self, chunk_id: int, items: list[Item] | None, epoch: int, warm: bool) -> list[Item]:
        ops = self.ops
        if self.cache is not None:
            if warm:
                items = pickle.loads(self.cache.store.read_bytes(self.cache.shard(chunk_id)))
            else:
                items = run_ops(ops[: self.cache_ops], items, self.seed, epoch)
                self.cache.store.write_bytes(self.cache.shard(chunk_id), dumps(items))
            ops = ops[self.cache_ops:]
        return run_ops(ops, items, self.seed, epoch)


def _run_chunk(blob_id: str, blob: bytes, chunk_id: int, items, epoch: int, warm: bool) -> list[Item]:
    job = _STAGE_CACHE.get(blob_id)
    if job is None:
        import cloudpickle

        job = _STAGE_CACHE[blob_id] = cloudpickle.loads(blob)
    return job.run(chunk_id, items, epoch, warm)


WARMUP_CHUNK = 999_999  # chunk id of the optimizer's warm-up jobs (a spare shard in a trial cache)


def _warm_chunk(blob_id: str, blob: bytes, chunk_id: int, items, warm: bool, hold_s: float = 0.02) -> int:
    """Load a stage in this worker and run one small chunk, then hold the worker for ``hold_s``
    so that concurrent warm-up jobs land on the other workers (the optimizer's trials)."""
    import time

    out = _run_chunk(blob_id, blob, chunk_id, items, 0, warm)
    time.sleep(hold_s)
    return len(out)


def _chunks(items: Iterator[Item], size: int) -> Iterator[list[Item]]:
    buf: list[Item] = []
    for it in items:
        buf.append(it)
        if len(buf) == size:
            yield buf
            buf = []
    if buf:
        yield buf


def _exit_with_parent(parent: int) -> None:
    """Pool initializer: a pool process whose parent is gone (a Dask worker killed mid-task, a run
    stopped by Ctrl-C) exits, as torch's DataLoader workers do, instead of waiting on the pool's queue
    forever, an orphan that keeps its parent's stdout open (seen: a stopped run's output never closed)."""
    import time

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


class Runtime:
    """Process pools and the remote executor of one pipeline, kept across epochs, and the
    shared-memory channel the pool's results come back through."""

    def __init__(self, remote: Any = None):
        self.remote = remote
        self._pool: ProcessPoolExecutor | None = None
        self._workers = 0
        self.channel = SharedMemoryChannel()

    def pool(self, workers: int) -> ProcessPoolExecutor:
        if self._pool is None or self._workers != workers or getattr(self._pool, "_broken", False):
            self.close()
            import multiprocessing as mp

            ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
            self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_exit_with_parent,
                                             initargs=(os.getpid(),))
            self._workers = workers
        return self._pool

    def process_submit(self, workers: int, transfer: Transfer = "shared_memory") -> Callable:
        """``submit(fn, *args)`` on the pool of ``workers`` processes; with ``shared_memory``, large
        arrays in results come back through shared memory (``self.channel`` counts how)."""
        pool = self.pool(workers)
        return self.channel.submitter(pool.submit) if transfer == "shared_memory" else pool.submit

    def adopt(self, other: "Runtime") -> None:
        """Take over ``other``'s process pool."""
        self.close()
        self._pool, self._workers, other._pool = other._pool, other._workers, None

    def worker_pids(self) -> list[int]:
        return list(getattr(self._pool, "_processes", {}) or {})

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self.channel.close()


def _parallel(submit: Callable, jobs: Iterator[tuple], inflight: int, what: str) -> Iterator[list[Item]]:
    """Submit ``jobs`` keeping at most ``inflight`` outstanding (a bounded buffer); yield results in
    submission order. A dead worker process becomes a WorkerDied error, never a hang."""
    pending: deque = deque()

    def take():
        fut, chunk_id = pending.popleft()
        try:
            return fut.result()
        except BrokenProcessPool:
            raise WorkerDied(f"a worker process died while running stage {what!r} (chunk {chunk_id}); "
                             f"the pool is restarted on the next iteration") from None

    try:
        for job in jobs:
            pending.append((submit(*job), job[2]))
            if len(pending) >= inflight:
                yield take()
        while pending:
            yield take()
    finally:  # an early stop or an error: results never taken are cancelled or freed
        for fut, _ in pending:
            discard = getattr(fut, "discard", None)
            if discard is not None:
                discard()  # waits for a running chunk, then unlinks its shared memory
            else:
                fut.cancel()


# ----- execution -------------------------------------------------------------------------------

def _prefetched(it: Iterator[Any], buffer: int) -> Iterator[Any]:
    """Run ``it`` in a background thread that stays at most ``buffer`` items ahead."""
    q: queue.Queue = queue.Queue(maxsize=buffer)
    stop = threading.Event()
    done = object()

    def fill():
        try:
            for x in it:
                while not stop.is_set():
                    try:
                        q.put((None, x), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put((None, done))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            q.put((exc, None))

    t = threading.Thread(target=fill, name="cedar-prefetch", daemon=True)
    t.start()
    try:
        while True:
            exc, x = q.get()
            if exc is not None:
                raise exc
            if x is done:
                return
            yield x
    finally:
        stop.set()
        t.join(timeout=5)


def execute(plan: Plan, source: Source, seed: int, epoch: int, runtime: Runtime) -> Iterator[Any]:
    """Yield the pipeline's outputs for one epoch under ``plan``."""
    stream: Iterator[Item] = (((i,), ref) for i, ref in enumerate(source.refs))
    for pos, step in enumerate(plan.steps):
        if isinstance(step, Op):
            if step.kind == "batch":
                stream = _batches(step, stream)
            elif step.kind == "shuffle":
                stream = _shuffled(step, stream, seed, epoch)
            else:  # an order-sensitive per-sample operator
                stream = apply_op(step, stream, seed, epoch)
        else:
            stream = _run_stage(plan, step, stream, source, seed, epoch, runtime, first=(pos == 0))
    values: Iterator[Any] = (x for _, x in stream)
    return _prefetched(values, plan.prefetch) if plan.prefetch else values


def _run_stage(plan: Plan, stage: Stage, stream: Iterator[Item], source: Source, seed: int, epoch: int,
               runtime: Runtime, first: bool) -> Iterator[Item]:
    if not stage.fused:
        for op in stage.ops:
            stream = apply_op(op, stream, seed, epoch)
        return stream
    cache = plan.cache if (first and stage.cache_ops) else None
    warm = cache is not None and cache.complete()
    executor = stage.warm if warm else stage.cold
    job = ChunkJob(stage.ops, seed, cache, stage.cache_ops if cache else 0)
    if warm:  # the source is not read at all: chunk ids name the shards
        n_chunks = -(-len(source.refs) // plan.chunk)
        jobs = ((i, None) for i in range(n_chunks))
    else:
        jobs = enumerate(_chunks(stream, plan.chunk))
    return _stage_outputs(job, jobs, executor, plan, epoch, warm, runtime, cache, stage.label())


def _stage_outputs(job: ChunkJob, jobs, executor: Executor, plan: Plan, epoch: int, warm: bool,
                   runtime: Runtime, cache: Cache | None, what: str) -> Iterator[Item]:
    if executor == "inline":
        results = (job.run(i, items, epoch, warm) for i, items in jobs)
    else:
        import cloudpickle

        blob = cloudpickle.dumps(job)
        blob_id = hashlib.sha1(blob).hexdigest()
        if executor == "process":
            psubmit, inflight = runtime.process_submit(plan.workers, plan.transfer), 2 * plan.workers
            submit = lambda *a: psubmit(_run_chunk, *a)  # noqa: E731
        else:
            if runtime.remote is None:
                raise ValueError("plan offloads to remote workers but the pipeline has no remote executor")
            inflight = 2 * max(plan.remote_workers, 1)
            submit = lambda *a: runtime.remote.submit(_run_chunk, *a)  # noqa: E731
        results = _parallel(submit, ((blob_id, blob, i, items, epoch, warm) for i, items in jobs), inflight, what)
    for out in results:
        yield from out
    if cache is not None and not warm:  # every shard written: later epochs read them
        cache.store.write_bytes(cache.manifest, b"ok")


__all__ = ["Op", "Source", "Stage", "Plan", "Decision", "Cache", "DirStore", "Runtime", "OperatorError",
           "deterministic_prefix",
           "WorkerDied", "execute", "apply_op", "call_op", "run_ops", "default_collate", "fmt_key", "dumps", "as_store",
           "store_label", "StorageReader", "ParquetRowGroups", "read_local_file"]
