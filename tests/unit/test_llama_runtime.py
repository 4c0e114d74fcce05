"""Llama's serverless runtime: a cold start happens once and warm invocations reuse the process; an idle
worker is stopped after the keep-alive (real and virtual clock); the concurrency limit holds; closing
the pool leaves no worker process behind; a worker whose parent goes away exits."""
from __future__ import annotations

import os
import time

import pytest

from mlsys_flows.systems.llama import ops
from mlsys_flows.systems.llama.runtime import Worker, WorkerError, WorkerPool


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie still answers kill(0): read its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] in "ZX"
    except FileNotFoundError:
        return True


def test_cold_start_once_then_warm_reuse():
    with WorkerPool(keep_alive_s=60.0, max_instances=2) as pool:
        inst, cold = pool.acquire("cpu")
        assert cold > 0 and cold == pool.stats.cold_start_s[0]
        pid = inst.worker.pid
        items = ops.make_video(0, 0, 2, 64, 1.0, 0.5)
        out, rtt, compute = inst.worker.call("decode", items, {"size": 64})
        assert len(out) == 2 and out[0][1].shape == (64, 64) and 0 <= compute <= rtt
        pool.release(inst)
        again, cold2 = pool.acquire("cpu")
        assert again is inst and again.worker.pid == pid and cold2 == 0.0
        assert pool.stats.cold_starts == 1
        pool.release(again)
        # the other tier is a separate instance: its own cold start
        gpu, cold3 = pool.acquire("gpu")
        assert cold3 > 0 and gpu.worker.pid != pid and pool.stats.cold_starts == 2
        pool.release(gpu)
        pids = pool.live_pids()
    assert all(gone(p) for p in pids)


def test_idle_worker_is_stopped_after_keep_alive():
    with WorkerPool(keep_alive_s=0.3, max_instances=1) as pool:
        inst, _ = pool.acquire("cpu")
        pid = inst.worker.pid
        pool.release(inst)
        assert pool.reap() == 0 and pool.idle("cpu") == 1      # still warm
        time.sleep(0.6)
        assert pool.idle("cpu") == 0
        assert pool.reap() == 1 and pool.stats.stopped_idle == 1
        assert gone(pid)
        fresh, cold = pool.acquire("cpu")                      # a new process: a second cold start
        assert cold > 0 and fresh.worker.pid != pid and pool.stats.cold_starts == 2
        pool.release(fresh)


def test_virtual_clock_keep_alive_and_concurrency_limit():
    spawned = []

    def spawn(tier):
        spawned.append(tier)
        return None, 0.5

    pool = WorkerPool(keep_alive_s=3.0, max_instances=1, spawn=spawn, clock=lambda: 0.0)
    a, cold = pool.acquire("cpu", now=0.0)
    assert cold == 0.5
    assert pool.acquire("cpu", now=0.1) is None                 # at the limit: waits
    pool.release(a, now=1.0)
    assert pool.acquire("cpu", now=2.0, allow_new=False)[1] == 0.0   # warm within keep-alive
    pool.release(a, now=2.0)
    assert pool.acquire("cpu", now=10.0, allow_new=False) is None    # expired and reaped, no scale-out allowed
    b, cold = pool.acquire("cpu", now=10.0)
    assert cold == 0.5 and b is not a and spawned == ["cpu", "cpu"] and pool.stats.stopped_idle == 1
    assert pool.prewarm("gpu", 1, now=10.0) == [0.5] and pool.idle("gpu", now=10.0) == 1


def test_close_leaves_no_worker_process():
    pool = WorkerPool(keep_alive_s=60.0, max_instances=2)
    held = [pool.acquire("cpu")[0] for _ in range(2)] + [pool.acquire("gpu")[0]]
    pids = [i.worker.pid for i in held]
    pool.release(held[0])          # idle and busy ones alike
    assert len(set(pids)) == 3 and not any(gone(p) for p in pids)
    pool.close()
    assert all(gone(p) for p in pids)
    with pytest.raises(WorkerError):
        pool.acquire("cpu")


def test_errors_are_reported_and_orphans_exit():
    w = Worker("cpu")
    try:
        with pytest.raises(WorkerError, match="KeyError"):
            w.call("no_such_op", [], {})
        assert w.call("aggregate", [((0, 0), 3)], {"video": 0})[0] == [(0, (0, 0, 0, 1, 0, 0, 0, 0))]
        w.proc.stdin.close()          # what the worker sees when its parent dies
        w.proc.wait(10)
        assert w.proc.returncode == 0
    finally:
        w.stop()
    with pytest.raises(ValueError):
        Worker("tpu")
