"""A run's task runs as its user sees them (mlsys_flows/task_runs.py): their log lines echoed to
the terminal when they ran on workers that are not the run's children, and none left unfinished when the
run stops."""
from __future__ import annotations

import io
import re
import sys

import cloudpickle
from prefect import flow, get_run_logger, task
from prefect.client.orchestration import get_client

from mlsys_flows.flows.common import tasks_on
from mlsys_flows.task_runs import TaskLogEcho, crash_unfinished

LINE = re.compile(r"\d\d:\d\d:\d\d\.\d{3} \| (DEBUG|INFO|WARNING|ERROR|CRITICAL) +\| Task run '[^']+' - ")


@task
def shout(i: int) -> None:
    get_run_logger().warning("progress line %d", i)  # the tests' log level is WARNING


@flow
def noisy() -> str:
    from faultkit import warm_cluster
    from prefect.runtime import flow_run

    with tasks_on(warm_cluster()):  # a cluster at an address: its workers log to the API only
        for i in range(3):
            shout.submit(i).result()
    return str(flow_run.get_id())


cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the warm cluster's workers cannot import tests/


def test_task_log_lines_are_echoed_once_each(prefect_api):
    """A run whose tasks ran on the session's warm cluster: once the API holds their lines, one poll
    writes each in Prefect's console shape, a second writes none again, the flow's own lines stay out."""
    from faultkit import wait_until

    run_id = noisy()
    out = io.StringIO()
    echo = TaskLogEcho(run_id, out=out)
    with get_client(sync_client=True) as client:
        wait_until(lambda: echo.poll(client) == 0 and out.getvalue().count("progress line") == 3, timeout=30,
                   interval=0.5, what="the run's three task log lines in the API")
        again = TaskLogEcho(run_id, out=io.StringIO())
        first, second = again.poll(client), echo.poll(client)
    lines = again.out.getvalue().splitlines()
    assert first == len(lines) == 3 and second == 0
    assert all(LINE.match(line) for line in lines), lines
    assert [line.rsplit(" ", 1)[1] for line in lines] == ["0", "1", "2"]  # in the order they were written


def test_a_stopped_runs_unfinished_task_runs_are_crashed(prefect_api):
    """A flow run with one task run Running and one Completed: the Running one is Crashed with the
    message, the Completed one is left alone."""
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
