"""DSI/DPP against real processes and servers: a Dask worker process SIGKILLed mid-run loses and
duplicates no work item; the DSI flow runs over S3 on the real SeaweedFS server."""
from __future__ import annotations

import os
import signal

import pytest

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.dsi import Params
from mlsys_flows.systems.dsi import data as d
from mlsys_flows.systems.dsi.dpp import num_batches, run_dpp
from mlsys_flows.tasks.dsi import DaskExecutor, plan_items

pytestmark = pytest.mark.integration


def test_killing_a_dask_worker_mid_run_loses_and_duplicates_nothing(tmp_path):
    from distributed import Client, LocalCluster

    p = Params.for_scale("smoke", files=2, row_groups_per_file=8, rows_per_group=512, step_ms=30.0,
                         start_workers=3, max_workers=3, queue_depth=2, prefetch=2)
    storage = ObjectStorage(url=(tmp_path / "s").as_uri()).check()
    for i in range(p.files):
        storage.write_bytes(d.file_key("ds", i), d.to_parquet(d.generate_file(p, i), p.rows_per_group))
    items = plan_items(p, storage, "ds")
    killed: dict[str, int] = {}
    consumed = []

    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        pids = client.run(os.getpid)

        def on_batch(b):
            consumed.append((b.item, b.index))
            if len(consumed) == 6 and not killed:
                # the worker holding the most work items (running, or finished but not yet collected)
                held = {w: 0 for w in pids}
                for keys in client.who_has().values():
                    for w in keys:
                        held[w] = held.get(w, 0) + 1
                for w, keys in client.processing().items():
                    held[w] = held.get(w, 0) + len(keys)
                victim = max((w for w in held if w in pids), key=held.get)
                os.kill(pids[victim], signal.SIGKILL)
                killed[victim] = pids[victim]

        metrics, details = run_dpp(items, DaskExecutor(client, storage, p.used_columns(), p), p.used_columns(), p,
                                   on_batch=on_batch)

    assert killed, "no worker was killed"
    got = details["consumed"]
    assert len(got) == len(set(got)) == num_batches(items, p.batch_size)      # no batch twice
    assert {i for i, _ in got} == {it.id for it in items}                     # no item lost
    assert sorted(details["delivered_items"]) == [it.id for it in items]      # each item acknowledged once
    assert metrics["reissued_items"] >= 1                                     # the master re-issued the victim's items


def test_dsi_flow_over_s3(s3_storage, dask_cluster, prefect_api):
    from mlsys_flows.platform.runner import run_system

    report = run_system("dsi", "smoke", storage=s3_storage, cluster=dask_cluster)
    dpp, inline, full = report.variants["dpp"], report.variants["inline"], report.variants["inline_full_rows"]
    assert report.headline.ratio > 0 and dpp["samples"] == inline["samples"] == full["samples"] > 0
    assert 0 < dpp["bytes_read"] < full["bytes_read"]  # the strong inline loader projects too
    parquet = [k for k in s3_storage.list(f"runs/dsi/{report.run_id}") if k.endswith(".parquet")]
    assert len(parquet) == Params.for_scale("smoke").files
    assert s3_storage.read_json(f"reports/dsi/{report.run_id}.json")["headline"]["metric"] == "trainer_samples_per_s"
