"""`mlsys-flows reproduce REPORT.json`: rerun a report and say whether each verdict holds."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from mlsys_flows.cli.console import console, fail


def reproduce(report: Path = typer.Argument(..., help="A RunReport JSON (e.g. benchmarks/results/radix-quick.json)."),
              other_code: bool = typer.Option(False, "--other-code", help="Rerun even when this checkout's code "
                                              "of the system differs from the report's."),
              storage: Optional[str] = typer.Option(None, help="Name of a saved ObjectStorage block."),
              cluster: Optional[str] = typer.Option(None, help="Name of a saved DaskCluster block (where tasks run)."),
              devices: Optional[str] = typer.Option(None, help="Name of a saved ResourcePool block.")) -> None:
    """Rerun a report's system with its recorded parameters, seed and scale, and print each comparison
    of both runs side by side with whether the verdicts agree (exit 1 when one does not)."""
    from mlsys_flows.platform.reproduce import ReproduceError, load, reproduce as rerun
    from mlsys_flows.platform.runner import RunError

    try:
        recorded = load(report)
        console.print(f"reproducing {report}: {recorded['system']} at scale {recorded['scale']}, seed "
                      f"{recorded['parameters'].get('seed')}, {len(recorded['parameters'])} recorded parameters",
                      highlight=False, soft_wrap=True)
        with console.status(f"[bold]running {recorded['system']}[/bold]...", spinner="dots"):
            _, new, rows = rerun(report, other_code=other_code, storage=storage, cluster=cluster, devices=devices)
    except (ReproduceError, RunError) as exc:
        fail(str(exc))
    table = Table(title=f"{recorded['title']} [{recorded['scale']}]: recorded run {recorded['run_id'][:8]} vs "
                        f"rerun {new.run_id[:8]}")
    for col in ("comparison", "recorded", "rerun", "verdicts agree"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r.comparison, r.recorded, r.rerun, "yes" if r.agree else "[bold red]no[/bold red]")
    console.print(table)
    differ = [r.comparison for r in rows if not r.agree]
    console.print(f"{len(rows) - len(differ)} of {len(rows)} verdicts agree" +
                  (f"; not: {'; '.join(differ)}" if differ else ""), highlight=False, soft_wrap=True)
    if differ:
        raise typer.Exit(1)
