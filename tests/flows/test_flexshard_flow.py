"""The flexshard flow at smoke scale: a RunReport with a measured headline, both variants, the trace,
the plans and the report on storage; byte counts declared deterministic."""
import math

from mlsys_flows.flows.flexshard import flexshard


def test_flexshard_flow_smoke(dask_cluster, local_storage):
    report = flexshard(scale="smoke", cluster=dask_cluster, storage=local_storage)
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"], h["better"]) == ("alltoall_bytes", "rowwise", "flexshard", "lower")
    assert math.isfinite(h["ratio"]) and h["ratio"] > 1.0
    assert set(report["variants"]) == {"rowwise", "flexshard"}
    ratios = {r["metric"]: r for r in report["ratios"]}
    assert {"alltoall_inter_bytes", "modeled_comm_latency_s", "comm_bytes", "comm_inter_node_bytes"} <= set(ratios)
    assert ratios["modeled_comm_latency_s"]["paper"] == 6.0
    fs = report["variants"]["flexshard"]
    assert fs["memory_vs_rowwise"] <= 1 + report["parameters"]["memory_headroom"]
    assert {"alltoall_bytes", "alltoall_inter_bytes", "sync_bytes"} <= set(report["deterministic_metrics"])
    run = f"runs/flexshard/{report['run_id']}"
    assert local_storage.exists(f"{run}/plans.npz") and local_storage.exists(f"{run}/trace/workload.npz")
    assert sum("heldout-" in k for k in local_storage.list(f"{run}/trace")) == report["parameters"]["replay_tasks"]
    assert local_storage.exists(f"reports/flexshard/{report['run_id']}.json")
