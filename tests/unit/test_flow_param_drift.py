"""The flow parameters are declared once (mlsys_flows/flow_params.py); nothing drifts from it.

Fails when the harness's flow signature (flows/common.py), the webhook receiver, the Airflow
operator, the generated deployments / committed prefect.yaml, the local runner, or what a system's
``overrides`` accepts no longer match the declaration.
"""
from __future__ import annotations

import inspect
import typing

import pytest
import yaml

from mlsys_flows import flow_params, registry
from mlsys_flows.platform import deploy, runner
from mlsys_flows.flow_params import NAMES, PARAMETERS
from mlsys_flows.systems.common.params import SCALES, ParamsError
from mlsys_flows.integrations.webhooks import DEFAULT_TEMPLATE, FLOW_PARAMETERS, HookConfig, Rejected, build_parameters

SYSTEMS = registry.names()
GOOD = {"scale": "smoke", "overrides": {"seed": 1}, "storage": "lab-s3", "cluster": "lab", "devices": "gpu-pool",
        "run_key": "nightly-1.a_b"}
BAD = {"scale": "huge", "overrides": ["seed"], "storage": 3, "cluster": " ", "devices": 7, "run_key": "../escape"}


def test_declaration_is_well_formed():
    assert len(set(NAMES)) == len(NAMES) and NAMES[:2] == ("scale", "overrides")
    assert set(GOOD) == set(BAD) == set(NAMES), "add a good and a bad value of the new parameter here"
    for p in PARAMETERS:
        assert p.kind in flow_params.KINDS and p.description.strip()
        assert (p.block_type is not None) == (p.kind == "block")
    assert flow_params.get("scale").default in SCALES
    assert set(flow_params.deployment_parameters()) <= set(NAMES)


def test_there_are_systems_to_check():
    assert SYSTEMS, "no implemented system: the drift checks below would pass vacuously"


# --- the harness: every system's flow ------------------------------------------------------------
@pytest.mark.parametrize("name", SYSTEMS)
def test_flow_signature_is_the_declaration(name):
    flow = registry.get(name).load_flow()
    params = inspect.signature(flow.fn).parameters
    assert tuple(params) == NAMES, f"{name}: the flow takes {tuple(params)}, flow_params.py declares {NAMES}"
    hints = typing.get_type_hints(flow.fn)
    for p in PARAMETERS:
        assert params[p.name].default == p.default, (name, p.name)
        accepted = set(typing.get_args(hints[p.name])) or {hints[p.name]}
        if p.kind == "scale":
            assert typing.get_args(hints[p.name]) == SCALES, (name, hints[p.name])
        elif p.kind == "overrides":  # the system's Params, every field optional: the UI's typed run form
            model = next(t for t in accepted if t is not type(None))
            fields = registry.get(name).params_model().model_fields
            assert set(model.model_fields) == set(fields) - {"scale"}, (name, hints[p.name])
            assert all(f.description for f in model.model_fields.values()), name
        else:  # block names and run keys travel as strings
            assert str in accepted and type(None) in accepted, (name, p.name, hints[p.name])
    # what a deployment registers (enforce_parameter_schema): Prefect's schema of the same function
    assert tuple(flow.parameters.properties) == NAMES, name
    assert not flow.parameters.required, name
    assert all(flow.parameters.properties[n].get("description") for n in NAMES), name


@pytest.mark.parametrize("name", SYSTEMS)
def test_deployment_schema_types_every_parameter_and_override(name):
    """The schema `prefect deploy` registers (from the flow object, as it does): every parameter and
    every override field has a concrete type (the UI's Parameters tab shows it, the run form takes a
    value without a "None" type to switch from) and a default exactly where one exists; the server's
    check of a run's parameters still takes null for an unset one and refuses a wrong type."""
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools.validation import ValidationError, validate

    schema = parameter_schema(registry.get(name).load_flow()).model_dump_for_openapi()
    for p in PARAMETERS:
        prop = schema["properties"][p.name]
        assert prop.get("type") and "anyOf" not in prop, (name, p.name, prop)
        assert prop.get("default") == p.default and ("default" in prop) == (p.default is not None), (name, p.name)
    fields = schema["properties"]["overrides"]["properties"]
    assert set(fields) == set(flow_params.override_names(registry.get(name).params_model())), name
    for field, prop in fields.items():
        assert prop.get("type") and "anyOf" not in prop and "default" not in prop, (name, field, prop)
        assert "Preset: smoke" in prop["description"], (name, field)
    field, prop = next(iter(fields.items()))
    unset = {"scale": "smoke", **{p.name: None for p in PARAMETERS if p.name != "scale"}}
    validate({**unset, "overrides": {field: None}}, schema, raise_on_error=True)
    validate({"overrides": {"seed": 1}, "storage": "lab", "run_key": "k1"}, schema, raise_on_error=True)
    for bad in ({"overrides": {"seed": "one"}}, {"overrides": {"no_such_field": 1}}, {"storage": 3}):
        with pytest.raises(ValidationError):
            validate(bad, schema, raise_on_error=True)


def test_platform_docs_list_the_declared_parameters():
    from mlsys_flows.platform.infra import REPO

    assert flow_params.markdown_table() in (REPO / "docs" / "platform.md").read_text(), \
        "paste flow_params.markdown_table() into docs/platform.md (Flow parameters)"


