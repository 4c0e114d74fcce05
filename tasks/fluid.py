"""Prefect tasks of the FLuID flow: one federated training per (policy, seed) whose clients' local
rounds fan out as Dask tasks on the run's cluster, and a fan-out timing on one worker vs all."""
from __future__ import annotations

import json
import time
import uuid

import numpy as np
from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.fluid import Params, plan_stragglers, run_federation
from mlsys_flows.systems.fluid.model import init_mlp, train_client


def _fan_out(client, tag: str, workers: list[str] | None = None):
    """A RunClients on a Dask client: one future per client job; a job whose task raised (its own
    error, or KilledWorker once Dask's retries of a lost worker are exhausted) comes back as that
    exception, so the round goes on without it."""
    def run(jobs: list[dict]) -> list:
        where = {"workers": workers, "allow_other_workers": True} if workers else {}
        futures = [client.submit(train_client, job, pure=False, **where,
                                 key=f"fluid-client-{tag}-r{job['round']}-c{job['client']}-{uuid.uuid4().hex[:6]}")
                   for job in jobs]
        out = []
        for f in futures:
            try:
                out.append(f.result())
            except Exception as exc:  # noqa: BLE001 - any failure of a client excludes it from the round
                out.append(exc)
        return out
    return run


@task(name="fluid-federate")
def federate(p: Params, policy: str, seed: int, storage: ObjectStorage, key: str, drop_fraction: float | None = None,
             stop_at: float | None = None) -> dict:
    """``p.rounds`` federated rounds of ``policy`` on the workload of ``seed`` (fedavg_drop drops
    ``drop_fraction`` of the clients; ``stop_at``: stop once the running mean test accuracy over 3 rounds reaches it);
    every round's client trainings are Dask tasks on this run's cluster (this task secedes while it
    waits for them). The per-round history (accuracy, simulated round times, exclusions and their
    reasons, dropped updates, the stragglers and sizes in force, the speed factors) is saved at ``key``."""
    from distributed import worker_client

    log = get_run_logger()
    w = p.workload(seed)
    plan = p.plan(w)
    with worker_client() as client:
        cfg = p.config(seed, drop_fraction)
        tag = f"{policy}-s{seed}-x{p.straggler_slowdown:g}-d{cfg.drop_fraction:g}"
        h = run_federation(w, plan, cfg, policy, _fan_out(client, tag), log=log.warning, stop_at=stop_at,
                           progress=lambda t, h: (t + 1) % 10 or log.info(
                               "%s seed %d: round %d/%d, test accuracy %.3f", policy, seed, t + 1, p.rounds,
                               h.accuracy[-1]))
    excluded = sum(len(e) for e in h.excluded)
    changes = sum(a != b for a, b in zip(h.stragglers[1:], h.stragglers[2:]))
    log.info("%s seed %d (straggler slowdown %g): %d rounds, last test accuracy %.3f, simulated %.2f s, %d update(s) "
             "excluded; profile stragglers %s (sub-model r %s), straggler set changed %d time(s) after round 1", policy,
             seed, p.straggler_slowdown, len(h.accuracy), h.accuracy[-1], sum(h.round_s), excluded, plan.stragglers,
             [plan.r[c] for c in plan.stragglers], changes)
    out = {**h.to_dict(), "profile_stragglers": plan.stragglers, "profile_r": [plan.r[c] for c in plan.stragglers],
           "straggler_slowdown": p.straggler_slowdown, "drop_fraction": cfg.drop_fraction, "stop_at": stop_at,
           "slowed": list(w.slowed), "samples": [len(s[1]) for s in w.shards],
           "labels_per_client": [int((c > 0).sum()) for c in w.label_counts]}
    storage.write_bytes(key, json.dumps(out).encode())
    return out


@task(name="fluid-fanout")
def fanout_timing(p: Params, rounds: int) -> dict:
    """Wall time of a round's full-model client trainings fanned out on one worker vs on every worker,
    alternating (measured); nothing else of this run is submitted meanwhile."""
    from distributed import worker_client

    log = get_run_logger()
    w = p.workload(p.seed)
    glob = init_mlp(64, p.hidden, 10, p.seed)
    jobs = [{"weights": glob, "x": x, "y": y, "epochs": p.local_epochs, "batch": p.batch_size, "lr": p.lr,
             "seed": p.seed, "client": c, "round": 0, "fault": None} for c, (x, y) in enumerate(w.shards)]
    out: dict[str, list[float]] = {"one": [], "all": []}
    with worker_client() as client:
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
        for i in range(rounds + 1):  # the first pair warms both workers up, untimed
            for mode in (("one", "all") if i % 2 == 0 else ("all", "one")):
                start = time.perf_counter()
                res = _fan_out(client, f"fanout-{mode}-{i}", workers[:1] if mode == "one" else None)(jobs)
                wall = time.perf_counter() - start
                if i and not any(isinstance(r, Exception) for r in res):
                    out[mode].append(wall)
    log.info("fan-out of %d clients: one worker median %.3f s, %d workers median %.3f s", len(jobs),
             np.median(out["one"] or [np.nan]), len(workers), np.median(out["all"] or [np.nan]))
    return {"workers": len(workers), **out}
