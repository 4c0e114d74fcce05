"""RecShard flow: MILP embedding sharding vs greedy size/lookup-balanced sharders, replayed on a
held-out trace, and each plan's sharded lookup run end to end on held-out batches."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.recshard.result import build_result
from mlsys_flows.tasks import recshard as t


@system_flow("recshard")
def recshard(ctx: RunContext):  # returns the SystemResult its package assembles
    p = ctx.params
    data = t.make_workload.submit(p, ctx.storage, ctx.key("tables.npz"), ctx.key("profile.npz"))
    planned = t.plan.submit(p, ctx.storage, data, ctx.key("plans.npz"))
    shards = [t.replay_shard.submit(p, ctx.storage, data, planned, s) for s in range(p.replay_shards)]
    shard_counts = [f.result() for f in shards]
    # timed alone, after the replay, one after the other: nothing else runs on the workers meanwhile
    tier = ctx.submit(t.tier_costs, p, ctx.devices, device="gpu").result()
    looked = ctx.submit(t.lookup, p, ctx.storage, data, planned, ctx.devices, ctx.key("lookup"), device="gpu").result()
    planned, data = planned.result(), data.result()
    return build_result(p, data, planned, shard_counts, tier, looked, ctx.storage.read_bytes(data["profile"]))
