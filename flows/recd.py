"""RecD flow: session-clustered storage + IKJT training vs arrival-order storage + KJT training (the
paper's baseline) and vs clustered storage + KJT training, then the user/item lookup mix swept."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.recd.result import build_result
from mlsys_flows.systems.recd.seeds import evaluated_seeds
from mlsys_flows.tasks import recd as t


@system_flow("recd")
def recd(ctx: RunContext):  # returns the SystemResult its package assembles
    p = ctx.params
    evaluated_seeds(p)  # a calibration seed among the evaluated ones fails here, before any work
    # the steps run one after another: each is timed and must not share the CPU with the next
    data = t.make_dataset.submit(p, ctx.storage, ctx.key("data")).result()
    reader = t.preprocess_throughput.submit(p, ctx.storage, data).result()
    trained = ctx.submit(t.train, p, ctx.storage, data, ctx.devices, ctx.checkpoints, ctx.run_key, device="gpu").result()
    points = ctx.submit(t.mix_sweep, p, ctx.devices, device="gpu").result() if p.mix_sweep else []
    return build_result(p, data, reader, trained, points)
