"""ERA flow: embodied prior learning + turn-level PPO vs PPO from scratch and vs the prior alone, at
equal RL environment steps, on both levels of the EmbodiedBench-style environments, several seeds.
First each RL variant's learning rate is calibrated per level on tasks of another generator seed, then
the evaluated cells run with the chosen rates."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.era import LEVEL_NAMES
from mlsys_flows.systems.era import calibrate as cal
from mlsys_flows.systems.era.result import build_result
from mlsys_flows.tasks import era as t


@system_flow("era")
def era(ctx: RunContext):
    p = ctx.params
    # the calibration cells are independent: they run side by side on the workers, before the evaluated cells
    pending = [t.calibrate.submit(p, v, lr, lvl, k) for v, lr, lvl, k in cal.runs(p)]
    calibration = [f.result() for f in pending]
    chosen = cal.choose(p, calibration)
    futures = {(lvl, s): t.train_and_evaluate.submit(p, lvl, s, ctx.storage, ctx.key(f"cell_{lvl}_seed{s}.json"),
                                                     {v: chosen[v][lvl]["lr"] for v in chosen})
               for s in range(p.seeds) for lvl in LEVEL_NAMES}
    cells = {k: f.result() for k, f in futures.items()}
    return build_result(p, cells, calibration=calibration, chosen=chosen)
