"""Signed webhooks that start deployment runs: `mlsys-flows webhooks serve`.

Prefect's open-source server has no webhooks (a Cloud feature), so this small Starlette app
maps ``POST /hooks/{name}`` to a run of the hook's deployment. A request must carry

    X-Mlsys-Timestamp: <unix seconds>
    X-Mlsys-Delivery:  <unique delivery id, [A-Za-z0-9._:-]{1,128}>
    X-Mlsys-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>\n<delivery id>\n" + raw body)>

Checks, in order, and the answer when one fails (no failed check creates a run):
  over the hook's rate limit -> 429 with Retry-After; body over ``max_body_bytes`` -> 413;
  missing signature headers -> 401; unknown hook or wrong signature -> 401, the same answer for
  both; timestamp outside ``tolerance_s`` (either side) -> 401; bad delivery id -> 400;
  body not a JSON object -> 400; parameters invalid -> 422 with ``field`` naming the field;
  replay (a delivery id reserved before) -> 409 with the first run's id when it has one.
A new run answers 202 with its id. The signature covers the delivery id, so a captured request
cannot be re-sent under a fresh one; the delivery id is reserved in a ``ReplayStore`` (SQLite,
shared by every receiver that opens the file, kept across restarts) before the run is created,
and is also the flow run's idempotency key (Prefect returns the existing run, whatever the store).

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
import math
import re
import secrets
import sqlite3
import threading
import time
from contextlib import closing
from importlib import import_module
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mlsys_flows import flow_params, registry
from mlsys_flows.errors import MlsysError
from mlsys_flows.platform.prefect_rest import PrefectAPIError, PrefectREST
from mlsys_flows.settings import home
from mlsys_flows.systems.common.params import ParamsError

log = logging.getLogger("mlsys_flows.integrations.webhooks")

TIMESTAMP_HEADER, SIGNATURE_HEADER, DELIVERY_HEADER = "X-Mlsys-Timestamp", "X-Mlsys-Signature", "X-Mlsys-Delivery"
FLOW_PARAMETERS = flow_params.NAMES  # the harness's flow signature, declared in flow_params.py
BODY_REF = re.compile(r"^\{\{\s*body((?:\.[A-Za-z0-9_-]+)*)\s*\}\}$")
DELIVERY_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
DEFAULT_TEMPLATE = flow_params.webhook_template()  # scale, overrides, run_key from the body
UNIX_SECONDS = re.compile(r"^[0-9]{1,12}$")
MIN_SECRET_CHARS = 16  # shorter secrets can be brute-forced from one captured request


# --- signing -----------------------------------------------------------------------------------
def signed_message(timestamp: str | int, delivery_id: str, body: bytes) -> bytes:
    """The exact bytes signed: ``"<timestamp>\n<delivery id>\n" + raw body``. Neither header value
    can hold a newline, so no other (timestamp, delivery id, body) gives the same bytes."""
    return f"{timestamp}\n{delivery_id}\n".encode() + body


def signature(secret: str, timestamp: str | int, delivery_id: str, body: bytes) -> str:
    mac = hmac.new(secret.encode(), signed_message(timestamp, delivery_id, body), hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def signed_headers(secret: str, body: bytes, delivery_id: str, timestamp: int | None = None) -> dict[str, str]:
    """Headers a sender adds (see docs/platform.md for curl + openssl)."""
    ts = int(time.time()) if timestamp is None else timestamp
    return {TIMESTAMP_HEADER: str(ts), SIGNATURE_HEADER: signature(secret, ts, delivery_id, body),
            DELIVERY_HEADER: delivery_id, "Content-Type": "application/json"}


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
    rate_per_s: float = Field(1.0, gt=0, le=100000, description="Requests per second each hook accepts on average "
                                                                "(token bucket per receiver); more get 429.")
    rate_burst: int = Field(30, ge=1, le=100000, description="Requests a hook accepts at once before rate_per_s applies.")
    replay_store: Path | None = Field(None, description="SQLite file of delivery-id reservations, shared by every "
                                                        "receiver that opens it; default MLSYS_FLOWS_HOME/webhooks/"
                                                        "replays.sqlite. Keep it on a local disk (file locks).")

    @field_validator("hooks")
    @classmethod
    def _names(cls, v: dict[str, HookConfig]) -> dict[str, HookConfig]:
        bad = [n for n in v if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", n)]
        if bad:
            raise ValueError(f"hook names must match [a-z0-9][a-z0-9._-]*: {bad}")
        return v

    @property
    def replay_store_path(self) -> Path:
        return Path(self.replay_store) if self.replay_store else home() / "webhooks" / "replays.sqlite"

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


class Rejected(MlsysError):
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
class ReplayStore:
    """Reservations of (hook, delivery id) until their request's timestamp goes stale, in a SQLite
    file: every receiver (replica) that opens the same file shares them, and a restart keeps them.
    A reservation is one ``BEGIN IMMEDIATE`` transaction (the file's write lock) whose INSERT fails
    on a key already there, so of concurrent requests for one delivery exactly one reserves."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.execute("PRAGMA journal_mode=WAL")  # readers never wait; persists in the file
            db.execute("CREATE TABLE IF NOT EXISTS deliveries (hook TEXT NOT NULL, delivery TEXT NOT NULL, "
                       "body_sha256 TEXT NOT NULL, expires REAL NOT NULL, flow_run_id TEXT, "
                       "PRIMARY KEY (hook, delivery))")
            db.execute("CREATE INDEX IF NOT EXISTS deliveries_expires ON deliveries (expires)")

    def _db(self):
        return closing(sqlite3.connect(self.path, timeout=60, isolation_level=None))  # autocommit; own BEGINs

    def reserve(self, hook: str, delivery: str, body_sha256: str, expires: float) -> tuple | None:
        """None when reserved; else the existing (body_sha256, flow_run_id), the run id None while
        its request is still creating the run. Expired reservations are purged first."""
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("DELETE FROM deliveries WHERE expires < ?", (time.time(),))
                db.execute("INSERT INTO deliveries VALUES (?, ?, ?, ?, NULL)", (hook, delivery, body_sha256, expires))
                return None
            except sqlite3.IntegrityError:
                return db.execute("SELECT body_sha256, flow_run_id FROM deliveries WHERE hook = ? AND delivery = ?",
                                  (hook, delivery)).fetchone()
            finally:
                db.execute("COMMIT")

    def record(self, hook: str, delivery: str, flow_run_id: str) -> None:
        with self._db() as db:
            db.execute("UPDATE deliveries SET flow_run_id = ? WHERE hook = ? AND delivery = ?",
                       (flow_run_id, hook, delivery))

    def release(self, hook: str, delivery: str) -> None:
        """Drop a reservation whose run could not be created, so that the sender's retry proceeds."""
        with self._db() as db:
            db.execute("DELETE FROM deliveries WHERE hook = ? AND delivery = ? AND flow_run_id IS NULL",
                       (hook, delivery))


class RateLimiter:
    """A token bucket per hook name, known or not (so a 429 never tells which hooks exist)."""

    MAX_BUCKETS = 10000

    def __init__(self, rate_per_s: float, burst: int):
        self.rate, self.burst, self._buckets, self._lock = rate_per_s, burst, {}, threading.Lock()

    def wait_s(self, name: str) -> float:
        """0 when ``name`` may go on (a token taken), else the seconds until a token is there."""
        with self._lock:
            now = time.monotonic()
            tokens, last = self._buckets.pop(name, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if len(self._buckets) >= self.MAX_BUCKETS:  # a full bucket is a fresh one: forget it
                self._buckets = {k: (t, at) for k, (t, at) in self._buckets.items()
                                 if t + (now - at) * self.rate < self.burst}
                while len(self._buckets) >= self.MAX_BUCKETS:  # still too many names: oldest out
                    del self._buckets[next(iter(self._buckets))]
            self._buckets[name] = (tokens - 1 if tokens >= 1 else tokens, now)
            return 0.0 if tokens >= 1 else (1 - tokens) / self.rate


class WebhookService:
    """Everything but HTTP: secrets, deployments, the checks. Thread-safe."""

    def __init__(self, config: WebhookConfig, api: PrefectREST):
        self.config, self.api = config, api
        self._secrets: dict[str, str] = {}
        self._deployments: dict[str, str] = {}
        self.replays = ReplayStore(config.replay_store_path)
        self._unknown_key = secrets.token_hex(32)  # for unknown hooks: see verify()
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

    def verify(self, name: str, headers: Any, body: bytes) -> tuple[str, int]:
        """Signature, then freshness, then delivery id. Returns (delivery id, timestamp). An unknown
        hook gets the answer of a wrong signature, after the same work (an HMAC under a key nobody
        holds), so that neither the answer nor its time tells which hooks exist."""
        ts, sig = headers.get(TIMESTAMP_HEADER), headers.get(SIGNATURE_HEADER)
        if not ts or not sig:
            raise Rejected(401, f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER} header")
        delivery = headers.get(DELIVERY_HEADER) or ""
        key = self.secret(name) if name in self.config.hooks else self._unknown_key
        good = hmac.compare_digest(signature(key, ts, delivery, body).encode(), sig.encode())
        if not good or name not in self.config.hooks:
            raise Rejected(401, "unknown hook or bad signature")
        if not UNIX_SECONDS.match(ts):
            raise Rejected(401, f"{TIMESTAMP_HEADER} must be unix seconds")
        age = time.time() - int(ts)
        if abs(age) > self.config.tolerance_s:
            when = f"{age:.0f} s in the past" if age > 0 else f"{-age:.0f} s in the future"
            raise Rejected(401, f"timestamp outside the tolerance: {when}, tolerance {self.config.tolerance_s} s")
        if not DELIVERY_ID.match(delivery):
            raise Rejected(400, f"{DELIVERY_HEADER} header required: 1-128 characters of [A-Za-z0-9._:-]")
        return delivery, int(ts)

    def handle(self, name: str, headers: Any, body: bytes) -> tuple[int, dict[str, Any]]:
        delivery, ts = self.verify(name, headers, body)
        hook = self.config.hooks[name]
        try:
            payload = json.loads(body or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise Rejected(400, "body is not valid JSON") from None
        params = build_parameters(hook, payload)
        # Reserved before the run is created, kept until the signed timestamp goes stale (then the
        # request is refused as stale, and Prefect's idempotency key still names the run).
        digest = hashlib.sha256(body).hexdigest()
        previous = self.replays.reserve(name, delivery, digest, ts + self.config.tolerance_s + 1)
        if previous is not None:
            what = "already processed" if previous[0] == digest else "already used for another body"
            if not previous[1]:
                raise Rejected(409, f"replay: delivery {delivery!r} {what} (its run is being created)")
            raise Rejected(409, f"replay: delivery {delivery!r} {what}", flow_run_id=previous[1])
        try:
            with self._api_slots:
                run = self.api.create_flow_run(self.deployment_id(name), params,
                                               idempotency_key=f"webhook:{name}:{delivery}",
                                               tags=["webhook", f"hook:{name}", *hook.tags])
        except BaseException:
            # no run, or one Prefect returns to the retry by its idempotency key: let the retry in
            self.replays.release(name, delivery)
            raise
        self.replays.record(name, delivery, run.id)
        if not run.created:
            raise Rejected(409, f"replay: delivery {delivery!r} already has a run (Prefect idempotency key)",
                           flow_run_id=run.id)
        return 202, {"flow_run_id": run.id, "flow_run_name": run.name, "deployment": hook.deployment_name,
                     "parameters": params}


def delivery_line(hook: str, delivery: str, status: int, payload: dict[str, Any]) -> str:
    """The operator's log line of one request: ``hook=... delivery=... status=... run=... reason=...``.
    The reason is the answer's detail (a bad signature, a stale timestamp and a missing header read
    apart), never a secret: the details name headers and limits, not values."""
    reason = payload.get("detail", "accepted" if status == 202 else "")
    if isinstance(reason, (list, dict)):
        reason = json.dumps(reason)[:300]
    return (f"hook={hook} delivery={delivery or '-'} status={status} run={payload.get('flow_run_id') or '-'} "
            f"reason={str(reason)[:300]!r}")


def configure_logging() -> logging.Logger:
    """The delivery lines on stderr beside uvicorn's own (uvicorn configures only its loggers)."""
    if not any(getattr(h, "_mlsys_webhooks", False) for h in log.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        handler._mlsys_webhooks = True
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    return log


def create_app(config: WebhookConfig, api: PrefectREST):
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    service = WebhookService(config, api)
    limiter = RateLimiter(config.rate_per_s, config.rate_burst)

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
        wait_s = limiter.wait_s(name)
        if wait_s:
            payload = {"detail": f"rate limit: {config.rate_per_s:g} requests/s per hook, burst {config.rate_burst}"}
            log.info(delivery_line(name, delivery, 429, payload))
            return JSONResponse(payload, status_code=429, headers={"Retry-After": str(max(1, math.ceil(wait_s)))})
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
        log.info(delivery_line(name, delivery, status, payload))
        return JSONResponse(payload, status_code=status)

    async def health(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})  # no hook names: they are not public

    app = Starlette(routes=[Route("/hooks/{name}", hook, methods=["POST"]), Route("/health", health)])
    app.state.service = service
    return app


def weak_secrets(config: WebhookConfig, api: PrefectREST) -> list[str]:
    """Hooks whose secret has fewer than MIN_SECRET_CHARS characters (refused on a public interface)."""
    service = WebhookService(config, api)
    try:
        return [name for name in config.hooks if len(service.secret(name)) < MIN_SECRET_CHARS]
    except PrefectAPIError as exc:
        raise ValueError(str(exc)) from None


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
