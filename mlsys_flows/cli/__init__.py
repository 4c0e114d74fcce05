"""The ``mlsys-flows`` command line."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from mlsys_flows import registry
# the platform's commands as modules (`from .server import server` would shadow the submodule's name)
from mlsys_flows.cli import (blocks as block_commands, deploy as deploy_commands, reproduce as reproduce_commands,
                             server as server_commands, webhooks as webhook_commands)
from mlsys_flows.cli.console import console, err, fail, run_errors_held, warn
from mlsys_flows.errors import MlsysError
from mlsys_flows.platform.runner import RunError, parse_param, run_system, validate, write_report
from mlsys_flows.systems.common import formatting as fmt
from mlsys_flows.systems.common.environment import quiet_load, too_busy
from mlsys_flows.systems.common.params import SCALES, ParamsError
from mlsys_flows.rendering import SMOKE_NOTE, claim_rows, regime_sentence, v3_cells, verdict_text

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Published ML-systems techniques as Prefect flows: run, benchmark and deploy them.")
app.add_typer(block_commands.blocks_app, name="blocks")

RESULTS = Path("benchmarks/results")


def _check_scale(scale: str) -> str:
    if scale not in SCALES:
        fail(f"--scale must be one of {', '.join(SCALES)} (got {scale!r})")
    return scale


@app.command("list")
def list_systems(as_json: bool = typer.Option(False, "--json", help="Print a JSON list instead of a table."),
                 markdown: bool = typer.Option(False, "--markdown", help="Print a markdown table (README).")) -> None:
    """List every system: family, paper and the paper's headline claim."""
    rows = [s.as_dict() for s in registry.SYSTEMS]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if markdown:
        print(registry.markdown_table())
        return
    if not sys.stdout.isatty():  # piped: one plain line per system, no table wrapping at 80 columns
        for r in rows:
            c = next(c for c in r["claims"] if c["headline"])
            paper = f"paper {c['paper']}x" if c["paper"] else "no paper number"
            print(f"{r['name']}\t{r['family']}\t{c['metric']}: {c['technique']} vs {c['baseline']} "
                  f"({c['better']} is better; {paper})")
        return
    table = Table(title=f"mlsys-flows systems ({len(rows)})")
    for col in ("name", "family", "paper", "headline claim"):
        table.add_column(col, overflow="fold")
    for r in rows:
        c = next(c for c in r["claims"] if c["headline"])
        paper = f"{c['paper']}x" if c["paper"] else "-"
        table.add_row(r["name"], r["family"], r["paper"],
                      f"{c['metric']} {c['technique']} vs {c['baseline']} ({c['better']} is better): paper {paper}")
    console.print(table)


def _run_one(name: str, scale: str, params: list[str], storage: Optional[str], cluster: Optional[str],
             devices: Optional[str] = None, run_key: Optional[str] = None):
    overrides = dict(parse_param(p) for p in params)
    validate(name, scale, overrides)  # before any work: names the bad system or field
    ui = _use_running_server()
    started = time.perf_counter()
    with console.status(f"[bold]running {name}[/bold] at scale {scale} (Prefect flow on Dask)...", spinner="dots"), \
            run_errors_held() as holds:
        try:
            report = run_system(name, scale, overrides, storage=storage, cluster=cluster, devices=devices,
                                run_key=run_key, tags=("cli",))
        except RunError as exc:
            if isinstance(exc.__cause__, MlsysError):  # a clear message of ours: one line, not Prefect's traceback
                for hold in holds:
                    hold.records.clear()
            raise
    console.print(f"{name} finished in {time.perf_counter() - started:.1f} s")
    from mlsys_flows.flows.common import resolve_storage
    from mlsys_flows.tasks.common import report_key

    console.print(f"report: {resolve_storage(storage).url_of(report_key(report))}.json (plot: .png)", highlight=False,
                  soft_wrap=True)
    if ui:
        console.print(f"flow run: {ui}/runs/flow-run/{report.run_id}", highlight=False, soft_wrap=True)
    return report


