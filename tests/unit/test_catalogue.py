"""The results catalogue: a row per registry system, docs/results.md goes stale
when a committed RunReport changes, and the HTML links only to files it writes."""
from __future__ import annotations

import json
import re
import shutil

import pytest
from typer.testing import CliRunner

from mlsys_flows import registry
from mlsys_flows.docsgen import catalogue, generate
from mlsys_flows.cli import app
from mlsys_flows.systems.common import formatting as fmt

SAMPLE = "recd" if (catalogue.RESULTS / "recd-quick.json").exists() else None


def _report(name: str = None) -> dict:
    name = name or SAMPLE
    if name is None:
        pytest.skip("no committed RunReport yet")
    return json.loads((catalogue.RESULTS / f"{name}-quick.json").read_text())


def test_a_row_per_registry_system():
    rows = catalogue.rows(catalogue.collect(history=False))
    assert [r["system"] for r in rows] == registry.names()
    for spec, row in zip(registry.all_specs(), rows):
        assert row["claim"] == spec.headline.statement
        if (catalogue.RESULTS / f"{spec.name}-quick.json").exists():
            report = json.loads((catalogue.RESULTS / f"{spec.name}-quick.json").read_text())
            assert row["ratio"] == fmt.ratio(report["headline"]["ratio"]) and row["kind"] == report["headline"]["kind"]
            assert row["commit"].startswith(report["environment"]["git_sha"][:8])
    text = catalogue.results_markdown()
    for spec in registry.all_specs():  # docs/results.md: one line per system, linked to its page
        (line,) = [ln for ln in text.splitlines() if ln.startswith(f"| {spec.name} |") or
                   ln.startswith(f"| [{spec.name}](")]
        assert line.startswith(f"| [{spec.name}]({spec.name}.md) |"), line


def test_a_system_without_a_report_is_not_run_yet(tmp_path):
    rows = catalogue.rows(catalogue.collect(tmp_path, history=False))  # an empty results folder
    assert len(rows) == len(registry.names()) and {r["ratio"] for r in rows} == {"not run yet"}


def test_reports_on_a_storage_block_join_the_history_and_the_newest_is_shown(tmp_path):
    from mlsys_flows.blocks import ObjectStorage

    base = _report()
    storage = ObjectStorage(url=(tmp_path / "store").as_uri())
    for i, ratio in enumerate((1.5, 3.25)):
        r = json.loads(json.dumps(base))
        r.update(run_id=f"run-{i}", created_at=f"2030-01-0{i + 1}T00:00:00+00:00")
        r["headline"]["ratio"] = ratio
        storage.write_json(f"reports/{SAMPLE}/run-{i}.json", r)  # where publish_report puts them
    storage.write_json(f"reports/{SAMPLE}/run-0.png.json", {"not": "a report"})  # skipped
    by = catalogue.collect(tmp_path / "empty", storage=storage, history=False)
    assert [f.report["run_id"] for f in by[SAMPLE]] == ["run-0", "run-1"]
    (row,) = [r for r in catalogue.rows(by) if r["system"] == SAMPLE]
    assert row["ratio"] == "3.25x" and row["runs"] == "2"
    page = catalogue.render_pages(by, ["test"])[f"systems/{SAMPLE}.html"]
    assert "History: 2 runs" in page and "1.50x" in page and "3.25x" in page


def test_docs_results_is_generated_and_goes_stale_when_a_committed_report_changes(tmp_path, monkeypatch):
    if SAMPLE is None:
        pytest.skip("no committed RunReport yet")
    assert "docs/results.md" in generate.files()
    results = tmp_path / "results"
    shutil.copytree(catalogue.RESULTS, results)
    monkeypatch.setattr(catalogue, "RESULTS", results)
    for path in generate.files():  # the repository's generated files, as the generator reads them
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        if (generate.REPO / path).exists():
            shutil.copy(generate.REPO / path, tmp_path / path)
    (tmp_path / "docs" / "results.md").write_text(catalogue.results_markdown())
    monkeypatch.setattr(generate, "REPO", tmp_path)
    assert "docs/results.md" not in generate.stale()
    report = json.loads((results / f"{SAMPLE}-quick.json").read_text())
    report["headline"]["ratio"] += 0.5  # a rerun's new number
    (results / f"{SAMPLE}-quick.json").write_text(json.dumps(report))
    assert "docs/results.md" in generate.stale()
    assert generate.write() and "docs/results.md" not in generate.stale()
    assert f"| {report['headline']['ratio']:.2f}x |" in (tmp_path / "docs" / "results.md").read_text()


