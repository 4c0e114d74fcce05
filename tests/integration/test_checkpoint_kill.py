"""Asynchronous checkpoints under a crash, and on a real S3 server.

- The checkpoint flow's process (with its Dask workers) is SIGKILLed while a background flush is
  writing a checkpoint; a rerun with the same run key resumes from the last complete checkpoint
  and ends with the same weights and optimizer state as an uninterrupted run with the same seed.
- The lazy asynchronous saver writes complete, loadable checkpoints to SeaweedFS S3.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch
from faultkit import kill_process_group, wait_until, warm_cluster

from mlsys_flows import registry
from mlsys_flows.blocks import CheckpointStore, ObjectStorage
from mlsys_flows.systems.checkpoint import Params
from mlsys_flows.systems.checkpoint.train import build, digest, load_state, train

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# a larger model than smoke's so each flush (~50 MB) lasts long enough to be caught in flight; the regime
# sweep (nothing here checks it) at a small width beside the headline's, whose runs the bench already made
OVERRIDES = {"width": 1024, "steps": 10, "every": 2, "regime_widths": [256, 1024]}
# the killed run's embedded cluster has one worker: it dies in its first task, the resumable training, and a
# second worker would only import the flow (seconds of CPU) to die idle
RUNNER = """
import json, sys
if __name__ == "__main__":
    from mlsys_flows import registry
    from mlsys_flows.blocks import DaskCluster, ObjectStorage
    url, run_key, overrides = sys.argv[1:4]
    registry.get("checkpoint").load_flow()(scale="smoke", overrides=json.loads(overrides),
                                           storage=ObjectStorage(url=url), run_key=run_key,
                                           cluster=DaskCluster(n_workers=1))
"""
BLOB = re.compile(r"^(?:\.tmp-[0-9a-f]+-)?step-(\d+)\.pt$")


@pytest.mark.timeout(600)
@pytest.mark.budget(120, reason="a checkpoint run in a process of its own, killed mid-flush, then the rerun "
                                "and an uninterrupted training to compare with")
def test_sigkill_during_a_flush_then_resume_ends_with_the_uninterrupted_weights(prefect_api, tmp_path):
    import json

    from prefect.settings import PREFECT_API_URL

    storage = ObjectStorage(url=(tmp_path / "storage").as_uri()).check()
    checkpoints = CheckpointStore(storage=storage, prefix="checkpoints/checkpoint")
    run_key = f"kill-{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "storage" / "checkpoints" / "checkpoint" / run_key

    def in_flight() -> int | None:
        """Step of a blob being written (temporary) or written but not yet in the manifest, while an
        earlier checkpoint is complete. The folder is listed before the manifest is read, so a flush
        that completes in between is not taken for one in flight."""
        names = os.listdir(folder) if folder.is_dir() else []
        steps = [int(m.group(1)) for m in map(BLOB.match, names) if m]
        done = [e["step"] for e in checkpoints.manifest(run_key)] if steps else []
        newer = [s for s in steps if done and s > max(done)]
        return max(newer) if newer else None

    script = tmp_path / "run_flow.py"
    script.write_text(RUNNER)
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    proc = subprocess.Popen([sys.executable, str(script), storage.root_url, run_key, json.dumps(OVERRIDES)],
                            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        killed_at = wait_until(lambda: in_flight() or proc.poll() is not None, timeout=200, interval=0.002,
                               what="a checkpoint flush in flight")
    finally:
        kill_process_group(proc)
    assert proc.returncode == -9, f"the flow ended before it was killed: {proc.stderr.read()[-2000:]}"
    last = checkpoints.latest(run_key)
    assert last is not None and last["step"] < killed_at, "the flush caught in flight completed before the kill"
    assert [e["step"] for e in checkpoints.manifest(run_key)][-1] == last["step"]  # nothing newer listed
    assert not storage.list(f"reports/checkpoint"), "the killed run published a report"

    # the rerun on the session's warm cluster (the killed run's own cluster went with its process)
    report = registry.get("checkpoint").load_flow()(scale="smoke", overrides=OVERRIDES, storage=storage,
                                                     run_key=run_key, cluster=warm_cluster())

    assert [r["step"] for r in checkpoints.resumes(run_key)] == [last["step"]]  # once, from the last complete one
    assert any(f"resumed after step {last['step']}" in n for n in report["notes"])
    p = Params.for_scale("smoke", **OVERRIDES)
    assert checkpoints.latest(run_key)["step"] == p.steps
    # the final checkpoint holds exactly the weights and Adam state of an uninterrupted run
    uninterrupted = train(p.width, p.depth, p.batch_size, p.steps, p.seed, threads=p.train_threads)
    model, opt = build(p.width, p.depth, p.seed)
    assert load_state(model, opt, checkpoints.restore(run_key)[1]) == p.steps
    assert digest(model, opt) == uninterrupted.digest
    v = report["variants"]
    assert v["training_run"]["weights_digest"] == v["none"]["weights_digest"]  # the flow's own uninterrupted runs


def test_lazy_async_checkpoints_on_s3(s3_storage):
    store = CheckpointStore(storage=s3_storage, prefix="ck", keep_last=2)
    rec = {}

    class Keep:
        """Wraps the S3 saver and keeps what each save was given, cloned at save time."""

        def __init__(self, inner):
            self.inner = inner

        def save(self, step, state):
            rec[step] = {k: v.detach().clone() for k, v in state["model"].items()}
            self.inner.save(step, state)

        def before_update(self):
            self.inner.before_update()

        def wait(self):
            self.inner.wait()

    saver = store.saver("s3run", asynchronous=True, lazy=True)
    res = train(64, 2, 8, 6, seed=2, saver=Keep(saver), every=2, threads=1)
    assert [e["step"] for e in store.manifest("s3run")] == [4, 6]  # keep_last=2; older ones deleted
    assert len([k for k in s3_storage.list("ck/s3run") if k.endswith(".pt")]) == 2
    step, state = store.restore("s3run")
    assert step == 6 and all(torch.equal(state["model"][k], rec[6][k]) for k in rec[6])
    assert res.digest == train(64, 2, 8, 6, seed=2, threads=1).digest
    assert all(f["bytes"] > 0 and f["seconds"] > 0 for f in saver.flushes)
