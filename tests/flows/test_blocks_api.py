"""Blocks against a live Prefect API: registration, save/load, and the device concurrency limit."""
import threading
import time
import uuid

import pytest

import mlsys_flows.blocks as exported
from mlsys_flows.blocks import CheckpointStore, DaskCluster, ObjectStorage, ResourcePool


def _examples(tmp_path):
    """One configured instance of every exported block type, secrets included."""
    storage = ObjectStorage(url=tmp_path.as_uri(), access_key_id="k", secret_access_key="s3-secret",
                            session_token="s3-token", role_arn="arn:aws:iam::123456789012:role/mlsys")
    return {
        "ObjectStorage": storage,
        "CheckpointStore": CheckpointStore(storage=storage, prefix="ck", keep_last=5, asynchronous=True, lazy=True),
        "DaskCluster": DaskCluster(cluster_class="distributed.LocalCluster", cluster_secrets={"token": "t0k"}),
        "ResourcePool": ResourcePool(kind="gpu", devices=["cuda:0", "cuda:1"], name="t-roundtrip"),
    }


def test_every_block_loads_by_name_after_save(tmp_path):
    """``Block.load("NAME")`` after ``.save("NAME")`` gives the same block, for every exported type
    (``CheckpointStore.load(run_key, step)`` once hid it; now ``restore``)."""
    from prefect.blocks.core import Block

    examples = _examples(tmp_path)
    assert set(examples) == {n for n in exported.__all__ if isinstance(getattr(exported, n), type)
                             and issubclass(getattr(exported, n), Block)}, "add an example of the new block"
    for name, block in examples.items():
        block.save(f"t-roundtrip-{name.lower()}", overwrite=True)
        loaded = type(block).load(f"t-roundtrip-{name.lower()}")
        assert type(loaded) is type(block) and loaded.model_dump() == block.model_dump(), name
    loaded = CheckpointStore.load("t-roundtrip-checkpointstore")
    assert loaded.storage.session_token.get_secret_value() == "s3-token"
    loaded.write("run", 1, {"w": 1})  # the loaded store works
    assert loaded.restore("run") == (1, {"w": 1})


def test_blocks_register_save_and_load(tmp_path):
    for block in (ObjectStorage, CheckpointStore, DaskCluster, ResourcePool):
        block.register_type_and_schema()
    ObjectStorage(url=tmp_path.as_uri(), access_key_id="k", secret_access_key="very-secret").save("t-store", overwrite=True)
    loaded = ObjectStorage.load("t-store")
    assert loaded.url == tmp_path.as_uri() and loaded.secret_access_key.get_secret_value() == "very-secret"
    assert "very-secret" not in repr(loaded)
    DaskCluster(address="tcp://127.0.0.1:9999").save("t-dask", overwrite=True)
    assert DaskCluster.load("t-dask").address == "tcp://127.0.0.1:9999"


def test_resource_pool_limits_concurrent_holders():
    """One device: two tasks claiming it never hold it at the same time."""
    pool = ResourcePool(kind="gpu", devices=["cuda:0"], name="t-one")
    pool.ensure_concurrency_limit()
    spans, devices = [], []

    def job():
        with pool.claim() as device:
            start = time.monotonic()
            time.sleep(0.8)
            spans.append((start, time.monotonic()))
            devices.append(device)

    threads = [threading.Thread(target=job) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(spans) == 2
    (a0, a1), (b0, b1) = sorted(spans)
    assert b0 >= a1 - 0.05, f"holders overlapped: {spans}"
    assert set(devices) <= {"cuda:0", "cpu"}  # the pool's device, or the CPU on a host without CUDA


def test_a_claim_that_cannot_get_a_slot_fails_naming_the_pool_the_slot_and_the_wait():
    """The pool's only slot is held (by a claim that waits on an event): a second claim with a short
    timeout fails with ClaimTimeout naming the pool, its concurrency limit, the slots and the wait."""
    from mlsys_flows.blocks.resources import ClaimTimeout

    pool = ResourcePool(kind="gpu", devices=["cuda:0"], name=f"t-{uuid.uuid4().hex[:8]}")
    pool.ensure_concurrency_limit()
    holding, release = threading.Event(), threading.Event()

    def holder():
        with pool.claim():
            holding.set()
            release.wait(120)

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert holding.wait(60)
        with pytest.raises(ClaimTimeout) as exc:
            with pool.claim(timeout_s=1):
                pass
    finally:
        release.set()
        t.join(60)
    message = str(exc.value)
    assert f"ResourcePool {pool.name!r}" in message and repr(pool.concurrency_limit_name) in message
    assert "1 slots, this claim needs 1" in message and "within 1 s" in message
    with pool.claim(timeout_s=30) as device:  # released by the holder: free again
        assert device in ("cuda:0", "cpu")


def test_cluster_secrets_are_saved_encrypted_and_loaded():
    DaskCluster(cluster_class="distributed.LocalCluster", cluster_secrets={"token": "cloud-token-123"}).save(
        "t-dask-secret", overwrite=True)
    loaded = DaskCluster.load("t-dask-secret")
    assert loaded.cluster_secrets["token"].get_secret_value() == "cloud-token-123"
    assert "cloud-token-123" not in repr(loaded)


def test_a_claim_occupies_as_many_slots_as_its_pool_gives_a_task():
    """per_task=2 on a 2-device pool: while one claim holds, the Prefect limit has both slots taken
    (a second claim could not start), and both are free again after it."""
    from prefect.client.orchestration import get_client

    pool = ResourcePool(kind="gpu", devices=["cuda:0", "cuda:1"], per_task=2, name=f"t-{uuid.uuid4().hex[:8]}")
    pool.ensure_concurrency_limit()

    def active() -> int:
        with get_client(sync_client=True) as client:
            return client.read_global_concurrency_limit_by_name(pool.concurrency_limit_name).active_slots

    assert pool.slots == 2 and pool.slots_per_claim == 2 and active() == 0
    with pool.claim(timeout_s=30):
        assert active() == 2
    assert active() == 0
