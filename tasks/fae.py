"""Prefect tasks of the fae flow: the family's dataset, training and regime tasks
(tasks/recsys_embeddings.py) with FAE's variants, and FAE's memory-budget sweep (counted)."""
from __future__ import annotations

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.fae import REGIME_VARIANTS, VARIANTS, Params
from mlsys_flows.systems.recsys_embeddings import experiment as ex
from mlsys_flows.systems.recsys_embeddings.hot import hot_inputs, hot_slots
from mlsys_flows.systems.recsys_embeddings.workload import Dataset
from mlsys_flows.tasks.recsys_embeddings import make_dataset, regime, train

__all__ = ["VARIANTS", "REGIME_VARIANTS", "make_dataset", "train", "regime", "budget_sweep"]


@task(name="fae-budget-sweep")
def budget_sweep(p: Params, storage: ObjectStorage, key: str) -> list[dict]:
    """FAE's profile ranked again at each budget of ``budget_sweep_mb``: hot rows and the share of
    training inputs that are hot (counted; nothing is trained)."""
    log = get_run_logger()
    ds = Dataset.from_bytes(storage.read_bytes(key))
    _, ids, _ = ds.split("train")
    points = []
    for mb in p.budget_sweep_mb:
        hot, _ = ex.hot_rows(ds, p, mb)
        frac = float(hot_inputs(ids, hot_slots(hot, ds.total_rows)).mean())
        points.append({"budget_mb": mb, "hot_rows": len(hot), "hot_input_fraction": frac})
        log.info("fae budget %.3g MB: %d hot rows, hot inputs %.3f", mb, len(hot), frac)
    return points
