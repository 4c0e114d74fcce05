"""The mechanism's ablation saver (pure: torch only; the store is duck-typed as the CheckpointStore block).

DataStates-LLM splits a checkpoint in two: a snapshot of the state into host memory (cheap, and
lazy: overlapped with the next forward and backward pass), then persistence from that snapshot in
the background. ``SerializeAsyncSaver`` keeps the background persistence but drops the in-memory
snapshot: with no copy of its own, the live state must be serialised before the loop may go on, so
the training thread runs ``torch.save`` itself and only the checksum, the write and the manifest run
in the background (at most one flush in flight, like ``AsyncSaver``).
"""
from __future__ import annotations

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
    return store.saver(run_key, asynchronous=mode[0], lazy=mode[1])
