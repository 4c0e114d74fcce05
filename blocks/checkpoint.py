"""CheckpointStore: torch state dicts and nested data on an ObjectStorage, with a checksummed manifest,
saved synchronously or lazily and asynchronously (DataStates-LLM, HPDC 2024)."""
from __future__ import annotations

import copy
import hashlib
import io
import logging
import threading
import time
from collections import OrderedDict
from typing import Any, Callable

from prefect.blocks.core import Block
from pydantic import Field

from ._docs import DOCS_URL
from .storage import ObjectStorage, StorageError

log = logging.getLogger("mlsys_flows.checkpoint")


class CheckpointStore(Block):
    """Checkpoints of a training run (``run_key``) on an ObjectStorage.

    Each ``write`` stores the blob atomically, then the manifest (step, key, sha256, size); the
    manifest keeps the last ``keep_last`` checkpoints. ``latest``/``restore``/``resume`` verify the
    checksum and skip a corrupted or partial checkpoint with a warning. (The checkpoint methods are
    ``write``/``restore``, not ``save``/``load``: those are the Block's own, saving and loading the
    block's configuration by name.)

    A checkpoint is complete once the manifest names it: the blob is written first (atomically), the
    manifest last, so a crash at any point leaves the previous complete checkpoint in place.

    Sharded checkpoints (one shard per torch.distributed rank, ``write_shard``/``restore_shard``, or
    ``saver(run_key, rank=r, world_size=n)``): each rank writes its shard, then the shard's record;
    the global checkpoint of a step commits (a ``COMMIT.json`` naming every shard with its checksum)
    only once every rank's record is durable, written by whichever rank completes the set. A rank
    lost mid-flush leaves that step uncommitted: resume takes the newest committed step.

    ``saver(run_key)`` returns an object with ``save(step, state)``, ``before_update()`` and
    ``wait()`` for a training loop. With ``asynchronous`` it snapshots the state to host memory and
    flushes it to storage on a background thread while training goes on (at most one flush in
    flight; the next snapshot waits for it); with ``lazy`` as well, the snapshot itself is copied
    in the background during the next forward and backward pass, and ``before_update()`` (called
    right before the optimizer step) blocks only until that copy is done.

    Example:
        ```python
        from mlsys_flows.blocks import CheckpointStore

        store = CheckpointStore.load("BLOCK_NAME")
        step, state = store.resume("run-42", default={"model": model.state_dict()})
        store.write("run-42", step + 1, {"model": model.state_dict(), "opt": opt.state_dict()})
        step, state = store.restore("run-42")  # the newest valid checkpoint (or restore("run-42", step))

        with store.saver("run-42", asynchronous=True, lazy=True) as saver:  # wait()s on exit
            for step in ...:
                loss.backward()
                saver.before_update()  # lazy: the snapshot copy must be done before the state changes
                opt.step()
                saver.save(step, {"model": model.state_dict(), "opt": opt.state_dict()})

        # one shard per rank (e.g. of ranks started by platform.ranks.run_ranks)
        step, shard = store.resume_shard("run-42", rank, world_size, default=my_shard)
        with store.saver("run-42", asynchronous=True, rank=rank, world_size=world_size) as saver:
            saver.save(step, my_shard)  # commits globally once every rank's shard is durable
        ```
    """

    _block_type_name = "mlsys CheckpointStore"
    _block_type_slug = "mlsys-checkpoint-store"
    _documentation_url = DOCS_URL + "#checkpointstore"
    _description = "Checksummed torch checkpoints with a manifest and keep-last-N on an ObjectStorage."

    storage: ObjectStorage = Field(default_factory=ObjectStorage, description="Where checkpoints are written.")
    prefix: str = Field(default="checkpoints", min_length=1, description="Key prefix under the storage root.")
    keep_last: int = Field(default=3, ge=1, le=1000, description="How many most recent checkpoints to keep per run.")
    asynchronous: bool = Field(default=False, description="Default mode of saver(): snapshot to host memory and flush "
                                                          "to storage in the background (True) or save in the "
                                                          "training loop (False).")
    lazy: bool = Field(default=False, description="With asynchronous: copy the snapshot in the background during the "
                                                  "next forward/backward pass, blocking only in before_update(), which "
                                                  "the loop must call before the optimizer step (DataStates-LLM); "
                                                  "False copies it at save time (safe for any loop).")

    def _manifest_key(self, run_key: str) -> str:
        return f"{self.prefix}/{_safe(run_key)}/manifest.json"

    def _manifest_doc(self, run_key: str) -> dict[str, Any]:
        key = self._manifest_key(run_key)
        return self.storage.read_json(key) if self.storage.exists(key) else {"run_key": run_key, "checkpoints": []}

    def manifest(self, run_key: str) -> list[dict[str, Any]]:
        """Entries oldest first: {step, key, sha256, size, saved_at}."""
        return list(self._manifest_doc(run_key)["checkpoints"])

    def resumes(self, run_key: str) -> list[dict[str, Any]]:
        """Each time ``resume`` continued this run from a checkpoint: {step, at}, oldest first."""
        return list(self._manifest_doc(run_key).get("resumes", []))

    def write(self, run_key: str, step: int, state: Any) -> dict[str, Any]:
        """Store ``state`` (anything ``torch.save`` takes) as checkpoint ``step`` of ``run_key``; its manifest entry."""
        import torch

        if step < 0:
            raise ValueError(f"checkpoint step must be >= 0 (got {step})")
        buf = io.BytesIO()
        torch.save(state, buf)
        blob = buf.getvalue()
        key = f"{self.prefix}/{_safe(run_key)}/step-{step:09d}.pt"
        self.storage.write_bytes(key, blob)
        entry = {"step": step, "key": key, "sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob),
                 "saved_at": time.time()}
        doc = self._manifest_doc(run_key)
        entries = [e for e in doc["checkpoints"] if e["step"] != step] + [entry]
        entries.sort(key=lambda e: e["step"])
        kept, dropped = entries[-self.keep_last:], entries[:-self.keep_last]
        self.storage.write_json(self._manifest_key(run_key), {**doc, "checkpoints": kept})
        for old in dropped:
            self.storage.delete(old["key"])
        return entry

    def saver(self, run_key: str, asynchronous: bool | None = None, lazy: bool | None = None,
              rank: int | None = None, world_size: int | None = None, attempt: str = "",
              on_flush: Callable[[str, int], None] | None = None) -> "SyncSaver":
        """A saver for one training run: ``SyncSaver`` or ``AsyncSaver`` (``asynchronous`` and
        ``lazy`` default to the block's fields). Use it as a context manager, or call ``wait()``.
        With ``rank`` and ``world_size`` it saves this rank's shard (``write_shard``, with ``attempt``). ``on_flush``
        is called as ``on_flush("start" | "done", step)`` around each write, on the thread that
        writes (progress reporting; the fault tests kill a rank at "start")."""
        _safe(run_key)
        shard = None
        if rank is not None or world_size is not None:
            _check_shard(rank, world_size)
            shard = (rank, world_size, attempt)
        asynchronous = self.asynchronous if asynchronous is None else asynchronous
        if not asynchronous:
            return SyncSaver(self, run_key, shard=shard, on_flush=on_flush)
        return AsyncSaver(self, run_key, lazy=self.lazy if lazy is None else lazy, shard=shard, on_flush=on_flush)

    # ----- sharded checkpoints: one shard per rank, committed when every shard is durable ------
    def _step_dir(self, run_key: str, step: int) -> str:
        return f"{self.prefix}/{_safe(run_key)}/sharded/step-{step:09d}"

    def write_shard(self, run_key: str, step: int, rank: int, world_size: int, state: Any,
                    attempt: str = "") -> dict[str, Any]:
        """Store ``state`` as rank ``rank``'s shard of checkpoint ``step``: the blob, then its record;
        then, if every rank's record of the same ``attempt`` is there, the step's commit. Returns the
        shard's record.

        Whichever rank writes the last record sees the whole set (each rank lists after its own
        record is durable) and commits; two ranks finishing together both write the same commit.
        ``attempt`` names one launch of the ranks (``RankInfo.launch_id``): a record left by a rank of
        an earlier, failed launch at the same step never completes this launch's set."""
        import torch

        _check_shard(rank, world_size)
        if step < 0:
            raise ValueError(f"checkpoint step must be >= 0 (got {step})")
        buf = io.BytesIO()
        torch.save(state, buf)
        blob = buf.getvalue()
        base = self._step_dir(run_key, step)
        key = f"{base}/shard-{rank:05d}-of-{world_size:05d}.pt"
        self.storage.write_bytes(key, blob)
        record = {"step": step, "rank": rank, "world_size": world_size, "key": key, "attempt": attempt,
                  "sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob)}
        self.storage.write_json(f"{base}/record-{rank:05d}.json", record)
        records = [k for k in self.storage.list(base) if k.rsplit("/", 1)[-1].startswith("record-")]
        if len(records) == world_size and not self.storage.exists(f"{base}/COMMIT.json"):
            shards = sorted((self.storage.read_json(k) for k in records), key=lambda r: r["rank"])
            if [r["rank"] for r in shards] == list(range(world_size)) and \
                    all(r["world_size"] == world_size and r["attempt"] == attempt for r in shards):
                self.storage.write_json(f"{base}/COMMIT.json", {"step": step, "world_size": world_size,
                                                                "shards": shards})
                self._prune_sharded(run_key)
        return record

    def committed(self, run_key: str) -> list[dict[str, Any]]:
        """The committed global checkpoints of ``run_key``, oldest first: {step, world_size, shards}."""
        base = f"{self.prefix}/{_safe(run_key)}/sharded"
        commits = [k for k in self.storage.list(base) if k.endswith("/COMMIT.json")]
        docs = []
        for key in commits:
            try:
                docs.append(self.storage.read_json(key))
            except StorageError:  # pruned between the listing and the read
                continue
        return sorted(docs, key=lambda d: d["step"])

    def _prune_sharded(self, run_key: str) -> None:
        """Drop committed steps beyond ``keep_last``, and any uncommitted step older than the oldest
        kept (a step a lost rank never completed)."""
        steps = [d["step"] for d in self.committed(run_key)]
        if len(steps) <= self.keep_last:
            return
        oldest_kept = steps[-self.keep_last]
        base = f"{self.prefix}/{_safe(run_key)}/sharded"
        for step in sorted({int(k.split("/step-", 1)[1][:9]) for k in self.storage.list(base) if "/step-" in k}):
            if step < oldest_kept:
                try:
                    self.storage.delete(self._step_dir(run_key, step))
                except (FileNotFoundError, StorageError):  # another rank that committed is pruning it too
                    pass

    def restore_shard(self, run_key: str, rank: int, world_size: int, step: int | None = None) -> tuple[int, Any]:
        """(step, state) of rank ``rank``'s shard of the newest committed checkpoint (or of ``step``)
        whose shard verifies; never an uncommitted step. A different ``world_size`` than the one
        saved is an error (no resharding)."""
        import torch

        _check_shard(rank, world_size)
        for doc in reversed(self.committed(run_key)):
            if step is not None and doc["step"] != step:
                continue
            if doc["world_size"] != world_size:
                raise ValueError(f"world_size: checkpoint step {doc['step']} of run {run_key!r} has "
                                 f"{doc['world_size']} shards, this run has {world_size} ranks")
            blob = self._verified({**doc["shards"][rank], "step": doc["step"]})
            if blob is not None:
                return doc["step"], torch.load(io.BytesIO(blob), weights_only=True)
            if step is not None:
                break
        raise StorageError(f"no committed checkpoint for run {run_key!r}" + (f" at step {step}" if step is not None
                                                                              else "") + f" with a valid shard {rank}")

    def resume_shard(self, run_key: str, rank: int, world_size: int, default: Any = None) -> tuple[int, Any]:
        """(step, state) for rank ``rank`` to continue from: its shard of the newest committed
        checkpoint, else (-1, default). Every rank of a run gets the same step unless a shard of
        that step fails its checksum (then the call raises rather than mix steps)."""
        docs = self.committed(run_key)
        if not docs:
            return -1, default
        newest = docs[-1]["step"]
        step, state = self.restore_shard(run_key, rank, world_size)
        if step != newest:
            raise StorageError(f"rank {rank}'s shard of committed step {newest} of run {run_key!r} is corrupted; "
                               f"the ranks would resume from different steps")
        log.info("run %s rank %d resumes after committed step %s", run_key, rank, step)
        return step, state

    def _verified(self, entry: dict[str, Any]) -> bytes | None:
        try:
            blob = self.storage.read_bytes(entry["key"])
        except StorageError as exc:
            log.warning("checkpoint step %s is missing (%s); skipping it", entry["step"], exc)
            return None
        if len(blob) != entry["size"] or hashlib.sha256(blob).hexdigest() != entry["sha256"]:
            log.warning("checkpoint step %s failed its checksum (corrupted or partial); skipping it", entry["step"])
            return None
        return blob

    def latest(self, run_key: str) -> dict[str, Any] | None:
        """The newest manifest entry whose blob verifies, or None."""
        for entry in reversed(self.manifest(run_key)):
            if self._verified(entry) is not None:
                return entry
        return None

    def restore(self, run_key: str, step: int | None = None) -> tuple[int, Any]:
        """(step, state) of ``step`` or of the newest valid checkpoint; never loads a bad one."""
        import torch

        for entry in reversed(self.manifest(run_key)):
            if step is not None and entry["step"] != step:
                continue
            blob = self._verified(entry)
            if blob is not None:
                return entry["step"], torch.load(io.BytesIO(blob), weights_only=True)
            if step is not None:
                break
        raise StorageError(f"no valid checkpoint for run {run_key!r}" + (f" at step {step}" if step is not None else ""))

    def resume(self, run_key: str, default: Any = None) -> tuple[int, Any]:
        """(step, state) to continue from: the newest valid checkpoint, else (-1, default).
        A resume from a checkpoint is recorded in the manifest (``resumes``)."""
        try:
            step, state = self.restore(run_key)
        except StorageError:
            return -1, default
        doc = self._manifest_doc(run_key)
        doc["resumes"] = [*doc.get("resumes", []), {"step": step, "at": time.time()}]
        self.storage.write_json(self._manifest_key(run_key), doc)
        log.info("run %s resumes after checkpoint step %s", run_key, step)
        return step, state


def _check_shard(rank: Any, world_size: Any) -> None:
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1 (got {world_size!r})")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an integer in 0..{world_size - 1} (got {rank!r})")


