"""Prefect tasks of the FlexShard flow: workload (training counts + held-out trace), plans, replay."""
from __future__ import annotations

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.flexshard import (Params, Workload, chunk_from_npz, chunk_to_npz, heldout_chunk, make_plans,
                                           plan_metrics, plans_from_npz, plans_to_npz, regime_point, replay_chunk)


@task(name="flexshard-workload")
def make_workload(p: Params, storage: ObjectStorage, prefix: str) -> dict:
    """Tables + training access counts at ``prefix/workload.npz``; the held-out trace in chunks at
    ``prefix/heldout-<i>.npz`` (a random stream of its own, never the training one)."""
    log = get_run_logger()
    w = p.make_workload()
    storage.write_bytes(f"{prefix}/workload.npz", w.to_npz())
    chunks = []
    for i, iterations in enumerate(p.chunk_iterations()):
        ids, counts = heldout_chunk(w, iterations, i, p.seed)
        chunks.append(f"{prefix}/heldout-{i:04d}.npz")
        storage.write_bytes(chunks[-1], chunk_to_npz(ids, counts))
    log.info("%d tables x %d rows, %d training lookups; held-out trace: %d iterations in %d chunks",
             p.tables, p.rows, int(w.train_counts.sum()), p.eval_iterations, len(chunks))
    return {"workload": f"{prefix}/workload.npz", "chunks": chunks}


@task(name="flexshard-plan")
def plan(p: Params, storage: ObjectStorage, data: dict, key: str) -> dict:
    """The row-wise baseline, FlexShard (per-lookup and deduplicated fetches) with the equal-memory
    row-wise caches, and the headroom sweep, all from the training counts."""
    log = get_run_logger()
    w = Workload.from_npz(storage.read_bytes(data["workload"]))
    plans = make_plans(p, w)
    storage.write_bytes(key, plans_to_npz(plans))
    base = plans["rowwise"].capacity_rows
    stats = {name: plan_metrics(pl, p, base) for name, pl in plans.items()}
    fs, cache = stats["flexshard"], stats["rowwise_cache"]
    log.info("flexshard: %d rows on every device, %d once per node, %d sharded; %.4f x row-wise memory per device; "
             "rowwise_cache: %d cached rows, %.4f x", fs["rows_full_replica"], fs["rows_node_replica"],
             fs["rows_sharded"], fs["memory_vs_rowwise"], cache["rows_full_replica"], cache["memory_vs_rowwise"])
    return {"key": key, "stats": stats}


@task(name="flexshard-replay")
def replay(p: Params, storage: ObjectStorage, data: dict, plans: dict, chunk: str) -> dict:
    """Every variant and sweep plan on one held-out chunk: name -> metric -> per-iteration values."""
    log = get_run_logger()
    w = Workload.from_npz(storage.read_bytes(data["workload"]))
    ids, counts = chunk_from_npz(storage.read_bytes(chunk))
    out = replay_chunk(p, w, plans_from_npz(storage.read_bytes(plans["key"])), ids, counts)
    log.info("%s: %d iterations, all-to-all bytes row-wise %.4g, flexshard %.4g", chunk, counts.shape[0],
             sum(out["rowwise"]["alltoall_intra_bytes"]) + sum(out["rowwise"]["alltoall_inter_bytes"]),
             sum(out["flexshard"]["alltoall_intra_bytes"]) + sum(out["flexshard"]["alltoall_inter_bytes"]))
    return out


@task(name="flexshard-regime")
def regime(p: Params) -> dict[float, dict[str, dict[str, float]]]:
    """The regime sweep over batch x sequence / rows: one table per point, planned and replayed (counted)."""
    log = get_run_logger()
    out = {}
    for x in p.regime_lookups_per_row:
        out[x] = regime_point(p, x)
        r = out[x]
        log.info("batch x seq / rows = %g (%d rows): inter-node all-to-all bytes rowwise %.4g, rowwise_cache %.4g, "
                 "flexshard %.4g; total bytes %.4g, %.4g, %.4g", x, p.regime_rows(x),
                 *(r[v][m] for m in ("alltoall_inter_bytes", "comm_bytes") for v in ("rowwise", "rowwise_cache", "flexshard")))
    return out
