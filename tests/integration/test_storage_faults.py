"""Storage faults on a real SeaweedFS S3 server and on a local folder.

- The server is killed during a large write, then restarted: the write fails with a clear error
  after bounded retries, and no object (partial or whole) exists under the final key.
- A checkpoint whose bytes were flipped or cut is detected by its checksum and never loaded.
"""
from __future__ import annotations

import hashlib
import io
import os
import signal
import threading
import time

import pytest
import torch
from faultkit import wait_until

from mlsys_flows.blocks import CheckpointStore, ObjectStorage, StorageError
from mlsys_flows.testing.local_s3 import SeaweedS3

pytestmark = pytest.mark.integration

BIG = 192 * 2**20  # large enough that the upload is still in flight when the server dies


def _storage(server: SeaweedS3, bucket: str, **kw) -> ObjectStorage:
    return ObjectStorage(url=f"s3://{bucket}/data", endpoint_url=server.endpoint_url, region="us-east-1",
                         access_key_id=server.access_key, secret_access_key=server.secret_key, **kw)


def _read_or_none(storage: ObjectStorage, key: str) -> bytes | None:
    try:
        return storage.read_bytes(key)
    except StorageError:
        return None


def _restart(workdir, port: int) -> SeaweedS3:
    """Same data folder and S3 port; the port may stay busy for a few seconds after the kill."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return SeaweedS3(workdir=workdir, port=port).start()
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


@pytest.mark.timeout(300)
def test_s3_killed_during_large_write_leaves_no_object(tmp_path):
    workdir = tmp_path / "seaweed"
    server = SeaweedS3(workdir=workdir).start()
    port = server.port
    try:
        server.create_bucket("faults")
        storage = _storage(server, "faults", max_attempts=2, timeout_s=3).check()
        storage.write_bytes("small.bin", b"kept")
        blob = os.urandom(BIG)
        outcome: dict = {}

        def write():
            started = time.monotonic()
            try:
                storage.write_bytes("big.bin", blob)
                outcome["result"] = "written"
            except BaseException as exc:  # noqa: BLE001
                outcome["error"] = exc
            outcome["elapsed"] = time.monotonic() - started

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        time.sleep(0.3)  # the upload is under way
        os.killpg(server.proc.pid, signal.SIGKILL)  # the S3 server crashes
        server.proc.wait(timeout=10)
        killed_at = time.monotonic()
        writer.join(timeout=120)
        assert not writer.is_alive(), "the write hung after the server died"
        assert "result" not in outcome, "the write finished before the server was killed; raise BIG"
        err = outcome["error"]
        assert isinstance(err, StorageError), repr(err)
        msg = str(err)
        assert "'big.bin'" in msg and "s3://faults/data" in msg and "failed" in msg, msg
        assert server.secret_key not in msg
        # bounded retries: a few attempts of at most timeout_s each, not an endless loop
        assert time.monotonic() - killed_at < 60, outcome["elapsed"]
    finally:
        server.stop()

    server = _restart(workdir, port)
    try:
        storage = _storage(server, "faults")
        # the data before the crash survived (the filer may answer 500 until its volumes are back)
        assert wait_until(lambda: _read_or_none(storage, "small.bin"), timeout=60, interval=0.5,
                          what="the restarted server to serve small.bin") == b"kept"
        assert not storage.exists("big.bin"), "a partial object exists under the final key"
        assert "big.bin" not in storage.list()
        storage.write_bytes("big.bin", blob[: 8 * 2**20])  # and the storage works again
        assert storage.size("big.bin") == 8 * 2**20
    finally:
        server.stop()


# ----- corrupted checkpoints ------------------------------------------------------------------------


def _state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"model": {"w": torch.randn(64, 32, generator=g)}, "step": torch.tensor(step)}


@pytest.mark.parametrize("where,damage", [("local", "flip"), ("local", "truncate"), ("s3", "flip")])
def test_corrupted_checkpoint_detected_and_never_loaded(where, damage, request, monkeypatch):
    any_storage = request.getfixturevalue("local_storage" if where == "local" else "s3_storage")
    store = CheckpointStore(storage=any_storage, prefix="ck", keep_last=5)
    for step in (1, 2):
        store.write("run", step, _state(step))
    entry = store.manifest("run")[-1]
    blob = bytearray(any_storage.read_bytes(entry["key"]))
    if damage == "flip":
        for i in range(len(blob) // 3, len(blob) // 3 + 16):
            blob[i] ^= 0xFF
    else:
        del blob[len(blob) // 2:]
    any_storage.write_bytes(entry["key"], bytes(blob))
    bad_sha = hashlib.sha256(bytes(blob)).hexdigest()

    loaded: list[str] = []
    real_load = torch.load

    def spy(f, *a, **kw):  # records every blob handed to torch.load
        data = f.getvalue() if isinstance(f, io.BytesIO) else b""
        loaded.append(hashlib.sha256(data).hexdigest())
        return real_load(f, *a, **kw)

    monkeypatch.setattr(torch, "load", spy)
    assert store.latest("run")["step"] == 1
    step, state = store.restore("run")
    assert step == 1 and torch.equal(state["model"]["w"], _state(1)["model"]["w"])
    with pytest.raises(StorageError, match="no valid checkpoint"):
        store.restore("run", step=2)
    assert store.resume("run", default=None)[0] == 1
    assert bad_sha not in loaded and loaded, "the corrupted checkpoint reached torch.load"
    assert store.resumes("run")[-1]["step"] == 1
