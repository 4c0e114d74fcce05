"""Prefect tasks of the DSI flow: write (or find) the dataset, calibrate the trainer's CPU step and the
preprocessing rounds, train with an on-trainer loader (projected or full rows), train with DPP on Dask
(its workers on other cores, or co-located on the trainer's: the mechanism's ablation), and the regime
sweep over the preprocessing cost."""
from __future__ import annotations

import os
import uuid
from contextlib import contextmanager

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage, ResourcePool
from mlsys_flows.systems.dsi import Params
from mlsys_flows.systems.dsi import data as d
from mlsys_flows.systems.dsi.cpu import (HAS_AFFINITY, available_cores, helper_pins, pin_process, pinned,
                                         process_identity, restore_process, split_cores)
from mlsys_flows.systems.dsi.dpp import (Trainer, calibrate_passes, run_dpp, run_inline, sweep_preprocessing,
                                         torch_threads)

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


def dpp_work(item: d.WorkItem, storage: ObjectStorage, used: list[str], p: Params, rounds: int = 0):
    """What a stateless DPP worker runs for one work item: projected, coalesced read + transform (its
    whole process is pinned to the DPP cores for the run, see :func:`off_trainer`)."""
    return d.process_item(item, storage.open_input, used, p, projected=True, rounds=rounds)


def warm_workers(executor: "DaskExecutor", item: d.WorkItem) -> None:
    """Outside the clock: every DPP worker the run may use runs :func:`dpp_work` on one item first, so no
    worker pays first-use costs (imports, pyarrow, the first read) inside a timed run; every run starts
    its own cluster, so its workers start cold."""
    futures = [executor.client.submit(dpp_work, item, executor.storage, executor.used, executor.p, executor.rounds,
                                      workers=[w], allow_other_workers=False, pure=False,
                                      key=f"dpp-warm-{executor.run}-{i}")
               for i, w in enumerate(executor.workers())]
    executor.client.gather(futures)


@contextmanager
def off_trainer(client, me: str, cpu: dict):
    """For one timed run: the run's embedded cluster's other processes (scheduler, nannies, the workers
    other than the trainer's ``me``) pinned whole to the DPP cores, restored afterwards; yields what
    got which cores. Every variant gets it, so none has the scheduler on the trainer's core."""
    record = {"trainer": {"pid": os.getpid(), "cores": cpu["trainer_cores"]}, "pinned": {}}
    if not HAS_AFFINITY or set(cpu["dpp_cores"]) == set(cpu["trainer_cores"]):
        record["note"] = "pinning skipped: " + ("no affinity call on this OS" if not HAS_AFFINITY else
                                                f"one core ({cpu['trainer_cores'][0]}) for everything")
        yield record
        return
    pins, record["note"] = helper_pins(process_identity(), client.run_on_scheduler(process_identity),
                                       client.run(process_identity), me, cpu.get("own_cluster", False))
    before: dict[int, dict] = {}
    try:
        for label, pid in pins.items():
            if pid not in before:
                before[pid] = pin_process(pid, cpu["dpp_cores"])
                record["pinned"][label] = {"pid": pid, "cores": cpu["dpp_cores"], "threads": len(before[pid])}
        yield record
    finally:
        for pid, masks in before.items():
            restore_process(pid, masks)


class DaskExecutor:
    """DPP's executor on a Dask client: one future per work item, pinned to the chosen worker.

    ``exclude``: a worker that must not preprocess (the trainer's own process), unless it is the
    only one; ``only``: the one worker that preprocesses (the ablation: the trainer's own process);
    ``rounds``: derived-feature rounds per item."""

    def __init__(self, client, storage: ObjectStorage, used: list[str], p: Params, exclude: str | None = None,
                 rounds: int = 0, only: str | None = None):
        self.client, self.storage, self.used, self.p = client, storage, used, p
        self.exclude, self.rounds, self.only = exclude, rounds, only
        self.run = uuid.uuid4().hex[:8]

    def workers(self) -> list[str]:
        ws = list(self.client.nthreads())  # the live workers: a far smaller answer than scheduler_info's
        if self.only is not None:
            return [w for w in ws if w == self.only]
        others = [w for w in ws if w != self.exclude]
        return others or ws

    def submit(self, item: d.WorkItem, worker: str):
        return self.client.submit(dpp_work, item, self.storage, self.used, self.p, self.rounds,
                                  workers=[worker],
                                  allow_other_workers=False, pure=False, retries=0,
                                  key=f"dpp-{self.run}-{item.id}-{uuid.uuid4().hex[:6]}")


