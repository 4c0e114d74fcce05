"""What a user reads: numbers with units and no scientific notation or float noise, each comparison
once, smoke runs labelled, and command output that survives a pipe (no wrapped commands, no
names split mid-word) with a narrow $COLUMNS; the embedded Dask cluster leaves port 8787 alone."""
from __future__ import annotations

import io
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hypothesis import given, strategies as st
from rich.console import Console

from mlsys_flows import registry
from mlsys_flows.docsgen import catalogue
from mlsys_flows.cli.deploy import print_deployed
from mlsys_flows.cli.webhooks import print_serving
from mlsys_flows.systems.common import formatting as fmt
from mlsys_flows.rendering import SMOKE_NOTE, claim_rows, summary_markdown, table_description, table_rows
from mlsys_flows.systems.common.runreport import RunReport

SCIENTIFIC = re.compile(r"\d(\.\d+)?e[+-]?\d", re.I)
HOTLINE = catalogue.RESULTS / "hotline-quick.json"


def _committed() -> list[dict]:
    return [f.report for f in catalogue.committed()]


@pytest.mark.parametrize("name,value,text", [
    ("samples_per_s", 34890.2, "34,890 samples/s"), ("time_to_logloss_s", 1.6623, "1.662 s"),
    ("step_ms", 0.0482, "48.2 \u00b5s"), ("iter_time_s", 0.1506, "150.6 ms"), ("comm_bytes", 234863264.0, "234.9 MB"),
    ("checkpoint_mb", 201.434307, "201.4 MB"), ("copy_gb_s", 0.9036, "903.6 MB/s"), ("slow_tier_share", 0.08545, "8.545%"),
    ("memory_vs_rowwise", 1.049992, "1.05x"), ("hbm_gib", 32.0, "32 GiB"), ("rows_gathered", 267928.0, "267,928"),
    ("ilp2_bound", 181080.99999999997, "181,081"), ("test_auc", 0.7432204, "0.7432"), ("sync_bytes", 0.0, "0 B"),
    ("cost", 4.48951e-07, "0.000000449"), ("no_unit_named", 3.489e4, "34,890")])
def test_a_metric_prints_with_the_unit_its_name_carries(name, value, text):
    assert fmt.metric(name, value) == text


def test_float_noise_rounds_to_zero_at_its_column_scale():
    # hotline's logloss_gap at smoke: identical runs differ by float rounding only
    assert fmt.column("logloss_gap", [0.0, -5.8e-4, -1.836e-10, 3.917e-10]) == ["0", "-0.00058", "0", "0"]
    assert fmt.column("time_to_logloss_s", [1.5, 1e-10]) == ["1.5 s", "0 s"]
    assert fmt.metric("logloss_gap", 2e-6) == "0.000002"  # not noise: above 1e-9


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e15, max_value=1e15))
def test_no_number_is_ever_in_scientific_notation_and_each_keeps_4_digits(x):
    text = fmt.number(x)
    assert not SCIENTIFIC.search(text) and "e" not in text
    assert float(text.replace(",", "")) == pytest.approx(x, rel=1e-3, abs=1e-300)


def test_no_cell_of_any_committed_report_is_in_scientific_notation():
    reports = _committed()
    if not reports:
        pytest.skip("no committed RunReport")
    for r in reports:
        report = RunReport.model_validate(r)
        cells = [v for row in table_rows(report) for v in row.values()]
        md = summary_markdown(report)
        table_lines = [ln for ln in md.splitlines() if ln.startswith("|")]
        assert not [c for c in cells if SCIENTIFIC.search(c)], r["system"]
        assert not [ln for ln in table_lines if SCIENTIFIC.search(ln.replace(r["run_id"], ""))], r["system"]


