"""Prefect tasks of the RecD flow: generate and store the log twice, time the readers, train, sweep the mix."""
from __future__ import annotations

import time

from prefect import get_run_logger, task

from mlsys_flows.blocks import CheckpointStore, ObjectStorage, ResourcePool
from mlsys_flows.systems.recd import Params
from mlsys_flows.systems.recd import pipeline as pl
from mlsys_flows.systems.recd import seeds as sd
from mlsys_flows.systems.recd import sweep as sw
from mlsys_flows.systems.recd.workload import Schema, arrival_order, generate_split, in_batch_dedup_factor, user_id_share


@task(name="recd-dataset")
def make_dataset(p: Params, storage: ObjectStorage, prefix: str) -> dict:
    """Write the same samples as parquet+zstd in arrival order and clustered by session, and the
    held-out sessions (never trained on) with the references of the held-out target."""
    log = get_run_logger()
    t0 = time.perf_counter()
    clustered, heldout, prob = generate_split(p)
    arrival = arrival_order(clustered, p.seed)
    rows = p.batch_size * p.batches_per_row_group
    out = {"samples": clustered.num_rows, "arrival_key": f"{prefix}/arrival.parquet",
           "clustered_key": f"{prefix}/clustered.parquet", "heldout_key": f"{prefix}/heldout.parquet"}
    out["arrival_bytes"] = storage.write_parquet(out["arrival_key"], arrival, row_group_size=rows)
    out["clustered_bytes"] = storage.write_parquet(out["clustered_key"], clustered, row_group_size=rows)
    storage.write_parquet(out["heldout_key"], heldout, row_group_size=rows)
    out.update(sd.heldout_refs(heldout.column(Schema.of(p).label).to_numpy(), prob, p.target_fraction))
    user = Schema.of(p).user[0]
    out["dedup_arrival"] = in_batch_dedup_factor(arrival, user, p.batch_size)
    out["dedup_clustered"] = in_batch_dedup_factor(clustered, user, p.batch_size)
    out["user_id_share"] = user_id_share(clustered, Schema.of(p))
    log.info("recd dataset: %d samples in %d sessions, %.3f of the ids in user features; parquet+zstd %.1f MB "
             "arrival order, %.1f MB clustered; in-batch user-list duplication %.2fx vs %.2fx (%.1f s)", out["samples"],
             p.sessions, out["user_id_share"], out["arrival_bytes"] / 1e6, out["clustered_bytes"] / 1e6,
             out["dedup_arrival"], out["dedup_clustered"], time.perf_counter() - t0)
    log.info("recd held-out set: %d samples of %d further sessions; logloss of the base rate %.4f, of the generator "
             "%.4f; target %.4f (target_fraction %g)", out["heldout_samples"], p.heldout_sessions,
             out["heldout_base_logloss"], out["heldout_bayes_logloss"], out["target_logloss"], p.target_fraction)
    return out


@task(name="recd-preprocess")
def preprocess_throughput(p: Params, storage: ObjectStorage, data: dict) -> dict[str, list[float]]:
    """Reader batches/s: KJT from the arrival-order file (baseline), IKJT from the clustered file
    (RecD), and KJT from the clustered file (dedup's share alone), measured interleaved."""
    log = get_run_logger()
    arrival, clustered = storage.read_bytes(data["arrival_key"]), storage.read_bytes(data["clustered_key"])
    for key, blob in ((data["arrival_key"], arrival), (data["clustered_key"], clustered)):
        pl.open_dataset(blob, Schema.of(p), key)  # empty or missing columns fail here, before any timing
    rates = pl.preprocess_throughput({"kjt": (arrival, False), "ikjt": (clustered, True),
                                      "kjt_clustered": (clustered, False)}, p)
    log.info("recd reader batches/s: %s", {k: [round(x, 1) for x in v] for k, v in rates.items()})
    return rates


