"""Prefect task of the SIA flow: serve each workload's operation mixes with both retraining schemes, the
retrains running on an FPGA board of the pool (or inline on the host for the inline variants)."""
from __future__ import annotations

import json
import time

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage, ResourcePool
from mlsys_flows.devices.fpga import open_board
from mlsys_flows.systems.sia import Params
from mlsys_flows.systems.sia.bench import measure_workload
from mlsys_flows.systems.sia.index import image


@task(name="sia-serve")
def serve(p: Params, storage: ObjectStorage, workloads: dict[str, bool], pool: ResourcePool, prefix: str) -> dict:
    """For each workload (name -> with the inline variants): build the index of its keys, then serve
    every variant's operation stream ``p.repeats`` times (variants interleaved), retraining on one
    claimed board; one workload after the other, each result also saved at ``prefix/<workload>.json``."""
    log = get_run_logger()
    out = {}
    with pool.claim() as device:
        t0 = time.perf_counter()
        with open_board(device) as board:
            board.load_image(image())  # declares the retrain kernels: the board runs nothing else
            # start the device process and import the kernels before any clock starts
            pid = board.run("mlsys_flows.systems.sia.train:warm_up")
            log.info("board %s ready (device process %d) in %.2f s", device, pid, time.perf_counter() - t0)
            for wl, inline in workloads.items():
                res = measure_workload(p, wl, board.run_async, inline, log=log.info,
                                       regime=tuple(p.regime_insert_shares) if wl == "ycsb" else ())
                res["device"] = device
                storage.write_bytes(f"{prefix}/{wl}.json", json.dumps(res | {"regime": {
                    str(k): v for k, v in res["regime"].items()}}).encode())
                out[wl] = res
    return out
