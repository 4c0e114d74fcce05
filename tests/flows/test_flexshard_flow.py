"""The flexshard flow at smoke scale: a RunReport whose headline is the inter-node all-to-all bytes of FlexShard
vs the row-wise baseline with a hot-row cache at equal memory (per-lookup rivals; dedup compared with dedup), every variant (dedup ones included), the trace, the
plans and the report on storage; byte counts declared deterministic."""
import math

from faultkit import reference_run


def test_flexshard_flow_smoke():
    """The shared smoke run (faultkit.reference_run), as the contract test sees it."""
    report, storage = reference_run("flexshard")
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"], h["better"]) == ("alltoall_inter_bytes", "rowwise_cache", "flexshard",
                                                                           "lower")
    assert math.isfinite(h["ratio"]) and h["ratio"] > 0 and h["kind"] == "counted"
    assert h["vs_strongest"]["baseline"] in {"rowwise", "rowwise_cache"}  # like with like: per-lookup rivals only
    assert set(report["variants"]) == {"rowwise", "rowwise_cache", "flexshard", "rowwise_dedup",
                                       "rowwise_dedup_cache", "flexshard_dedup", "flexshard_flat"}
    ratios = {(r["metric"], r["baseline"], r["technique"]): r for r in report["ratios"]}
    assert {("alltoall_bytes", "rowwise_cache", "flexshard"), ("modeled_comm_latency_s", "rowwise_cache", "flexshard"),
            ("comm_bytes", "rowwise", "flexshard"), ("comm_bytes", "rowwise_dedup", "flexshard_dedup"),
            ("comm_bytes", "rowwise_dedup_cache", "flexshard_dedup"), ("comm_bytes", "rowwise_cache", "flexshard"),
            ("alltoall_inter_bytes", "rowwise_dedup", "flexshard_dedup"),
            ("alltoall_inter_bytes", "rowwise_dedup_cache", "flexshard_dedup")} <= set(ratios)
    assert ratios["modeled_comm_latency_s", "rowwise_cache", "flexshard"]["paper"] == 6.0
    assert ratios["modeled_comm_latency_s", "rowwise_cache", "flexshard"]["kind"] == "modelled"
    kinds = report["metric_kinds"]
    assert all(k == "counted" for m, k in kinds.items() if m.endswith("_bytes") or m.endswith("_per_device"))
    v = report["variants"]
    row = report["parameters"]["dim"] * report["parameters"]["element_bytes"]
    for fs, cache in (("flexshard", "rowwise_cache"), ("flexshard_dedup", "rowwise_dedup_cache")):  # equal memory
        assert abs(v[fs]["memory_bytes_per_device"] - v[cache]["memory_bytes_per_device"]) <= row
        assert v[fs]["memory_vs_rowwise"] <= 1 + report["parameters"]["memory_headroom"]
    assert v["rowwise_cache"]["rows_full_replica"] > 0 and v["rowwise_cache"]["sync_bytes"] > 0
    assert v["rowwise_dedup"]["alltoall_bytes"] < v["rowwise"]["alltoall_bytes"]
    assert {"alltoall_bytes", "comm_bytes", "sync_bytes"} <= set(report["deterministic_metrics"])
    assert any("memory headroom" in c["title"] for c in report["curves"])
    run = f"runs/flexshard/{report['run_id']}"
    assert storage.exists(f"{run}/plans.npz") and storage.exists(f"{run}/trace/workload.npz")
    assert sum("heldout-" in k for k in storage.list(f"{run}/trace")) == report["parameters"]["replay_tasks"]
    # contract v3: roles, the paper-comparable claim, the mechanism's ablation (no per-node tier, same memory)
    # and the counted regime over batch x sequence / rows
    assert all("oracle" not in r for r in report["roles"].values()) and "paper" in report["roles"]["rowwise"]
    paper = ratios["alltoall_bytes", "rowwise", "flexshard"]
    assert paper["kind"] == "counted" and paper["ratio"] > 1 and paper["paper"] > 6
    m = h["mechanism"]
    assert m["baseline"] == "flexshard_flat" and m["kind"] == "counted" and math.isfinite(m["ratio"])
    assert v["flexshard_flat"]["rows_node_replica"] == 0 and v["flexshard"]["rows_node_replica"] > 0
    assert v["flexshard_flat"]["memory_vs_rowwise"] <= 1 + report["parameters"]["memory_headroom"]
    g = report["regime"]
    assert g["parameter"] == "batch x sequence / rows" and [pt["value"] for pt in g["points"]] == [0.03, 3.0]
    assert all(pt["kind"] == "counted" and pt["baseline"] in ("rowwise", "rowwise_cache")
               and pt["ratio"] > 0 and pt["valid"] for pt in g["points"])  # equal memory at every point
    p = report["parameters"]
    assert g["headline_value"] == p["batch_per_device"] * p["seq_len"] / p["rows"]
    assert any(c["title"].startswith("inter-node all-to-all vs") for c in report["curves"])
    # issue 45 review: the dedup setting in the regime, the bandwidths as assumptions of the counted headline,
    # and all inter-node traffic (sync included) beside it
    dedup = report["curves"][4]  # docs/flexshard.md quotes this curve's series by index (curves[4])
    assert dedup["title"].startswith("regime, dedup setting")
    assert set(dedup["series"]) == {"rowwise_dedup_over_flexshard", "rowwise_dedup_over_flexshard_dedup",
                                    "rowwise_dedup_cache_over_flexshard_dedup"}
    assert all(x > 0 for xs, ys in dedup["series"].values() for x in ys)
    assert {"intra_node_gb_s", "inter_node_gb_s", "bandwidth_ratio"} <= set(h["assumptions"])
    assert ("comm_inter_node_bytes", "rowwise_cache", "flexshard") in ratios
    assert any(n.startswith("Beside the headline") and "comm_inter_node_bytes" in n for n in report["notes"])
    assert any("dedup against dedup" in n and "flexshard_dedup vs rowwise_dedup:" in n for n in report["notes"])
    assert storage.exists(f"reports/flexshard/{report['run_id']}.json")
