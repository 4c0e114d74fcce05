"""Prefect tasks of the DSI flow: write (or find) the dataset, calibrate the trainer's CPU step, train
with an on-trainer loader (projected or full rows), train with DPP on Dask."""
from __future__ import annotations

import uuid

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage, ResourcePool
from mlsys_flows.systems.dsi import Params
from mlsys_flows.systems.dsi import data as d
from mlsys_flows.systems.dsi.cpu import available_cores, pinned, split_cores
from mlsys_flows.systems.dsi.dpp import Trainer, calibrate_passes, run_dpp, run_inline, torch_threads

_WARM: set[str] = set()  # runs whose data and model this process has touched once already


def warm_up(p: Params, storage: ObjectStorage, data: dict, device: str) -> None:
    """Once per process and dataset, outside the timed region: read and preprocess the first item both
    ways and take one trainer step, so no variant pays first-use costs (pyarrow, torch) in its time."""
    if data["prefix"] in _WARM:
        return
    used = p.used_columns()
    for projected in (True, False):
        batches, _ = d.process_item(data["items"][0], storage.open_input, used, p, projected=projected)
    Trainer(p.model_copy(update={"step_ms": 0.0}), used, device).step(batches[0])
    _WARM.add(data["prefix"])


def dpp_work(item: d.WorkItem, storage: ObjectStorage, used: list[str], p: Params, cores: list[int] | None = None):
    """What a stateless DPP worker runs for one work item: projected, coalesced read + transform, on
    the DPP cores (this thread pinned for the item, then restored)."""
    with pinned(cores, whole_process=False):
        return d.process_item(item, storage.open_input, used, p, projected=True)


class DaskExecutor:
    """DPP's executor on a Dask client: one future per work item, pinned to the chosen worker.

    ``exclude``: a worker that must not preprocess (the trainer's own process), unless it is the
    only one; ``cores``: the cores a work item runs on."""

    def __init__(self, client, storage: ObjectStorage, used: list[str], p: Params, exclude: str | None = None,
                 cores: list[int] | None = None):
        self.client, self.storage, self.used, self.p = client, storage, used, p
        self.exclude, self.cores = exclude, cores
        self.run = uuid.uuid4().hex[:8]

    def workers(self) -> list[str]:
        ws = list(self.client.scheduler_info(n_workers=-1)["workers"])
        others = [w for w in ws if w != self.exclude]
        return others or ws

    def submit(self, item: d.WorkItem, worker: str):
        return self.client.submit(dpp_work, item, self.storage, self.used, self.p, self.cores, workers=[worker],
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


@task(name="dsi-cpu-budget")
def cpu_budget(p: Params, storage: ObjectStorage, data: dict, pool: ResourcePool) -> dict:
    """Split the cores (trainer host: one; DPP workers: the rest) and calibrate the CPU trainer step:
    how many real DLRM passes per batch take ``step_ms`` on the trainer's core. Every variant then
    does the same step work."""
    trainer, dpp, note = split_cores(available_cores())
    passes, pass_ms = None, float("nan")
    if not pool.device().startswith("cuda"):
        batch = d.process_item(data["items"][0], storage.open_input, p.used_columns(), p, projected=True)[0][0]
        with pinned(trainer), torch_threads(len(trainer)):
            passes, pass_ms = calibrate_passes(p, p.used_columns(), batch)
    get_run_logger().info("dsi cpu budget: %s; step passes %s (%.2f ms each)", note, passes, pass_ms)
    return {"trainer_cores": trainer, "dpp_cores": dpp, "note": note, "passes": passes, "pass_ms": pass_ms}


@task(name="dsi-inline")
def train_inline(p: Params, storage: ObjectStorage, data: dict, pool: ResourcePool, cpu: dict,
                 projected: bool = True, repeat: int = 0) -> dict:
    """The on-trainer loader: the trainer and its prefetch threads pinned to the trainer host's core.
    ``repeat`` makes each timed repeat its own call: an identical call in the same flow run would be
    answered from its persisted result (Prefect's input-keyed cache), not run again."""
    log = get_run_logger()
    with pool.claim() as device:
        warm_up(p, storage, data, device)
        with pinned(cpu["trainer_cores"]), torch_threads(len(cpu["trainer_cores"])):
            m = run_inline(data["items"], storage.open_input, p.used_columns(), p, device=device,
                           projected=projected, passes=cpu["passes"])
    log.info("inline (%s): %.0f samples/s, stall %.0f%%, %.1f MB read", "projected" if projected else "full rows",
             m["trainer_samples_per_s"], 100 * m["stall_fraction"], m["bytes_read"] / 1e6)
    return m


@task(name="dsi-dpp")
def train_dpp(p: Params, storage: ObjectStorage, data: dict, pool: ResourcePool, cpu: dict, repeat: int = 0) -> dict:
    """The trainer runs here, pinned to the trainer host's core; DPP work items run on the other Dask
    worker processes, pinned to the DPP cores. ``repeat``: as for :func:`train_inline`."""
    from distributed import get_worker, worker_client

    log = get_run_logger()
    me = get_worker().address
    with pool.claim() as device, worker_client() as client:  # secedes; this worker is excluded from preprocessing
        warm_up(p, storage, data, device)
        executor = DaskExecutor(client, storage, p.used_columns(), p, exclude=me, cores=cpu["dpp_cores"])
        with pinned(cpu["trainer_cores"]), torch_threads(len(cpu["trainer_cores"])):
            m, details = run_dpp(data["items"], executor, p.used_columns(), p, device=device,
                                 passes=cpu["passes"])
    log.info("dpp: %.0f samples/s, stall %.0f%%, %.1f MB read, workers mean %.2f max %d, re-issued %d",
             m["trainer_samples_per_s"], 100 * m["stall_fraction"], m["bytes_read"] / 1e6, m["workers_mean"],
             m["workers_max"], m["reissued_items"])
    return {"metrics": m, "workers_over_time": details["workers_over_time"], "device": device}
