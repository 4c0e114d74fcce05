"""Prefect tasks of the cedar flow: write the images, the corpus and the clips, benchmark one pipeline."""
from __future__ import annotations

import multiprocessing
import time
from contextlib import contextmanager

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.cedar import Params, make_workload as _make_workload, pipelines
from mlsys_flows.systems.cedar.bench import PrefixedStore, bench_pipeline


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


@task(name="cedar-benchmark")
def benchmark(p: Params, storage: ObjectStorage, manifest: dict, pipeline: str, cache_prefix: str) -> dict:
    """DataLoader (each num_workers), cedar as written and cedar optimized on one pipeline, interleaved;
    fails (OutputsDiffer) when a variant's outputs differ from cedar as written."""
    log = get_run_logger()
    build = pipelines(p, storage, manifest)[pipeline]
    cache = PrefixedStore(storage, cache_prefix) if p.cache == "storage" else None
    t0 = time.perf_counter()
    with _children_allowed():
        result = bench_pipeline(build, epochs=p.epochs, repeats=p.repeats, workers_grid=list(p.workers_grid),
                                profile_samples=p.profile_samples, cache=cache, prefetch_factor=p.prefetch_factor,
                                log=lambda m: log.info("cedar %s: %s", pipeline, m))
    log.info("cedar %s: samples/s %s; outputs equal to cedar as written: %s (%.1f s)\n%s", pipeline,
             {k: round(v["samples_per_s"], 1) for k, v in result["variants"].items()}, ", ".join(result["verified"]),
             time.perf_counter() - t0, result["plan"])
    return result