def _use_running_server() -> str | None:
    """Runs go to the Prefect API of a running `mlsys-flows server` (or PREFECT_API_URL), so they show
    in its UI; else to an embedded temporary API. Says which; returns the UI's URL when there is one."""
    import json as _json

    from mlsys_flows.platform.runner import connect
    from mlsys_flows.platform.server import state_file

    url = connect()  # the embedded API, when started, boots while the flow is imported
    if url is None:
        console.print("Prefect API: embedded, temporary (start `mlsys-flows server` to keep runs in its UI)")
        return None
    ui = None
    if state_file().exists():
        info = _json.loads(state_file().read_text())
        ui = info.get("ui_url") if info.get("api_url") == url else None
    console.print(f"Prefect API: {url}" + (f" (UI {ui})" if ui else ""), highlight=False, soft_wrap=True)
    return ui


# The options `run` and `bench` share: a scripted user runs any system with any parameters either way.
SCALE_OPT = typer.Option("quick", help="smoke | quick | full")
PARAM_OPT = typer.Option([], "--param", "-p", help="Parameter override key=value (repeatable).")
STORAGE_OPT = typer.Option(None, help="Name of a saved ObjectStorage block (reports, checkpoints).")
CLUSTER_OPT = typer.Option(None, help="Name of a saved DaskCluster block (where tasks run).")
DEVICES_OPT = typer.Option(None, help="Name of a saved ResourcePool block (the devices device tasks claim).")


def _print_report(report) -> None:
    console.print(f"[bold]verdict: {verdict_text(report.model_dump(mode='json'))}[/bold] (the strongest deployable "
                  "baseline of this run)", highlight=False, soft_wrap=True)
    table = Table(title=f"{report.title} [{report.scale}]")
    for col in ("comparison", "kind", "baseline", "technique", "ratio", "range", "paper"):
        # a narrow terminal folds a long name onto a second line rather than cutting it ("time_to_logloss_…")
        table.add_column(col, justify="left" if col in ("comparison", "kind") else "right", overflow="fold")
    for name, r in claim_rows(report.model_dump(mode="json")):
        table.add_row(name, r["kind"], *fmt.column(r["metric"], [r["baseline_value"], r["technique_value"]]),
                      f"[bold]{fmt.ratio(r['ratio'])}[/bold]", fmt.ratio_range(r.get("range"), r["kind"]),
                      fmt.ratio(r.get("paper")))
    console.print(table)
    if report.scale == "smoke":
        console.print(SMOKE_NOTE, highlight=False)
    if report.regime is not None:
        console.print(regime_sentence(report).replace("**", ""), highlight=False)
    for note in report.notes:
        console.print(f"- {note}", highlight=False)


def _guard(fn):
    """Turn known user errors into one line on stderr and a non-zero exit, no traceback."""
    try:
        return fn()
    except (registry.UnknownSystem, ParamsError, RunError) as exc:
        fail(str(exc))
    except ValueError as exc:  # e.g. a block's own validation
        fail(str(exc).splitlines()[0])


@app.command()
def run(name: str = typer.Argument(..., help="System name (see `mlsys-flows list`)."),
        scale: str = SCALE_OPT, param: List[str] = PARAM_OPT,
        storage: Optional[str] = STORAGE_OPT, cluster: Optional[str] = CLUSTER_OPT,
        devices: Optional[str] = DEVICES_OPT,
        json_path: Optional[Path] = typer.Option(None, "--json", help="Write the RunReport JSON here."),
        run_key: Optional[str] = typer.Option(None, "--run-key", help="Make training resumable: a rerun with the "
                                              "same key continues from its last complete checkpoint.")) -> None:
    """Run one system's flow and print its report."""
    _check_scale(scale)
    report = _guard(lambda: _run_one(name, scale, param, storage, cluster, devices, run_key))
    _print_report(report)
    if json_path:
        _write_json(json_path, report.model_dump(mode="json"))


def _write_json(path: Path, payload) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))
    console.print(f"wrote {path}")


