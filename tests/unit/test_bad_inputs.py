"""Bad inputs for every system, through the parameter model and the CLI.

Parametrized over ``registry.names()``: a system is covered as soon as the registry names it. Invalid values come from each model's own limits (``mlsys_flows.docsgen.limits``): wrong types,
zero/negative sizes, values past ``le``/``lt``, unknown keys. The flow path (no task runs,
nothing written) is in tests/flows/test_bad_inputs_flow.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mlsys_flows import registry
from mlsys_flows.cli import app
from mlsys_flows.docsgen.limits import bad_override, field_limits, render_markdown
from mlsys_flows.systems.common.params import ParamsError

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = registry.names()
FAST = settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])


def _model(name):
    return registry.get(name).params_model()


def _assert_names(err: str, field: str) -> None:
    assert f"'{field}'" in err, f"error does not name {field!r}: {err}"
    assert "Traceback" not in err


@pytest.mark.parametrize("name", SYSTEMS)
@FAST
@given(data=st.data())
def test_params_reject_bad_value_naming_the_field(name, data):
    model = _model(name)
    field, overrides = data.draw(bad_override(model), label="bad override")
    with pytest.raises(ParamsError) as exc:
        model.for_scale("smoke", **overrides)
    assert exc.value.field.split(".")[0] == field
    _assert_names(str(exc.value), field)
    assert "\n" not in str(exc.value)


_JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                        max_leaves=6)


@pytest.mark.parametrize("name", SYSTEMS)
@FAST
@given(data=st.data())
def test_params_any_overrides_validate_or_raise_params_error(name, data):
    """Arbitrary values for known fields never escape as another exception type (TypeError,
    ZeroDivisionError in a validator, ...): either a valid model or one ParamsError."""
    model = _model(name)
    keys = sorted(set(model.model_fields) - {"scale"})
    overrides = data.draw(st.dictionaries(st.sampled_from(keys), _JSONISH, max_size=4))
    scale = data.draw(st.sampled_from(["smoke", "quick", "full"]))
    try:
        params = model.for_scale(scale, **overrides)
    except ParamsError as exc:
        assert exc.field.split(".")[0] in set(model.model_fields) | {"parameters"}
    else:
        assert params.scale == scale


@pytest.mark.parametrize("name", SYSTEMS)
def test_every_numeric_parameter_has_documented_limits(name):
    """Sizes need an upper bound too, so huge values are rejected before any work."""
    for lim in field_limits(_model(name)):
        assert lim.description, f"{name}.{lim.name} has no description"
        if lim.kind in ("int", "float"):
            assert lim.lower is not None and lim.upper is not None, \
                f"{name}.{lim.name} needs both a lower and an upper limit (ge/gt and le/lt)"


@pytest.mark.parametrize("name", SYSTEMS)
def test_scale_is_not_an_override(name):
    with pytest.raises(ParamsError) as exc:
        _model(name).for_scale("smoke", scale="full")
    assert exc.value.field == "scale"


def test_limits_doc_matches_models():
    doc = ROOT / "docs" / "limits.md"
    assert doc.exists() and doc.read_text() == render_markdown(), \
        "docs/limits.md is out of date: run `mlsys-flows generate`"


# ----- CLI: one line on stderr naming the parameter, exit code 2, no traceback ---------------------
def _cli_arg(field: str, value) -> str:
    return f"{field}={value if isinstance(value, str) else json.dumps(value)}"


@pytest.mark.parametrize("name", SYSTEMS)
@settings(deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_cli_run_rejects_bad_param(name, data):
    field, overrides = data.draw(bad_override(_model(name)))
    (value,) = overrides.values()
    if isinstance(value, float) and value != value:
        value = "NaN"
    result = CliRunner().invoke(app, ["run", name, "--scale", "smoke", "--param", _cli_arg(field, value)])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    _assert_names(lines[0], field)
    assert result.stdout.strip() == ""  # no flow started: nothing printed


def _cli(*args: str) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).parent / "mlsys-flows")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "80"})


@pytest.mark.parametrize("name", SYSTEMS)
def test_cli_subprocess_bad_param(name):
    """The real console script: exit code 2, one line naming the parameter, no traceback."""
    lim = next(lim for lim in field_limits(_model(name)) if lim.kind in ("int", "float") and lim.upper is not None)
    proc = _cli("run", name, "--scale", "smoke", "--param", f"{lim.name}={lim.upper * 10 + 1}")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    _assert_names(lines[0], lim.name)


@pytest.mark.skipif(not SYSTEMS, reason="no system implemented yet")
def test_cli_subprocess_scale_override_and_malformed_param():
    for arg, needle in (("scale=full", "'scale'"), ("no-equals-sign", "no-equals-sign")):
        proc = _cli("run", SYSTEMS[0], "--scale", "smoke", "--param", arg)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr, proc.stderr
