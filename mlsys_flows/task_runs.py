"""A flow run's task runs as its user sees them: their log lines echoed to this terminal when they run
in worker processes that are not this process's children (a running server's warm cluster, a
cluster at an address), and none left Running when the run stops (Ctrl-C, a termination signal).

Both read and write through the Prefect API the run reports to."""
from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Iterator, TextIO
from uuid import UUID

# how often the echo asks the API for new task-run log lines; a log line reaches the API within about
# a second of being written (the worker's log handler sends in batches), so shorter buys nothing
ECHO_INTERVAL_S = 1.0
LATE_S = 15.0  # how much later than a newer line a line may reach the API (batches every 2 s by default)
PAGE = 200
_LEVELS = {10: "DEBUG", 20: "INFO", 30: "WARNING", 40: "ERROR", 50: "CRITICAL"}


def _line(when: datetime, level: int, task_run: str, message: str) -> str:
    """The shape of Prefect's own console lines, so echoed and local runs read alike."""
    return f"{when.astimezone():%H:%M:%S}.{when.microsecond // 1000:03d} | {_LEVELS.get(level, str(level)):<7} | " \
           f"Task run {task_run!r} - {message}"


class TaskLogEcho:
    """Polls the API for the log lines of ``flow_run_id``'s task runs and writes each once to ``out``."""

    def __init__(self, flow_run_id: UUID | str, out: TextIO | None = None, interval_s: float = ECHO_INTERVAL_S):
        self.flow_run_id = UUID(str(flow_run_id))
        self.out = out  # None: through Prefect's console handler (its level, the CLI's held errors apply)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._seen: set[UUID] = set()
        self._newest: datetime | None = None
        self._names: dict[UUID, str] = {}
        self._thread = threading.Thread(target=self._loop, name="mlsys-task-log-echo", daemon=True)

    def poll(self, client) -> int:
        """Write the lines not written yet; how many. Workers send their lines in batches, so a line
        can reach the API after a later one from another worker: each poll rereads the last
        ``LATE_S`` seconds before the newest line seen and skips the lines already written."""
        from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId, LogFilterTimestamp
        from prefect.client.schemas.sorting import LogSort

        after = self._newest - timedelta(seconds=LATE_S) if self._newest else None
        written, offset = 0, 0
        while True:
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[self.flow_run_id]),
                                                         timestamp=LogFilterTimestamp(after_=after)),
                                    sort=LogSort.TIMESTAMP_ASC, limit=PAGE, offset=offset)
            for log in logs:
                self._newest = max(self._newest or log.timestamp, log.timestamp)
                # the flow run's own lines are this process's: already on its console
                if log.id in self._seen or log.task_run_id is None:
                    continue
                if log.task_run_id not in self._names:
                    self._names[log.task_run_id] = client.read_task_run(log.task_run_id).name
                self._write(log.timestamp, log.level, self._names[log.task_run_id], log.message)
                self._seen.add(log.id)
                written += 1
            if len(logs) < PAGE:
                if self.out is not None:
                    self.out.flush()
                return written
            offset += PAGE

    def _write(self, when: datetime, level: int, task_run: str, message: str) -> None:
        if self.out is not None:
            self.out.write(_line(when, level, task_run, message) + "\n")
            return
        # a record of Prefect's task-run logger, kept off the API (it came from there): the console
        # prints it in Prefect's own shape at Prefect's level, and a CLI that holds a failed run's
        # ERROR records to print one line of its own holds these too
        logger = logging.getLogger("prefect.task_runs")
        if not logger.isEnabledFor(level):
            return
        record = logger.makeRecord(logger.name, level, __file__, 0, message, None, None,
                                   extra={"task_run_name": task_run, "send_to_api": False})
        record.created, record.msecs = when.timestamp(), when.microsecond // 1000
        logger.handle(record)

    def _loop(self) -> None:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            while True:
                stopping = self._stop.wait(self.interval_s)
                try:
                    self.poll(client)
                except Exception:  # noqa: BLE001 - progress is a courtesy: an API hiccup must not fail the run
                    pass
                if stopping:
                    return

    def __enter__(self) -> "TaskLogEcho":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()  # one last poll: the lines of the tasks that just ended
        self._thread.join(timeout=3 * self.interval_s + 5)


@contextmanager
def echo_task_logs(flow_run_id: UUID | str | None, out: TextIO | None = None) -> Iterator[None]:
    if flow_run_id is None:
        yield
        return
    with TaskLogEcho(flow_run_id, out):
        yield


UNFINISHED = ("SCHEDULED", "PENDING", "RUNNING", "PAUSED", "CANCELLING")


def crash_unfinished(flow_run_id: UUID | str, message: str) -> int:
    """Mark Crashed every task run of ``flow_run_id`` not yet in a final state; how many. Prefect marks
    the flow run Crashed when its process is interrupted, but not the task runs it had in flight on
    workers that die with it or never report again: they would read Running forever."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (FlowRunFilter, FlowRunFilterId, TaskRunFilter, TaskRunFilterState,
                                                TaskRunFilterStateType)
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(str(flow_run_id))])),
            task_run_filter=TaskRunFilter(state=TaskRunFilterState(type=TaskRunFilterStateType(
                any_=[StateType(s) for s in UNFINISHED]))))
        for run in runs:
            client.set_task_run_state(run.id, Crashed(message=message), force=True)
    return len(runs)
