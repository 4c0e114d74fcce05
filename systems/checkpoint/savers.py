"""The mechanism's ablation saver (pure: torch only; the store is duck-typed as the CheckpointStore block).

DataStates-LLM splits a checkpoint in two: a snapshot of the state into host memory (cheap, and
lazy: overlapped with the next forward and backward pass), then persistence from that snapshot in
the background. ``SerializeAsyncSaver`` keeps the background persistence but drops the in-memory
snapshot: with no copy of its own, the live state must be serialised before the loop may go on, so
the training thread runs ``torch.save`` itself and only the checksum, the write and the manifest run
in the background (at most one flush in flight, like ``AsyncSaver``).

``DcpAsyncSaver`` is a deployable baseline: PyTorch's own asynchronous checkpointing
(``torch.distributed.checkpoint.async_save``), a copy into cached host buffers then a write on a
background thread. ``lazy=False`` (variant ``dcp_async``) stages eagerly inside ``save``; ``lazy=True``
(variant ``dcp_async_lazy``) keeps DCP's default asynchronous staging: the copy runs on DCP's staging
thread while the next forward and backward pass run, and the loop waits for it (``staging_completion``)
only right before the next optimizer step, the same barrier as DataStates-LLM's lazy copy.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import threading
import time
from typing import Any


def write_blob(store: Any, run_key: str, step: int, blob: bytes) -> dict[str, Any]:
    """Persist an already serialised checkpoint the way ``CheckpointStore.save`` persists its own
    serialisation: the blob (atomic, fsynced by the storage), then the manifest entry, then the
    checkpoints past ``keep_last`` deleted. Returns the manifest entry."""
    key = f"{store.prefix}/{run_key}/step-{step:09d}.pt"
    store.storage.write_bytes(key, blob)
    entry = {"step": step, "key": key, "sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob),
             "saved_at": time.time()}
    doc = store._manifest_doc(run_key)
    entries = sorted([e for e in doc["checkpoints"] if e["step"] != step] + [entry], key=lambda e: e["step"])
    kept, dropped = entries[-store.keep_last:], entries[:-store.keep_last]
    store.storage.write_json(store._manifest_key(run_key), {**doc, "checkpoints": kept})
    for old in dropped:
        store.storage.delete(old["key"])
    return entry


class SerializeAsyncSaver:
    """Asynchronous persistence without the in-memory snapshot: ``save`` waits for the previous
    flush, serialises the live state in the training thread (the stall the snapshot avoids), then
    writes it on a background thread. ``flushes`` as the block's savers record them (``copy_s`` is
    the in-loop serialisation)."""

    asynchronous = True
    lazy = False

    def __init__(self, store: Any, run_key: str):
        self.store, self.run_key = store, run_key
        self.flushes: list[dict[str, Any]] = []
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(self, step: int, state: Any) -> None:
        import torch

        if step < 0:
            raise ValueError(f"checkpoint step must be >= 0 (got {step})")
        self._join()
        t0 = time.perf_counter()
        buf = io.BytesIO()
        torch.save(state, buf)
        blob = buf.getvalue()
        serialise_s = time.perf_counter() - t0
        self._thread = threading.Thread(target=self._run, args=(step, blob, serialise_s),
                                        name=f"checkpoint-write-{self.run_key}", daemon=False)
        self._thread.start()

    def _run(self, step: int, blob: bytes, serialise_s: float) -> None:
        try:
            t0 = time.perf_counter()
            entry = write_blob(self.store, self.run_key, step, blob)
            self.flushes.append({"step": step, "bytes": entry["size"],
                                 "seconds": serialise_s + time.perf_counter() - t0, "copy_s": serialise_s})
        except BaseException as exc:  # noqa: BLE001 - raised in the training loop by the next call
            self._error = exc

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"a checkpoint write of run {self.run_key!r} failed: {err}") from err

    def before_update(self) -> None:
        """The state was serialised inside ``save``: the optimizer step may mutate it."""
        if self._error is not None:
            self._join()

    def wait(self) -> None:
        self._join()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.wait()


def make_saver(store: Any, variant: str, run_key: str):
    """The saver of ``variant`` (None for "none") on ``store`` (a CheckpointStore)."""
    from . import MODES

    mode = MODES[variant]
    if mode is None:
        return None
    if mode == "serialize":
        return SerializeAsyncSaver(store, run_key)
    if mode == "dcp":
        return DcpAsyncSaver(store, run_key)
    if mode == "dcp_lazy":
        return DcpAsyncSaver(store, run_key, lazy=True)
    return store.saver(run_key, asynchronous=mode[0], lazy=mode[1])


class DcpAsyncSaver:
    """The asynchronous save practitioners deploy from PyTorch itself: ``torch.distributed.checkpoint``'s
    ``async_save`` (single process, ``no_dist=True``) with one long-lived stager (``DefaultStager``) that
    caches the host copies and reuses them from one checkpoint to the next, a ``FileSystemWriter`` with
    ``sync_files=True`` (every file fsynced; the ``.metadata`` file, written last, commits the checkpoint;
    DCP writes no checksum and keeps no manifest of its own), and the previous save's upload waited for
    before the next one (at most one in flight, like the other asynchronous savers).

    ``lazy=False`` (``dcp_async``): staging off the stager's thread (``use_async_staging=False``): the copy
    into the staged buffers happens inside ``save`` (eager staging). ``lazy=True`` (``dcp_async_lazy``):
    DCP's default asynchronous staging (``StagingOptions()``'s ``use_async_staging=True``; pinned memory and
    non-blocking copies are moot on a CPU-only build, so off): ``save`` returns at once with an
    ``AsyncSaveResponse``, the copy runs on the stager's thread during the next forward and backward pass,
    and ``before_update`` waits for its ``staging_completion`` before the optimizer mutates the state (the
    state must not change while it is copied). In both the write runs on DCP's background thread and the
    final ``wait`` waits for the upload. Each checkpoint is a folder ``step-N/`` under the store's
    ``prefix/run_key`` on a local storage root; the ``keep_last`` newest are kept. ``flushes`` as the
    block's savers record them (``copy_s`` the staging: in ``save`` when eager, on the stager's thread when
    lazy; ``seconds`` from the end of ``save`` to the end of the write)."""

    asynchronous = True

    def __init__(self, store: Any, run_key: str, lazy: bool = False):
        if getattr(store.storage, "is_s3", False):
            raise ValueError("dcp_async writes through torch.distributed.checkpoint's FileSystemWriter: it needs a "
                             f"local (file://) storage root, not {store.storage.root_url}")
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        self.store, self.run_key, self.lazy = store, run_key, lazy
        self.flushes: list[dict[str, Any]] = []
        self._stager = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                                    use_async_staging=lazy, use_non_blocking_copy=False))
        self._future = None
        self._staging = None  # lazy: the staging_completion future the next optimizer step waits for
        self._pending: dict[str, Any] | None = None
        self._kept: list[tuple[int, str]] = []  # (step, key) of the checkpoints on storage, oldest first

    def key_of(self, step: int) -> str:
        return f"{self.store.prefix}/{self.run_key}/step-{step:09d}"

    def save(self, step: int, state: Any) -> None:
        import torch.distributed.checkpoint as dcp

        if step < 0:
            raise ValueError(f"checkpoint step must be >= 0 (got {step})")
        self._join()
        key = self.key_of(step)
        writer = dcp.FileSystemWriter(self.store.storage.path(key), sync_files=True)
        t0 = time.perf_counter()
        with _quiet():
            out = dcp.async_save(state, storage_writer=writer, async_stager=self._stager, no_dist=True)
        t1 = time.perf_counter()
        pending = {"step": step, "key": key, "copy_s": t1 - t0, "t0": t1, "finished": threading.Event()}
        if self.lazy:  # an AsyncSaveResponse: the copy is still running on the stager's thread
            future, self._staging = out.upload_completion, out.staging_completion
            self._staging.add_done_callback(lambda f, p=pending, t=t0: p.__setitem__("copy_s", time.perf_counter() - t))
        else:  # staging (the copy into the cached host buffers) ran inside
            future = out
        future.add_done_callback(lambda f, p=pending: self._finish(f, p))
        self._future, self._pending = future, pending

    def _finish(self, future, pending: dict[str, Any]) -> None:
        """On DCP's thread once the write is done (the block's savers, too, prune in the background):
        the checkpoint's size, then the checkpoints past ``keep_last`` deleted."""
        try:
            pending["done"] = time.perf_counter()
            if future.exception() is None:
                fs, _ = self.store.storage.filesystem()
                # the data files only: DCP's ``.metadata`` index embeds the storage path, so counting it would
                # make a counted size depend on where the run writes (a resumed or faulted run writes elsewhere)
                pending["bytes"] = sum(fs.size(f) for f in fs.find(self.store.storage.path(pending["key"]))
                                       if not f.endswith(".metadata"))
                self._kept.append((pending["step"], pending["key"]))
                while len(self._kept) > self.store.keep_last:
                    self.store.storage.delete(self._kept.pop(0)[1])
        except BaseException as exc:  # noqa: BLE001 - raised in the training loop by the next call
            pending["error"] = exc
        finally:
            pending["finished"].set()

    def _join(self) -> None:
        if self._future is None:
            return
        future, pending, self._future, self._pending = self._future, self._pending, None, None
        staging, self._staging = self._staging, None
        try:
            if staging is not None:
                staging.result()
            future.result()
            pending["finished"].wait()
            if "error" in pending:
                raise pending["error"]
        except BaseException as exc:  # noqa: BLE001 - raised in the training loop, like the block's savers
            raise RuntimeError(f"a torch.distributed.checkpoint save of run {self.run_key!r} failed: {exc}") from exc
        self.flushes.append({"step": pending["step"], "bytes": pending["bytes"],
                             "seconds": pending["done"] - pending["t0"], "copy_s": pending["copy_s"]})

    def before_update(self) -> None:
        """Eager: staging copied the state inside ``save``. Lazy: the optimizer step may mutate the state
        only once its staging (the copy on the stager's thread) has completed."""
        if self._staging is not None:
            staging, self._staging = self._staging, None
            try:
                staging.result()
            except BaseException as exc:  # noqa: BLE001 - raised in the training loop, like the block's savers
                raise RuntimeError(f"a torch.distributed.checkpoint staging of run {self.run_key!r} failed: "
                                   f"{exc}") from exc

    def wait(self) -> None:
        self._join()

    def restore(self, template: Any, step: int | None = None) -> Any:
        """The checkpoint of ``step`` (default: the newest kept) loaded into ``template`` (a state of the
        same structure, filled in place and returned)."""
        import torch.distributed.checkpoint as dcp

        self.wait()
        key = dict(self._kept)[step] if step is not None else self._kept[-1][1]
        with _quiet():
            dcp.load(template, checkpoint_id=self.store.storage.path(key), no_dist=True)
        return template

    def close(self) -> None:
        self.wait()
        self._stager.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def _quiet():
    """Silence DCP's warning that torch.distributed is not initialised (single process on purpose:
    no_dist=True) for the calls inside only: warnings.catch_warnings restores the filters on exit."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized",
                                category=UserWarning)
        yield