@app.command()
def bench(name: str = typer.Argument(..., help="System name, or 'all' for every system."),
          scale: str = SCALE_OPT, param: List[str] = PARAM_OPT,
          json_path: Optional[Path] = typer.Option(None, "--json", help="Write the RunReport JSON here "
                                                   "(for 'all': a JSON list of reports)."),
          save: bool = typer.Option(False, "--save", help=f"Also write {RESULTS}/<name>-<scale>.json, the committed "
                                    "results the README and the stale-results test read."),
          record: bool = typer.Option(False, "--record", help="--save, then regenerate docs/results.md (and every "
                                      "generated file) and the HTML catalogue (`mlsys-flows report`)."),
          storage: Optional[str] = STORAGE_OPT, cluster: Optional[str] = CLUSTER_OPT,
          devices: Optional[str] = DEVICES_OPT,
          quiet_wait: float = typer.Option(600.0, "--quiet-wait", help="With --save/--record: seconds to wait, "
                                           "before each system, for the 1-minute load to fall to 0.75 per usable "
                                           "core; a report with measured metrics whose run started above it is not "
                                           "saved.")) -> None:
    """Run systems and compare each headline ratio (with its kind) with the paper's claim."""
    _check_scale(scale)
    names = registry.names() if name == "all" else [name]
    save = save or record
    if save and param:
        fail("--save/--record write the committed results, which are the scale's preset: drop the -p overrides "
              "or use --json")
    sweep_started = time.perf_counter()
    reports, failed = [], {}
    for n in names:
        if save:
            _wait_for_quiet(quiet_wait)
        if len(names) == 1:
            report = _guard(lambda: _run_one(n, scale, param, storage, cluster, devices))
        else:  # a sweep goes on past a failing system and names it at the end
            try:
                report = _run_one(n, scale, param, storage, cluster, devices)
            except Exception as exc:  # noqa: BLE001 - reported below, exit code 1
                failed[n] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                err.print(f"[red]{n} failed:[/red] {failed[n]}", highlight=False, soft_wrap=True)
                continue
        if save and (busy := too_busy(report.model_dump(mode="json"))):
            failed[n] = f"not saved: {busy}"
            err.print(f"[red]{n} not saved:[/red] {busy}", highlight=False, soft_wrap=True)
        elif save:
            write_report(report, RESULTS / f"{n}-{scale}.json")
            console.print(f"saved {RESULTS / f'{n}-{scale}.json'}")
        reports.append(report)
    if json_path:
        payload = [r.model_dump(mode="json") for r in reports]
        _write_json(json_path, payload[0] if name != "all" else payload)
    table = Table(title=f"paper claim vs this run ({scale})")
    for col in ("system", "verdict vs strongest deployable", "metric", "technique vs baseline", "kind", "ratio",
                "range", "paper", "vs strongest", "mechanism alone", "regime"):
        table.add_column(col, overflow="fold")
    for r in reports:
        h, s = r.headline, r.headline.vs_strongest
        v3 = v3_cells(r.model_dump(mode="json"))
        table.add_row(r.system, f"[bold]{verdict_text(r.model_dump(mode='json'))}[/bold]", h.metric,
                      f"{h.technique} vs {h.baseline}", h.kind, fmt.ratio(h.ratio),
                      fmt.ratio_range(h.range, h.kind), fmt.ratio(h.paper),
                      f"{fmt.ratio(s.ratio)} vs {s.baseline}", v3["mechanism"] or "-", v3["regime"] or "-")
    console.print(table)
    took = time.perf_counter() - sweep_started
    console.print(f"{len(reports)} system{'s' if len(reports) != 1 else ''} at {scale} took {took:.0f} s "
                  f"({took / 60:.1f} min) in all")
    if record:
        from mlsys_flows.docsgen import catalogue
        from mlsys_flows.docsgen import generate as gen

        for path in gen.write():
            console.print(f"wrote {path}")
        console.print(f"catalogue: {catalogue.build(catalogue.OUT, results=RESULTS)}", highlight=False)
    if failed:
        fail(f"{len(failed)} of {len(names)} systems failed: " + "; ".join(f"{n} ({why})" for n, why in failed.items()),
              code=1)


QUIET_START_SHARE = 0.7  # of the quiet load: where a saved run may start


