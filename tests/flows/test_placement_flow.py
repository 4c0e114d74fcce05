"""The placement flow at smoke (the session's shared reference run): on its default graph, the project's
own torch.fx ResNet-50 (no data folder needed), modelled max-load for every variant, the DP at or below
every contiguous baseline, the IP at or below the DP, and the splits on storage."""
import json

from faultkit import reference_run

from mlsys_flows.systems.placement import VARIANTS


def test_placement_flow_smoke(prefect_api):
    report, storage = reference_run("placement")
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"], h["kind"]) == ("max_load", "pipedream", "dp", "modelled")
    assert set(report["variants"]) == set(VARIANTS)
    v = {name: m["max_load"] for name, m in report["variants"].items()}
    assert all(v["dp"] <= v[b] + 1e-9 for b in ("pipedream", "greedy", "local_search", "one_accelerator"))
    assert v["ip"] <= v["dp"] + 1e-9
    assert 1.05 < h["ratio"] < 1.25           # fx ResNet-50 inference, 6 accelerators (paper: 1.17x)
    kinds = report["metric_kinds"]
    assert kinds["ideals"] == "counted" and kinds["ip_gap"] == "modelled"
    assert report["variants"]["dp"]["ideals"] > 100
    key = f"runs/placement/{report['run_id']}/placement_fx_resnet50.json"
    saved = json.loads(storage.read_bytes(key))
    assert saved["graph"] == "fx_resnet50" and (saved["accelerators"], saved["cpus"]) == (6, 1)
    assert set(saved["placements"]) == set(VARIANTS)
    assert len(saved["placements"]["dp"]) == 176
    # contract v3: the DP's mechanism (every downset, not a chain's prefixes) and the accelerator sweep
    assert v["dp"] <= v["dp_chain"] + 1e-9 and h["mechanism"]["baseline"] == "dp_chain"
    g = report["regime"]
    assert g["parameter"] == "accelerators" and [p["value"] for p in g["points"]] == [2.0, 6.0]
    assert all(p["ratio"] >= 1 - 1e-9 for p in g["points"])  # exact over contiguous splits at every k
    assert set(saved["placements"]["dp"].values()) <= set(range(saved["accelerators"] + saved["cpus"]))
