"""Hotline's SystemResult from its tasks' outputs: the family's training result with the background
gather's overlap, the slow-tier regime and the projection (pure)."""
from __future__ import annotations

from mlsys_flows.systems.common.repeats import repeats_note
from mlsys_flows.systems.common.report import SystemResult
from mlsys_flows.systems.recsys_embeddings import experiment as ex

from . import SPEC, Params


def build_result(p: Params, data: dict, trained: dict, sweep: dict[float, dict[str, dict]]) -> SystemResult:
    """``data``: the dataset task's output; ``trained``: the training task's; ``sweep``: the regime
    task's. Raises ParityError on a parity miss."""
    result, first = ex.training_result(trained["runs"], p, data, trained["profiled"])
    h, s = first["hotline"], first["hotline_sync"]
    result.notes.append(
        f"Hotline's background gather (a thread on the slow-tier socket) took {h['gather_s']:.2f} s in the first "
        f"repeat, of which the trainer waited {h['gather_wait_s']:.2f} s after its popular micro-batch: "
        f"{h['gather_overlap']:.0%} of the gather overlapped compute (gather_overlap, measured). Hot rows stay in "
        f"the fast tier, so Hotline gathered {h['rows_gathered']:.0f} rows vs {first['hybrid']['rows_gathered']:.0f} "
        "by hybrid; its update is hybrid's (both micro-batches' gradients applied in one step), so their test "
        f"logloss differs by float rounding only. The mechanism's ablation hotline_sync gathered the same "
        f"{s['rows_gathered']:.0f} rows inline, before the popular micro-batch (blocked "
        f"{s['slow_tier_share']:.0%} of its training time vs {h['slow_tier_share']:.0%} for hotline).")
    ex.add_regime(result, sweep, "samples_per_s", p, SPEC)
    result.projection = ex.projection(
        trained, p, "hybrid", "hotline", True,
        "training samples per second with the hot rows in GPU HBM and the tables in host memory behind PCIe: this "
        "run's compute plus its counted rows moved at the stated per-row costs, Hotline's gather hidden behind its "
        "popular micro-batch's compute", per_second=True)
    reps = trained.get("repeats")
    if reps and reps["maximum"] > reps["minimum"]:
        result.repeats = reps
        result.notes.append(repeats_note(reps, "every variant's training"))
    return result
