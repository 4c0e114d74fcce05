"""cedar: pipeline API, profiler, optimizer rewrites, equivalence, errors, worker death."""
from __future__ import annotations

import os
import signal
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlsys_flows.systems.cedar import OperatorError, Params, Pipeline, WorkerDied
from mlsys_flows.systems.common.params import ParamsError


def ms(outputs) -> Counter:
    """Multiset of samples (or of the samples inside dict batches)."""
    def flat(x):
        if isinstance(x, dict) and x and isinstance(next(iter(x.values())), (np.ndarray, list)):
            n = len(next(iter(x.values())))
            return [tuple(sorted((k, repr(np.asarray(v[i]).tolist())) for k, v in x.items())) for i in range(n)]
        return [repr(x) if not isinstance(x, dict) else tuple(sorted(x.items()))]
    return Counter(s for o in outputs for s in flat(o))


def slow_square(s):
    time.sleep(0.002)
    return s | {"sq": s["a"] * s["a"]}


def base(n=40, seed=0):
    return Pipeline.from_list([{"a": i, "b": i % 7} for i in range(n)], seed=seed)


# ----- API -------------------------------------------------------------------------------------

def test_pipeline_is_a_plain_iterable_with_keys_seeding_random_ops():
    p = base(10).map(lambda s, rng: s | {"r": int(rng.integers(1000))}, name="noise", random=True).batch(4)
    a, b = list(p), list(p)  # two epochs
    assert [len(x["a"]) for x in a] == [4, 4, 2]
    assert p.take(3, epoch=0)[0]["r"].tolist() == a[0]["r"].tolist()  # reproducible per epoch
    assert a[0]["r"].tolist() != b[0]["r"].tolist()  # a new epoch draws new augmentations


def test_flat_map_shuffle_and_names():
    p = Pipeline.from_list([1, 2, 3]).flat_map(lambda x: [x] * x, name="rep").shuffle(4)
    assert sorted(p.iterate(0)) == [1, 2, 2, 3, 3, 3]
    with pytest.raises(ValueError, match="used twice"):
        p.map(str, name="rep")
    with pytest.raises(ValueError, match="batch size"):
        p.batch(0)


def test_sources_files_storage_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = []
    for i in range(3):
        (tmp_path / f"{i}.bin").write_bytes(bytes([i]) * (i + 1))
        paths.append(tmp_path / f"{i}.bin")
    files = Pipeline.from_files(paths, meta=[{"y": i} for i in range(3)]).map(lambda s: (s["y"], len(s["data"])), name="n")
    assert list(files.iterate()) == [(0, 1), (1, 2), (2, 3)]

    class Store(dict):
        def read_bytes(self, key):
            return self[key]

    stored = Pipeline.from_storage(Store(k1=b"xy", k2=b"z"), ["k1", "k2"]).map(lambda s: s["data"], name="d")
    assert list(stored.iterate()) == [b"xy", b"z"]

    pq.write_table(pa.table({"id": list(range(10)), "t": [str(i) for i in range(10)]}), tmp_path / "x.parquet",
                   row_group_size=3)
    rows = Pipeline.from_parquet(str(tmp_path / "x.parquet"), columns=["id"])
    assert [r["id"] for r in rows.iterate()] == list(range(10))
    assert len(rows.source.refs) == 4


def test_operator_error_names_operator_and_sample():
    p = base(10).map(lambda s: s | {"inv": 1 / (s["a"] - 5)}, name="invert")
    with pytest.raises(OperatorError, match=r"operator 'invert' failed on sample 5: ZeroDivisionError"):
        list(p.iterate())
    # the profiler samples items 0, 3, 6, 9; the failure comes from inside a worker process
    with p.optimize(workers=2, mode="always", sample=4) as fast:
        assert fast.plan.steps[0].cold == "process"
        with pytest.raises(OperatorError, match=r"'invert' failed on sample 5") as info:
            list(fast.iterate())
    assert info.value.op == "invert" and info.value.key == (5,)


# ----- optimizer -------------------------------------------------------------------------------

def test_reorder_hoists_a_cheap_filter_ahead_of_an_expensive_map():
    p = (base(60).map(slow_square, name="square", reads=("a",), writes=("sq",))
         .filter(lambda s: s["b"] == 0, name="keep_b0", reads=("b",)).batch(5))
    fast = p.optimize(workers=1)
    stage = fast.plan.steps[0]
    assert [o.name for o in stage.ops] == ["keep_b0", "square"]
    moved = [d for d in fast.plan.decisions if d.rule == "reorder" and d.applied]
    assert moved and moved[0].est_gain_s > 0
    assert ms(fast.iterate()) == ms(p.iterate())
    assert "keep_b0" in fast.explain() and "+ reorder" in fast.explain()


