"""Swarm control flow: centralized (Hungarian on a backend), centralized greedy dispatch and distributed
(radio claims) task allocation, simulated for every swarm size of the grid as Dask tasks, repeated."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.swarm import POLICIES
from mlsys_flows.systems.swarm.result import build_result
from mlsys_flows.tasks import swarm as t


@system_flow("swarm")
def swarm(ctx: RunContext):
    p = ctx.params
    # fan out: every (repeat, N, policy) is one Dask task; largest swarms first (the longest tasks), the
    # policies' order rotating every repeat so none always shares the CPU with the same neighbour
    futures = {}
    for r in range(ctx.repeats):
        order = POLICIES[r % len(POLICIES):] + POLICIES[:r % len(POLICIES)]
        for n in sorted(p.n_grid, reverse=True):
            for policy in order:
                futures[(r, n, policy)] = t.simulate_one.submit(p, n, policy, r)
    return build_result(p, ctx.repeats, {key: f.result() for key, f in futures.items()})
