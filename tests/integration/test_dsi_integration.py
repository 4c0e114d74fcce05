"""DSI/DPP against real processes and servers: a Dask worker process SIGKILLed mid-run loses and
duplicates no work item; the DSI flow runs over S3 on the real SeaweedFS server; a `dask worker` process
started on loopback in the flow's cluster (one the run did not start) becomes a second DPP worker that
the controller adds and gives work items."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

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


def test_dpp_uses_a_worker_started_on_loopback_in_the_flows_cluster(prefect_api, dask_cluster, local_storage,
                                                                      tmp_path):
    """A cluster the run did not start (``address=``) keeps its size, so the controller's pool is the workers
    there are: this test adds one, a real `dask worker` process bound to 127.0.0.1 and pinned to the DPP
    cores (never the trainer's), and DPP's controller goes from one worker to two and gives it work items.
    Which worker a Prefect task lands on is Dask's choice: wherever the trainer runs, the extra worker runs
    DPP work items (in the pool of the other workers, both used from the start-up decision on, or as the
    trainer's own worker in the co-located ablation); ``regime_items`` covers every item so the sweep's DPP
    runs use both pool workers too."""
    from distributed import Client, get_task_stream
    from prefect.settings import PREFECT_API_URL

    from mlsys_flows.flows.dsi import dsi
    from mlsys_flows.platform.procs import Proc
    from mlsys_flows.systems.dsi.cpu import HAS_AFFINITY, available_cores, pin_process, split_cores

    if not HAS_AFFINITY or len(available_cores()) < 2:
        pytest.skip("needs two cores and sched_setaffinity: the extra worker goes on a core other than the trainer's")
    _, dpp_cores, _ = split_cores(available_cores())
    address = dask_cluster.address
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    with Client(address, timeout=60) as client:
        before = set(client.scheduler_info(n_workers=-1)["workers"])
        dask = str(Path(sys.executable).parent / "dask")
        extra = Proc("dpp-extra", [dask, "worker", address, "--host", "127.0.0.1", "--nthreads", "1", "--no-nanny",
                                   "--no-dashboard", "--dashboard-address", "127.0.0.1:0", "--name", "dpp-extra"],
                     env=env, log=tmp_path / "dpp-extra.log")
        def pin_me(cores):  # runs in a worker: its whole process to ``cores``; returns its old mask
            old = os.sched_getaffinity(0)
            pin_process(os.getpid(), cores)
            return sorted(old)

        # the fixture's workers too: whichever the trainer lands on pins itself to the trainer's core for
        # its runs, every other one (DPP's pool) stays off that core
        fixture_masks = client.run(pin_me, dpp_cores)
        try:
            pin_process(extra.pid, dpp_cores)  # its threads started from here on inherit the mask
            client.wait_for_workers(len(before) + 1, timeout=90)
            added = set(client.scheduler_info(n_workers=-1)["workers"]) - before
            assert len(added) == 1 and next(iter(added)).startswith("tcp://127.0.0.1:"), added
            extra_addr = next(iter(added))
            with get_task_stream(client) as stream:
                report = dsi(scale="smoke", overrides={"regime_items": 6}, cluster=dask_cluster,
                             storage=local_storage)
            assert os.sched_getaffinity(extra.pid) == set(dpp_cores)  # any pin the run made was undone
            trainer_cores = set(available_cores()) - set(dpp_cores)
            masks = client.run(lambda: sorted(os.sched_getaffinity(0)))
            assert all(not set(m) & trainer_cores for m in masks.values()), masks  # no DPP worker on its core
        finally:
            extra.stop(grace_s=5)
            for worker, mask in fixture_masks.items():  # the fixture's workers as they were
                client.run(pin_me, mask, workers=[worker])
    # work items only: the warm-up (keys dpp-warm-...) runs on every worker whether or not the master used it
    ran_dpp = {r["worker"] for r in stream.data
               if str(r["key"]).startswith("dpp-") and not str(r["key"]).startswith("dpp-warm-")}
    assert extra_addr in ran_dpp, (extra_addr, ran_dpp)
    workers = next(n for n in report["notes"] if n.startswith("DPP workers"))
    assert f"other than the trainer's: {len(before)} of {len(before) + 1} here" in workers, workers
    assert report["variants"]["dpp"]["workers_max"] == 2 and "(no change)" not in workers, workers
    assert report["regime"]["headline_value"] == report["regime"]["paper_value"]
