"""Block standards and local behaviour of ObjectStorage, CheckpointStore, DaskCluster, ResourcePool."""
import logging
import os

import pyarrow as pa
import pytest
import torch

from mlsys_flows.blocks import CheckpointStore, DaskCluster, ObjectStorage, ResourcePool, StorageError

BLOCKS = [ObjectStorage, CheckpointStore, DaskCluster, ResourcePool]


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.__name__)
def test_block_standards(block):
    for name, field in block.model_fields.items():
        assert field.description, f"{block.__name__}.{name} has no description"
    doc = block.__doc__ or ""
    assert ".load(" in doc and "Example" in doc, f"{block.__name__} docstring lacks a .load() example"
    assert block.get_block_type_slug().startswith("mlsys-")


def test_storage_roundtrip(local_storage):
    local_storage.write_bytes("a/b.bin", b"xyz")
    local_storage.write_json("a/c.json", {"k": [1, 2]})
    table = pa.table({"x": list(range(100)), "y": [str(i) for i in range(100)]})
    n = local_storage.write_parquet("a/d.parquet", table)
    assert n == local_storage.size("a/d.parquet") > 0
    assert local_storage.read_bytes("a/b.bin") == b"xyz"
    assert local_storage.read_json("a/c.json") == {"k": [1, 2]}
    assert local_storage.read_parquet("a/d.parquet", columns=["x"]).column_names == ["x"]
    assert local_storage.list("a") == ["a/b.bin", "a/c.json", "a/d.parquet"]
    local_storage.delete("a/b.bin")
    assert not local_storage.exists("a/b.bin")


def test_storage_rejects_bad_urls_and_keys(tmp_path):
    with pytest.raises(ValueError, match="url"):
        ObjectStorage(url="ftp://host/x")
    with pytest.raises(ValueError, match="bucket"):
        ObjectStorage(url="s3://")
    with pytest.raises(StorageError, match="does not exist"):
        ObjectStorage(url=(tmp_path / "no" / "such" / "dir").as_uri()).check()
    store = ObjectStorage(url=tmp_path.as_uri())
    with pytest.raises(StorageError, match="invalid storage key"):
        store.write_bytes("../escape", b"x")
    with pytest.raises(StorageError, match="no object"):
        store.read_bytes("missing")


def test_interrupted_local_write_leaves_no_final_object(local_storage, monkeypatch):
    """A crash between the temporary write and the move leaves nothing under the final key."""
    def crash(*a, **k):
        raise OSError("simulated crash before commit")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(StorageError, match="simulated crash"):
        local_storage.write_bytes("final.bin", b"x" * 1000)
    monkeypatch.undo()
    assert not local_storage.exists("final.bin")
    assert local_storage.list() == []  # the temporary file was removed too


def test_checkpoint_keep_last_resume_and_corruption(local_storage, caplog):
    store = CheckpointStore(storage=local_storage, keep_last=2)
    assert store.resume("run", default={"fresh": True}) == (-1, {"fresh": True})
    for step in range(4):
        store.save("run", step, {"w": torch.full((3,), float(step)), "meta": {"step": step, "tags": ["a"]}})
    assert [e["step"] for e in store.manifest("run")] == [2, 3]
    assert len([k for k in local_storage.list("checkpoints/run") if k.endswith(".pt")]) == 2
    step, state = store.resume("run")
    assert step == 3 and torch.equal(state["w"], torch.full((3,), 3.0)) and state["meta"]["tags"] == ["a"]

    # flip bytes in the newest blob: it is detected by checksum and skipped with a warning
    key = store.manifest("run")[-1]["key"]
    blob = bytearray(local_storage.read_bytes(key))
    blob[len(blob) // 2] ^= 0xFF
    local_storage.write_bytes(key, bytes(blob))
    with caplog.at_level(logging.WARNING, logger="mlsys_flows.checkpoint"):
        step, state = store.resume("run")
    assert step == 2 and float(state["w"][0]) == 2.0
    assert "checksum" in caplog.text
    assert store.latest("run")["step"] == 2
    with pytest.raises(StorageError):
        store.load("run", step=3)  # never loads the corrupted one


def test_checkpoint_rejects_bad_run_key(local_storage):
    with pytest.raises(ValueError, match="run_key"):
        CheckpointStore(storage=local_storage).save("a/b", 0, {})


def test_dask_cluster_modes():
    local = DaskCluster()
    assert local.mode == "local"
    runner = local.task_runner()
    assert runner.cluster_kwargs["n_workers"] == 2 and runner.cluster_kwargs["dashboard_address"] is None
    assert DaskCluster(address="tcp://127.0.0.1:8786").task_runner().address == "tcp://127.0.0.1:8786"
    with pytest.raises(ValueError, match="address"):
        DaskCluster(address="127.0.0.1:8786")
    with pytest.raises(ValueError, match="cluster_class"):
        DaskCluster(cluster_class="no_such_pkg.Cluster").task_runner()
    custom = DaskCluster(cluster_class="distributed.LocalCluster", cluster_kwargs={"n_workers": 1})
    assert custom.task_runner().cluster_kwargs == {"n_workers": 1}


def test_resource_pool(caplog):
    pool = ResourcePool(kind="gpu", devices=["cuda:0", "cuda:1"], name="lab")
    assert pool.worker_resources() == {"GPU": 2.0}
    assert pool.concurrency_limit_name == "mlsys-gpu-lab"
    with pytest.raises(ValueError, match="per_task"):
        ResourcePool(kind="gpu", devices=["cuda:0"], per_task=2)
    if not torch.cuda.is_available():
        with caplog.at_level(logging.WARNING, logger="mlsys_flows.resources"):
            assert pool.device() == "cpu"
        assert "falling back to CPU" in caplog.text
    assert ResourcePool(kind="fpga", devices=["fpga:0"]).device() == "fpga-sw:0"
    import dask

    with pool.annotate():
        assert dask.get_annotations()["resources"] == {"GPU": 1.0}