def test_reorder_respects_field_conflicts_and_undeclared_ops():
    p = (base(30).map(slow_square, name="square", reads=("a",), writes=("sq",))
         .filter(lambda s: s["sq"] % 2 == 0, name="even_sq", reads=("sq",))  # reads what square writes
         .map(lambda s: s, name="opaque")  # no fields declared: a barrier to moves
         .filter(lambda s: s["b"] == 0, name="late", reads=("b",)))
    fast = p.optimize(workers=1)
    assert [o.name for o in fast.plan.steps[0].ops] == ["square", "even_sq", "opaque", "late"]
    assert ms(fast.iterate()) == ms(p.iterate())


def test_cache_serves_later_epochs_without_recomputing(tmp_path):
    calls = []

    def expensive(s):
        calls.append(s["a"])
        time.sleep(0.003)
        return s | {"e": s["a"] * 3}

    p = base(30).map(expensive, name="expensive").map(lambda s, r: s | {"r": float(r.random())}, name="aug",
                                                      random=True).batch(8)
    fast = p.optimize(epochs=3, cache=str(tmp_path), workers=1)
    decision = next(d for d in fast.plan.decisions if d.rule == "cache")
    assert decision.applied and decision.est_gain_s > 0 and "after 'expensive'" in decision.detail
    calls.clear()
    first = ms(fast.iterate(0))
    assert len(calls) == 30
    second = ms(fast.iterate(1))
    assert len(calls) == 30  # epoch 1 read the cache
    assert first == ms(p.iterate(0)) and second == ms(p.iterate(1))  # random op still re-drawn per epoch
    assert first != second


def test_no_cache_for_one_epoch_or_random_prefix(tmp_path):
    p = base(20).map(slow_square, name="square")
    assert not any(d.applied for d in p.optimize(epochs=1, cache=str(tmp_path), workers=1).plan.decisions
                   if d.rule == "cache")
    r = base(20).map(lambda s, rng: s, name="aug", random=True).map(slow_square, name="square")
    d = next(d for d in r.optimize(epochs=3, cache=str(tmp_path), workers=1).plan.decisions if d.rule == "cache")
    assert not d.applied and "not deterministic" in d.detail


def test_fusion_and_offload_decisions_are_logged():
    p = base(64).map(slow_square, name="square").map(lambda s: s | {"c": 1}, name="tag").batch(8)
    with p.optimize(workers=2) as fast:
        rules = {d.rule for d in fast.plan.decisions}
        assert {"reorder", "fuse", "cache", "offload", "prefetch"} <= rules
        off = next(d for d in fast.plan.decisions if d.rule == "offload")
        assert "Amdahl model" in off.detail and ("trial on" in off.detail if off.applied else True)
        assert ms(fast.iterate()) == ms(p.iterate())


def test_prefetch_buffer_with_a_consumer():
    p = base(20).map(slow_square, name="square")
    fast = p.optimize(workers=1, consumer_s=0.001)
    assert fast.plan.prefetch >= 2
    assert ms(fast.iterate()) == ms(p.iterate())


def test_remote_offload_through_an_executor_interface():
    p = base(24).map(slow_square, name="square").batch(6)
    with ThreadPoolExecutor(2) as ex, p.optimize(workers=1, remote=ex, remote_workers=2, mode="always") as fast:
        assert fast.plan.steps[0].cold == "remote"
        assert ms(fast.iterate()) == ms(p.iterate())


def test_remote_offload_on_dask_workers():
    distributed = pytest.importorskip("distributed")
    p = base(24).map(slow_square, name="square").batch(6)
    with distributed.Client(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=None) as client:
        with p.optimize(workers=1, remote=client, remote_workers=2, mode="always") as fast:
            assert ms(fast.iterate()) == ms(p.iterate())


# ----- equivalence (property) -------------------------------------------------------------------

