"""Tasks every flow shares: publishing the RunReport."""
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
