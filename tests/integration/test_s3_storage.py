"""ObjectStorage and CheckpointStore against a real SeaweedFS S3 server on 127.0.0.1."""
import multiprocessing as mp
import os
import signal
import time

import pyarrow as pa
import pytest
import torch

from mlsys_flows.blocks import CheckpointStore, ObjectStorage, StorageError
from storage_keys import KEY_METHODS, assert_refused_everywhere

pytestmark = pytest.mark.integration


def test_s3_roundtrip(s3_storage):
    s3_storage.write_bytes("x/a.bin", b"hello")
    s3_storage.write_json("x/b.json", {"ok": True})
    table = pa.table({"a": list(range(1000)), "b": [float(i) for i in range(1000)]})
    s3_storage.write_parquet("x/c.parquet", table, row_group_size=100)
    assert s3_storage.read_bytes("x/a.bin") == b"hello"
    assert s3_storage.read_json("x/b.json") == {"ok": True}
    assert s3_storage.read_parquet("x/c.parquet", columns=["b"]).num_rows == 1000
    assert s3_storage.list("x") == ["x/a.bin", "x/b.json", "x/c.parquet"]
    s3_storage.delete("x/a.bin")
    assert not s3_storage.exists("x/a.bin")


@pytest.mark.parametrize("method", sorted(KEY_METHODS))
def test_s3_every_key_method_refuses_keys_leaving_the_root(s3_storage, method):
    s3_storage.write_bytes("a/inside.bin", b"x")
    assert_refused_everywhere(s3_storage, method)
    assert s3_storage.list() == ["a/inside.bin"]


def test_s3_checkpoints_detect_corruption(s3_storage):
    store = CheckpointStore(storage=s3_storage, keep_last=2)
    store.write("r", 1, {"w": torch.ones(4)})
    store.write("r", 2, {"w": torch.full((4,), 2.0)})
    key = store.manifest("r")[-1]["key"]
    blob = bytearray(s3_storage.read_bytes(key))
    blob[-5] ^= 0x55
    s3_storage.write_bytes(key, bytes(blob))
    step, state = store.resume("r")
    assert step == 1 and torch.equal(state["w"], torch.ones(4))


def test_wrong_credentials_are_a_clear_error(s3, s3_storage):
    bad = ObjectStorage(url=s3_storage.url, endpoint_url=s3.endpoint_url, region="us-east-1",
                        access_key_id="wrong-key", secret_access_key="wrong-secret-value", max_attempts=1)
    with pytest.raises(StorageError) as exc:
        bad.write_bytes("k.bin", b"x")
    assert "rejected the credentials" in str(exc.value)
    assert "wrong-secret-value" not in str(exc.value)


def test_a_session_token_is_sent_and_checked(s3, s3_storage):
    """The session-token path reaches the server: SeaweedFS accepts the keys alone (s3_storage) and
    rejects the same keys with a token it did not issue. (It issues none: no STS here.)"""
    with_token = ObjectStorage(url=s3_storage.url, endpoint_url=s3.endpoint_url, region="us-east-1",
                               access_key_id=s3.access_key, secret_access_key=s3.secret_key,
                               session_token="not-issued-by-this-server", max_attempts=1)
    s3_storage.write_bytes("k.bin", b"x")
    with pytest.raises(StorageError) as exc:
        with_token.read_bytes("k.bin")
    assert "rejected the credentials (check access_key_id, secret_access_key, session_token)" in str(exc.value)
    assert "not-issued-by-this-server" not in str(exc.value)


def test_missing_bucket_is_a_clear_error(s3):
    store = ObjectStorage(url="s3://no-such-bucket-xyz/p", endpoint_url=s3.endpoint_url, region="us-east-1",
                          access_key_id=s3.access_key, secret_access_key=s3.secret_key)
    with pytest.raises(StorageError, match="bucket 'no-such-bucket-xyz' does not exist"):
        store.check()


def _writer(storage_json: str, size: int) -> None:
    store = ObjectStorage.model_validate_json(storage_json)
    payload = os.urandom(size)
    while True:  # keeps overwriting until killed
        store.write_bytes("big/final.bin", payload)


def test_killed_writer_never_leaves_a_partial_object(s3_storage):
    """SIGKILL a process in the middle of large writes: the final key is absent or complete."""
    size = 24 * 1024 * 1024
    # SecretStr fields serialise masked; pass the real values to the child explicitly.
    spec = s3_storage.model_dump(mode="json")
    spec["access_key_id"] = s3_storage.access_key_id.get_secret_value()
    spec["secret_access_key"] = s3_storage.secret_access_key.get_secret_value()
    import json

    ctx = mp.get_context("spawn")
    for delay in (0.3, 1.1, 2.3):
        proc = ctx.Process(target=_writer, args=(json.dumps(spec), size))
        proc.start()
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        if s3_storage.exists("big/final.bin"):
            assert s3_storage.size("big/final.bin") == size
        assert all(not k.endswith("final.bin") or k == "big/final.bin" for k in s3_storage.list("big"))


def test_an_s3_write_is_one_put(s3_storage):
    """An S3 PUT is atomic already: a write costs one request, leaves no temporary key, and is whole."""
    fs, _ = s3_storage.filesystem()
    calls: list[str] = []

    def count(model, **_):
        calls.append(model.name)

    fs.s3.meta.events.register("before-call.s3", count)
    try:
        s3_storage.write_bytes("one/put.bin", b"x" * 1000)
    finally:
        fs.s3.meta.events.unregister("before-call.s3", count)
    assert calls == ["PutObject"], calls
    assert s3_storage.read_bytes("one/put.bin") == b"x" * 1000
    assert s3_storage.list("one") == ["one/put.bin"]