def free_bytes(storage: ObjectStorage) -> tuple[int | None, str]:
    """(free bytes, where) of a local storage root's disk; None for S3 (no free space to ask)."""
    import shutil
    from pathlib import Path

    if storage.is_s3:
        return None, storage.root_url
    path = Path(storage.filesystem()[1])
    while not path.exists() and path != path.parent:  # the root folder may not exist yet
        path = path.parent
    return shutil.disk_usage(path).free, f"{storage.root_url} (its disk)"


def grow_for_dpp(client, own_cluster: bool, want: int) -> int:
    """Grow the run's own embedded cluster to the trainer's worker plus ``want`` DPP workers (a cluster
    started elsewhere keeps its size); returns the Dask workers there are."""
    have = len(client.scheduler_info(n_workers=-1)["workers"])
    cluster = getattr(client, "cluster", None)
    if own_cluster and cluster is not None and have < want + 1:
        cluster.scale(want + 1)
        client.wait_for_workers(want + 1, timeout=120)
        have = len(client.scheduler_info(n_workers=-1)["workers"])
    return have


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
def cpu_budget(p: Params, storage: ObjectStorage, data: dict, pool: ResourcePool, own_cluster: bool = False) -> dict:
    """Split the cores (trainer host: one; DPP workers: the rest) and calibrate on the trainer's core the
    CPU trainer step (how many real DLRM passes per batch take ``step_ms``) and the cost of one round of
    derived features per batch (the rounds that make ``extra_preprocess`` steps). Every variant then
    does the same step and preprocessing work. ``own_cluster``: the run started the cluster, so its
    processes may be pinned (:func:`off_trainer`)."""
    trainer, dpp, note = split_cores(available_cores())
    passes, pass_ms, step_cpu_ms = None, float("nan"), p.step_ms
    item, used = data["items"][0], p.used_columns()
    with pinned(trainer), torch_threads(len(trainer)):
        if not pool.device().startswith("cuda"):
            batch = d.process_item(item, storage.open_input, used, p, projected=True)[0][0]
            passes, pass_ms = calibrate_passes(p, used, batch)
            step_cpu_ms = passes * pass_ms
        round_ms = d.derive_ms_per_batch(item, storage.open_input, used, p)
    rounds = d.rounds_for(p.extra_preprocess, step_cpu_ms, round_ms)
    get_run_logger().info("dsi cpu budget: %s; step passes %s (%.2f ms each); a derived-feature round %.3f ms per "
                          "batch, %d round(s) for extra_preprocess %g", note, passes, pass_ms, round_ms, rounds,
                          p.extra_preprocess)
    return {"trainer_cores": trainer, "dpp_cores": dpp, "note": note, "passes": passes, "pass_ms": pass_ms,
            "step_cpu_ms": step_cpu_ms, "round_ms": round_ms, "rounds": rounds, "own_cluster": own_cluster,
            "extra_preprocess": p.extra_preprocess}


def _inline(p: Params, storage: ObjectStorage, items: list[d.WorkItem], device: str, cpu: dict, client, me: str,
            projected: bool, rounds: int) -> tuple[dict, dict]:
    """One on-trainer run: the trainer and its loader threads pinned to the trainer's core."""
    with off_trainer(client, me, cpu) as pins, pinned(cpu["trainer_cores"]), torch_threads(len(cpu["trainer_cores"])):
        return run_inline(items, storage.open_input, p.used_columns(), p, device=device, projected=projected,
                          passes=cpu["passes"], rounds=rounds), pins


@task(name="dsi-inline")
def train_inline(p: Params, storage: ObjectStorage, data: dict, pool: ResourcePool, cpu: dict,
                 projected: bool = True, repeat: int = 0) -> dict:
    """The on-trainer loader: the trainer and its prefetch threads pinned to the trainer host's core.
    ``repeat`` makes each timed repeat its own call: an identical call in the same flow run would be
    answered from its persisted result (Prefect's input-keyed cache), not run again."""
    from distributed import get_client, get_worker

    log = get_run_logger()
    with pool.claim() as device:
        warm_up(p, storage, data, device)
        m, _ = _inline(p, storage, data["items"], device, cpu, get_client(), get_worker().address, projected,
                       cpu["rounds"])
    log.info("inline (%s): %.0f samples/s, stall %.0f%%, %.1f MB read", "projected" if projected else "full rows",
             m["trainer_samples_per_s"], 100 * m["stall_fraction"], m["bytes_read"] / 1e6)
    return m


