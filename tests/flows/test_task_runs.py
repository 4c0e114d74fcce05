"""A run's task runs as its user sees them (mlsys_flows/platform/task_runs.py): their log lines echoed to
the terminal when they ran on workers that are not the run's children, and none left unfinished when the
run stops."""
from __future__ import annotations

import io
import re

from prefect.client.orchestration import get_client

from mlsys_flows.platform.task_runs import TaskLogEcho, crash_unfinished

LINE = re.compile(r"\d\d:\d\d:\d\d\.\d{3} \| (DEBUG|INFO|WARNING|ERROR|CRITICAL) +\| Task run '[^']+' - ")


def test_task_log_lines_are_echoed_once_each(prefect_api):
    """The shared phaze smoke run ran its tasks on the session's warm cluster: one poll writes each of
    their log lines in Prefect's console shape, a second writes none again, the flow's own lines stay out."""
    from faultkit import reference_run

    report, _ = reference_run("phaze")
    out = io.StringIO()
    echo = TaskLogEcho(report["run_id"], out=out)
    with get_client(sync_client=True) as client:
        first, second = echo.poll(client), echo.poll(client)
    lines = out.getvalue().splitlines()
    assert first == len(lines) > 0 and second == 0
    assert all(LINE.match(line) for line in lines), lines[:5]
    assert not any("resolved parameters" in line for line in lines)  # a flow-run line, already on its console


def test_a_stopped_runs_unfinished_task_runs_are_crashed(prefect_api):
    """A flow run with one task run Running and one Completed: the Running one is Crashed with the
    message, the Completed one is left alone."""
    from prefect import flow, task
    from prefect.states import Completed, Running

    @task
    def step() -> None:
        pass

    @flow
    def stopped() -> None:
        pass

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(stopped)
        running = client.create_task_run(step, flow_run_id=run.id, dynamic_key="0", state=Running())
        done = client.create_task_run(step, flow_run_id=run.id, dynamic_key="1", state=Completed())
        assert crash_unfinished(run.id, "the flow run stopped (KeyboardInterrupt) while this task ran") == 1
        a, b = client.read_task_run(running.id), client.read_task_run(done.id)
    assert a.state.type.value == "CRASHED" and "KeyboardInterrupt" in a.state.message
    assert b.state.type.value == "COMPLETED"
