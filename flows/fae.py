"""FAE flow: hot-embedding-aware training (hot batches in the fast tier, cold ones hybrid, hot rows
synced at phase switches) vs hybrid training, on the family's two-tier trainer; then a budget sweep."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, SystemResult, system_flow
from mlsys_flows.systems.common.report import Curve
from mlsys_flows.systems.recsys_embeddings.experiment import build_result
from mlsys_flows.tasks import fae as t


@system_flow("fae")
def fae(ctx: RunContext) -> SystemResult:
    p = ctx.params
    data = t.make_dataset.submit(p, ctx.storage, ctx.key("data.npz")).result()
    trained = t.train.submit(p, ctx.storage, data["key"], t.VARIANTS).result()  # timed: nothing else runs beside it
    points = t.budget_sweep.submit(p, ctx.storage, data["key"]).result() if p.budget_sweep_mb else []
    result, first = build_result(trained["runs"], p, data, trained["profiled"])
    f = first["fae"]
    result.notes.append(
        f"FAE laid out each epoch as {p.fae_phases} hot/cold phase pairs: {f['syncs']:.0f} syncs moved "
        f"{f['sync_rows']:.0f} rows (with their Adagrad state) between the tiers; hot batches gathered nothing from "
        f"the slow tier: batches gathered {f['rows_gathered']:.0f} rows vs {first['hybrid']['rows_gathered']:.0f} by "
        "hybrid (the syncs' rows are counted apart in sync_rows).")
    if points:
        base = first["hybrid"]["train_time_s"]
        for pt in points:
            result.variants[f"fae@{pt['budget_mb']:g}MB"] = {
                "hot_input_fraction": pt["hot_input_fraction"], "hot_rows": pt["hot_rows"],
                "test_logloss": pt["test_logloss"], "train_time_s": pt["train_time_s"]}
        mbs = [pt["budget_mb"] for pt in points]
        result.curves.append(Curve(
            title="FAE budget sweep (one run per budget)", x_label="fast-tier budget (MB)",
            y_label="hot-input fraction; hybrid time / FAE time",
            series={"hot-input fraction (counted)": (mbs, [pt["hot_input_fraction"] for pt in points]),
                    "hybrid train time / FAE train time (measured, 1 run)": (mbs, [base / pt["train_time_s"] for pt in points])}))
        result.notes.append("Budget sweep variants fae@<MB>: FAE trained once more at each budget (one run each, "
                            "train_time_s measured against the first hybrid repeat in the plot; not interleaved).")
    return result
