"""The harness's task policy (tasks/common.py ``with_policy``, set on every submission by ``tasks_on``):
a task that fails once on storage I/O is retried and completes; other errors fail at once; a task past
``task_timeout_s`` and a run past ``flow_timeout_s`` fail naming the parameter."""
from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

import pytest
from prefect import flow, task

from mlsys_flows.blocks import DaskCluster
from mlsys_flows.flows.common import run_deadline, tasks_on

CLUSTER = DaskCluster(n_workers=1, processes=False)  # threads: the fault injected here reaches the task


@task
def save(storage, key: str) -> str:
    storage.write_bytes(key, b"payload")
    return key


@task
def broken() -> None:
    raise ValueError("a bug, not an I/O failure")


@task
def wait_for(flag: str) -> None:
    while not os.path.exists(flag):  # Python code runs between sleeps: the timeout can interrupt it
        time.sleep(0.05)


@flow
def submit_one(fn, *args) -> tuple:
    """(the task's final state, how many times it ran, as the Prefect API recorded it)"""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with tasks_on(CLUSTER, task_timeout_s=60):
        future = fn.submit(*args)
        future.wait()
    # the API records a task run and its states from events it processes after the task ends: wait
    # until the run exists with its final state before reading how many times the task ran
    recorded = None
    with get_client(sync_client=True) as client:
        for _ in range(1200):
            try:
                recorded = client.read_task_run(future.task_run_id)
            except ObjectNotFound:
                recorded = None
            if recorded is not None and recorded.state is not None and recorded.state.is_final():
                break
            time.sleep(0.05)
    assert recorded is not None, "the API never recorded the task run"
    return future.state, recorded.run_count


def test_a_task_whose_first_write_fails_is_retried(local_storage, monkeypatch):
    failed = threading.Event()
    real_replace = os.replace

    def fail_first(src, dst):
        if not failed.is_set():
            failed.set()  # the fault: the first commit of a write fails, later ones succeed
            raise OSError("injected: disk went away")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", fail_first)
    state, runs = submit_one(save, local_storage, "retried.bin")
    assert failed.is_set() and state.is_completed() and runs == 2
    assert local_storage.read_bytes("retried.bin") == b"payload"


def test_a_task_failing_on_a_bug_is_not_retried():
    state, runs = submit_one(broken)
    assert state.is_failed() and runs == 1


def test_a_task_past_task_timeout_fails_naming_the_parameter(tmp_path):
    """The task waits for a file nobody writes until the test ends: only its timeout ends it."""
    params = SimpleNamespace(scale="smoke", task_timeout_s=1, flow_timeout_s=600)
    flag = tmp_path / "release"

    @flow
    def stuck():
        with run_deadline("demo", params), tasks_on(CLUSTER, task_timeout_s=params.task_timeout_s):
            wait_for.submit(str(flag)).result()

    try:
        with pytest.raises(TimeoutError, match=r"demo: a task exceeded task_timeout_s=1 s \(scale smoke"):
            stuck()
    finally:
        flag.touch()


def test_a_run_past_flow_timeout_fails_naming_the_parameter():
    params = SimpleNamespace(scale="quick", task_timeout_s=600, flow_timeout_s=1)

    @flow
    def stuck():
        with run_deadline("demo", params):
            while not threading.Event().wait(0.05):
                pass

    with pytest.raises(TimeoutError, match=r"demo: the run's work exceeded flow_timeout_s=1 s \(scale quick"):
        stuck()


@task
def noop() -> None:
    return None


def test_task_runs_do_not_carry_the_runs_tags():
    """A run started under tags (the CLI's, a webhook's) keeps them on its flow run; its task runs have
    none, so Prefect's tag concurrency gate (an API round trip before Running that sometimes waited
    about 2 s) is skipped for every task."""
    import prefect
    from prefect.client.orchestration import get_client

    with prefect.tags("cli", "system:demo"):
        state, _ = submit_one(noop)
    with get_client(sync_client=True) as client:
        task_run = client.read_task_run(state.state_details.task_run_id)
        flow_run = client.read_flow_run(task_run.flow_run_id)
    assert {"cli", "system:demo"} <= set(flow_run.tags)
    assert task_run.tags == []
