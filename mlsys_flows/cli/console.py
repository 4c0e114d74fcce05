"""What every command of the CLI shares: consoles that do not wrap in a pipe, one-line errors with
exit code 2, warnings, and the Prefect API a command talks to."""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator, Optional

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


class HeldErrors(logging.Filter):
    """Prefect's ERROR records (a failed task's or flow's traceback), held back from one console
    handler while a run goes; INFO and WARNING records pass live."""

    def __init__(self, handler: logging.Handler):
        super().__init__()
        self.handler, self.records = handler, []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.name.startswith("prefect"):
            self.records.append(record)
            return False
        return True


@contextmanager
def run_errors_held() -> Iterator[list[HeldErrors]]:
    """The CLI owns the console when a run fails: Prefect's ERROR records wait until the run ends.
    The caller empties each hold's ``records`` when the run failed with one of the project's own
    errors, whose message the CLI prints as one line; whatever is left is printed on the way out
    (an unexpected failure keeps its traceback). The API's log handler is not touched: the UI keeps
    every record."""
    import prefect.main  # noqa: F401 - sets up Prefect's logging: the console handler held here

    holds = [HeldErrors(h) for h in logging.getLogger().handlers
             if type(h).__name__ == "PrefectConsoleHandler"]
    for hold in holds:
        hold.handler.addFilter(hold)
    try:
        yield holds
    finally:
        for hold in holds:
            hold.handler.removeFilter(hold)
            for record in hold.records:
                hold.handler.handle(record)


def warn(message: Optional[str]) -> None:
    if message:
        err.print(f"[yellow]warning:[/yellow] {message}", highlight=False, soft_wrap=True)


def api_url(explicit: Optional[str]) -> str:
    from mlsys_flows.platform.server import discover_api_url

    url = explicit or discover_api_url()
    if not url:
        fail("no Prefect API: start `mlsys-flows server` (another terminal) or set PREFECT_API_URL")
    return url
