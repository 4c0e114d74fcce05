"""DSI/DPP flow: disaggregated preprocessing on Dask workers vs on-trainer loaders on the trainer's own core,
DPP co-located on the trainer's core (the mechanism's ablation), and the regime sweep over the
preprocessing cost per batch."""
from __future__ import annotations

from prefect.context import FlowRunContext

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.dsi import data as sd
from mlsys_flows.systems.dsi.cpu import dpp_workers_wanted
from mlsys_flows.systems.dsi.result import VARIANTS, build_result
from mlsys_flows.tasks import dsi as t


@system_flow("dsi")
def dsi(ctx: RunContext):  # returns the SystemResult its package assembles
    p = ctx.params
    sd.check_fits(p, *t.free_bytes(ctx.storage))  # before any work: a dataset larger than the disk fails here
    own = ctx.cluster.mode == "local"  # the run started the cluster: its processes may be pinned and grown
    data = t.make_dataset.submit(p, ctx.storage, ctx.key("data")).result()
    cpu = ctx.submit(t.cpu_budget, p, ctx.storage, data, ctx.devices, own_cluster=own, device="gpu").result()
    # workers_per_dpp_core DPP worker processes per DPP core (up to max_workers, never on the trainer's core),
    # so the controller has workers to add
    want = dpp_workers_wanted(p.max_workers, cpu["trainer_cores"], cpu["dpp_cores"], p.workers_per_dpp_core)
    workers = t.grow_for_dpp(FlowRunContext.get().task_runner.client, own and ctx.cluster.processes, want)
    # timed one after the other, rotating which goes first: DPP's workers must not compete with an
    # on-trainer loader, and no variant always runs on a warmer machine
    # the ablation runs once (the first round): its one sample keeps the sweep's cost down
    runs: dict[str, list[dict]] = {n: [] for n in VARIANTS}
    for r in range(ctx.repeats):
        for name in VARIANTS[r % 4:] + VARIANTS[:r % 4]:
            if name == "dpp_colocated" and r > 0:
                continue
            if name in ("dpp", "dpp_colocated"):
                runs[name].append(ctx.submit(t.train_dpp, p, ctx.storage, data, ctx.devices, cpu, repeat=r,
                                             colocated=name == "dpp_colocated", device="gpu").result())
            else:
                runs[name].append(ctx.submit(t.train_inline, p, ctx.storage, data, ctx.devices, cpu,
                                             projected=name == "inline", repeat=r, device="gpu").result())
    sweep = ctx.submit(t.regime, p, ctx.storage, data, ctx.devices, cpu, device="gpu").result()
    return build_result(p, data, cpu, runs, sweep, workers=workers, want=want)