@task(name="recd-train")
def train(p: Params, storage: ObjectStorage, data: dict, pool: ResourcePool,
          checkpoints: CheckpointStore | None = None, run_key: str | None = None) -> dict:
    """Four trainers on the same samples, taking turns: KJT batches of the arrival-order file (the
    paper's baseline), KJT batches of the session-clustered file, IKJT batches of the clustered
    file (RecD) and IKJT batches of the arrival-order file (the mechanism's ablation). With a ``run_key`` the training checkpoints (about 8 times per run) and a rerun resumes."""
    log = get_run_logger()
    with pool.claim() as device:  # a device of the run's pool (or this worker's own)
        arrival, clustered = storage.read_bytes(data["arrival_key"]), storage.read_bytes(data["clustered_key"])
        batches = {"kjt": list(pl.read_batches(arrival, p, dedup=False, where=data["arrival_key"])),
                   "kjt_clustered": list(pl.read_batches(clustered, p, dedup=False, where=data["clustered_key"])),
                   "ikjt": list(pl.read_batches(clustered, p, dedup=True, where=data["clustered_key"])),
                   # the mechanism's ablation: the IKJT (every in-batch repeat, found by hashing) on arrival order
                   sw.ABLATION: list(pl.read_batches(arrival, p, dedup=True, adjacent=False, where=data["arrival_key"]))}
        digest = pl.check_same_samples(batches)  # the same multiset of samples, or no comparison at all
        # the held-out batches every trainer is evaluated on (IKJT: the same math as KJT, cheaper)
        heldout = list(pl.read_batches(storage.read_bytes(data["heldout_key"]), p, dedup=True, where=data["heldout_key"]))
        values = {n: sum(b.sparse[1].num_values() for b in bs) for n, bs in batches.items()}
        ids = {n: pl.looked_up_ids(bs) for n, bs in batches.items()}
        log.info("recd training %d batches of %d on %s (samples digest %s); user-feature values per epoch: %s",
                 len(batches["kjt"]), p.batch_size, device, digest[:12], values)
        state, saver = None, None
        if checkpoints is not None and run_key:
            last, state = checkpoints.resume(run_key)
            if state is not None:
                log.info("recd training resumes after turn %d of run key %s", last, run_key)
            saver = checkpoints.saver(run_key)  # in the store's mode (synchronous by default)
        turns = -(-len(batches["kjt"]) // p.chunk_steps)
        result = pl.train_interleaved(batches, p, device, state=state, checkpoint=saver.save if saver else None,
                                      checkpoint_every=max(1, turns // 8), heldout=heldout)
        if saver is not None:
            saver.wait()  # the last flush is complete before the task reports
        for n, r in result.items():
            r["user_values"], r["looked_up_ids"] = values[n], ids[n]
            log.info("recd %s: %.0f samples/s, final loss %.4f, held-out logloss %.4f (mean of the last %d "
                     "evaluations)", n, r["samples_per_s"], pl.final_loss(r["losses"]), pl.final_heldout(r["evals"]),
                     pl.FINAL_EVALS)
        # the further evaluated seeds (issue 45): each its own data, held-out set, target and run of the four
        # trainers, so that the headline is paired by seed; generated in memory with the same preprocessing
        runs = [{"seed": p.seed, "digest": digest, **{k: data[k] for k in ("heldout_samples", "heldout_base_logloss",
                                                                           "heldout_bayes_logloss", "target_logloss")},
                 "trainers": {n: {k: r[k] for k in ("evals", "chunk_rates", "samples")} for n, r in result.items()}}]
        for seed in sd.evaluated_seeds(p)[1:]:
            t0 = time.perf_counter()
            runs.append(sd.train_seed(p.model_copy(update={"seed": seed}), device))
            log.info("recd seed %d: target %.4f, held-out logloss %s (%.1f s)", seed, runs[-1]["target_logloss"],
                     {n: round(pl.final_heldout(r["evals"]), 4) for n, r in runs[-1]["trainers"].items()},
                     time.perf_counter() - t0)
        return {"device": device, "digest": digest, **result, "seeds": runs}


@task(name="recd-mix-sweep")
def mix_sweep(p: Params, pool: ResourcePool) -> list[dict]:
    """At each user-feature share of ``p.mix_sweep``: a short run of the three trainers (KJT arrival
    order, KJT clustered, IKJT clustered) on the same samples, ids per sample held at the headline's."""
    log = get_run_logger()
    with pool.claim() as device:
        points = []
        for share in p.mix_sweep:
            t0 = time.perf_counter()
            pt = sw.mix_point(p, share, device)
            points.append(pt)
            log.info("recd mix %.3f (counted %.3f; user lists ~%d, item lists ~%d) samples/s: %s (%.1f s)",
                     share, pt["user_id_share"], pt["user_list_len"], pt["item_list_len"],
                     {n: [round(x) for x in pt[n]["rates"]] for n in sw.TRAINERS}, time.perf_counter() - t0)
        return points
