"""The flow parameters every system flow takes: declared once, here.

The harness (``flows/common.py``, the function ``run`` inside ``system_flow``) makes every
system's Prefect flow with exactly these parameters, in this order. Everything that starts a
run from outside reads this declaration instead of keeping its own list: the webhook receiver
(``integrations/webhooks.py``: which template keys exist, which the default template reads from the body,
how a request's parameters are checked), the Airflow operator (``integrations/airflow/operators.py``: its
arguments, templated fields and the parameters it sends) and the generated ``prefect.yaml``
(``platform/deploy.py``: the deployments' default parameters). ``tests/unit/test_flow_param_drift.py``
fails when the harness's signature, a system's ``Params`` or any of those drifts from it.

Pure: imports no prefect, dask or airflow (the Airflow operator imports it in an environment
without Prefect). :func:`check` applies the same rules as the harness, before any run exists, and
raises :class:`ParamsError` naming the offending field.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Literal, Mapping

from pydantic import BaseModel, WithJsonSchema

from mlsys_flows import registry
from mlsys_flows.systems.common.params import SCALES, ParamsError, SystemParams

Kind = Literal["scale", "overrides", "block", "run_key"]

KINDS: dict[str, str] = {
    "scale": f"one of {', '.join(SCALES)}",
    "overrides": "JSON object of parameter overrides, validated by the system's Params",
    "block": "name of a saved Prefect block",
    "run_key": "run key: 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit",
}

# The harness's rule for run keys (flows/common.py); also a storage key part, so no '/' or '..'.
# Applied with fullmatch: with match, '$' would also accept a key ending in a newline.
RUN_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class FlowParam:
    """One parameter of the harness's flow signature."""

    name: str
    kind: Kind
    description: str
    default: Any = None
    # In every generated deployment's ``parameters`` (prefect.yaml) with ``default``.
    in_deployment: bool = False
    # Read from the request body by the webhook's default template (``{{ body.<name> }}``).
    from_webhook_body: bool = False
    # kind "block": the block class the name must load as.
    block_type: str | None = None

    @property
    def type_text(self) -> str:
        text = KINDS[self.kind]
        return f"{text} ({self.block_type})" if self.block_type else text


PARAMETERS: tuple[FlowParam, ...] = (
    FlowParam("scale", "scale", "Workload size: smoke (the pipeline on a tiny workload, under a minute), quick (a "
                                "few minutes on 2 cores), full (GPU or cluster). Chooses the preset the overrides "
                                "apply to.",
              default="quick", in_deployment=True, from_webhook_body=True),
    FlowParam("overrides", "overrides", "Values of the system's own parameters on top of the scale's preset; "
                                        "only the fields of the system's Params are accepted.",
              from_webhook_body=True),
    FlowParam("storage", "block", "ObjectStorage block the report and checkpoints go to; none: the local "
                                  "default folder.", block_type="ObjectStorage"),
    FlowParam("cluster", "block", "DaskCluster block the tasks run on; none: an embedded LocalCluster.",
              block_type="DaskCluster"),
    FlowParam("devices", "block", "ResourcePool block of the devices (GPUs, FPGAs) the run's device tasks claim: "
                                  "they run only on Dask workers started with that resource (e.g. `dask worker "
                                  "--resources GPU=1`), no more at a time than the pool has devices; none: device "
                                  "tasks run on any worker, on its own device if it has one.",
              block_type="ResourcePool"),
    FlowParam("run_key", "run_key", "Names the run's training so that it can resume: a later run of the same "
                                    "system with the same key and storage continues from the last complete "
                                    "checkpoint (under checkpoints/<system>/<key>) instead of starting over; none: "
                                    "not resumable.",
              from_webhook_body=True),
)

NAMES: tuple[str, ...] = tuple(p.name for p in PARAMETERS)
_BY_NAME = {p.name: p for p in PARAMETERS}


def get(name: str) -> FlowParam:
    return _BY_NAME[name]


def deployment_parameters() -> dict[str, Any]:
    """The default parameters of every generated deployment (prefect.yaml)."""
    return {p.name: p.default for p in PARAMETERS if p.in_deployment}


def webhook_template() -> dict[str, str]:
    """A hook's default template: the parameters a request body may set."""
    return {p.name: f"{{{{ body.{p.name} }}}}" for p in PARAMETERS if p.from_webhook_body}


