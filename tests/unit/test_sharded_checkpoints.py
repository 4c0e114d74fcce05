"""Sharded checkpoints on a CheckpointStore: a step commits only once every rank's shard is durable,
a record left by an earlier launch never completes a later one's set, a corrupted or missing shard is
never restored, and old steps (committed or abandoned) are pruned. Ranks are played by direct calls
here; tests/integration/test_ranks.py runs real ranks on Dask workers and kills one mid-flush."""
from __future__ import annotations

import threading

import pytest
import torch

from mlsys_flows.blocks import CheckpointStore, ObjectStorage, StorageError


@pytest.fixture
def store(tmp_path):
    return CheckpointStore(storage=ObjectStorage(url=f"file://{tmp_path}"), prefix="ck", keep_last=2)


def shard(rank: int, step: int) -> dict:
    return {"w": torch.full((3,), float(10 * step + rank))}


def test_a_step_commits_only_when_every_rank_has_written(store):
    store.write_shard("r", 4, 0, 3, shard(0, 4), attempt="a")
    store.write_shard("r", 4, 2, 3, shard(2, 4), attempt="a")
    assert store.committed("r") == []
    assert store.resume_shard("r", 0, 3, default="fresh") == (-1, "fresh")
    store.write_shard("r", 4, 1, 3, shard(1, 4), attempt="a")
    (commit,) = store.committed("r")
    assert commit["step"] == 4 and [s["rank"] for s in commit["shards"]] == [0, 1, 2]
    for rank in range(3):
        step, state = store.resume_shard("r", rank, 3)
        assert step == 4 and torch.equal(state["w"], shard(rank, 4)["w"])


def test_ranks_writing_at_once_commit_each_step_exactly_as_written(store):
    barrier = threading.Barrier(4)

    def rank(r: int) -> None:
        for step in (1, 3, 5):
            barrier.wait()
            store.write_shard("r", step, r, 4, shard(r, step), attempt="a")

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [c["step"] for c in store.committed("r")] == [3, 5]  # keep_last=2
    assert torch.equal(store.restore_shard("r", 2, 4)[1]["w"], shard(2, 5)["w"])


def test_a_record_of_an_earlier_launch_never_completes_the_set(store):
    # launch "a": rank 1 wrote its shard of step 8, rank 0 was lost before writing its own
    store.write_shard("r", 8, 1, 2, shard(1, 8), attempt="a")
    # launch "b" resumed and reaches step 8 again: rank 0 first, then rank 1
    store.write_shard("r", 8, 0, 2, shard(0, 8), attempt="b")
    assert store.committed("r") == [], "rank 1's shard from launch a completed launch b's set"
    store.write_shard("r", 8, 1, 2, {"w": torch.zeros(3)}, attempt="b")
    (commit,) = store.committed("r")
    assert {s["attempt"] for s in commit["shards"]} == {"b"}
    assert torch.equal(store.restore_shard("r", 1, 2)[1]["w"], torch.zeros(3))


def test_a_corrupted_shard_is_never_restored(store):
    for step in (2, 4):
        for r in range(2):
            store.write_shard("r", step, r, 2, shard(r, step), attempt="a")
    newest = store.committed("r")[-1]["shards"][1]["key"]
    store.storage.write_bytes(newest, b"not a checkpoint")
    # rank 1's newest shard fails its checksum: restore falls back to the older committed step ...
    assert store.restore_shard("r", 1, 2)[0] == 2
    # ... but a resume would put rank 1 on another step than rank 0: it refuses
    assert store.resume_shard("r", 0, 2)[0] == 4
    with pytest.raises(StorageError, match="different steps"):
        store.resume_shard("r", 1, 2)


def test_the_world_size_must_match_the_checkpoint(store):
    for r in range(2):
        store.write_shard("r", 0, r, 2, shard(r, 0))
    with pytest.raises(ValueError, match="world_size"):
        store.restore_shard("r", 0, 3)


@pytest.mark.parametrize("rank, world_size, field", [(2, 2, "rank"), (-1, 2, "rank"), (0, 0, "world_size"),
                                                     (True, 2, "rank"), (0, 1.5, "world_size")])
def test_a_bad_rank_or_world_size_is_refused_naming_it(store, rank, world_size, field):
    with pytest.raises(ValueError, match=field):
        store.write_shard("r", 0, rank, world_size, shard(0, 0))
    with pytest.raises(ValueError, match=field):
        store.saver("r", rank=rank, world_size=world_size)


def test_old_steps_and_abandoned_ones_are_pruned(store):
    store.write_shard("r", 1, 0, 2, shard(0, 1))  # step 1: rank 1 never wrote (lost)
    for step in (2, 3, 4):
        for r in range(2):
            store.write_shard("r", step, r, 2, shard(r, step))
    steps_on_storage = {k.split("/step-")[1][:9] for k in store.storage.list("ck/r/sharded")}
    assert steps_on_storage == {"000000003", "000000004"}


def test_the_async_saver_writes_shards_and_reports_each_flush(store):
    events = []
    with store.saver("r", asynchronous=True, rank=0, world_size=1, attempt="a",
                     on_flush=lambda phase, step: events.append((phase, step))) as saver:
        for step in (0, 1):
            saver.save(step, shard(0, step))
    assert events == [("start", 0), ("done", 0), ("start", 1), ("done", 1)]
    assert [c["step"] for c in store.committed("r")] == [0, 1]
    assert [f["step"] for f in saver.flushes] == [0, 1]
