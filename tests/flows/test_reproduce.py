"""`mlsys-flows reproduce REPORT.json` (issue 52 item 8): a report's system rerun with its recorded
parameters, seed and scale; each comparison of both runs side by side with whether the verdicts agree;
a report made by other code refused with one line unless asked."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mlsys_flows.cli import app
from mlsys_flows.platform.reproduce import ReproduceError, compare, load

SYSTEM = "atlas"  # a short smoke run whose verdicts are exact (counted)


@pytest.fixture(scope="module")
def user_home(tmp_path_factory):
    """A user's MLSYS_FLOWS_HOME for the module: runs that name no storage publish under its storage/."""
    home = tmp_path_factory.mktemp("user-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLSYS_FLOWS_HOME", str(home))
        yield home


@pytest.fixture(scope="module")
def smoke_report(user_home):
    from mlsys_flows.platform.runner import run_system

    path = user_home / f"{SYSTEM}-smoke.json"
    report = run_system(SYSTEM, "smoke", {"seed": 3})  # the default storage: the user's home
    path.write_text(json.dumps(report.model_dump(mode="json")))
    return path


def test_the_catalogue_shows_the_users_own_runs_by_default(smoke_report, user_home):
    """Issue 52 item 5: `mlsys-flows report` with no --storage includes the runs of the default storage."""
    run_id = json.loads(smoke_report.read_text())["run_id"]
    out = user_home / "catalogue"
    result = CliRunner().invoke(app, ["report", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "with your runs' reports from" in result.output
    pages = " ".join(p.read_text() for p in out.rglob("*.html"))
    assert run_id[:8] in pages


def test_a_rerun_of_a_report_agrees_with_it(smoke_report):
    result = CliRunner().invoke(app, ["reproduce", str(smoke_report)])
    assert result.exit_code == 0, result.output
    assert "seed 3" in result.output and "verdicts agree" in result.output
    rows = compare(json.loads(smoke_report.read_text()), json.loads(smoke_report.read_text()))
    assert f"{len(rows)} of {len(rows)} verdicts agree" in result.output


def test_a_report_of_other_code_is_refused_in_one_line(smoke_report, tmp_path):
    report = json.loads(smoke_report.read_text())
    report["environment"]["code_hash"] = "0" * 64
    other = tmp_path / "other.json"
    other.write_text(json.dumps(report))
    result = CliRunner().invoke(app, ["reproduce", str(other)])
    assert result.exit_code == 2, result.output
    assert "other code" in result.output and "--other-code" in result.output
    assert "Traceback" not in result.output and "running" not in result.output


@pytest.mark.parametrize("content,match", [("not json", "not a JSON RunReport"), ("{}", "not a RunReport"),
                                           ('{"system": "nope", "scale": "smoke", "parameters": {}, "headline": {}, '
                                            '"environment": {}}', "is not one of")])
def test_what_is_not_a_report_is_named(tmp_path, content, match):
    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(ReproduceError, match=match):
        load(path)


def test_a_verdict_that_flips_does_not_agree(smoke_report):
    recorded = json.loads(smoke_report.read_text())
    flipped = json.loads(smoke_report.read_text())
    h = flipped["headline"]
    h["verdict"] = {**h["verdict"], "outcome": {"wins": "loses"}.get(h["verdict"]["outcome"], "wins")}
    rows = compare(recorded, flipped)
    head = next(r for r in rows if r.comparison.startswith(f"{h['metric']}: {h['technique']} vs {h['baseline']}"))
    assert not head.agree and sum(not r.agree for r in rows) == 1
    assert all(r.agree for r in compare(recorded, recorded))
