import json
import re
from pathlib import Path

from typer.testing import CliRunner

from mlsys_flows import registry
from mlsys_flows.cli import app

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]


def test_registry_lists_every_system_once():
    names = [s.name for s in registry.SYSTEMS]
    assert len(names) == len(set(names)) == 27  # the 26 papers plus asynchronous checkpoints (related work of ReCycle)
    for s in registry.SYSTEMS:
        assert re.fullmatch(r"[a-z][a-z0-9]*", s.name)
        assert sum(c.headline for c in s.claims) == 1 and s.headline.baseline in s.baselines
        for c in s.claims:
            assert c.better in ("higher", "lower") and c.baseline != c.technique
            assert c.paper is None or c.paper > 0


def test_listing_the_catalogue_loads_no_heavy_engine():
    """`mlsys-flows list` stays quick: the specs import neither torch nor prefect nor dask."""
    import subprocess
    import sys

    code = ("import sys; from mlsys_flows import registry; registry.SYSTEMS; "
            "print(sorted(m for m in ('torch', 'prefect', 'dask', 'distributed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_every_system_has_params_and_a_flow():
    for s in registry.all_specs():
        assert (REPO / s.entrypoint.split(":")[0]).is_file(), s.entrypoint
        params = s.params_model()
        assert params.SYSTEM == s.name
        for scale in ("smoke", "quick", "full"):
            params.for_scale(scale)  # every preset validates


def test_cli_list_json():
    out = runner.invoke(app, ["list", "--json"])
    assert out.exit_code == 0
    rows = json.loads(out.stdout)
    assert len(rows) == 27
    for row in rows:
        assert {"name", "family", "paper", "entrypoint", "claims", "baselines"} <= set(row)
        for claim in row["claims"]:
            assert {"metric", "baseline", "technique", "better", "paper", "headline"} <= set(claim)


def test_cli_list_table():
    out = runner.invoke(app, ["list"])
    assert out.exit_code == 0 and "recd" in out.stdout and "swiftmoe" in out.stdout


def _one_line_error(result, *needles):
    assert result.exit_code == 2, result.output
    text = result.output.strip()
    assert "Traceback" not in text and len(text.splitlines()) <= 3, text  # rich may wrap one line
    for needle in needles:
        assert needle in text, text


def test_cli_unknown_system():
    _one_line_error(runner.invoke(app, ["run", "nosuch"]), "unknown system 'nosuch'")


def test_cli_bad_scale():
    _one_line_error(runner.invoke(app, ["bench", "recd", "--scale", "huge"]), "--scale")


def test_cli_bad_param_syntax_and_unknown_param():
    name = registry.names()[0]
    _one_line_error(runner.invoke(app, ["run", name, "--param", "novalue"]), "key=value")
    _one_line_error(runner.invoke(app, ["run", name, "--param", "no_such_param=3"]), "no_such_param")


def test_cli_list_piped_is_one_line_per_system():
    out = runner.invoke(app, ["list"])  # CliRunner's stdout is not a terminal
    lines = out.stdout.strip().splitlines()
    assert out.exit_code == 0 and len(lines) == len(registry.names())
    assert lines[0].startswith("cedar\tinput-data\t") and "paper 2.74x" in lines[0]


def test_cli_webhooks_send_bad_body_is_one_line():
    _one_line_error(runner.invoke(app, ["webhooks", "send", "any", "--body", "not json"]), "--body must be JSON")
