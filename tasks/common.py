"""Tasks every flow shares: how every task runs (retries on I/O failures, a timeout: ``with_policy``);
publishing the RunReport; the OpenAI-compatible client whose API key comes from a Prefect Secret block
(vcache, bagel)."""
from __future__ import annotations

import base64
import logging

from prefect import Task, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from mlsys_flows.blocks import ObjectStorage, StorageError
from mlsys_flows.blocks.resources import ClaimTimeout
from mlsys_flows.systems.common.plotting import render_png
from mlsys_flows import rendering
from mlsys_flows.systems.common.runreport import RunReport


# Every task's retry policy, set by the harness on each submission (``with_policy``), not per task:
# a failed storage read or write, a dropped connection or an LLM endpoint error is retried twice,
# after 2 s then 10 s (+-20%); any other error (a bug, a bad parameter) fails at once.
IO_RETRIES = 2
IO_RETRY_DELAYS_S = [2.0, 10.0]


class _ThreadTimeoutNotice(logging.Filter):
    """Drops Prefect's warning that a task with a timeout runs in a worker thread: every Dask task
    does, so it would be on every task run. What it says (the timeout interrupts Python code, not a
    blocking call) is in docs/platform.md once; storage and LLM calls have their own timeouts."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "configured for this task, but the task is running in a worker thread" not in str(record.msg)


# on every worker that runs a task with the policy: unpickling its retry_condition_fn imports this module
logging.getLogger("prefect.task_runs").addFilter(_ThreadTimeoutNotice())


def is_transient(exc: BaseException | None) -> bool:
    """An I/O or remote-call failure that a later attempt may not meet: storage, network, endpoint.
    Timeouts of the task itself or of a device claim are not: they already waited their limit."""
    import httpx
    from prefect.task_engine import TaskRunTimeoutError

    from mlsys_flows.systems.common.llm import LLMError

    if isinstance(exc, (TaskRunTimeoutError, ClaimTimeout)):
        return False
    return isinstance(exc, (StorageError, LLMError, OSError, httpx.TransportError))


def retry_on_io(task: Task, task_run, state) -> bool:
    """Prefect's ``retry_condition_fn``: the failed state carries the exception the task raised."""
    return is_transient(state.data if isinstance(state.data, BaseException) else None)


def with_policy(task: Task, timeout_s: float | None) -> Task:
    """``task`` with the platform's retries on I/O failures and ``timeout_s`` (the run's
    ``task_timeout_s``); what a task sets on its own decorator is kept."""
    options = {}
    if not task.retries and task.retry_condition_fn is None:
        options.update(retries=IO_RETRIES, retry_delay_seconds=IO_RETRY_DELAYS_S, retry_jitter_factor=0.2,
                       retry_condition_fn=retry_on_io)
    if task.timeout_seconds is None and timeout_s is not None:
        options["timeout_seconds"] = timeout_s
    return task.with_options(**options) if options else task


def report_key(report: RunReport) -> str:
    """Where a run's report lies on its storage: ``<key>.json`` and ``<key>.png``."""
    return f"reports/{report.system}/{report.run_id}"


@task(name="publish-report")
def publish_report(report: RunReport, storage: ObjectStorage) -> bytes:
    """Save the report as JSON and its plot as PNG on the storage block; returns the PNG."""
    base = report_key(report)
    png = render_png(report)
    storage.write_json(f"{base}.json", report.model_dump(mode="json"))
    storage.write_bytes(f"{base}.png", png)
    return png


def report_artifacts(report: RunReport, png: bytes, storage: ObjectStorage) -> None:
    """The report as Prefect artifacts (a table and a markdown summary) of the current run. Called by
    the flow itself, not inside a task: an artifact belongs to the task run it was created in, and the
    run's Artifacts tab would list it under ``publish-report`` instead of under the flow run."""
    base = report_key(report)
    create_table_artifact(key=f"{report.system}-report", table=rendering.table_rows(report),
                          description=rendering.table_description(report))
    # the plot travels inside the artifact (a data URI): the browser shows it whatever the storage
    # is (a local folder or a private bucket the browser cannot reach)
    plot = f"![{report.system} plot](data:image/png;base64,{base64.b64encode(png).decode()})"
    create_markdown_artifact(
        key=f"{report.system}-summary",
        markdown="\n\n".join([rendering.summary_markdown(report), plot, "## Parameters (resolved)",
                                rendering.parameters_markdown(report),
                                f"Report JSON and plot on storage: `{storage.root_url}/{base}.json` and `{base}.png`"]),
        description=f"{report.system} RunReport")


def resolve_api_key(secret_name: str | None) -> str | None:
    """The API key from the Prefect Secret block ``secret_name`` (None: no key). Never logged."""
    if not secret_name:
        return None
    from prefect.blocks.system import Secret

    try:
        return str(Secret.load(secret_name).get())
    except ValueError as exc:
        raise ValueError(f"no Secret block named {secret_name!r} holds the LLM API key") from exc


def llm_client(base_url: str, model: str, secret_name: str | None, timeout_s: float = 60.0):
    """An OpenAI-compatible client whose key comes from a Secret block (the only place it is read)."""
    from mlsys_flows.systems.common.llm import LLMConfig, OpenAICompatibleClient

    return OpenAICompatibleClient(LLMConfig(base_url=base_url, model=model, api_key=resolve_api_key(secret_name),
                                            timeout_s=timeout_s))
