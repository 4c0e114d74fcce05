"""CheckpointStore: torch state dicts and nested data on an ObjectStorage, with a checksummed manifest."""
from __future__ import annotations

import hashlib
import io
import logging
import time
from typing import Any

from prefect.blocks.core import Block
from pydantic import Field

from .storage import ObjectStorage, StorageError

log = logging.getLogger("mlsys_flows.checkpoint")


class CheckpointStore(Block):
    """Checkpoints of a training run (``run_key``) on an ObjectStorage.

    Each save writes the blob atomically, then the manifest (step, key, sha256, size); the
    manifest keeps the last ``keep_last`` checkpoints. ``latest``/``resume`` verify the
    checksum and skip a corrupted or partial checkpoint with a warning.

    Example:
        ```python
        from mlsys_flows.blocks import CheckpointStore

        store = CheckpointStore.load("training-checkpoints")
        step, state = store.resume("run-42", default={"model": model.state_dict()})
        store.save("run-42", step + 1, {"model": model.state_dict(), "opt": opt.state_dict()})
        ```
    """

    _block_type_name = "mlsys CheckpointStore"
    _block_type_slug = "mlsys-checkpoint-store"
    _description = "Checksummed torch checkpoints with a manifest and keep-last-N on an ObjectStorage."

    storage: ObjectStorage = Field(default_factory=ObjectStorage, description="Where checkpoints are written.")
    prefix: str = Field(default="checkpoints", min_length=1, description="Key prefix under the storage root.")
    keep_last: int = Field(default=3, ge=1, le=1000, description="How many most recent checkpoints to keep per run.")

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

    def save(self, run_key: str, step: int, state: Any) -> dict[str, Any]:
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

    def load(self, run_key: str, step: int | None = None) -> tuple[int, Any]:
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
            step, state = self.load(run_key)
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