def _dpp(p: Params, storage: ObjectStorage, items: list[d.WorkItem], device: str, cpu: dict, client, me: str,
         colocated: bool, rounds: int):
    """One DPP run with the trainer here (pinned to the trainer's core): work items on the other Dask
    workers, whose processes are pinned to the DPP cores, or (``colocated``) on this worker process and
    the trainer's core. Returns (metrics, details, pinning record)."""
    if colocated:
        executor = DaskExecutor(client, storage, p.used_columns(), p, only=me, rounds=rounds)
    else:
        executor = DaskExecutor(client, storage, p.used_columns(), p, exclude=me, rounds=rounds)
    warm_workers(executor, items[0])
    with off_trainer(client, me, cpu) as pins, pinned(cpu["trainer_cores"]), torch_threads(len(cpu["trainer_cores"])):
        m, details = run_dpp(items, executor, p.used_columns(), p, device=device, passes=cpu["passes"])
    return m, details, pins


@task(name="dsi-dpp")
def train_dpp(p: Params, storage: ObjectStorage, data: dict, pool: ResourcePool, cpu: dict, repeat: int = 0,
              colocated: bool = False) -> dict:
    """The trainer runs here, pinned to the trainer host's core; DPP work items run on the other Dask
    worker processes, pinned to the DPP cores (``colocated``: on this worker process, pinned to the
    trainer's core, the mechanism's ablation). ``repeat``: as for :func:`train_inline`."""
    from distributed import get_worker, worker_client

    log = get_run_logger()
    me = get_worker().address
    with pool.claim() as device, worker_client() as client:  # secedes: this worker may run co-located items
        warm_up(p, storage, data, device)
        m, details, pins = _dpp(p, storage, data["items"], device, cpu, client, me, colocated, cpu["rounds"])
    log.info("dpp%s: %.0f samples/s, stall %.0f%%, %.1f MB read, workers mean %.2f max %d, re-issued %d; pinned %s",
             " (co-located on the trainer's core)" if colocated else "", m["trainer_samples_per_s"],
             100 * m["stall_fraction"], m["bytes_read"] / 1e6, m["workers_mean"], m["workers_max"],
             m["reissued_items"], pins)
    return {"metrics": m, "workers_over_time": details["workers_over_time"], "decisions": details["decisions"],
            "device": device, "pinning": pins,
            "trainer_worker": me, "items_by_worker": details["items_by_worker"]}


@task(name="dsi-regime")
def regime(p: Params, storage: ObjectStorage, data: dict, pool: ResourcePool, cpu: dict) -> dict:
    """The regime sweep: inline, DPP and DPP co-located on the trainer's core at each extra preprocessing
    cost of ``regime_extra_preprocess``, one run each on the first ``regime_items`` work items.
    Returns {"points": {extra: {variant: samples/s}}, "rounds": {extra: rounds}}."""
    from distributed import get_worker, worker_client

    log = get_run_logger()
    me, items, used = get_worker().address, data["items"][:p.regime_items], p.used_columns()
    rounds = {x: d.rounds_for(x, cpu["step_cpu_ms"], cpu["round_ms"]) for x in p.regime_extra_preprocess}
    with pool.claim() as device, worker_client() as client:
        warm_up(p, storage, data, device)

        def run(variant: str, extra: float) -> float:
            if variant == "inline":
                m, _ = _inline(p, storage, items, device, cpu, client, me, True, rounds[extra])
            else:
                m, _, _ = _dpp(p, storage, items, device, cpu, client, me, variant == "dpp_colocated", rounds[extra])
            log.info("regime extra_preprocess %g (%d rounds): %s %.0f samples/s, stall %.0f%%", extra,
                     rounds[extra], variant, m["trainer_samples_per_s"], 100 * m["stall_fraction"])
            return m["trainer_samples_per_s"]

        points = sweep_preprocessing(p.regime_extra_preprocess, run)
    return {"points": points, "rounds": rounds}
