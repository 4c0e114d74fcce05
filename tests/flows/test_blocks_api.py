"""Blocks against a live Prefect API: registration, save/load, and the device concurrency limit."""
import threading
import time

from mlsys_flows.blocks import CheckpointStore, DaskCluster, ObjectStorage, ResourcePool


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
    assert set(devices) <= {"cuda", "cpu"}
