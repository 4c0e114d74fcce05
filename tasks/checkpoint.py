"""Prefect tasks of the checkpoint flow: a resumable training run with lazy asynchronous checkpoints,
and the interleaved measurement of no / synchronous / eager-asynchronous / DCP async_save (eager and
lazy staging) / lazy-asynchronous checkpoints and the mechanism's ablation."""
from __future__ import annotations

import time

from prefect import get_run_logger, task

from mlsys_flows.blocks import CheckpointStore, ObjectStorage
from mlsys_flows.systems.checkpoint import LOCAL_ONLY, MODES, SWEPT, Params
from mlsys_flows.systems.checkpoint.bench import run_bench, sweep_widths
from mlsys_flows.systems.checkpoint.savers import make_saver as saver_of
from mlsys_flows.systems.checkpoint.sharded import train_sharded
from mlsys_flows.systems.checkpoint.train import build, state_of, train
from mlsys_flows.systems.common.distributed import RankInfo


@task(name="checkpoint-train")
def train_resumable(p: Params, checkpoints: CheckpointStore, run_key: str) -> dict:
    """Train ``p.steps`` steps with lazy asynchronous checkpoints every ``p.every`` steps on
    ``checkpoints`` under ``run_key``; a rerun with the same key resumes from the newest complete one."""
    log = get_run_logger()
    store = CheckpointStore(storage=checkpoints.storage, prefix=checkpoints.prefix, keep_last=p.keep_last)
    last, state = store.resume(run_key)
    if state is not None:
        log.info("checkpoint training resumes after step %d of run key %s", last, run_key)
    with store.saver(run_key, asynchronous=True, lazy=True) as saver:
        res = train(p.width, p.depth, p.batch_size, p.steps, p.seed, saver=saver, every=p.every, state=state,
                    threads=p.train_threads)
    log.info("checkpoint training: steps %d..%d, %.3f s/iter, stall %.3f s/iter, %d flushes, weights %s",
             res.start_step + 1, res.steps, res.wall_s / max(1, res.iterations), res.stall_s / max(1, res.iterations),
             len(saver.flushes), res.digest[:12])
    return {"start_step": res.start_step, "steps": res.steps, "last_loss": res.last_loss, "digest": res.digest,
            "flushes": saver.flushes}


def train_sharded_rank(info: RankInfo, checkpoints: CheckpointStore, run_key: str, width: int, depth: int,
                       batch_size: int, steps: int, every: int, seed: int, on_flush=None) -> dict:
    """One rank of a data-parallel run (``platform.ranks.run_ranks`` starts them) that checkpoints its
    shard asynchronously on ``checkpoints`` under ``run_key`` and resumes, like every rank, from the
    newest step whose shards all committed. ``on_flush`` goes to the saver."""
    from dataclasses import asdict

    def resume(default: dict) -> tuple[int, dict]:
        return checkpoints.resume_shard(run_key, info.rank, info.world_size, default)

    with checkpoints.saver(run_key, asynchronous=True, lazy=False, rank=info.rank, world_size=info.world_size,
                           attempt=info.launch_id, on_flush=on_flush) as saver:
        res = train_sharded(info.rank, info.world_size, width, depth, batch_size, steps, every, seed, resume, saver)
    return {**asdict(res), "flushes": saver.flushes, "backend": info.backend, "device": info.device}


def _variants(storage: ObjectStorage, names) -> tuple[str, ...]:
    """``names`` that can run on ``storage`` (DCP's FileSystemWriter needs a local root)."""
    return tuple(v for v in names if not (storage.is_s3 and v in LOCAL_ONLY))


def _close(saver) -> None:
    if hasattr(saver, "close"):
        saver.close()


@task(name="checkpoint-bench")
def bench(p: Params, storage: ObjectStorage, prefix: str) -> dict:
    """Every variant trains the same ``p.steps`` steps from the same seed, ``p.repeats`` times
    (more, up to ``p.max_repeats``, until the headline's verdict decides), interleaved; checkpoints go to ``storage`` under ``prefix`` and are deleted after each run,
    except that the first repeat's last checkpoints of every mode are compared tensor by tensor."""
    import torch

    log = get_run_logger()
    store = CheckpointStore(storage=storage, prefix=prefix, keep_last=p.keep_last)
    log.info("checkpoint bench: MLP %d x %d (%.0f MB of state), %d steps, a checkpoint every %d, %d repeats, "
             "storage %s", p.depth, p.width, p.state_mb, p.steps, p.every, p.repeats, storage.root_url)

    def make_saver(variant: str, repeat: int):
        return saver_of(store, variant, f"{variant}-r{repeat}")

    first: dict[str, dict] = {}

    def done(variant: str, repeat: int, saver) -> None:
        if saver is None:
            return
        if repeat == 0:  # the newest checkpoint of each mode, kept for the comparison
            if hasattr(saver, "restore"):  # DCP: loaded into a fresh state of the same structure
                first[variant] = saver.restore(state_of(*build(p.width, p.depth, p.seed), 0, 0.0))
            else:
                first[variant] = store.restore(saver.run_key)[1]
        _close(saver)
        storage.delete(f"{prefix}/{saver.run_key}")

    t0 = time.perf_counter()
    reps = p.adaptive_repeats()
    runs = run_bench(p, make_saver, done, log=log.info, reps=reps, variants=_variants(storage, MODES))
    equal = {v: float(_same(first[v], first["sync"], torch)) for v in first}
    log.info("checkpoint bench done in %.1f s; last checkpoint equal to the synchronous one: %s",
             time.perf_counter() - t0, equal)
    return {"runs": runs, "equal_to_sync": equal, "repeats": reps.summary()}


def _same(a, b, torch) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k], torch) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y, torch) for x, y in zip(a, b))
    return a == b


@task(name="checkpoint-regime")
def regime(p: Params, storage: ObjectStorage, prefix: str) -> dict:
    """The regime sweep: each checkpointed variant once per state size of ``p.regime_widths`` (the
    headline width left to the bench); checkpoints go under ``prefix`` and are deleted after each run."""
    log = get_run_logger()
    store = CheckpointStore(storage=storage, prefix=prefix, keep_last=p.keep_last)

    def done(variant: str, index: int, saver) -> None:
        _close(saver)
        storage.delete(f"{prefix}/{saver.run_key}")

    t0 = time.perf_counter()
    out = sweep_widths(p, lambda v, w, i: saver_of(store, v, f"{v}-w{w}"), done, variants=_variants(storage, SWEPT),
                       log=log.info)
    log.info("checkpoint regime sweep done in %.1f s", time.perf_counter() - t0)
    return out
