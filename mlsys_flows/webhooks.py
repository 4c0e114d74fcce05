"""Signed webhooks that start deployment runs: `mlsys-flows webhooks serve`.

Prefect's open-source server has no webhooks (a Cloud feature), so this small Starlette app
maps ``POST /hooks/{name}`` to a run of the hook's deployment. A request must carry

    X-Mlsys-Timestamp: <unix seconds>
    X-Mlsys-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>." + raw body)>
    X-Mlsys-Delivery:  <unique delivery id, [A-Za-z0-9._:-]{1,128}>

Checks, in order, and the answer when one fails (no failed check creates a run):
  body over ``max_body_bytes`` -> 413; unknown hook -> 404; missing/wrong signature -> 401;
  timestamp outside ``tolerance_s`` (either side) -> 401; missing delivery id -> 400;
  replay (a delivery id or a signature seen before) -> 409 with the first run's id;
  body not a JSON object -> 400; parameters invalid -> 422 with ``field`` naming the field.
A new run answers 202 with its id. Replays are stopped twice: the delivery id is the flow run's
idempotency key (Prefect returns the existing run, across restarts and replicas), and each
accepted signature is remembered for the tolerance window, so a captured request re-sent
with a fresh delivery id is refused too.

The body becomes flow parameters through the hook's ``template``: a value ``"{{ body.a.b }}"``
takes the body's field ``a.b`` (absent: the deployment's default), anything else is literal.
Body fields the template does not use are refused (422), so a typo never passes silently.
Template keys are the harness's flow parameters, declared in ``flow_params.py``; the default
template reads ``scale``, ``overrides`` and ``run_key`` from the body (``storage`` and ``cluster``
only where a hook's template names them), and the parameters are checked by the same rules as the
flow's (``flow_params.check``) before any run is created.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import threading
import time
from importlib import import_module
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mlsys_flows import flow_params, registry
from mlsys_flows.prefect_rest import PrefectAPIError, PrefectREST
from mlsys_flows.systems.common.params import ParamsError

log = logging.getLogger("mlsys_flows.webhooks")

TIMESTAMP_HEADER, SIGNATURE_HEADER, DELIVERY_HEADER = "X-Mlsys-Timestamp", "X-Mlsys-Signature", "X-Mlsys-Delivery"
FLOW_PARAMETERS = flow_params.NAMES  # the harness's flow signature, declared in flow_params.py
BODY_REF = re.compile(r"^\{\{\s*body((?:\.[A-Za-z0-9_-]+)*)\s*\}\}$")
DELIVERY_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
DEFAULT_TEMPLATE = flow_params.webhook_template()  # scale, overrides, run_key from the body


# --- signing -----------------------------------------------------------------------------------
def signature(secret: str, timestamp: str | int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def signed_headers(secret: str, body: bytes, delivery_id: str, timestamp: int | None = None) -> dict[str, str]:
    """Headers a sender adds (see docs/platform.md for curl + openssl)."""
    ts = int(time.time()) if timestamp is None else timestamp
    return {TIMESTAMP_HEADER: str(ts), SIGNATURE_HEADER: signature(secret, ts, body), DELIVERY_HEADER: delivery_id,
            "Content-Type": "application/json"}


# --- configuration -----------------------------------------------------------------------------
class HookConfig(BaseModel):
    """One hook. Parameters are validated by ``system``'s Params (or ``params_model``,
    ``module:Class`` of a SystemParams subclass, for flows outside the registry)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    system: str | None = Field(None, description="Registry system whose Params validate the parameters.")
    params_model: str | None = Field(None, description="module:Class of the parameter model (flows outside the registry).")
    deployment: str | None = Field(None, description="flow-name/deployment-name; default <system>/<system>.")
    secret_block: str | None = Field(None, description="Name of the Prefect Secret block holding the HMAC key.")
    secret_env: str | None = Field(None, description="Or: environment variable holding the HMAC key.")
    template: dict[str, Any] = Field(default_factory=lambda: dict(DEFAULT_TEMPLATE),
                                     description="Flow parameter -> literal or '{{ body.field }}'.")
    tags: list[str] = Field(default_factory=list, description="Extra tags of the runs it creates.")

    @field_validator("template")
    @classmethod
    def _known_parameters(cls, v: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(v) - set(FLOW_PARAMETERS))
        if unknown:
            raise ValueError(f"template names unknown flow parameter(s) {unknown}; flows take {list(FLOW_PARAMETERS)}")
        return v

    @model_validator(mode="after")
    def _complete(self) -> "HookConfig":
        if (self.system is None) == (self.params_model is None):
            raise ValueError("set exactly one of system, params_model")
        if self.system is not None:
            try:
                registry.get(self.system)
            except registry.UnknownSystem as exc:
                raise ValueError(str(exc)) from None
        if self.params_model is not None and self.deployment is None:
            raise ValueError("deployment is required with params_model")
        if sum(x is not None for x in (self.secret_block, self.secret_env)) != 1:
            raise ValueError("set exactly one of secret_block, secret_env")
        return self

    @property
    def deployment_name(self) -> str:
        return self.deployment or f"{self.system}/{self.system}"

    def model(self):
        if self.system:
            return registry.get(self.system).params_model()
        module, _, attr = self.params_model.partition(":")
        return getattr(import_module(module), attr)


class WebhookConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hooks: dict[str, HookConfig]
    tolerance_s: int = Field(300, ge=1, le=3600, description="Accepted clock difference of X-Mlsys-Timestamp, seconds.")
    max_body_bytes: int = Field(65536, ge=64, le=16 * 2**20, description="Larger bodies are refused with 413.")
    api_concurrency: int = Field(2, ge=1, le=64, description="Run creations in flight at once against the Prefect "
                                                             "API (more only adds lock contention on SQLite).")

    @field_validator("hooks")
    @classmethod
    def _names(cls, v: dict[str, HookConfig]) -> dict[str, HookConfig]:
        bad = [n for n in v if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", n)]
        if bad:
            raise ValueError(f"hook names must match [a-z0-9][a-z0-9._-]*: {bad}")
        return v

    @classmethod
    def load(cls, path: str | Path) -> "WebhookConfig":
        path = Path(path)
        if not path.exists():
            raise ValueError(f"webhook config {path} does not exist")
        data = yaml.safe_load(path.read_text()) if path.suffix in (".yaml", ".yml") else json.loads(path.read_text())
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            e = exc.errors()[0]
            raise ValueError(f"{path}: {'.'.join(map(str, e['loc']))}: {e['msg']}") from None


# --- request -> parameters -----------------------------------------------------------------------
_ABSENT = object()


class Rejected(Exception):
    """A request refused with an HTTP status; ``field`` names the offending parameter."""

    def __init__(self, status: int, detail: str, field: str | None = None, **extra: Any):
        super().__init__(detail)
        self.status, self.detail, self.field, self.extra = status, detail, field, extra

    def payload(self) -> dict[str, Any]:
        body = {"detail": self.detail, **self.extra}
        if self.field:
            body["field"] = self.field
        return body


def render_template(template: dict[str, Any], body: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """Flow parameters from the body, and the top-level body fields the template used."""
    used: set[str] = set()

    def value(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: r for k, x in v.items() if (r := value(x)) is not _ABSENT}
        m = BODY_REF.match(v) if isinstance(v, str) else None
        if not m:
            return v
        path = [p for p in m.group(1).split(".") if p]
        if path:
            used.add(path[0])
        node: Any = body
        for part in path:
            if not isinstance(node, dict) or part not in node:
                return _ABSENT
            node = node[part]
        if not path:
            used.update(body)
        return node

    params = {k: r for k, x in template.items() if (r := value(x)) is not _ABSENT}
    return params, used


def build_parameters(hook: HookConfig, body: Any) -> dict[str, Any]:
    """Validated flow parameters of a request body; raises Rejected(422) naming the field."""
    if not isinstance(body, dict):
        raise Rejected(400, "body must be a JSON object")
    params, used = render_template(hook.template, body)
    extra = sorted(set(body) - used)
    if extra:
        raise Rejected(422, f"unknown field {extra[0]!r} in the body; this hook reads "
                            f"{', '.join(sorted(used)) or 'no fields'}", field=extra[0])
    try:
        flow_params.check(params, hook.model(), hook.system)  # the harness's rules, before any run
    except ParamsError as exc:
        raise Rejected(422, str(exc), field=exc.field) from None
    return params


# --- the app -----------------------------------------------------------------------------------
class _SeenSignatures:
    """Signatures accepted within the tolerance window -> their run id (bounded by the window)."""

    def __init__(self, window_s: int):
        self.window_s, self._seen, self._lock = window_s, {}, threading.Lock()

    def get(self, sig: str) -> str | None:
        with self._lock:
            cutoff = time.time() - 2 * self.window_s
            for key in [k for k, (t, _) in self._seen.items() if t < cutoff]:
                del self._seen[key]
            hit = self._seen.get(sig)
            return hit[1] if hit else None

    def add(self, sig: str, run_id: str) -> None:
        with self._lock:
            self._seen[sig] = (time.time(), run_id)


class WebhookService:
    """Everything but HTTP: secrets, deployments, the checks. Thread-safe."""

    def __init__(self, config: WebhookConfig, api: PrefectREST):
        self.config, self.api = config, api
        self._secrets: dict[str, str] = {}
        self._deployments: dict[str, str] = {}
        self._seen = _SeenSignatures(config.tolerance_s)
        self._api_slots = threading.BoundedSemaphore(config.api_concurrency)

    def secret(self, name: str) -> str:
        if name not in self._secrets:
            hook = self.config.hooks[name]
            if hook.secret_block:
                self._secrets[name] = self.api.read_secret(hook.secret_block)
            else:
                import os

                value = os.environ.get(hook.secret_env or "")
                if not value:
                    raise PrefectAPIError(f"hook {name!r}: environment variable {hook.secret_env} is not set")
                self._secrets[name] = value
        return self._secrets[name]

    def deployment_id(self, name: str) -> str:
        if name not in self._deployments:
            self._deployments[name] = self.api.read_deployment(self.config.hooks[name].deployment_name)["id"]
        return self._deployments[name]

    def verify(self, name: str, headers: Any, body: bytes) -> tuple[str, str]:
        """Signature, then freshness, then delivery id. Returns (delivery id, signature)."""
        ts, sig = headers.get(TIMESTAMP_HEADER), headers.get(SIGNATURE_HEADER)
        if not ts or not sig:
            raise Rejected(401, f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER} header")
        if not hmac.compare_digest(signature(self.secret(name), ts, body).encode(), sig.encode()):
            raise Rejected(401, "bad signature")
        try:
            age = time.time() - int(ts)
        except ValueError:
            raise Rejected(401, f"{TIMESTAMP_HEADER} must be unix seconds") from None
        if abs(age) > self.config.tolerance_s:
            when = f"{age:.0f} s in the past" if age > 0 else f"{-age:.0f} s in the future"
            raise Rejected(401, f"timestamp outside the tolerance: {when}, tolerance {self.config.tolerance_s} s")
        delivery = headers.get(DELIVERY_HEADER) or ""
        if not DELIVERY_ID.match(delivery):
            raise Rejected(400, f"{DELIVERY_HEADER} header required: 1-128 characters of [A-Za-z0-9._:-]")
        previous = self._seen.get(sig)
        if previous:
            raise Rejected(409, "replayed request (signature already used)", flow_run_id=previous)
        return delivery, sig

    def handle(self, name: str, headers: Any, body: bytes) -> tuple[int, dict[str, Any]]:
        if name not in self.config.hooks:
            raise Rejected(404, f"unknown hook {name!r}")
        hook = self.config.hooks[name]
        delivery, sig = self.verify(name, headers, body)
        try:
            payload = json.loads(body or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise Rejected(400, "body is not valid JSON") from None
        params = build_parameters(hook, payload)
        with self._api_slots:
            run = self.api.create_flow_run(self.deployment_id(name), params, idempotency_key=f"webhook:{name}:{delivery}",
                                           tags=["webhook", f"hook:{name}", *hook.tags])
        self._seen.add(sig, run.id)
        if not run.created:
            raise Rejected(409, f"delivery {delivery!r} already processed", flow_run_id=run.id)
        return 202, {"flow_run_id": run.id, "flow_run_name": run.name, "deployment": hook.deployment_name,
                     "parameters": params}


def create_app(config: WebhookConfig, api: PrefectREST):
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    service = WebhookService(config, api)

    async def read_body(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > config.max_body_bytes):
            raise Rejected(413, f"body over {config.max_body_bytes} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():  # also bounds chunked bodies without a length
            size += len(chunk)
            if size > config.max_body_bytes:
                raise Rejected(413, f"body over {config.max_body_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def hook(request: Request) -> JSONResponse:
        name = request.path_params["name"]
        delivery = request.headers.get(DELIVERY_HEADER, "-")[:128]
        try:
            body = await read_body(request)
            status, payload = await run_in_threadpool(service.handle, name, request.headers, body)
        except Rejected as exc:
            status, payload = exc.status, exc.payload()
        except PrefectAPIError as exc:
            status, payload = 502, {"detail": f"Prefect API: {exc}"}
        except Exception as exc:  # never echo internals (they could hold a secret)
            log.exception("hook %s delivery %s: internal error %s", name, delivery, type(exc).__name__)
            status, payload = 500, {"detail": "internal error"}
        log.info("hook %s delivery %s -> %s %s", name, delivery, status, payload.get("flow_run_id", ""))
        return JSONResponse(payload, status_code=status)

    async def health(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "hooks": sorted(config.hooks)})

    app = Starlette(routes=[Route("/hooks/{name}", hook, methods=["POST"]), Route("/health", health)])
    app.state.service = service
    return app


def check(config: WebhookConfig, api: PrefectREST) -> list[str]:
    """Start-up checks: every hook's secret readable; problems (e.g. a deployment not there yet)."""
    service, problems = WebhookService(config, api), []
    for name in config.hooks:
        try:
            service.secret(name)
        except PrefectAPIError as exc:
            raise ValueError(f"hook {name!r}: {exc}") from None
        try:
            service.deployment_id(name)
        except PrefectAPIError as exc:
            problems.append(f"hook {name!r}: {exc} (deploy it before sending)")
    return problems
