"""The contract's sources stay single: a paper's number lives only in its spec, and a committed
result was made by the code committed with it."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from mlsys_flows import registry
from mlsys_flows.systems.common.environment import code_hash, too_busy
from mlsys_flows.systems.common.spec import ASSUMED

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
IMPLEMENTED = registry.names()


def _paper_values() -> set[float]:
    return {c.paper for s in registry.SYSTEMS for c in s.claims if c.paper is not None}


def paper_numbers_in(source: str, values: set[float]) -> list[tuple[int, float]]:
    """Numeric literals equal to a paper value, or to the fraction behind one (0.85 for 1/(1-0.85)).
    Small integers and subscripts (``digest[:12]``) are left out: they are counts and indices far
    more often than claims."""
    tree = ast.parse(source)
    indices = {id(n) for sub in ast.walk(tree) if isinstance(sub, ast.Subscript) for n in ast.walk(sub.slice)}
    hits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or isinstance(node.value, bool) \
                or not isinstance(node.value, (int, float)) or id(node) in indices:
            continue
        x = float(node.value)
        if isinstance(node.value, int) and x < 10:
            continue
        for v in values:
            if abs(x - v) < 1e-9 or (0 < x < 1 and abs(1 / (1 - x) - v) < 5e-3):
                hits.append((node.lineno, node.value))
    return hits


def test_no_paper_number_in_flows_or_tasks():
    values = _paper_values()
    found = {f"{p.relative_to(ROOT)}:{line}": v
             for layer in ("flows", "tasks") for p in sorted((ROOT / layer).glob("*.py"))
             for line, v in paper_numbers_in(p.read_text(), values)}
    assert not found, f"paper numbers belong in the system's SPEC claims, not in flows/tasks: {found}"


@pytest.mark.parametrize("source,hit", [
    ("ratio(v, 'bytes', 'a', 'b', 'lower', 3.71)", 3.71),                  # typed-in claim
    ("paper = round(1 / (1 - 0.85), 2)", 0.85),                           # the fraction behind 6.67
    ("Claim('x', 'a', 'b', 'lower', 87)", 87),
])
def test_the_paper_number_check_catches_a_typed_in_claim(source, hit):
    assert [v for _, v in paper_numbers_in(source, _paper_values())] == [hit]


def test_the_paper_number_check_ignores_ordinary_constants():
    assert paper_numbers_in("x = 1e3 * n / 2; k = 6; y = [0.5, 100.0]; z = digest[:12]", _paper_values()) == []


@pytest.mark.parametrize("name", IMPLEMENTED)
def test_committed_quick_result_was_made_by_the_current_code(name):
    """Results are regenerated, never edited: `mlsys-flows bench NAME --scale quick --save` after any change
    to systems/NAME, tasks/NAME.py, flows/NAME.py (or a family package they use)."""
    path = RESULTS / f"{name}-quick.json"
    assert path.exists(), f"no committed result: run `mlsys-flows bench {name} --scale quick --save`"
    report = json.loads(path.read_text())
    assert report["environment"].get("code_hash") == code_hash(name), \
        f"{path.name} was made by other code than this; regenerate: mlsys-flows bench {name} --scale quick --save"


def _extra_reports() -> list:
    """Committed RunReports of a system run with other parameters (``<name>-<stem>.json``, quoted by its
    page through ``@<name>-<stem>:`` spans); other JSON files there are not RunReports."""
    out = []
    for path in sorted(RESULTS.glob("*.json")):
        report = json.loads(path.read_text())
        name = report.get("system") if isinstance(report, dict) else None
        if name in IMPLEMENTED and path.name != f"{name}-{report.get('scale')}.json" and "environment" in report:
            out.append(pytest.param(name, path.name, id=path.stem))
    return out


@pytest.mark.parametrize("name,file", _extra_reports())
def test_other_committed_reports_were_made_by_the_current_code(name, file):
    report = json.loads((RESULTS / file).read_text())
    assert report["environment"].get("code_hash") == code_hash(name), \
        f"{file} was made by other code than this; rerun it with the parameters its notes record"


@pytest.mark.parametrize("name", IMPLEMENTED)
def test_committed_quick_result_meets_the_contract(name):
    report = json.loads((RESULTS / f"{name}-quick.json").read_text())
    spec = registry.get(name)
    h = report["headline"]
    assert report["scale"] == "quick" and report["parameters"]["repeats"] >= 3
    assert (h["metric"], h["baseline"], h["technique"], h["paper"]) == \
        (spec.headline.metric, spec.headline.baseline, spec.headline.technique, spec.headline.paper)
    assert h["vs_strongest"]["baseline"] in spec.baselines
    for r in [h, *report["ratios"]]:
        assert r["kind"] == report["metric_kinds"][r["metric"]]
        assert r["kind"] not in ASSUMED or r["assumptions"], r["metric"]
    # every timed metric keeps its samples: the headline's two variants one per repeat; another variant
    # may be timed fewer times (an ablation run once to save time: its ratio then shows no range)
    for variant, metrics in report["variants"].items():
        for metric in metrics:
            if report["metric_kinds"][metric] == "measured" and metric in report["samples"].get(variant, {}):
                n = len(report["samples"][variant][metric])
                # adaptive repeats (contract v4): the headline's pair ran as many repeats as the report says
                # (or one per evaluated seed where the headline pairs by seed: recd's eval_seeds, era's seeds)
                repeats = (report.get("repeats") or {}).get("repeats") or report["parameters"]["repeats"]
                seeds = report["parameters"].get("eval_seeds") or report["parameters"].get("seeds")
                assert n >= 1 and (n in (repeats, report["parameters"]["repeats"], seeds) or
                                   variant not in (h["baseline"], h["technique"])), (variant, metric, n)
    if h["kind"] == "measured":
        assert h["range"] is not None and h["repeats"] >= 3
    env = report["environment"]
    assert env["git_dirty"] is not None and env["load_before"] and env["load_after"] and env["harness_hash"]


@pytest.mark.parametrize("name", ["moetuner", "swiftmoe", "flexshard"])
def test_headlines_built_on_models_or_counts_are_not_called_measured(name):
    report = json.loads((RESULTS / f"{name}-quick.json").read_text())
    assert report["headline"]["kind"] != "measured"


def repeated_without_rerunning(report: dict) -> list[str]:
    """Measured metrics whose repeats are bit-identical non-integers: the repeats were not run again
    (an identical task call in one flow run is answered from its persisted result). Zeros and whole
    numbers (no stall, a step count) can honestly repeat."""
    kinds = report["metric_kinds"]
    return sorted(f"{variant}.{metric}" for variant, metrics in report["samples"].items()
                  for metric, values in metrics.items()
                  if kinds.get(metric) == "measured" and len(values) > 1 and len(set(values)) == 1
                  and values[0] != int(values[0]))


def test_repeat_check_catches_a_cached_repeat():
    report = {"metric_kinds": {"t": "measured", "n": "measured"},
              "samples": {"a": {"t": [1.25, 1.25, 1.25], "n": [14.0, 14.0]}, "b": {"t": [1.25, 1.5]}}}
    assert repeated_without_rerunning(report) == ["a.t"]


@pytest.mark.parametrize("name", IMPLEMENTED)
def test_committed_repeats_were_really_run(name):
    path = RESULTS / f"{name}-quick.json"
    if not path.exists():
        pytest.skip(f"no committed quick result for {name}")
    assert not repeated_without_rerunning(json.loads(path.read_text()))


def test_dirty_code_leaves_out_results_and_generated_outputs():
    from mlsys_flows.systems.common.environment import dirty_code

    status = " M benchmarks/results/dsi-quick.json\n M docs/dsi.md\n M README.md\n M prefect.yaml\n" \
             " M systems/dsi/loader.py\nR  flows/a.py -> flows/b.py\n"
    assert dirty_code(status) == ["flows/b.py", "systems/dsi/loader.py"]
    assert dirty_code(" M benchmarks/results/dsi-quick.json\n M docs/results.md\n") == []


# Committed reports written before `dirty_files` existed: their `git_dirty` also counted results and
# generated files that an earlier system of the same sweep had just written, so it says little. They are
# replaced system by system as each is rerun; this set may only shrink.
BEFORE_DIRTY_FILES: set[str] = set()  # every committed quick result now records its dirty files


@pytest.mark.parametrize("name", IMPLEMENTED)
def test_committed_quick_result_ran_committed_code(name):
    """A committed result's code is its commit's: `git_dirty` false, no changed code file. Commit the
    code first, then `mlsys-flows bench NAME --scale quick --save`, then commit the result."""
    env = json.loads((RESULTS / f"{name}-quick.json").read_text())["environment"]
    if name in BEFORE_DIRTY_FILES:
        assert "dirty_files" not in env, f"{name}-quick.json was rerun: take it off BEFORE_DIRTY_FILES"
        return
    assert env.get("dirty_files") == [] and env["git_dirty"] is False, \
        f"{name}-quick.json ran uncommitted code: {env.get('dirty_files', 'no dirty_files recorded')}"


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*-quick.json")),
                         ids=lambda p: p.stem)
def test_committed_measured_results_started_on_a_quiet_machine(path):
    """Contract v4 (issue 43 item 5): a committed report with measured metrics started at a 1-minute
    load of at most 0.75 per usable core; `bench --save` waits for that and refuses otherwise."""
    why = too_busy(json.loads(path.read_text()))
    assert why is None, f"{path.name}: {why}; rerun it alone on the machine"


def test_a_busy_start_is_refused_only_for_measured_metrics():
    report = {"metric_kinds": {"throughput": "measured", "items": "counted"},
              "environment": {"load_before": [1.6, 1.2, 1.0], "usable_cores": 2}}
    assert "1.6" in too_busy(report) and "throughput" in too_busy(report)
    assert too_busy({**report, "environment": {"load_before": [1.5, 2.0, 2.0], "usable_cores": 2}}) is None
    assert too_busy({**report, "metric_kinds": {"items": "counted"}}) is None
