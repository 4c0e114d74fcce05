"""Prefect tasks the hot-embedding family (fae, hotline, slipstream) shares: the Criteo-like dataset,
then the chosen variants trained on the family's two-tier trainer (systems/recsys_embeddings),
interleaved over the repeats. The training tasks are device tasks: each holds a device of the run's
pool (``pool.claim()``: a GPU of the ``devices`` pool, else this worker's own CUDA device, else the
CPU with a logged warning) and trains every variant there; the runs say which device it was."""
from __future__ import annotations

import time

from prefect import get_run_logger, task

from mlsys_flows import registry
from mlsys_flows.blocks import ObjectStorage, ResourcePool
from mlsys_flows.systems.recsys_embeddings import experiment as ex
from mlsys_flows.systems.recsys_embeddings.params import HarnessParams
from mlsys_flows.systems.recsys_embeddings.workload import Dataset


@task(name="recsys-dataset")
def make_dataset(p: HarnessParams, storage: ObjectStorage, key: str) -> dict:
    """Generate the workload once and store it (the train/test split is fixed by the seed)."""
    t0 = time.perf_counter()
    ds = ex.dataset(p)
    storage.write_bytes(key, ds.to_bytes())
    out = {"key": key, "total_rows": ds.total_rows, "bayes_logloss": ds.bayes_logloss, "hot_share": ds.hot_share,
           "positive_rate": float(ds.labels.mean())}
    get_run_logger().info("%s dataset: %d train + %d test samples, %d tables, %d rows; hottest 7%% of rows take %.3f of "
                          "accesses; Bayes test logloss %.4f (%.1f s)", p.SYSTEM, p.samples, p.test_samples, p.num_tables,
                          ds.total_rows, ds.hot_share, ds.bayes_logloss, time.perf_counter() - t0)
    return out


def variants_of(p: HarnessParams, ds: Dataset, names: list[str], budget_mb: float | None = None):
    hot, profiled = ex.hot_rows(ds, p, budget_mb)
    return [ex.variant(n, p, hot) for n in names], profiled


@task(name="recsys-train")
def train(p: HarnessParams, storage: ObjectStorage, key: str, names: list[str], pool: ResourcePool) -> dict:
    """Every variant in ``names`` ``repeats`` times, interleaved, on a device of ``pool`` (the flow's
    ``ctx.devices``); each run starts its own slow-tier process."""
    log = get_run_logger()
    ds = Dataset.from_bytes(storage.read_bytes(key))
    variants, profiled = variants_of(p, ds, names)
    with pool.claim() as device:
        log.info("%s training on %s (the model and the hot rows there, the slow tier in host memory)", p.SYSTEM,
                 device)
        reps = p.adaptive_repeats()
        runs = ex.run_interleaved(ds, p, variants, reps, lambda s: log.info("%s %s", p.SYSTEM, s), str(device),
                                  spec=registry.get(p.SYSTEM))
    return {"runs": runs, "profiled": profiled, "device": ex.devices_of(runs), "repeats": reps.summary()}


@task(name="recsys-regime")
def regime(p: HarnessParams, storage: ObjectStorage, key: str, names: list[str],
           pool: ResourcePool) -> dict[float, dict[str, dict]]:
    """The regime sweep: each variant in ``names`` once at every added slow-tier cost per row
    (``regime_slow_row_us``) on the first ``regime_samples`` training inputs, on a device of ``pool``."""
    log = get_run_logger()
    ds = Dataset.from_bytes(storage.read_bytes(key))
    variants, _ = variants_of(p, ds, names)
    with pool.claim() as device:
        return ex.regime_sweep(ds, p, variants, lambda s: log.info("%s %s", p.SYSTEM, s), str(device))
