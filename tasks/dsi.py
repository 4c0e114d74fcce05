"""Prefect tasks of the DSI flow: write (or find) the dataset, train inline, train with DPP on Dask."""
from __future__ import annotations

import uuid

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage, ResourcePool
from mlsys_flows.systems.dsi import Params
from mlsys_flows.systems.dsi import data as d
from mlsys_flows.systems.dsi.dpp import run_dpp, run_inline


def dpp_work(item: d.WorkItem, storage: ObjectStorage, used: list[str], p: Params):
    """What a stateless DPP worker runs for one work item: projected, coalesced read + transform."""
    return d.process_item(item, storage.open_input, used, p, projected=True)


class DaskExecutor:
    """DPP's executor on a Dask client: one future per work item, pinned to the chosen worker."""

    def __init__(self, client, storage: ObjectStorage, used: list[str], p: Params):
        self.client, self.storage, self.used, self.p = client, storage, used, p
        self.run = uuid.uuid4().hex[:8]

    def workers(self) -> list[str]:
        return list(self.client.scheduler_info(n_workers=-1)["workers"])

    def submit(self, item: d.WorkItem, worker: str):
        return self.client.submit(dpp_work, item, self.storage, self.used, self.p, workers=[worker],
                                  allow_other_workers=False, pure=False, retries=0,
                                  key=f"dpp-{self.run}-{item.id}-{uuid.uuid4().hex[:6]}")


def plan_items(p: Params, storage: ObjectStorage, prefix: str) -> list[d.WorkItem]:
    keys = [k for k in storage.list(prefix) if k.endswith(".parquet")]
    return d.plan(keys, storage.open_input, p.used_columns(), f"{storage.root_url}/{prefix}")


@task(name="dsi-dataset")
def make_dataset(p: Params, storage: ObjectStorage, prefix: str) -> dict:
    """Generate the dataset (or use ``p.dataset``) and split it into work items; fails on an empty
    dataset or a missing column before any training."""
    log = get_run_logger()
    if not p.dataset:
        for i in range(p.files):
            storage.write_bytes(d.file_key(prefix, i), d.to_parquet(d.generate_file(p, i), p.rows_per_group))
    source = p.dataset.strip("/") or prefix
    items = plan_items(p, storage, source)
    size = sum(storage.size(k) for k in {it.key for it in items})
    log.info("dsi dataset %s: %d work items, %d rows, %.1f MB; model uses %d columns",
             source, len(items), sum(it.rows for it in items), size / 1e6, len(p.used_columns()))
    return {"prefix": source, "items": items, "stored_bytes": size}


@task(name="dsi-inline")
def train_inline(p: Params, storage: ObjectStorage, data: dict, gpus: ResourcePool) -> dict:
    log = get_run_logger()
    m = run_inline(data["items"], storage.open_input, p.used_columns(), p, device=gpus.device())
    log.info("inline: %.0f samples/s, stall %.0f%%, %.1f MB read", m["trainer_samples_per_s"],
             100 * m["stall_fraction"], m["bytes_read"] / 1e6)
    return m


@task(name="dsi-dpp")
def train_dpp(p: Params, storage: ObjectStorage, data: dict, gpus: ResourcePool) -> dict:
    """The trainer runs here; DPP work items run on the cluster's workers via a worker client."""
    from distributed import worker_client

    log = get_run_logger()
    with worker_client() as client:  # secedes: this worker's slot is free for work items meanwhile
        executor = DaskExecutor(client, storage, p.used_columns(), p)
        m, details = run_dpp(data["items"], executor, p.used_columns(), p, device=gpus.device())
    log.info("dpp: %.0f samples/s, stall %.0f%%, %.1f MB read, workers mean %.2f max %d, re-issued %d",
             m["trainer_samples_per_s"], 100 * m["stall_fraction"], m["bytes_read"] / 1e6, m["workers_mean"],
             m["workers_max"], m["reissued_items"])
    return {"metrics": m, "workers_over_time": details["workers_over_time"], "device": gpus.device()}
