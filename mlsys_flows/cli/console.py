"""What every command of the CLI shares: consoles that do not wrap in a pipe, one-line errors with
exit code 2, warnings, and the Prefect API a command talks to."""
from __future__ import annotations

from typing import Optional

import typer
from rich.console import Console, ConsoleDimensions

PIPE_WIDTH = 10_000


class PipeConsole(Console):
    """A rich console that wraps nothing when its output is not a terminal (a pipe, a file, a CI log),
    where rich would wrap at $COLUMNS or 80 and split commands, URLs and names across lines; on a
    terminal, its real width. Tables then take their natural width."""

    def _size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)
        return size if self.is_terminal else ConsoleDimensions(PIPE_WIDTH, size.height)

    size = property(_size, Console.size.fset)


console = PipeConsole()
err = PipeConsole(stderr=True)


def fail(message: str, code: int = 2) -> None:
    err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def warn(message: Optional[str]) -> None:
    if message:
        err.print(f"[yellow]warning:[/yellow] {message}", highlight=False, soft_wrap=True)


def api_url(explicit: Optional[str]) -> str:
    from mlsys_flows.platform.server import discover_api_url

    url = explicit or discover_api_url()
    if not url:
        fail("no Prefect API: start `mlsys-flows server` (another terminal) or set PREFECT_API_URL")
    return url
