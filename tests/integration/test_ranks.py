"""Ranks as Dask tasks on real `dask worker` processes (no nanny: a SIGKILL takes a worker down for
good): torch.distributed gloo ranks rendezvous and reduce; a failed or lost rank is reported by
rank, the others fail at their next collective instead of hanging, and no rank or process group
outlives its launch. Then issue 32's fault: a rank of a data-parallel run with sharded asynchronous
checkpoints is killed while it flushes its shard; the relaunch resumes from the last checkpoint
whose shards all committed and ends bit-identical to an uninterrupted run."""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faultkit import DaskProcesses, no_rank_left, rank_states, ranks_idle, wait_until

from mlsys_flows.blocks import CheckpointStore, ObjectStorage
from mlsys_flows.systems.swiftmoe import CALIBRATED
from mlsys_flows.systems.swiftmoe import Params as SwiftMoEParams
from mlsys_flows.systems.swiftmoe.calibrate import calibration_job, replay_rank, summarize
from mlsys_flows.tasks.checkpoint import train_sharded_rank
from mlsys_flows.platform.ranks import RanksFailed, run_ranks

pytestmark = pytest.mark.integration
HERE = Path(__file__).resolve().parent
TIMEOUT_S = 30.0  # a collective's bound: a peer that vanished fails it sooner (its sockets close)
SIZES = dict(width=48, depth=3, batch_size=16, steps=16, every=4, seed=7)


@pytest.fixture(scope="module")
def dask():
    # the scheduler and the workers import this file (and faultkit) for its rank functions: Dask
    # pickles functions by reference
    path = os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])
    with DaskProcesses(n_workers=3, env={"PYTHONPATH": path}) as procs:
        yield procs


@pytest.fixture
def client(dask):
    with dask.client() as c:
        yield c


def reduce_ranks(info, base: float) -> dict:
    import torch
    import torch.distributed as dist

    t = torch.tensor([base + info.rank])
    dist.all_reduce(t)
    return {"sum": t.item(), "rank": info.rank, "world": info.world_size, "pid": os.getpid()}


def rank_one_raises(info) -> None:
    import torch
    import torch.distributed as dist

    if info.rank == 1:
        raise ValueError("rank 1 gives up before the collective")
    dist.all_reduce(torch.ones(1))  # rank 0 waits here for a peer that is gone


def test_ranks_rendezvous_and_reduce_one_per_worker_process(client):
    run = run_ranks(client, reduce_ranks, 3, 10.0, timeout_s=TIMEOUT_S)
    assert run.backend == "gloo" and run.world_size == 3 and len(set(run.workers)) == 3
    assert [r["sum"] for r in run.results] == [33.0] * 3 and [r["rank"] for r in run.results] == [0, 1, 2]
    assert len({r["pid"] for r in run.results}) == 3, "two ranks shared a process"
    no_rank_left(client)
    again = run_ranks(client, reduce_ranks, 2, 1.0, timeout_s=TIMEOUT_S)  # the workers take a new launch
    assert [r["sum"] for r in again.results] == [3.0, 3.0] and again.launch_id != run.launch_id


def test_more_ranks_than_workers_is_refused_naming_world_size(client):
    with pytest.raises(ValueError, match="world_size: 9 ranks need 9 distinct Dask workers"):
        run_ranks(client, reduce_ranks, 9, 0.0, timeout_s=2)  # waits that long for workers to join


def test_a_named_worker_that_never_joins_is_refused_naming_it(client):
    present = sorted(client.scheduler_info(n_workers=-1)["workers"])
    with pytest.raises(ValueError, match="tcp://127.0.0.1:1'\\] are not among them"):
        run_ranks(client, reduce_ranks, 2, 0.0, workers=[present[0], "tcp://127.0.0.1:1"], timeout_s=1)


def test_a_failing_rank_is_named_and_its_peer_is_released(client):
    with pytest.raises(RanksFailed) as err:
        run_ranks(client, rank_one_raises, 2, timeout_s=TIMEOUT_S)
    assert 1 in err.value.failed and "rank 1 gives up" in str(err.value)
    assert not err.value.lost
    no_rank_left(client)


