"""Known S3 secret values never appear in a log line, artifact, RunReport, flow-run parameter,
exception message, or anywhere in the Prefect database and home folder.

A SeaweedFS server of its own with random keys, so that a hit can only come from this test.
(Webhook secrets: tests/integration/test_webhooks*.py.)
"""
from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path

import pytest
from faultkit import DaskProcesses, child_flow_runs, implemented, wait_until

from mlsys_flows import registry
from mlsys_flows.blocks import DaskCluster, ObjectStorage, StorageError
from mlsys_flows.testing.local_s3 import SeaweedS3

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def secret_s3():
    with SeaweedS3(access_key=f"AKID{uuid.uuid4().hex[:16].upper()}",
                   secret_key=f"sk-{uuid.uuid4().hex}{uuid.uuid4().hex[:8]}") as server:
        server.create_bucket("secrets")
        yield server


def _storage(server, secret: str | None = None) -> ObjectStorage:
    return ObjectStorage(url="s3://secrets/runs", endpoint_url=server.endpoint_url, region="us-east-1",
                         access_key_id=server.access_key, secret_access_key=secret or server.secret_key)


def _api_text(flow_run_ids) -> str:
    """Logs, artifacts, flow-run parameters and states of these runs (and their subflows), as text."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter,
                                                FlowRunFilterId, LogFilter, LogFilterFlowRunId)

    ids = list(flow_run_ids)
    ids += [child.id for run_id in ids for child in child_flow_runs(run_id)]
    with get_client(sync_client=True) as client:
        def read_logs():  # logs reach the API in batches: wait for the final headline line and a task's lines
            found, page = [], None
            while page is None or len(page) == 200:
                page = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=ids)), limit=200,
                                        offset=len(found))
                found += page
            done = any("headline" in log.message for log in found) and any(log.task_run_id for log in found)
            return found if done else None

        logs = wait_until(read_logs, timeout=30, interval=0.5, what="the flow's and the tasks' logs in the API")
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=ids)))
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
        tasks = [t for run_id in ids for t in client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))]
    parts = [log.message for log in logs] + [json.dumps(a.data, default=str) + str(a.description) for a in arts]
    parts += [json.dumps(r.parameters, default=str) + str(r.state) for r in runs]
    parts += [t.model_dump_json() for t in tasks]
    return "\n".join(parts)


def _files_containing(roots, needles: list[bytes]) -> list[str]:
    hits = []
    for root in roots:
        for path in Path(root).rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                hits += [f"{path}: {n[:6]!r}..." for n in needles if n in data]
    return hits


@pytest.fixture
def info_logging(prefect_api):
    """Prefect's default INFO level (the suite runs at WARNING), here and on the Dask workers, so
    every flow and task log line reaches the API."""
    from prefect.settings import PREFECT_API_URL

    for spec in registry.all_specs():
        spec.load_flow()  # importing prefect's flow machinery re-applies its logging config: do it first
    prefect_logger = logging.getLogger("prefect")
    level = prefect_logger.level
    prefect_logger.setLevel(logging.INFO)
    try:
        with DaskProcesses(env={"PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_LOGGING_LEVEL": "INFO"}) as procs:
            yield DaskCluster(address=procs.address)
    finally:
        prefect_logger.setLevel(level)


@pytest.mark.timeout(600)
def test_s3_secrets_never_leak(secret_s3, info_logging, caplog, capfd):
    from prefect.settings import PREFECT_HOME, PREFECT_SERVER_DATABASE_CONNECTION_URL

    dask_cluster = info_logging

    # one flow through S3 suffices (the secrets travel in the storage block, the same for all);
    # recd writes the most objects
    systems = implemented()
    name = "recd" if "recd" in systems else systems[0] if systems else pytest.skip("no system implemented yet")
    secrets = [secret_s3.access_key, secret_s3.secret_key]
    wrong = f"wrong-{uuid.uuid4().hex}"
    flow = registry.get(name).load_flow()
    caplog.set_level(logging.INFO)

    ok = flow(scale="smoke", cluster=dask_cluster, storage=_storage(secret_s3), return_state=True)
    assert ok.is_completed(), ok
    report = ok.result()
    bad = flow(scale="smoke", cluster=dask_cluster, storage=_storage(secret_s3, wrong), return_state=True)
    assert bad.is_failed()
    error = bad.result(raise_on_failure=False)
    assert isinstance(error, StorageError) and "rejected the credentials" in str(error), error
    with pytest.raises(StorageError) as direct:
        _storage(secret_s3, wrong).check()

    published = _storage(secret_s3).read_json(f"reports/{name}/{report['run_id']}.json")
    out, errout = capfd.readouterr()
    texts = {
        "RunReport": json.dumps(report), "report on S3": json.dumps(published),
        "exceptions": f"{error!s} {error!r} {bad.message} {direct.value!s}",
        "captured logs": "\n".join(r.getMessage() + str(r.exc_info or "") for r in caplog.records),
        "stdout/stderr": out + errout,
        "Prefect API": _api_text([ok.state_details.flow_run_id, bad.state_details.flow_run_id]),
        "block repr": repr(_storage(secret_s3)) + json.dumps(_storage(secret_s3).model_dump(mode="json")),
    }
    for where, text in texts.items():
        for secret in [*secrets, wrong]:
            assert secret not in text, f"a secret leaked into {where}"
    db = PREFECT_SERVER_DATABASE_CONNECTION_URL.value().split(":///", 1)[-1]
    roots = [Path(db).parent, PREFECT_HOME.value()]
    assert os.path.exists(db)
    assert _files_containing(roots, [b"s3://secrets/runs"]), "the scan does not see the runs' records"
    hits = _files_containing(roots, [s.encode() for s in [*secrets, wrong]])
    assert not hits, f"secrets found in Prefect files: {hits}"
