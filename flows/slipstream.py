"""Slipstream flow: Hotline's pipeline skipping inputs that touch only stale hot rows, vs FAE,
Hotline and hybrid training, on the family's two-tier trainer."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, SystemResult, system_flow
from mlsys_flows.systems.recsys_embeddings.experiment import build_result
from mlsys_flows.tasks import slipstream as t


@system_flow("slipstream")
def slipstream(ctx: RunContext) -> SystemResult:
    p = ctx.params
    data = t.make_dataset.submit(p, ctx.storage, ctx.key("data.npz")).result()
    trained = t.train.submit(p, ctx.storage, data["key"], t.VARIANTS).result()
    result, first = build_result(trained["runs"], p, data, trained["profiled"])
    s = first["slipstream"]
    result.notes.append(
        f"Slipstream snapshot the hot rows every {p.snapshot_every} steps; the relative drift threshold "
        f"{s['stale_threshold']:.3g} was chosen at the second snapshot on a sample (the largest sampled drift "
        f"quantile keeping the sampled skip share within {p.max_skip}); {s['skipped_fraction']:.1%} of the inputs "
        f"were skipped (counted), and its final test logloss differs from Hotline's by "
        f"{s['test_logloss'] - first['hotline']['test_logloss']:+.4f}.")
    return result