OPS = {
    "scale_a": lambda p: p.map(lambda s: s | {"a": s["a"] * 3 + 1}, name="scale_a", reads=("a",), writes=("a",)),
    "rand_b": lambda p: p.map(lambda s, r: s | {"b": s["b"] + int(r.integers(5))}, name="rand_b", random=True,
                              reads=("b",), writes=("b",)),
    "even_a": lambda p: p.filter(lambda s: s["a"] % 2 == 0, name="even_a", reads=("a",)),
    "small_b": lambda p: p.filter(lambda s: s["b"] < 5, name="small_b", reads=("b",)),
    "mix": lambda p: p.map(lambda s: s | {"c": s["a"] + s["b"]}, name="mix"),
    "dup": lambda p: p.flat_map(lambda s: [s | {"d": 0}, s | {"d": 1}], name="dup"),
    "shuffle": lambda p: p.shuffle(5),
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.sampled_from(sorted(OPS)), min_size=1, max_size=6, unique=True),
       n=st.integers(1, 30), seed=st.integers(0, 3), batch=st.one_of(st.none(), st.integers(1, 7)))
def test_optimized_pipeline_yields_the_same_multiset(tmp_path, names, n, seed, batch):
    p = Pipeline.from_list([{"a": i, "b": (i * 7) % 9} for i in range(n)], seed=seed)
    for name in names:
        p = OPS[name](p)
    if batch:
        p = p.batch(batch)
    fast = p.optimize(epochs=2, cache=str(tmp_path / f"c{seed}-{n}-{len(names)}"), workers=1, sample=8, mode="always")
    for epoch in (0, 1):  # epoch 1 reads the cache where one was chosen
        assert ms(fast.iterate(epoch)) == ms(p.iterate(epoch))


def test_equivalence_with_worker_processes(tmp_path):
    p = (base(50).map(slow_square, name="square", reads=("a",), writes=("sq",))
         .filter(lambda s: s["b"] < 4, name="b_small", reads=("b",))
         .map(lambda s, r: s | {"n": float(r.normal())}, name="noise", random=True).batch(7))
    with p.optimize(epochs=2, cache=str(tmp_path), workers=2, mode="always") as fast:
        assert fast.plan.steps[0].cold == "process"
        for epoch in (0, 1):
            assert ms(fast.iterate(epoch)) == ms(p.iterate(epoch))


# ----- worker death -----------------------------------------------------------------------------

def slow_identity(s):
    time.sleep(0.02)
    return s


@pytest.mark.timeout(60)
def test_killed_worker_raises_instead_of_hanging():
    p = base(200).map(slow_identity, name="slow")
    with p.optimize(workers=2, mode="always", chunk=2) as fast:
        it = fast.iterate()
        next(it)
        os.kill(fast.runtime.worker_pids()[0], signal.SIGKILL)
        t0 = time.perf_counter()
        with pytest.raises(WorkerDied, match="worker process died while running stage 'slow'"):
            list(it)
        assert time.perf_counter() - t0 < 30
        assert len(list(fast.iterate())) == 200  # a fresh pool on the next pass


def _own_a_pool(ready) -> None:
    """A process that owns cedar's pool (as a Dask worker running cedar does), then idles."""
    from mlsys_flows.systems.cedar.pipeline import Runtime

    runtime = Runtime()
    list(runtime.pool(2).map(abs, [1, 2]))
    ready.put(runtime.worker_pids())
    time.sleep(600)


def test_pool_processes_exit_when_the_process_owning_the_pool_dies():
    """The pool's owner SIGKILLed (a Dask worker killed mid-task, a run stopped by Ctrl-C): its pool
    processes exit too; without that they waited on the pool's queue forever, holding the stopped
    run's output open."""
    import multiprocessing as mp

    import psutil

    ctx = mp.get_context("fork")
    ready = ctx.Queue()
    owner = ctx.Process(target=_own_a_pool, args=(ready,))
    owner.start()
    try:
        pids = ready.get(timeout=120)
        pool = []
        for pid in pids:
            try:
                pool.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        assert pool, "the pool started no process"
    finally:
        os.kill(owner.pid, signal.SIGKILL)
        owner.join()
    _, alive = psutil.wait_procs(pool, timeout=30)  # a hang guard: they exit within a second
    for p in alive:
        p.kill()
    assert not alive, f"pool processes outlived their owner: {[p.pid for p in alive]}"


# ----- parameters -------------------------------------------------------------------------------

def test_params_reject_bad_values_naming_the_field():
    with pytest.raises(ParamsError, match="crop_size"):
        Params.for_scale("smoke", crop_size=100, image_size=64)
    with pytest.raises(ParamsError, match="n_images"):
        Params.for_scale("smoke", n_images=10**9)
    with pytest.raises(ParamsError, match="workers_grid"):
        Params.for_scale("smoke", workers_grid=[0, 99])
    assert Params.for_scale("quick").epochs >= 2