def test_each_comparison_shows_once_the_strongest_baseline_merged_into_its_claim():
    if not HOTLINE.exists():
        pytest.skip("no committed hotline report")
    report = json.loads(HOTLINE.read_text())
    # which baseline is strongest follows the run's timings: make it fae, whose comparison is also a claim
    fae = next(r for r in report["ratios"] if (r["metric"], r["baseline"]) == ("samples_per_s", "fae"))
    report["headline"]["vs_strongest"] = {**fae, "statement": report["headline"]["vs_strongest"]["statement"]}
    names = [name for name, _ in claim_rows(report)]
    vs_fae = [n for n in names if n.startswith("samples_per_s: hotline vs fae")]  # a claim and the strongest
    assert vs_fae == ["samples_per_s: hotline vs fae, the strongest deployable baseline"]
    assert names[0] == "samples_per_s: hotline vs hybrid (headline)" and len(set(names)) == len(names)
    page = catalogue.render_pages(catalogue.collect(history=False), ["test"])["systems/hotline.html"]
    assert page.count("samples_per_s: hotline vs fae".replace("_", "_<wbr>")) == 1


def test_a_smoke_report_says_its_ratios_are_not_measurements_and_why_its_range_is_empty(tmp_path):
    if not HOTLINE.exists():
        pytest.skip("no committed hotline report")
    r = json.loads(HOTLINE.read_text())
    r["scale"] = "smoke"
    for ratio in (r["headline"], r["headline"]["vs_strongest"]):
        ratio.update(range=None, repeats=1)
    report = RunReport.model_validate(r)
    assert SMOKE_NOTE in summary_markdown(report) and table_description(report).startswith(SMOKE_NOTE)
    assert table_rows(report)[0]["range"] == fmt.ONE_SAMPLE
    quick = RunReport.model_validate(json.loads(HOTLINE.read_text()))
    assert SMOKE_NOTE not in summary_markdown(quick) + table_description(quick)
    (tmp_path / "hotline-smoke.json").write_text(json.dumps(r))  # the catalogue says so too
    pages = catalogue.render_pages(catalogue.collect(tmp_path, history=False), ["test"])
    assert SMOKE_NOTE in pages["systems/hotline.html"] and "not a measurement" in pages["index.html"]
    assert f'<td class="num">{fmt.ONE_SAMPLE}</td>' in pages["systems/hotline.html"]


def test_wide_variant_tables_are_split_to_fit_a_panel():
    reports = {r["system"]: r for r in _committed()}
    if "placement" not in reports:
        pytest.skip("no committed placement report")
    md = summary_markdown(RunReport.model_validate(reports["placement"]))  # 63 variants, 5 metrics
    header = [ln for ln in md.splitlines() if ln.startswith("| variant |")]
    assert header and all(ln.count("|") <= 8 for ln in header)


# ----- output through a pipe ----------------------------------------------------------------------
NARROW = {"COLUMNS": "40"}


def _lines(capsys) -> list[str]:
    return capsys.readouterr().out.splitlines()


