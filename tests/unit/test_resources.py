"""Device assignment of ResourcePool claims (no GPU needed: the lease works on any inventory), the
retry policy every task gets, and DaskCluster's remote-cluster checks and secret fields."""
from __future__ import annotations

import threading
import uuid

import httpx
import pytest

from mlsys_flows.blocks import DaskCluster, ResourcePool, StorageError
from mlsys_flows.blocks.resources import ClaimTimeout
from mlsys_flows.tasks.common import is_transient


def _pool(**kw) -> ResourcePool:
    return ResourcePool(kind="gpu", name=f"t{uuid.uuid4().hex[:8]}", limit_concurrency=False, **kw)


def _hold(pool: ResourcePool, got: list, release: threading.Event, ready: threading.Event) -> None:
    with pool.lease(timeout_s=30) as devices:
        got.append(devices)
        ready.set()
        release.wait(30)


def test_concurrent_claims_get_distinct_devices_released_on_exit():
    pool = _pool(devices=["cuda:0", "cuda:1", "cuda:2"])
    release, got, threads = threading.Event(), [], []
    for _ in range(3):
        ready = threading.Event()
        threads.append(threading.Thread(target=_hold, args=(pool, got, release, ready)))
        threads[-1].start()
        assert ready.wait(30)
    assert sorted(d for held in got for d in held) == ["cuda:0", "cuda:1", "cuda:2"]  # one each, all distinct
    with pytest.raises(ClaimTimeout) as exc:  # all held: a fourth claim fails naming the pool and its wait
        with pool.lease(timeout_s=0.2):
            pass
    assert repr(pool.name) in str(exc.value) and "cuda:0, cuda:1, cuda:2" in str(exc.value) and "0.2 s" in str(exc.value)
    release.set()
    for t in threads:
        t.join(30)
    with pool.lease(timeout_s=1) as devices:  # released on exit
        assert devices == ["cuda:0"]


def test_slots_and_devices_follow_per_task():
    two = _pool(devices=["cuda:0", "cuda:1", "cuda:2", "cuda:3"], per_task=2)
    assert (two.slots, two.slots_per_claim) == (4, 2)
    with two.lease(timeout_s=1) as a, two.lease(timeout_s=1) as b:
        assert len(a) == len(b) == 2 and not set(a) & set(b)
        with pytest.raises(ClaimTimeout, match=r"this claim needs 2"):
            with two.lease(timeout_s=0.1):
                pass
    half = _pool(devices=["cuda:0", "cuda:1"], per_task=0.5)  # two claims share each device
    assert (half.slots, half.slots_per_claim) == (4, 1)
    with half.lease(timeout_s=1) as a, half.lease(timeout_s=1) as b, half.lease(timeout_s=1) as c:
        assert sorted(a + b + c) == ["cuda:0", "cuda:0", "cuda:1"]
    with pytest.raises(ValueError, match="per_task"):
        _pool(devices=["cuda:0", "cuda:1"], per_task=1.5)


def test_a_claim_yields_its_devices_and_fpga_boards_by_name():
    pool = ResourcePool(kind="fpga", devices=["fpga:0", "fpga:1"], name=f"t{uuid.uuid4().hex[:8]}",
                        limit_concurrency=False)
    with pool.claim() as a, pool.claim() as b:
        assert {a, b} == {"fpga-sw:0", "fpga-sw:1"} and a.devices == (a,)
        with pytest.raises(ClaimTimeout, match=r"\(fpga\): its devices \(fpga:0, fpga:1\) stayed held .* for 0.2 s"):
            with pool.claim(timeout_s=0.2):
                pass


def test_only_io_and_remote_call_failures_are_retried():
    from prefect.task_engine import TaskRunTimeoutError

    from mlsys_flows.systems.common.llm import LLMError

    for exc in (StorageError("writing 'k' failed"), ConnectionResetError(), LLMError("HTTP 503"),
                httpx.ConnectError("refused"), OSError("disk")):
        assert is_transient(exc), exc
    for exc in (ValueError("bad"), KeyError("k"), TaskRunTimeoutError("slow"), ClaimTimeout("pool"), None):
        assert not is_transient(exc), exc


def test_remote_cluster_with_a_loopback_api_fails_naming_the_fix():
    remote = DaskCluster(address="tcp://10.1.2.3:8786")
    for api in ("http://127.0.0.1:4200/api", "http://localhost:4200/api", None):
        with pytest.raises(ValueError, match="prefect server start --host 0.0.0.0"):
            remote.check_api_reachable(api)
    remote.check_api_reachable("http://10.1.2.1:4200/api")  # a routable API: fine
    with pytest.raises(ValueError, match="KubeCluster"):
        DaskCluster(cluster_class="dask_kubernetes.operator.KubeCluster").check_api_reachable(None)
    for local in (DaskCluster(), DaskCluster(address="tcp://127.0.0.1:8786"),
                  DaskCluster(cluster_class="distributed.LocalCluster")):
        local.check_api_reachable(None)  # workers on this machine reach a loopback API


def test_cluster_secrets_are_masked_and_merged_only_when_the_cluster_starts():
    block = DaskCluster(cluster_class="distributed.LocalCluster", cluster_kwargs={"n_workers": 1},
                        cluster_secrets={"token": "s3cr3t-token"}, client_kwargs={"timeout": 30})
    assert "s3cr3t-token" not in repr(block) and "s3cr3t-token" not in block.model_dump_json()
    runner = block.task_runner()
    assert runner.cluster_kwargs["token"] == "s3cr3t-token" and runner.client_kwargs["timeout"] == 30
    with pytest.raises(ValueError, match="tls_ca_secret"):
        DaskCluster(address="tls://10.0.0.1:8786", tls_cert_secret="cert").security()
