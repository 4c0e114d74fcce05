"""Prefect tasks of the cedar flow: write the images, the corpus and the clips, benchmark one pipeline,
sweep the per-sample CPU cost (the regime)."""
from __future__ import annotations

import multiprocessing
import statistics
import time
from contextlib import contextmanager

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.cedar import Params, make_workload as _make_workload, pipelines, regime_builders
from mlsys_flows.systems.cedar.bench import PrefixedStore, bench_pipeline, sweep_cost
from mlsys_flows.systems.cedar.workloads import featurize_round_us


@task(name="cedar-workload")
def make_workload(p: Params, storage: ObjectStorage, prefix: str) -> dict:
    """PNG images, a parquet corpus and WAV clips on the storage block, made from the run's seed."""
    log = get_run_logger()
    t0 = time.perf_counter()
    manifest = _make_workload(p, storage, prefix)
    log.info("cedar workload: %d PNGs (%d px), %d documents in %s, %d WAV clips (%.1f s)", p.n_images, p.image_size,
             p.n_docs, manifest["text"], p.n_clips, time.perf_counter() - t0)
    return manifest


@contextmanager
def _children_allowed():
    """Dask worker processes are daemonic and multiprocessing refuses to start children from a
    daemonic process. The DataLoader workers and cedar's pool are started and shut down inside
    the task, so lift the flag for its duration."""
    proc = multiprocessing.current_process()
    was = proc._config.get("daemon")
    proc._config["daemon"] = False
    try:
        yield
    finally:
        if was is not None:
            proc._config["daemon"] = was


class DaskWorkers:
    """The cluster's workers other than this task's, as the remote executor cedar's optimizer
    offloads to (``submit(fn, *args)``; every call a fresh task, never a cached result)."""

    def __init__(self, client, workers: list[str]):
        self.client, self.workers = client, workers

    def submit(self, fn, *args):
        return self.client.submit(fn, *args, workers=self.workers, allow_other_workers=False, pure=False)


@contextmanager
def _dask_workers(p: Params):
    """(executor, threads) of the other Dask workers while this task runs on one, else (None, 0).
    With a local-disk cache only workers on this host are offered (they must read its shards)."""
    try:
        from distributed import get_worker, worker_client

        me = get_worker()
    except (ImportError, ValueError):  # not on a Dask worker: no remote executor
        yield None, 0
        return
    with worker_client() as client:  # secedes while the task waits on the chunks it submitted
        info = client.scheduler_info(n_workers=-1)["workers"]
        host = me.address.rsplit(":", 1)[0]
        others = [a for a, w in info.items() if a != me.address
                  and (p.cache == "storage" or a.rsplit(":", 1)[0] == host)]
        threads = sum(int(info[a].get("nthreads", 1)) for a in others)
        yield (DaskWorkers(client, sorted(others)), threads) if others else (None, 0)


@task(name="cedar-benchmark")
def benchmark(p: Params, storage: ObjectStorage, manifest: dict, pipeline: str, cache_prefix: str) -> dict:
    """DataLoader (each num_workers), the caching DataLoader (num_workers calibrated), cedar as written and
    cedar optimized on one pipeline, interleaved;
    fails (OutputsDiffer) when a variant's outputs differ from cedar as written. cedar optimized may
    offload a stage to local worker processes (large arrays back through shared memory) or to the
    cluster's other Dask workers, whichever its cost model and a measured trial say pays."""
    log = get_run_logger()
    build = pipelines(p, storage, manifest)[pipeline]
    cache = PrefixedStore(storage, cache_prefix) if p.cache == "storage" else None
    t0 = time.perf_counter()
    with _children_allowed(), _dask_workers(p) as (remote, remote_workers):
        result = bench_pipeline(build, epochs=p.epochs, repeats=p.repeats, workers_grid=list(p.workers_grid),
                                profile_samples=p.profile_samples, cache=cache, prefetch_factor=p.prefetch_factor,
                                calibrate_items=p.calibrate_items, log=lambda m: log.info("cedar %s: %s", pipeline, m),
                                remote=remote, remote_workers=remote_workers)
    result["remote_workers"] = remote_workers
    log.info("cedar %s: samples/s %s; outputs equal to cedar as written: %s (%.1f s)\n%s", pipeline,
             {k: round(v["samples_per_s"], 1) for k, v in result["variants"].items()}, ", ".join(result["verified"]),
             time.perf_counter() - t0, result["plan"])
    return result


@task(name="cedar-regime")
def regime(p: Params, storage: ObjectStorage, cache_prefix: str) -> dict:
    """The regime sweep: a synthetic pipeline (deterministic featurize of a chosen per-sample CPU cost,
    calibrated here; cheap random jitter) at each cost of ``regime_cost_us``, ``regime_repeats`` interleaved
    runs each of the DataLoader and the caching DataLoader (num_workers calibrated), cedar and cedar
    optimized. Returns {"points": {us: {variant: [samples/s per repeat], "num_workers", "cached_num_workers",
    "applied"}}, "round_us", "rounds": {us: rounds}}."""
    log = get_run_logger()
    round_us = featurize_round_us()
    rounds = {us: max(1, round(us / round_us)) for us in p.regime_cost_us}
    cache = PrefixedStore(storage, cache_prefix) if p.cache == "storage" else None
    t0 = time.perf_counter()
    with _children_allowed(), _dask_workers(p) as (remote, remote_workers):
        build, calibrate = regime_builders(p, rounds)
        points = sweep_cost(list(p.regime_cost_us), build,
                            epochs=p.epochs, workers_grid=list(p.workers_grid), profile_samples=p.profile_samples,
                            calibrate_items=min(p.calibrate_items, p.regime_items), prefetch_factor=p.prefetch_factor,
                            repeats=p.regime_repeats, cache=cache, remote=remote, remote_workers=remote_workers,
                            # half the point's size, other samples (ids past the evaluated ones) and another
                            # seed: worker start-up weighs about as it will in the evaluated runs
                            calibrate_build=calibrate, calibrate_trials=p.regime_calibrate_trials)
    for us, pt in points.items():
        log.info("cedar regime %g us/sample (%d rounds), median samples/s: dataloader (num_workers=%d) %.0f, caching "
                 "dataloader (num_workers=%d) %.0f, cedar %.0f, optimized %.0f (%s; optimize() %.0f%% of its run)", us,
                 rounds[us],
                 pt["num_workers"], statistics.median(pt["dataloader"]), pt["cached_num_workers"],
                 statistics.median(pt["dataloader_cached"]), statistics.median(pt["cedar"]),
                 statistics.median(pt["cedar_optimized"]), ", ".join(pt.get("applied", [])) or "no rewrite",
                 100 * statistics.median(pt["optimize_share"]))
    log.info("cedar regime: %.1f s", time.perf_counter() - t0)
    return {"points": points, "round_us": round_us, "rounds": rounds}