def test_piped_list_prints_a_whole_line_per_system():
    cli = Path(sys.executable).parent / "mlsys-flows"  # the installed command, its stdout a pipe
    done = subprocess.run([str(cli), "list"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **NARROW}, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for spec in registry.all_specs():
        (line,) = [ln for ln in lines if ln.startswith(f"{spec.name}\t")]
        assert f"{spec.headline.metric}: {spec.headline.technique} vs {spec.headline.baseline}" in line


def test_piped_report_table_keeps_every_comparison_whole(capsys, monkeypatch):
    if not HOTLINE.exists():
        pytest.skip("no committed hotline report")
    from mlsys_flows import cli

    monkeypatch.setenv("COLUMNS", "40")
    report = RunReport.model_validate(json.loads(HOTLINE.read_text()))
    cli._print_report(report)
    out = _lines(capsys)
    for name, r in claim_rows(report.model_dump(mode="json")):
        assert any(name in ln and fmt.ratio(r["ratio"]) in ln for ln in out), name
    for note in report.notes:
        assert f"- {note}" in out  # one line each: nothing wraps


def test_piped_deploy_suggestion_is_one_pasteable_command(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    url, names = "http://127.0.0.1:4200/api", ["hotline/hotline", "slipstream/slipstream"]
    print_deployed(names, url)
    out = _lines(capsys)
    assert len(out) == len(names)
    for name, line in zip(names, out):
        command = shlex.split(line.split("(run: ", 1)[1].rstrip(")"))
        assert command[0] == f"PREFECT_API_URL={url}" and command[2:5] == ["deployment", "run", name]
    # the test can fail: a plain rich console at this width breaks the same line
    plain = Console(file=io.StringIO(), width=40)
    plain.print(f"deployed {names[0]}  (run: PREFECT_API_URL={url} prefect deployment run {names[0]})")
    assert len(plain.file.getvalue().splitlines()) > 1


def test_piped_webhooks_serve_lines_keep_every_hook_name_whole(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    hooks = registry.names()
    print_serving(hooks, "127.0.0.1", 8765, "http://127.0.0.1:4200/api")
    out = _lines(capsys)
    assert [ln.split("/hooks/")[1] for ln in out[1:]] == hooks and len(out) == 1 + len(hooks)


# ----- the embedded Dask cluster ------------------------------------------------------------------
def test_the_embedded_cluster_does_not_ask_for_port_8787():
    from distributed import LocalCluster

    from mlsys_flows.blocks import DaskCluster

    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 8787))  # held by this test (or already by someone else: the same case)
        holder.listen()
    except OSError:
        pass

    def warned(kwargs) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with LocalCluster(**kwargs):
                pass
        return [str(w.message) for w in caught if "8787" in str(w.message)]

    try:
        _, kwargs = DaskCluster(n_workers=1, processes=False)._cluster_spec()
        assert warned(kwargs) == []
        old = {k: v for k, v in kwargs.items() if k != "scheduler_kwargs"}  # the previous spec: warns
        assert warned(old)
    finally:
        holder.close()


@pytest.mark.parametrize("ours", [True, False])
def test_a_failed_run_prints_prefects_error_records_only_when_the_cli_has_no_clear_message(ours):
    """The CLI holds Prefect's ERROR records while a run goes: dropped when the run failed with one of
    the project's errors (the CLI prints its one line), printed on the way out otherwise (the
    traceback of an unexpected failure is kept). INFO/WARNING records are never held."""
    import logging

    import prefect.main  # noqa: F401 - Prefect's logging set up first (it replaces the root's handlers)
    from prefect.logging.handlers import PrefectConsoleHandler

    from mlsys_flows.cli.console import run_errors_held

    stream = io.StringIO()
    handler = PrefectConsoleHandler(stream=stream)
    root, logger = logging.getLogger(), logging.getLogger("prefect.mlsys-test")
    root.addHandler(handler)
    try:
        with run_errors_held() as holds:
            logger.warning("a warning goes out live")
            logger.error("Encountered exception during execution")
            assert "a warning" in stream.getvalue() and "Encountered" not in stream.getvalue()
            if ours:
                for hold in holds:
                    hold.records.clear()
    finally:
        root.removeHandler(handler)
    assert ("Encountered exception" in stream.getvalue()) is not ours
    assert not handler.filters  # the hold is taken off the handler


def test_a_saved_bench_run_waits_for_a_quiet_machine(monkeypatch, capsys):
    """`bench --save` waits (bounded by --quiet-wait) for the 1-minute load to fall to 0.75 per usable
    core, less a margin for the run's own start, before each system; past the bound it warns and runs
    (the report is refused if measured)."""
    import mlsys_flows.cli as cli

    loads = iter([1.9, 1.4, 1.0])  # 1.4 is under the limit (1.5) but leaves no margin for the start
    monkeypatch.setattr(cli.os, "getloadavg", lambda: (next(loads), 1.0, 1.0))
    monkeypatch.setattr(cli.time, "sleep", lambda s: None)
    monkeypatch.setattr(cli, "quiet_load", lambda: 1.5)
    cli._wait_for_quiet(600)
    assert next(loads, None) is None  # polled until the load fell
    monkeypatch.setattr(cli.os, "getloadavg", lambda: (3.0, 3.0, 3.0))
    cli._wait_for_quiet(0)
    assert "still 3.00" in capsys.readouterr().err
