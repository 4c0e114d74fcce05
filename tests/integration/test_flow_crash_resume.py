"""A training flow's process (and its embedded Dask workers) SIGKILLed mid-run, then rerun with the
same run key: training resumes from the last complete checkpoint and loses no completed steps.

Covers every implemented system whose flow checkpoints through ``ctx.checkpoints`` (the harness's
CheckpointStore on the run's storage, keyed by the flow's ``run_key``).
"""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from faultkit import (OWN_CLUSTER, REFERENCE_RUN_KEY, deterministic_view, fault_systems, implemented,
                      kill_process_group, leaf_diff, reference_run, wait_until, warm_cluster)

from mlsys_flows import registry
from mlsys_flows.blocks import CheckpointStore, ObjectStorage

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# The killed run's embedded cluster starts one worker (or the workers the system asks for): it is killed
# in its first training task, and a second worker would only import the flow (seconds of CPU) to die idle.
RUNNER = """
import sys
if __name__ == "__main__":
    from mlsys_flows import registry
    from mlsys_flows.blocks import DaskCluster, ObjectStorage
    name, url, run_key = sys.argv[1:4]
    spec = registry.get(name)
    workers = spec.params_model().for_scale("smoke").embedded_workers() or 1
    spec.load_flow()(scale="smoke", storage=ObjectStorage(url=url), run_key=run_key,
                     cluster=DaskCluster(n_workers=workers))
"""


def checkpointing_systems() -> list[str]:
    """Implemented systems whose flow hands ``ctx.checkpoints`` to a training task."""
    return [n for n in implemented() if "ctx.checkpoints" in (ROOT / "flows" / f"{n}.py").read_text()]


SYSTEMS = checkpointing_systems()


@pytest.mark.skipif(not SYSTEMS, reason="no implemented flow checkpoints through ctx.checkpoints yet")
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", fault_systems(SYSTEMS))
def test_sigkill_flow_process_then_resume_with_same_run_key(name, prefect_api, tmp_path):
    from prefect.settings import PREFECT_API_URL

    reference, ref_storage = reference_run(name)
    ref_steps = [e["step"] for e in CheckpointStore(storage=ref_storage, prefix=f"checkpoints/{name}")
                 .manifest(REFERENCE_RUN_KEY)]
    assert ref_steps, f"{name} saved no checkpoint in an uninterrupted run"

    storage = ObjectStorage(url=(tmp_path / "storage").as_uri())
    checkpoints = CheckpointStore(storage=storage, prefix=f"checkpoints/{name}")
    run_key = f"crash-{uuid.uuid4().hex[:8]}"
    script = tmp_path / "run_flow.py"
    script.write_text(RUNNER)
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    proc = subprocess.Popen([sys.executable, str(script), name, storage.root_url, run_key], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        # crash as soon as the first checkpoint is complete: the flow, its Dask workers, everything
        wait_until(lambda: checkpoints.manifest(run_key) or proc.poll() is not None, timeout=400,
                   interval=0.02, what="the first checkpoint")
    finally:
        kill_process_group(proc)
    assert proc.returncode == -9, f"the flow ended before it was killed: {proc.stderr.read()[-2000:]}"
    assert not storage.list(f"reports/{name}"), "the killed run published a report"
    last = checkpoints.latest(run_key)
    assert last is not None and last["step"] < ref_steps[-1], "killed too late: nothing left to resume"

    # the rerun on the cluster the reference ran on (the session's warm one, unless the system needs its own):
    # the killed run's cluster went with its process, and a fresh embedded one costs two worker starts
    own = name in OWN_CLUSTER or registry.get(name).params_model().for_scale("smoke").own_cluster()
    resumed = registry.get(name).load_flow()(scale="smoke", storage=storage, run_key=run_key,
                                             cluster=None if own else warm_cluster())

    # resumed exactly once, from the last checkpoint complete at the crash
    assert [r["step"] for r in checkpoints.resumes(run_key)] == [last["step"]]
    # no completed step lost: same final checkpoint and same deterministic results (losses, counts)
    # as the uninterrupted run
    assert checkpoints.manifest(run_key)[-1]["step"] == ref_steps[-1]
    diff = leaf_diff(deterministic_view(resumed), deterministic_view(reference))
    assert not diff, f"the resumed run differs from an uninterrupted one: {diff}"
