"""A number in a system page's prose comes from the committed report (a generated block or an inline
run span that `mlsys-flows generate` fills) or is the paper's; anything else fails (issue 29 item 6)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlsys_flows import registry
from mlsys_flows.docsgen import docnumbers

ROOT = Path(__file__).resolve().parents[2]
REPORT = {"run_id": "abcdef0123456789", "headline": {"ratio": 1.1349, "vs_strongest": {"baseline": "greedy"}},
          "ratios": [{"baseline": "greedy", "ratio": 1.5}, {"baseline": "local_search", "ratio": 1.25}],
          "regime": {"points": [{"value": 2.0, "ratio": 1.0}, {"value": 6.0, "ratio": 1.12}], "crossover": None}}


def test_a_span_is_filled_from_the_report_and_refilled_when_it_changes():
    text = "wins by <!-- run:headline.ratio {:.2f}x -->9.99x<!-- /run --> vs <!-- run:headline.vs_strongest.baseline -->" \
           "?<!-- /run -->, <!-- run:regime.points[value=6].ratio {:.3f} -->0<!-- /run --> at k=6"
    out = docnumbers.render(text, REPORT)
    assert "-->1.13x<!--" in out and "-->greedy<!--" in out and "-->1.120<!--" in out
    assert docnumbers.render(out, REPORT) == out  # rendering is idempotent
    assert docnumbers.resolve(REPORT, "ratios[1].ratio") == 1.25
    assert docnumbers.resolve(REPORT, "ratios[baseline=local_search].ratio") == 1.25
    assert docnumbers.resolve(REPORT, "regime.crossover") is None


@pytest.mark.parametrize("path", ["headline.nope", "ratios[7].ratio", "ratios[baseline=none].ratio", "headline..ratio"])
def test_a_span_whose_path_does_not_resolve_fails_naming_it(path):
    with pytest.raises(docnumbers.SpanError, match="nothing at|cannot read"):
        docnumbers.render(f"<!-- run:{path} -->x<!-- /run -->", REPORT)


def test_a_span_reads_another_committed_report_of_its_system(tmp_path):
    (tmp_path / "demo-quick.json").write_text(json.dumps(REPORT))
    (tmp_path / "demo-minilm.json").write_text(json.dumps({"headline": {"ratio": 2.345}}))
    (tmp_path / "other-minilm.json").write_text(json.dumps({"headline": {"ratio": 9.0}}))
    text = "<!-- run:headline.ratio {:.2f}x -->?<!-- /run --> and <!-- run:@demo-minilm:headline.ratio {:.2f}x -->?<!-- /run -->"
    out = docnumbers.render_page("demo", text, tmp_path)
    assert "-->1.13x<!--" in out and "-->2.35x<!--" in out
    for stem in ("demo-absent", "other-minilm"):  # missing, or another system's
        with pytest.raises(docnumbers.SpanError, match=f"no committed report {stem}.json"):
            docnumbers.render_page("demo", f"<!-- run:@{stem}:headline.ratio -->?<!-- /run -->", tmp_path)


def test_a_span_without_a_committed_report_fails():
    with pytest.raises(docnumbers.SpanError, match="no committed quick report"):
        docnumbers.render("<!-- run:headline.ratio -->x<!-- /run -->", None, "docs/demo.md")


def test_the_checker_finds_run_numbers_and_leaves_the_papers_and_generated_ones():
    page = "\n\n".join([
        "## The paper's claim\nIt is 2.48x faster.",                          # the paper's section
        "## What is built\nThe paper reports 1.17x on ResNet-50.",             # cites the paper
        "Here the DP wins by 1.13x.",                                           # a run's number: flagged
        "In the committed quick run the DP took 4 steps.",                     # run words and a number: flagged
        "It wins by <!-- run:headline.ratio {:.2f}x -->1.13x<!-- /run -->.",   # a span
        "<!-- results:start -->\n| a | 1.13x |\n<!-- results:end -->",         # the generated block
        "A batch of 64 rows.",                                                   # a parameter, not a run's
        "| stage | run | ratio |\n|---|---|---|\n| v1 | `0badc0de` | 2.26x |\n| now | `abcdef01` | 1.13x |",
    ])
    found = docnumbers.unmarked(page, current_run=REPORT["run_id"])
    assert found == ["Here the DP wins by 1.13x.", "In the committed quick run the DP took 4 steps.",
                     "| now | `abcdef01` | 1.13x |"]  # the history row of an older run is a record of that run


@pytest.mark.parametrize("name", registry.names())
def test_prose_numbers_are_generated_or_the_papers(name):
    """Quote a committed run's number through a span (`<!-- run:PATH FORMAT -->...<!-- /run -->`, filled
    by `mlsys-flows generate`), cite the paper, or say it without the number."""
    report = json.loads((ROOT / "benchmarks" / "results" / f"{name}-quick.json").read_text())
    found = docnumbers.unmarked((ROOT / "docs" / f"{name}.md").read_text(), report["run_id"])
    assert not found, f"docs/{name}.md quotes numbers no report backs:\n" + "\n".join(found)


@pytest.mark.parametrize("name", registry.names())
def test_the_results_header_counts_the_headlines_own_samples(name):
    """Not the `repeats` parameter: a counted headline from one seed says so (issue 29 item 5)."""
    from mlsys_flows.docsgen import readme

    n = json.loads((ROOT / "benchmarks" / "results" / f"{name}-quick.json").read_text())["headline"]["repeats"]
    block = readme.system_results(name)
    assert (f"headline over {n} samples" if n != 1 else "headline over 1 sample (no range)") in block


def test_an_undefined_ratio_prints_a_dash_not_nan(tmp_path):
    """A ratio of 0 vs 0 is NaN in the report's JSON: the docs' tables print "-", never "nanx" or "nan-nanx"."""
    import math

    from mlsys_flows.docsgen import readme
    from mlsys_flows.systems.common import formatting as fmt

    nan = float("nan")
    assert fmt.ratio(nan) == "-" and fmt.ratio_range((nan, nan), "counted") == "-"
    assert fmt.ratio(None) == "n/a" and fmt.ratio(1.5) == "1.50x" and fmt.ratio_range((0.98, 1.03)) == "0.98-1.03x"
    r = json.loads((ROOT / "benchmarks" / "results" / "embodiedbench-quick.json").read_text())
    h = r["headline"]
    for x in (h, h["vs_strongest"], *r["ratios"]):
        x["ratio"], x["range"] = nan, [nan, nan]
    for p in (r.get("regime") or {}).get("points", []):
        p["ratio"] = nan
    (tmp_path / "embodiedbench-quick.json").write_text(json.dumps(r))
    block = readme.system_results("embodiedbench", tmp_path)
    table = [line for line in block.splitlines() if line.startswith("|")]
    assert table and not any("nan" in line.lower() for line in table) and "| - | - |" in block
    assert math.isnan(json.loads((tmp_path / "embodiedbench-quick.json").read_text())["headline"]["ratio"])
