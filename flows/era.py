"""ERA flow: embodied prior learning + turn-level PPO vs PPO from scratch and vs the prior alone, at
equal RL environment steps, on both levels of the EmbodiedBench-style environments, several seeds."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.era import LEVEL_NAMES
from mlsys_flows.systems.era.result import build_result
from mlsys_flows.tasks import era as t


@system_flow("era")
def era(ctx: RunContext):
    p = ctx.params
    # one coarse task per (level, seed): the cells are independent, so they run side by side on the workers
    futures = {(lvl, s): t.train_and_evaluate.submit(p, lvl, s, ctx.storage, ctx.key(f"cell_{lvl}_seed{s}.json"))
               for s in range(p.seeds) for lvl in LEVEL_NAMES}
    cells = {k: f.result() for k, f in futures.items()}
    return build_result(p, cells)
