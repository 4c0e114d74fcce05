"""Tasks every flow shares: publishing the RunReport; the OpenAI-compatible client whose API key comes
from a Prefect Secret block (vcache, bagel)."""
from __future__ import annotations

import base64

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.common.plotting import render_png
from mlsys_flows.systems.common.report import RunReport


@task(name="publish-report")
def publish_report(report: RunReport, storage: ObjectStorage) -> str:
    """Save the report as JSON and PNG on the storage block and publish it as artifacts."""
    base = f"reports/{report.system}/{report.run_id}"
    png = render_png(report)
    storage.write_json(f"{base}.json", report.model_dump(mode="json"))
    storage.write_bytes(f"{base}.png", png)
    h = report.headline
    create_table_artifact(
        key=f"{report.system}-report", table=report.table_rows(),
        description=f"{report.title}: {h.metric} {h.technique} vs {h.baseline} = {h.label()} "
                    f"(paper {'n/a' if h.paper is None else f'{h.paper:.2f}x'})")
    # the plot travels inside the artifact (a data URI): the browser shows it whatever the storage
    # is (a local folder or a private bucket the browser cannot reach)
    plot = f"![{report.system} plot](data:image/png;base64,{base64.b64encode(png).decode()})"
    create_markdown_artifact(
        key=f"{report.system}-summary",
        markdown="\n\n".join([report.summary_markdown(), plot, "## Parameters (resolved)",
                                report.parameters_markdown(),
                                f"Report JSON and plot on storage: `{storage.root_url}/{base}.json` and `{base}.png`"]),
        description=f"{report.system} RunReport")
    return f"{base}.json"


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