def override_names(model: type[SystemParams]) -> tuple[str, ...]:
    """What ``overrides`` accepts for a system: its Params fields; ``scale`` has its own parameter."""
    return tuple(name for name in model.model_fields if name != "scale")


def check(params: Mapping[str, Any], model: type[SystemParams] | None, system: str | None = None) -> SystemParams | None:
    """Check flow parameters sent from outside (by name, block names not objects) as the harness
    will, before a run exists; returns the validated Params (None when ``model`` is None: the
    overrides are then only checked to be an object). Raises ParamsError naming the field."""
    system = system or (model.SYSTEM if model is not None else "flow")
    unknown = [k for k in params if k not in _BY_NAME]
    if unknown:
        raise ParamsError(system, str(unknown[0]), f"unknown flow parameter; flows take {', '.join(NAMES)}")
    scale = params.get("scale", get("scale").default)
    if not isinstance(scale, str) or scale not in SCALES:
        raise ParamsError(system, "scale", f"must be one of {', '.join(SCALES)} (got {scale!r})")
    overrides = params.get("overrides")
    overrides = {} if overrides is None else overrides
    if not isinstance(overrides, Mapping):
        raise ParamsError(system, "overrides", f"must be a JSON object (got {type(overrides).__name__})")
    for p in PARAMETERS:
        value = params.get(p.name)
        if value is None:
            continue
        if p.kind == "block" and not (isinstance(value, str) and value.strip()):
            raise ParamsError(system, p.name, f"must be the name of a saved {p.block_type} block (got {value!r})")
        if p.kind == "run_key" and not (isinstance(value, str) and RUN_KEY.fullmatch(value)):
            raise ParamsError(system, p.name, f"must be 1-128 letters, digits, '.', '_' or '-' (got {value!r})")
    if model is None:
        return None
    return model.for_scale(scale, **overrides)


def check_system(system: str, params: Mapping[str, Any]) -> SystemParams:
    """:func:`check` with the registry system's Params (raises registry.UnknownSystem, ImportError
    when the system's code cannot be imported here)."""
    return check(params, registry.get(system).params_model(), system)


def concrete_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON schema with each optional field as its concrete type (``anyOf [X, null]`` -> X,
    no ``default: null``): the UI's run form then takes a value at once, without a "None" type to
    switch away from. Null is still accepted where the server checks a run's parameters (Prefect
    treats a field that is neither required nor defaulted as nullable)."""
    schema = model.model_json_schema()
    if "$defs" in schema:
        raise ValueError(f"{model.__name__}: nested models are not flattened into the run form")
    properties = {}
    for name, prop in schema["properties"].items():
        options = [o for o in prop.get("anyOf", []) if o != {"type": "null"}]
        concrete = {k: v for k, v in prop.items() if k != "anyOf" and not (k == "default" and v is None)}
        properties[name] = {**options[0], **concrete} if len(options) == 1 else concrete
    return {**schema, "type": "object", "properties": properties}


def schema_signature(fn: Callable[..., Any], overrides_model: type[BaseModel]) -> inspect.Signature:
    """The signature Prefect derives a deployment's parameter schema from (the harness sets it as the
    flow's ``__signature__``; the flow still calls ``fn`` with ``fn``'s own defaults). Every parameter
    has a concrete type: block names and run keys are strings, ``overrides`` is the system's typed
    object; a ``None`` default is left out of the schema (``MISSING``), since JSON ``null`` is not a
    value of that type and the UI's Parameters tab would show no type for ``anyOf [string, null]``."""
    from pydantic import MISSING  # pydantic>=2.14; imported here: the Airflow operator's env may be older

    by_kind = {"overrides": Annotated[dict[str, Any], WithJsonSchema(concrete_schema(overrides_model))],
               "block": str, "run_key": str}
    return inspect.Signature([p.replace(annotation=by_kind.get(get(p.name).kind, p.annotation),
                                        default=MISSING if p.default is None else p.default)
                              for p in inspect.signature(fn, eval_str=True).parameters.values()])


def markdown_table() -> str:
    """The flow parameters as a markdown table (for docs)."""
    lines = ["| parameter | type | default | description |", "|---|---|---|---|"]
    for p in PARAMETERS:
        lines.append(f"| `{p.name}` | {p.type_text} | {'' if p.default is None else f'`{p.default}`'} | "
                     f"{p.description} |")
    return "\n".join(lines)