def _wait_for_quiet(timeout_s: float) -> None:
    """Before a run whose report will be committed: wait, at most ``timeout_s``, for the machine to be
    quiet (contract v4: measured numbers that partly time other work are not committed)."""
    # a margin under the limit: the run's own start (imports, the flow run's creation) raises the load
    # in the seconds before its report records ``load_before`` (a sweep saw 1.53 and 1.67 after waiting
    # for 1.5)
    limit = QUIET_START_SHARE * quiet_load()
    deadline = time.monotonic() + timeout_s
    load = os.getloadavg()[0]
    if load <= limit:
        return
    with console.status("", spinner="dots") as status:
        while load > limit and time.monotonic() < deadline:
            status.update(f"waiting for the 1-minute load ({load:.2f}) to fall to {limit:g} before a saved run "
                          f"({deadline - time.monotonic():.0f} s left of --quiet-wait)")
            time.sleep(5)
            load = os.getloadavg()[0]
    if load > limit:
        warn(f"the 1-minute load is still {load:.2f} (quiet: {limit:g}) after --quiet-wait {timeout_s:g} s: "
             "running anyway; a report with measured metrics will not be saved")


@app.command()
def report(storage: Optional[str] = typer.Option(None, help="Also read the RunReports on this ObjectStorage block "
                                                 "(name, or a file:// URL) under reports/<system>/<run_id>.json, "
                                                 "where every run publishes its report; default: the storage runs "
                                                 "use when none is named (MLSYS_FLOWS_HOME/storage)."),
           out: Path = typer.Option(Path("build/catalogue"), help="Folder of the catalogue (index.html, "
                                    "systems/, img/).")) -> None:
    """Build the static HTML results catalogue: every system's claim beside its runs, a page per
    system with its report and history. Opens from a file, no server and no network."""
    from mlsys_flows.docsgen import catalogue

    store = None
    if storage:
        from mlsys_flows.platform.runner import connect

        connect(embedded="://" not in storage)  # a block name is read from the API `run` uses: the running server
        from mlsys_flows.blocks import ObjectStorage
        from mlsys_flows.platform.runner import _load_block

        try:
            store = ObjectStorage(url=storage) if "://" in storage else _load_block(ObjectStorage, storage, "--storage")
        except RunError as exc:
            fail(str(exc))
        except ValueError as exc:  # the block's own validation (pydantic): its first message
            fail(f"--storage {storage!r}: " + (exc.errors()[0]["msg"] if hasattr(exc, "errors") else str(exc)))
    else:  # the user's own runs: those that named no storage published here
        from mlsys_flows.blocks import ObjectStorage
        from mlsys_flows.settings import default_storage_url

        default = ObjectStorage(url=default_storage_url())
        if default.list("reports/"):
            store = default
            console.print(f"with your runs' reports from {default.root_url} (another: --storage)", highlight=False,
                          soft_wrap=True)
    with console.status("[bold]building the catalogue[/bold] (plots with matplotlib)...", spinner="dots"):
        index = catalogue.build(out, storage=store)
    console.print(f"wrote {index} (open file://{index.resolve()})", highlight=False, soft_wrap=True)


@app.command()
def generate(check: bool = typer.Option(False, "--check", help="Write nothing; fail if a generated file is stale.")) -> None:
    """Rewrite every generated file (README tables, docs results blocks, docs/results.md, docs/limits.md,
    prefect.yaml, infra/work-pools templates) from the registry and the committed RunReports."""
    from mlsys_flows.docsgen import generate as gen

    if check:
        stale = gen.stale()
        if stale:
            fail("stale generated files (run `mlsys-flows generate`): " + ", ".join(stale))
        console.print(f"{len(gen.files())} generated files are current")
        return
    written = gen.write()
    console.print("\n".join(f"wrote {p}" for p in written) or "every generated file is current")


app.command()(server_commands.server)
app.command()(deploy_commands.deploy)
app.command()(reproduce_commands.reproduce)
app.add_typer(webhook_commands.webhooks_app, name="webhooks")


def main() -> None:
    from mlsys_flows.platform.procs import stop_on_signals

    stop_on_signals()  # Ctrl-C and SIGTERM stop any command, however it was started
    app()


if __name__ == "__main__":
    sys.exit(main())