def test_the_overhead_table_shows_only_when_its_file_exists(tmp_path):
    if SAMPLE:
        shutil.copy(catalogue.RESULTS / f"{SAMPLE}-quick.json", tmp_path)
    by = catalogue.collect(tmp_path, history=False)
    assert "Orchestration overhead" not in catalogue.results_markdown(tmp_path)
    assert "Orchestration overhead" not in catalogue.render_pages(by, ["test"], tmp_path)["index.html"]
    (tmp_path / "overhead.json").write_text(json.dumps({
        "columns": ["flow", "share"], "rows": [{"flow": "cedar", "share": 0.0412, "ignored": 1}],
        "notes": ["measured on 2 cores"]}))
    assert catalogue.collect(tmp_path, history=False) == by  # not read as a RunReport
    md = catalogue.results_markdown(tmp_path)
    assert "## Orchestration overhead" in md and "| cedar | 0.0412 |" in md and "ignored" not in md
    index = catalogue.render_pages(by, ["test"], tmp_path)["index.html"]
    assert '<td>cedar</td><td class="num">0.0412</td>' in index and "measured on 2 cores" in index


def test_pages_link_only_to_files_of_the_catalogue_and_fetch_nothing(tmp_path):
    if SAMPLE is None:
        pytest.skip("no committed RunReport yet")
    shutil.copy(catalogue.RESULTS / f"{SAMPLE}-quick.json", tmp_path)
    index = catalogue.build(tmp_path / "out", results=tmp_path, history=False)
    out = index.parent
    pages = sorted(out.rglob("*.html"))
    assert len(pages) == 1 + len(registry.names())
    for page in pages:
        text = page.read_text()
        assert "http://" not in text and "https://" not in text and "<script" not in text
        for ref in re.findall(r'(?:href|src)="([^"]+)"', text):
            assert (page.parent / ref).resolve().is_file(), (page, ref)
    # broken on purpose: a missing image is seen
    (out / catalogue.image_names(SAMPLE, catalogue.collect(tmp_path, history=False)[SAMPLE])["thumb"]).unlink()
    missing = [ref for ref in re.findall(r'src="([^"]+)"', index.read_text()) if not (out / ref).is_file()]
    assert len(missing) == 1


def test_a_second_catalogue_copies_the_images_the_first_drew(tmp_path, monkeypatch):
    """Images are kept in a cache under a digest of the rendering code: a catalogue built in another
    folder draws nothing, and its images are the first one's, byte for byte."""
    if SAMPLE is None:
        pytest.skip("no committed RunReport yet")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    shutil.copy(catalogue.RESULTS / f"{SAMPLE}-quick.json", tmp_path)
    first = catalogue.build(tmp_path / "one", results=tmp_path, history=False).parent

    def drawn(*_):
        raise AssertionError("drew an image the cache holds")

    for name in ("plot_png", "thumbnail_png", "history_png"):
        monkeypatch.setattr(catalogue, name, drawn)
    second = catalogue.build(tmp_path / "two", results=tmp_path, history=False).parent
    images = sorted(p.relative_to(first) for p in (first / "img").iterdir())
    assert len(images) == 3 and images == sorted(p.relative_to(second) for p in (second / "img").iterdir())
    assert all((first / p).read_bytes() == (second / p).read_bytes() for p in images)
    assert catalogue.image_cache().is_relative_to(tmp_path / "cache")


def test_record_refuses_overrides_before_any_run():
    result = CliRunner().invoke(app, ["bench", "all", "--record", "-p", "seed=1"])
    assert result.exit_code != 0 and "--record" in result.output


def test_bench_all_goes_on_past_a_failing_system_and_names_it(monkeypatch):
    import mlsys_flows.cli as cli
    from mlsys_flows.platform.runner import RunError

    tried = []

    def fail(name, *args, **kwargs):
        tried.append(name)
        raise RunError(f"{name} broke")

    monkeypatch.setattr(cli, "_run_one", fail)
    result = CliRunner().invoke(app, ["bench", "all", "--scale", "smoke"])
    names = registry.names()
    assert tried == names
    assert result.exit_code == 1
    assert f"{len(names)} of {len(names)} systems failed" in result.output and f"{names[-1]} broke" in result.output
