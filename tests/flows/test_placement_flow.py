"""The placement flow at smoke (the session's shared reference run): on its default graph, the project's
own torch.fx ResNet-50 (no data folder needed), modelled max-load for every variant, the DP at or below
every contiguous baseline, the IP at or below the DP, and the splits on storage."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from faultkit import reference_run, warm_cluster

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


def test_cli_placement_infeasible_setting_names_the_parameter(prefect_api, tmp_path):
    """Settings no placement satisfies are found by the solver in a Dask task (GraphError naming
    memory_per_accelerator): the error crosses the process boundary as itself (issue 42 item 3; it
    failed to unpickle before: TypeError) and the CLI exits 2 with one line naming the parameter. The CLI reports to
    the session's test API and runs on its warm cluster (a block of that API), as against a server."""
    from prefect.settings import PREFECT_API_URL

    warm_cluster().save("test-warm-cluster", overwrite=True)
    exe = str(Path(sys.executable).parent / "mlsys-flows")
    proc = subprocess.run([exe, "run", "placement", "--scale", "smoke", "--cluster", "test-warm-cluster",
                           "-p", "graph=fx_resnet", "-p", "accelerators=2", "-p", "cpus=0",
                           "-p", "memory_per_accelerator=1000"], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={**os.environ, "COLUMNS": "80", "PREFECT_API_URL": PREFECT_API_URL.value(),
                                             "MLSYS_FLOWS_HOME": str(tmp_path / "home")})
    assert proc.returncode == 2, proc.stderr
    assert "missing 1 required positional argument" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "memory_per_accelerator" in errors[0], proc.stderr
    # the CLI holds Prefect's ERROR records (the task's and flow's tracebacks) and prints one line
    assert proc.stderr.strip().splitlines() == errors and "Traceback" not in proc.stderr, proc.stderr