def test_swiftmoe_calibration_replays_the_recorded_work_on_two_ranks(client):
    p = SwiftMoEParams.for_scale("smoke", profile_repeats=1)
    prepared = calibration_job(p, repeats=2, iterations=1)
    launch = run_ranks(client, replay_rank, 2, prepared["job"], timeout_s=120)
    by_policy = summarize(prepared, launch.results[0], launch.seconds)
    assert set(by_policy) == set(CALIBRATED) and launch.backend == "gloo"  # every compared policy replayed
    for res in by_policy.values():
        assert res["workers"] == 2 and len(res["measured_iter_s"]) == 2
        assert all(math.isfinite(x) and x > 0 for x in res["measured_iter_s"]) and res["simulated_iter_s"] > 0
        assert res["error"] == pytest.approx([m / res["simulated_iter_s"] for m in res["measured_iter_s"]])
        assert res["link_gbps"] > 0 and res["breakdown_s"]["total"] == pytest.approx(res["simulated_iter_s"])
    no_rank_left(client)


def test_a_broken_calibration_job_fails_naming_the_ranks(client):
    with pytest.raises(RanksFailed) as err:
        run_ranks(client, replay_rank, 2, {"cfg": {}, "trace": [], "seed": 0}, timeout_s=30)
    assert set(err.value.failed) == {0, 1} and "rank 0 failed" in str(err.value)
    no_rank_left(client)


def dies_while_flushing(info, store, run_key: str, kill_rank: int, kill_step: int, **sizes) -> dict:
    def on_flush(phase: str, step: int) -> None:
        if (phase, step, info.rank) == ("start", kill_step, kill_rank):
            os.kill(os.getpid(), signal.SIGKILL)  # the worker process dies in the flush of its shard

    return train_sharded_rank(info, store, run_key, on_flush=on_flush, **sizes)


def test_a_rank_killed_during_a_sharded_flush_resumes_from_the_last_complete_checkpoint(dask, client, tmp_path):
    store = CheckpointStore(storage=ObjectStorage(url=f"file://{tmp_path}"), prefix="ck", keep_last=3)
    reference = run_ranks(client, train_sharded_rank, 2, store, "uninterrupted", timeout_s=TIMEOUT_S, **SIZES)
    assert [r["start_step"] for r in reference.results] == [-1, -1]
    assert len({r["digest"] for r in reference.results}) == 1

    # rank 1's worker dies while it flushes its shard of step 7 (the second checkpoint)
    with pytest.raises(RanksFailed) as err:
        run_ranks(client, dies_while_flushing, 2, store, "faulty", 1, 7, timeout_s=TIMEOUT_S, **SIZES)
    assert list(err.value.lost) == [1], str(err.value)
    # step 7 never committed (rank 1's shard is missing); step 3 did
    assert [c["step"] for c in store.committed("faulty")] == [3]
    no_rank_left(client)  # the survivors: rank 0's group torn down after its collective failed

    dask.add_worker()
    dask.wait_for_workers(3)
    resumed = run_ranks(client, train_sharded_rank, 2, store, "faulty", timeout_s=TIMEOUT_S, **SIZES)
    assert [r["start_step"] for r in resumed.results] == [3, 3]
    assert [r["steps"] for r in resumed.results] == [SIZES["steps"]] * 2
    assert {r["digest"] for r in resumed.results} == {reference.results[0]["digest"]}, \
        "the resumed run's parameters differ from the uninterrupted run's"
    assert [c["step"] for c in store.committed("faulty")] == [7, 11, 15]
    no_rank_left(client)


def survivors_carry_on(info, victim: int = 2) -> dict:
    """Rank ``victim``'s worker dies between two membership rounds; the others notice (its worker left the
    cluster), open a group of their own and reduce on it, as ReCycle's survivors do."""
    import torch
    import torch.distributed as dist

    from mlsys_flows.systems.recycle.failover import Membership
    from mlsys_flows.platform.ranks import rank_alive

    membership = Membership(info.store, info.rank, list(range(info.world_size)), rank_alive(info), prefix="carry")
    membership.round(0)
    if info.rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    live = sorted(membership.round(1))
    t = torch.tensor([float(info.rank + 1)])
    dist.all_reduce(t, group=dist.new_group(live, use_local_synchronization=True))
    return {"live": live, "sum": t.item()}