def _safe(run_key: str) -> str:
    if not run_key or "/" in run_key or run_key in (".", ".."):
        raise ValueError(f"run_key must be a non-empty name without '/' (got {run_key!r})")
    return run_key


# ----- savers: what a training loop calls ----------------------------------------------------------
class SyncSaver:
    """Saves in the training loop: ``save`` returns once the checkpoint is complete on storage.
    ``flushes`` records each save: step, bytes, seconds (serialize, checksum, write, manifest)."""

    asynchronous = False
    lazy = False

    def __init__(self, store: CheckpointStore, run_key: str, shard: tuple[int, int, str] | None = None,
                 on_flush: Callable[[str, int], None] | None = None):
        self.store, self.run_key, self.shard, self.on_flush = store, run_key, shard, on_flush
        self.flushes: list[dict[str, Any]] = []

    def _write(self, step: int, state: Any) -> dict[str, Any]:
        """The checkpoint (or this rank's shard) on storage, with ``on_flush`` around it."""
        if self.on_flush:
            self.on_flush("start", step)
        if self.shard is None:
            entry = self.store.write(self.run_key, step, state)
        else:
            rank, world_size, attempt = self.shard
            entry = self.store.write_shard(self.run_key, step, rank, world_size, state, attempt=attempt)
        if self.on_flush:
            self.on_flush("done", step)
        return entry

    def save(self, step: int, state: Any) -> None:
        t0 = time.perf_counter()
        entry = self._write(step, state)
        self.flushes.append({"step": step, "bytes": entry["size"], "seconds": time.perf_counter() - t0,
                             "copy_s": 0.0})

    def before_update(self) -> None:
        """Called right before the optimizer step mutates the state: nothing to wait for here."""

    def wait(self) -> None:
        """Every save is complete when it returns: nothing to wait for."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.wait()


class AsyncSaver(SyncSaver):
    """Snapshot to host memory, flush in the background, at most one flush in flight.

    ``save(step, state)`` first waits for the previous flush (the host buffers are reused), then
    copies every tensor of ``state`` into the host buffers: at once (``lazy=False``), or on the
    background thread while the caller runs the next forward and backward pass (``lazy=True``;
    the caller must then call ``before_update()`` before it mutates the state again). The same
    thread then writes the snapshot with ``CheckpointStore.write`` (blob first, manifest last). A
    flush that failed raises its error from the next ``save``, ``before_update`` or ``wait``."""

    asynchronous = True

    def __init__(self, store: CheckpointStore, run_key: str, lazy: bool = False,
                 shard: tuple[int, int, str] | None = None, on_flush: Callable[[str, int], None] | None = None):
        super().__init__(store, run_key, shard=shard, on_flush=on_flush)
        self.lazy = lazy
        self._buffers: list[Any] = []  # host tensors, reused from one snapshot to the next
        self._thread: threading.Thread | None = None
        self._copied = threading.Event()
        self._copied.set()
        self._error: BaseException | None = None

    def _raise_failed(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"an asynchronous checkpoint flush of run {self.run_key!r} failed: {err}") from err

    def save(self, step: int, state: Any) -> None:
        if step < 0:
            raise ValueError(f"checkpoint step must be >= 0 (got {step})")
        self._join()  # at most one flush in flight: this snapshot reuses the host buffers
        sources: list[Any] = []
        tree = _skeleton(state, sources)
        targets = self._host_buffers(sources)
        self._copied.clear()
        if not self.lazy:
            t0 = time.perf_counter()
            _copy_all(targets, sources)
            copy_s = time.perf_counter() - t0
            self._copied.set()
            sources = []
        else:
            copy_s = None
        self._thread = threading.Thread(target=self._run, args=(step, tree, targets, sources, copy_s),
                                        name=f"checkpoint-flush-{self.run_key}", daemon=False)
        self._thread.start()

    def _run(self, step: int, tree: Any, targets: list[Any], sources: list[Any], copy_s: float | None) -> None:
        try:
            if copy_s is None:  # lazy: the caller is in its forward/backward pass meanwhile
                t0 = time.perf_counter()
                _copy_all(targets, sources)
                copy_s = time.perf_counter() - t0
                self._copied.set()
            sources = []  # the live tensors are no longer needed
            t0 = time.perf_counter()
            entry = self._write(step, _fill(tree, targets))
            self.flushes.append({"step": step, "bytes": entry["size"], "seconds": time.perf_counter() - t0,
                                 "copy_s": copy_s})
        except BaseException as exc:  # noqa: BLE001 - raised in the training loop by the next call
            log.warning("asynchronous checkpoint step %s of run %s failed: %s", step, self.run_key, exc)
            self._error = exc
        finally:
            self._copied.set()

    def _host_buffers(self, sources: list[Any]) -> list[Any]:
        import torch

        same = len(self._buffers) == len(sources) and all(
            b.shape == s.shape and b.dtype == s.dtype for b, s in zip(self._buffers, sources))
        if not same:
            pin = torch.cuda.is_available() and any(s.is_cuda for s in sources)
            self._buffers = [torch.empty(s.shape, dtype=s.dtype, device="cpu", pin_memory=pin) for s in sources]
        return self._buffers

    def before_update(self) -> None:
        """Block until the lazy snapshot copy is done: the optimizer step may then mutate the state."""
        self._copied.wait()
        self._raise_failed()

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._raise_failed()

    def wait(self) -> None:
        """Block until the last flush is complete on storage (call before the training exits)."""
        self._join()


def _skeleton(obj: Any, tensors: list[Any]) -> Any:
    """``obj`` with every tensor replaced by its index in ``tensors`` (appended); other leaves copied."""
    import torch

    if isinstance(obj, torch.Tensor):
        tensors.append(obj.detach())
        return _Slot(len(tensors) - 1)
    if isinstance(obj, dict):
        out = OrderedDict() if isinstance(obj, OrderedDict) else {}
        for k, v in obj.items():
            out[k] = _skeleton(v, tensors)
        if hasattr(obj, "_metadata"):  # a module state_dict's version info
            out._metadata = copy.deepcopy(obj._metadata)
        return out
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_skeleton(v, tensors) for v in obj)
    return copy.deepcopy(obj)


def _fill(tree: Any, tensors: list[Any]) -> Any:
    if isinstance(tree, _Slot):
        return tensors[tree.index]
    if isinstance(tree, dict):
        out = OrderedDict() if isinstance(tree, OrderedDict) else {}
        for k, v in tree.items():
            out[k] = _fill(v, tensors)
        if hasattr(tree, "_metadata"):
            out._metadata = tree._metadata
        return out
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        return type(tree)(_fill(v, tensors) for v in tree)
    return tree


def _copy_all(targets: list[Any], sources: list[Any]) -> None:
    for dst, src in zip(targets, sources):
        dst.copy_(src)


class _Slot:
    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index
