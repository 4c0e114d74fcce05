"""Prefect tasks of the fae flow: the family's dataset and training tasks (tasks/recsys_embeddings.py)
with FAE's variants, and FAE's memory-budget sweep."""
from __future__ import annotations

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.fae import Params
from mlsys_flows.systems.recsys_embeddings import experiment as ex
from mlsys_flows.systems.recsys_embeddings.workload import Dataset
from mlsys_flows.tasks.recsys_embeddings import make_dataset, train, variants_of

VARIANTS = ["hybrid", "fae"]
__all__ = ["VARIANTS", "make_dataset", "train", "budget_sweep"]


@task(name="fae-budget-sweep")
def budget_sweep(p: Params, storage: ObjectStorage, key: str) -> list[dict]:
    """FAE once more at each budget of ``budget_sweep_mb`` (one run each)."""
    log = get_run_logger()
    ds = Dataset.from_bytes(storage.read_bytes(key))
    points = []
    for mb in p.budget_sweep_mb:
        (v,), _ = variants_of(p, ds, ["fae"], mb)
        r = ex.run_once(ds, p, v)
        r["budget_mb"] = mb
        points.append(r)
        log.info("fae budget %.3g MB: %d hot rows, hot inputs %.3f, %.2f s training, test logloss %.4f", mb,
                 r["hot_rows"], r["hot_input_fraction"], r["train_time_s"], r["test_logloss"])
    return points