def test_harness_run_key_rule_is_the_declared_one():
    from mlsys_flows.flows import common

    assert common.RUN_KEY is flow_params.RUN_KEY


# --- the system's Params: exactly what `overrides` accepts ---------------------------------------
@pytest.mark.parametrize("name", SYSTEMS)
def test_overrides_accept_exactly_the_params_fields(name):
    model = registry.get(name).params_model()
    fields = [f for f in model.model_fields if f != "scale"]
    assert flow_params.override_names(model) == tuple(fields)
    preset = model.for_scale("smoke").model_dump()
    for field in fields:  # every field is accepted (with the value the preset validated)
        flow_params.check_system(name, {"scale": "smoke", "overrides": {field: preset[field]}})
    for field in ("no_such_param", "scale"):  # nothing else is
        with pytest.raises(ParamsError) as exc:
            flow_params.check_system(name, {"scale": "smoke", "overrides": {field: preset.get(field, 1)}})
        assert exc.value.field == field


@pytest.mark.parametrize("param", NAMES)
def test_check_names_the_bad_parameter(param):
    name = SYSTEMS[0]
    assert flow_params.check_system(name, GOOD) is not None
    with pytest.raises(ParamsError) as exc:
        flow_params.check_system(name, {**GOOD, param: BAD[param]})
    assert exc.value.field == param
    with pytest.raises(ParamsError) as exc:
        flow_params.check_system(name, {**GOOD, "scales": "quick"})
    assert exc.value.field == "scales"


# --- the webhook receiver -------------------------------------------------------------------------
def _hook(**kw):
    return HookConfig(**{"system": SYSTEMS[0], "secret_env": "X", **kw})


def test_webhook_accepts_exactly_the_declared_parameters():
    assert tuple(FLOW_PARAMETERS) == NAMES
    _hook(template={n: f"{{{{ body.{n} }}}}" for n in NAMES})  # every declared parameter is a template key
    with pytest.raises(ValueError, match="unknown flow parameter"):
        _hook(template={"scale": "quick", "not_a_flow_parameter": 1})
    assert DEFAULT_TEMPLATE == {p.name: f"{{{{ body.{p.name} }}}}" for p in PARAMETERS if p.from_webhook_body}
    body = {n: GOOD[n] for n in DEFAULT_TEMPLATE}
    assert build_parameters(_hook(), body) == body


@pytest.mark.parametrize("param", NAMES)
def test_webhook_refuses_a_bad_value_naming_the_parameter(param):
    hook = _hook(template={n: f"{{{{ body.{n} }}}}" for n in NAMES})
    assert build_parameters(hook, GOOD) == GOOD
    with pytest.raises(Rejected) as exc:
        build_parameters(hook, {**GOOD, param: BAD[param]})
    assert exc.value.status == 422 and exc.value.field == param


# --- the Airflow operator -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def operator_cls():
    pytest.importorskip("airflow.sdk", reason="apache-airflow-task-sdk not installed")
    from airflow.sdk.bases.operator import ExecutorSafeguard

    from mlsys_flows.integrations.airflow.operators import MlsysFlowOperator

    ExecutorSafeguard.test_mode = True
    return MlsysFlowOperator


def test_operator_takes_and_sends_the_declared_parameters(operator_cls):
    params = inspect.signature(operator_cls.__init__).parameters
    for p in PARAMETERS:
        assert p.name in params, f"MlsysFlowOperator has no argument {p.name!r}"
        assert params[p.name].default == p.default, p.name
        assert p.name in operator_cls.template_fields, p.name
    op = operator_cls(task_id="t", system=SYSTEMS[0], **GOOD)
    assert op._parameters() == GOOD
    op._validate()
    assert set(operator_cls(task_id="t", system=SYSTEMS[0])._parameters()) == {"scale", "overrides"}


@pytest.mark.parametrize("param", NAMES)
def test_operator_refuses_a_bad_value_before_any_run(operator_cls, param):
    from airflow.sdk.exceptions import AirflowException

    op = operator_cls(task_id="t", system=SYSTEMS[0], prefect_conn_id="no_such_connection", **{**GOOD, param: BAD[param]})
    with pytest.raises(AirflowException, match=f"parameter '{param}'"):
        op.execute({})  # validation comes first: the missing connection is never looked up


# --- deployments and the local runner -------------------------------------------------------------
def test_deployments_carry_only_declared_parameters():
    generated = deploy.prefect_yaml()["deployments"]
    committed = yaml.safe_load(deploy.PREFECT_YAML.read_text())["deployments"]
    assert [d["name"] for d in generated] == [d["name"] for d in committed] == SYSTEMS
    for gen, com in zip(generated, committed):
        assert gen["parameters"] == com["parameters"] == flow_params.deployment_parameters(), gen["name"]
        flow_params.check_system(com["name"], com["parameters"])


def test_runner_takes_the_declared_parameters():
    params = [n for n, p in inspect.signature(runner.run_system).parameters.items()
              if p.kind is not p.KEYWORD_ONLY]  # keyword-only: how the run is made (tags), not flow parameters
    assert tuple(params[1:]) == NAMES
