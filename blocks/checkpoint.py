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
from typing import Any

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

    def saver(self, run_key: str, asynchronous: bool | None = None, lazy: bool | None = None) -> "SyncSaver":
        """A saver for one training run: ``SyncSaver`` or ``AsyncSaver`` (``asynchronous`` and
        ``lazy`` default to the block's fields). Use it as a context manager, or call ``wait()``."""
        _safe(run_key)
        asynchronous = self.asynchronous if asynchronous is None else asynchronous
        if not asynchronous:
            return SyncSaver(self, run_key)
        return AsyncSaver(self, run_key, lazy=self.lazy if lazy is None else lazy)

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

    def __init__(self, store: CheckpointStore, run_key: str):
        self.store, self.run_key = store, run_key
        self.flushes: list[dict[str, Any]] = []

    def save(self, step: int, state: Any) -> None:
        t0 = time.perf_counter()
        entry = self.store.write(self.run_key, step, state)
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

    def __init__(self, store: CheckpointStore, run_key: str, lazy: bool = False):
        super().__init__(store, run_key)
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
            entry = self.store.write(self.run_key, step, _fill(tree, targets))
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