def test_survivors_of_a_lost_rank_carry_on_and_their_results_come_back(dask, client):
    dask.wait_for_workers(3)
    with pytest.raises(RanksFailed) as err:
        run_ranks(client, survivors_carry_on, 3, timeout_s=TIMEOUT_S)
    assert list(err.value.lost) == [2] and not err.value.failed, str(err.value)
    assert err.value.results == {0: {"live": [0, 1], "sum": 3.0}, 1: {"live": [0, 1], "sum": 3.0}}
    assert len(set(err.value.workers)) == 3 and err.value.lost[2] == err.value.workers[2]
    no_rank_left(client)  # the survivors' groups, the new one too, are torn down


def test_survivors_of_a_lost_rank_0_carry_on(dask, client):
    """Issue 48: the launch's rendezvous store lived in rank 0's worker, so losing rank 0 failed every
    survivor (DistNetworkError at their next store access); it lives in the launching process now, and
    losing rank 0 is like losing any rank."""
    for _ in range(3 - len(client.scheduler_info(n_workers=-1)["workers"])):  # the test before killed one
        dask.add_worker()
    dask.wait_for_workers(3)
    with pytest.raises(RanksFailed) as err:
        run_ranks(client, survivors_carry_on, 3, 0, timeout_s=TIMEOUT_S)
    assert list(err.value.lost) == [0] and not err.value.failed, str(err.value)
    assert err.value.store == "caller"
    assert err.value.results == {1: {"live": [1, 2], "sum": 5.0}, 2: {"live": [1, 2], "sum": 5.0}}
    no_rank_left(client)


def spin(info, flags: str) -> None:
    """Reduce forever (each collective bounded by the launch's timeout): only a cancel ends it."""
    import torch
    import torch.distributed as dist

    Path(flags, f"rank-{info.rank}").touch()
    while True:
        dist.all_reduce(torch.ones(1))
        time.sleep(0.01)


DRIVER = """
import sys
from distributed import Client
from mlsys_flows.platform.ranks import run_ranks
from test_ranks import spin
with Client(sys.argv[1], timeout=60) as client:
    run_ranks(client, spin, 2, sys.argv[2], timeout_s=30)
"""


def test_ranks_whose_caller_is_killed_are_torn_down(dask, client, tmp_path):
    """The process that launched the ranks (a flow's) is SIGKILLed while they run: the scheduler
    releases their tasks, each rank raises RankCancelled at its next instruction and leaves its
    process group, and the workers take the next launch. The moment is an event: both ranks started."""
    dask.wait_for_workers(2)  # the cluster may have lost a worker to an earlier test: 2 ranks need 2
    flags = tmp_path / "flags"
    flags.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, dask.address, str(flags)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_until(lambda: len(list(flags.iterdir())) == 2 or driver.poll() is not None, timeout=180,
                   what="both ranks to start")
        assert driver.poll() is None, driver.stderr.read().decode()[-2000:]
        assert any(s["rank_running"] for s in rank_states(client).values())
    finally:
        driver.kill()
        driver.wait()
    wait_until(lambda: ranks_idle(rank_states(client)), timeout=120,
               what="the cancelled ranks to leave their process groups")
    again = run_ranks(client, reduce_ranks, 2, 1.0, timeout_s=TIMEOUT_S)
    assert [r["sum"] for r in again.results] == [3.0, 3.0]


def test_the_callers_store_is_kept_only_where_rank_0_reads_it_back(client):
    """Review of issue 48: a worker that advertises 127.0.0.1 without being on the caller's machine (a
    tunnel) would be handed a store it cannot reach; the caller checks with a nonce read back on rank
    0's worker and otherwise lets rank 0 open the store."""
    from mlsys_flows.platform.ranks import _store_reachable
    from mlsys_flows.systems.common.distributed import master_store

    worker = sorted(client.scheduler_info(n_workers=-1)["workers"])[0]
    store = master_store("127.0.0.1", 1, 10)
    assert _store_reachable(client, worker, store, f"127.0.0.1:{store.port}", "nonce-ok")
    other = master_store("127.0.0.1", 1, 10)   # another store at the advertised address: not ours
    assert not _store_reachable(client, worker, store, f"127.0.0.1:{other.port}", "nonce-other", timeout_s=2)
    assert run_ranks(client, reduce_ranks, 2, 1.0, timeout_s=TIMEOUT_S).store == "caller"
