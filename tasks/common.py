"""Tasks every flow shares: publishing the RunReport."""
from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.common.plotting import render_png
from mlsys_flows.systems.common.report import RunReport


@task(name="publish-report")
def publish_report(report: RunReport, storage: ObjectStorage) -> str:
    """Save the report as JSON and PNG on the storage block and publish it as artifacts."""
    base = f"reports/{report.system}/{report.run_id}"
    storage.write_json(f"{base}.json", report.model_dump(mode="json"))
    storage.write_bytes(f"{base}.png", render_png(report))
    h = report.headline
    create_table_artifact(
        key=f"{report.system}-report", table=report.table_rows(),
        description=f"{report.title}: {h.metric} {h.technique} vs {h.baseline} = {h.label()}")
    create_markdown_artifact(
        key=f"{report.system}-summary",
        markdown=report.summary_markdown() + f"\n\nReport JSON and plot: `{storage.root_url}/{base}.json`, `.png`",
        description=f"{report.system} RunReport")
    return f"{base}.json"
