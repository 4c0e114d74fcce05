"""Hotline flow: popular micro-batch in the fast tier while the rest's cold rows are gathered in the
background, vs hybrid training and FAE, on the family's two-tier trainer."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, SystemResult, system_flow
from mlsys_flows.systems.recsys_embeddings.experiment import build_result
from mlsys_flows.tasks import hotline as t


@system_flow("hotline")
def hotline(ctx: RunContext) -> SystemResult:
    p = ctx.params
    data = t.make_dataset.submit(p, ctx.storage, ctx.key("data.npz")).result()
    trained = t.train.submit(p, ctx.storage, data["key"], t.VARIANTS).result()
    result, first = build_result(trained["runs"], p, data, trained["profiled"])
    h = first["hotline"]
    result.notes.append(
        f"Hotline's background gather (a thread on the slow-tier socket) took {h['gather_s']:.2f} s in the first "
        f"repeat, of which the trainer waited {h['gather_wait_s']:.2f} s after its popular micro-batch: "
        f"{h['gather_overlap']:.0%} of the gather overlapped compute (gather_overlap, measured). Hot rows stay in "
        f"the fast tier, so Hotline gathered {h['rows_gathered']:.0f} rows vs {first['hybrid']['rows_gathered']:.0f} "
        "by hybrid; its update is hybrid's (both micro-batches' gradients applied in one step), so their test "
        "logloss differs by float rounding only.")
    return result
