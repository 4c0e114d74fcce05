"""Checkpoint flow (DataStates-LLM, HPDC 2024): training with no checkpoints, synchronous torch.save to
the storage block, an eager asynchronous snapshot, torch.distributed.checkpoint.async_save and the lazy
asynchronous one (and the mechanism's ablation), interleaved and judged on end-to-end iteration time; plus
a resumable training run with lazy asynchronous checkpoints keyed by the flow's run key."""
from __future__ import annotations

from mlsys_flows.blocks import CheckpointStore
from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.checkpoint.result import build_result
from mlsys_flows.tasks import checkpoint as t


@system_flow("checkpoint")
def checkpoint(ctx: RunContext):  # returns the SystemResult its package assembles
    p = ctx.params
    # the resumable run: with a run key on the system's checkpoints (a rerun resumes), else private to this run
    if ctx.run_key:
        store, key = ctx.checkpoints, ctx.run_key
    else:
        store, key = CheckpointStore(storage=ctx.storage, prefix=ctx.key("training")), "training"
    # one after the other: each is timed and must not share the CPU with the other
    trained = t.train_resumable.submit(p, store, key).result()
    measured = t.bench.submit(p, ctx.storage, ctx.key("bench")).result()
    swept = t.regime.submit(p, ctx.storage, ctx.key("regime")).result()  # after the bench: timed alone too
    if not ctx.run_key:
        ctx.storage.delete(ctx.key("training"))
    return build_result(p, trained, measured, swept, storage_url=ctx.storage.root_url, run_key=ctx.run_key)
