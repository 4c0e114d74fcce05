"""FAE's SystemResult from its tasks' outputs: the family's training result with FAE's own counters,
the slow-tier regime, the projection and the counted budget sweep (pure)."""
from __future__ import annotations

from mlsys_flows.systems.common.report import Curve, SystemResult
from mlsys_flows.systems.recsys_embeddings import experiment as ex

from . import SPEC, Params


def build_result(p: Params, data: dict, trained: dict, sweep: dict[float, dict[str, dict]],
                 points: list[dict]) -> SystemResult:
    """``data``: the dataset task's output; ``trained``: the training task's; ``sweep``: the regime
    task's; ``points``: the budget sweep's (empty: none ran). Raises ParityError on a parity miss."""
    result, first = ex.training_result(trained["runs"], p, data, trained["profiled"])
    f, c = first["fae"], first["cache"]
    result.notes.append(
        f"FAE laid out each epoch as phases of at most {p.fae_phase_batches} hot batches, each followed by its share "
        f"of the cold batches: {f['syncs']:.0f} syncs moved {f['sync_rows']:.0f} rows (with their Adagrad state) "
        f"between the tiers; hot batches gathered nothing from the slow tier: batches gathered "
        f"{f['rows_gathered']:.0f} rows vs {first['hybrid']['rows_gathered']:.0f} by hybrid (the syncs' rows are "
        f"counted apart in sync_rows). The mechanism's ablation cache (the same hot rows, no input classification) "
        f"gathered {c['rows_gathered']:.0f}: a batch's hot rows never cross the tiers, whether or not the input is "
        "all hot.")
    ex.add_regime(result, sweep, "train_time_s", p, SPEC)
    result.projection = ex.projection(
        trained, p, "hybrid", "fae", False,
        "training seconds of the same epochs (the headline's accuracy parity holds, so also to the same loss) with "
        "the hot rows in GPU HBM and the tables in host memory behind PCIe: this run's compute plus its counted rows "
        "moved at the stated per-row costs")
    if points:
        for pt in points:
            result.variants[f"fae@{pt['budget_mb']:g}MB"] = {"hot_input_fraction": pt["hot_input_fraction"],
                                                            "hot_rows": float(pt["hot_rows"])}
        mbs = [pt["budget_mb"] for pt in points]
        result.curves.append(Curve(
            title="FAE budget sweep (counted, no training)", x_label="fast-tier budget (MB)",
            y_label="hot-input fraction",
            series={"hot-input fraction (counted)": (mbs, [pt["hot_input_fraction"] for pt in points])}))
        result.notes.append("Budget sweep variants fae@<MB>: FAE's profile ranked again at each budget; hot rows and "
                            "the share of training inputs whose every row is hot (counted, nothing trained).")
    return result
