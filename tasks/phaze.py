"""Prefect tasks of the PHAZE flow: one task per candidate accelerator design (ILPs + placement DP on
both model sizes), its result saved on storage."""
from __future__ import annotations

import os
import time
from dataclasses import asdict

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.phaze import Arch, Params, evaluate_all_sizes


@task(name="phaze-evaluate-design")
def evaluate_candidate(p: Params, arch: Arch, storage: ObjectStorage, key: str) -> dict:
    """Schedule every layer (ILP) and place both models (DP) on one design; the task's own wall time
    is measured so the flow can compare the fan-out's wall time with the serial sum."""
    log = get_run_logger()
    start_unix, started = time.time(), time.perf_counter()
    results = evaluate_all_sizes(p, arch)
    task_s = time.perf_counter() - started
    out = {"design": arch.name, "arch": asdict(arch), "results": results, "task_s": task_s, "pid": os.getpid(),
           "start_unix": start_unix, "end_unix": start_unix + task_s}
    storage.write_json(key, out)
    for size, r in results.items():
        log.info("%s%s: %.4g tokens/s modelled (plan %s), %d ILPs, max gap %.2g, %.2f s", arch.name, size,
                 r["train_throughput"], r.get("plan"), r["ilps"], r["ilp_max_gap"], r["wall_s"])
    return out
