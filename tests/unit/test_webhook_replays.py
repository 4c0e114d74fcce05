"""The webhook's replay store and rate limiter on their own (issue 35): reservations are atomic
across receivers sharing one file, survive a restart, expire with the replay window."""
from __future__ import annotations

import multiprocessing as mp
import threading
import time

from mlsys_flows.integrations.webhooks import RateLimiter, ReplayStore

EXPIRES = time.time() + 3600  # far in the future: nothing below depends on the clock


def test_concurrent_reservations_across_two_stores_admit_exactly_one(tmp_path):
    path = tmp_path / "replays.sqlite"
    stores = [ReplayStore(path), ReplayStore(path)]  # two receivers (replicas) sharing one file
    n = 16
    barrier, results = threading.Barrier(n), [None] * n

    def reserve(i: int) -> None:
        barrier.wait()  # every thread inserts at once
        results[i] = stores[i % 2].reserve("h", "delivery-1", "digest", EXPIRES)

    threads = [threading.Thread(target=reserve, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(None) == 1  # exactly one reserved
    assert all(r == ("digest", None) for r in results if r is not None)  # the others see it in flight


def _reserve_in_a_process(path: str, barrier, results) -> None:
    store = ReplayStore(path)
    barrier.wait(timeout=300)
    results.put(store.reserve("h", "delivery-1", "digest", EXPIRES))


def test_concurrent_reservations_from_separate_processes_admit_exactly_one(tmp_path):
    """Replicas are processes: SQLite's file locks, not a lock in one process, make it atomic."""
    ctx, n = mp.get_context("spawn"), 4
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_reserve_in_a_process, args=(str(tmp_path / "replays.sqlite"), barrier, results))
             for _ in range(n)]
    for proc in procs:
        proc.start()
    try:
        outcomes = [results.get(timeout=300) for _ in range(n)]
    finally:
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
    assert outcomes.count(None) == 1 and outcomes.count(("digest", None)) == n - 1


def test_reservation_survives_a_restart_and_names_the_run(tmp_path):
    path = tmp_path / "replays.sqlite"
    first = ReplayStore(path)
    assert first.reserve("h", "d", "digest", EXPIRES) is None
    first.record("h", "d", "run-1")
    del first
    restarted = ReplayStore(path)
    assert restarted.reserve("h", "d", "digest", EXPIRES) == ("digest", "run-1")
    assert restarted.reserve("h", "d", "other", EXPIRES) == ("digest", "run-1")  # same id, another body
    assert restarted.reserve("other-hook", "d", "digest", EXPIRES) is None  # ids are per hook


def test_release_and_expiry_free_a_delivery(tmp_path):
    store = ReplayStore(tmp_path / "replays.sqlite")
    assert store.reserve("h", "d", "x", EXPIRES) is None
    store.release("h", "d")  # the run could not be created: the sender's retry may proceed
    assert store.reserve("h", "d", "x", EXPIRES) is None
    store.record("h", "d", "run-1")
    store.release("h", "d")  # a reservation with a run is never released
    assert store.reserve("h", "d", "x", EXPIRES) == ("x", "run-1")
    assert store.reserve("h", "old", "x", time.time() - 1) is None  # already past its window
    assert store.reserve("h", "old", "x", EXPIRES) is None  # purged, so free again


def test_rate_limiter_refuses_after_the_burst_per_name():
    limiter = RateLimiter(rate_per_s=0.001, burst=3)  # refills one token per 1000 s: no clock dependence
    assert [limiter.wait_s("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = limiter.wait_s("a")
    assert 0 < wait <= 1000
    assert limiter.wait_s("b") == 0.0  # another hook has its own bucket


def test_rate_limiter_memory_is_bounded(monkeypatch):
    monkeypatch.setattr(RateLimiter, "MAX_BUCKETS", 100)
    limiter = RateLimiter(rate_per_s=0.001, burst=2)
    for i in range(1000):  # a flood of made-up hook names
        limiter.wait_s(f"name-{i}")
    assert len(limiter._buckets) <= 100
