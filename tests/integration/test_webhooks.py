"""The webhook over real HTTP on 127.0.0.1 against a real Prefect API: every bad request is
refused with its status and creates no run; a good one creates exactly one; replays none."""
from __future__ import annotations

import json
import logging
import time
import uuid

import httpx
import pytest
from webhook_fixtures import hook_env, systems  # noqa: F401 (fixture)

from mlsys_flows import registry
from mlsys_flows.webhooks import DELIVERY_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, signed_headers

pytestmark = pytest.mark.integration


def post(env, hook: str, body, secret: str | None = None, delivery: str | None = None, ts: int | None = None,
         headers: dict | None = None, raw: bytes | None = None) -> httpx.Response:
    payload = raw if raw is not None else json.dumps(body).encode()
    h = signed_headers(secret if secret is not None else env.secrets.get(hook, "x"), payload,
                       delivery or uuid.uuid4().hex, ts)
    h.update(headers or {})
    return httpx.post(f"{env.url}/hooks/{hook}", content=payload, headers=h, timeout=30)


def first(env) -> str:
    return next(iter(env.secrets))


def test_signed_request_creates_one_run_and_replays_create_none(hook_env):
    env, hook = hook_env, first(hook_env)
    before = env.runs(hook)
    body, delivery = {"scale": "smoke", "overrides": {"seed": 7}}, f"d-{uuid.uuid4().hex}"
    r = post(env, hook, body, delivery=delivery)
    assert r.status_code == 202, r.text
    run_id = r.json()["flow_run_id"]
    run = env.api.read_flow_run(run_id)
    assert run["parameters"] == {"scale": "smoke", "overrides": {"seed": 7}}
    assert run["idempotency_key"] == f"webhook:{hook}:{delivery}" and "webhook" in run["tags"]
    # the sender retries the same delivery (new timestamp, so a new signature): same run, 409
    again = post(env, hook, body, delivery=delivery)
    assert again.status_code == 409 and again.json()["flow_run_id"] == run_id
    # a captured request re-sent verbatim with a fresh delivery id: the signature was used, 409
    payload = json.dumps(body).encode()
    headers = signed_headers(env.secrets[hook], payload, delivery)
    assert httpx.post(f"{env.url}/hooks/{hook}", content=payload, headers=headers).status_code == 409
    headers[DELIVERY_HEADER] = "fresh-" + uuid.uuid4().hex
    replay = httpx.post(f"{env.url}/hooks/{hook}", content=payload, headers=headers)
    assert replay.status_code == 409 and replay.json()["flow_run_id"] == run_id
    assert env.runs(hook) == before + 1


def _rejections(env, hook):
    secret = env.secrets[hook]
    good = {"scale": "smoke"}
    # timestamps are taken when a request is sent, a minute past the 300 s tolerance: a slow machine
    # must not carry a "future" timestamp back inside the window
    return {
        "bad signature": (401, lambda: post(env, hook, good, secret="not-the-secret")),
        "signature of another body": (401, lambda: post(env, hook, good, headers={
            SIGNATURE_HEADER: signed_headers(secret, b"{}", "x")[SIGNATURE_HEADER]})),
        "missing signature": (401, lambda: httpx.post(f"{env.url}/hooks/{hook}", json=good)),
        "stale timestamp": (401, lambda: post(env, hook, good, ts=int(time.time()) - 360)),
        "future timestamp": (401, lambda: post(env, hook, good, ts=int(time.time()) + 360)),
        "timestamp not a number": (401, lambda: post(env, hook, good, ts=None, headers={TIMESTAMP_HEADER: "soon"})),
        "unknown hook": (404, lambda: post(env, "no-such-hook", good, secret=secret)),
        "body too big": (413, lambda: post(env, hook, {"scale": "smoke", "pad": "x" * 5000})),
        "body too big, chunked": (413, lambda: httpx.post(
            f"{env.url}/hooks/{hook}", content=iter([b"{" + b" " * 3000, b" " * 3000 + b"}"]),
            headers=signed_headers(secret, b"", "chunked"))),
        "missing delivery id": (400, lambda: post(env, hook, good, headers={DELIVERY_HEADER: ""})),
        "bad delivery id": (400, lambda: post(env, hook, good, delivery="no spaces/or slashes")),
        "not JSON": (400, lambda: post(env, hook, None, raw=b"scale=smoke")),
        "not an object": (400, lambda: post(env, hook, ["smoke"])),
        "unknown body field": (422, lambda: post(env, hook, {"scale": "smoke", "scael": "quick"})),
        "bad scale": (422, lambda: post(env, hook, {"scale": "huge"})),
        "overrides not an object": (422, lambda: post(env, hook, {"overrides": "seed=1"})),
    }


CASES = ["bad signature", "signature of another body", "missing signature", "stale timestamp", "future timestamp",
         "timestamp not a number", "unknown hook", "body too big", "body too big, chunked", "missing delivery id",
         "bad delivery id", "not JSON", "not an object", "unknown body field", "bad scale", "overrides not an object"]


@pytest.mark.parametrize("case", CASES)
def test_bad_requests_are_refused_without_a_run(hook_env, case):
    env, hook = hook_env, first(hook_env)
    rejections = _rejections(env, hook)
    assert sorted(rejections) == sorted(CASES)
    status, send = rejections[case]
    before = {h: env.runs(h) for h in env.deployments}
    r = send()
    assert r.status_code == status, (case, r.text)
    assert "detail" in r.json()
    assert {h: env.runs(h) for h in env.deployments} == before


def _size_field(model) -> str | None:
    """A non-negative integer parameter other than seed (a size, a count)."""
    for name, f in model.model_fields.items():
        if name in ("seed", "scale") or f.annotation is not int:
            continue
        if any((getattr(m, "ge", None) is not None and m.ge >= 0) or (getattr(m, "gt", None) is not None and m.gt >= 0)
               for m in f.metadata):
            return name
    return None


@pytest.mark.parametrize("system", systems())
def test_bad_parameters_are_422_naming_the_field(hook_env, system):
    """Per implemented system: unknown key, wrong type, negative size -> 422 naming it, no run."""
    env = hook_env
    size = _size_field(registry.get(system).params_model())
    cases = [({"no_such_param": 1}, "no_such_param")]
    if size:
        cases += [({size: "lots"}, size), ({size: -1}, size)]
    before = env.runs(system)
    for overrides, field in cases:
        r = post(env, system, {"scale": "smoke", "overrides": overrides})
        assert r.status_code == 422, (overrides, r.text)
        assert r.json()["field"] == field and field in r.json()["detail"]
    assert env.runs(system) == before
    assert size, f"{system}: no non-negative integer parameter found to test a negative size"


def test_secrets_never_leak(hook_env, caplog):
    """Known secret values appear in no response, log record or exception text."""
    env, hook = hook_env, first(hook_env)
    caplog.set_level(logging.DEBUG)
    texts = []
    for case, (_, send) in _rejections(env, hook).items():
        r = send()
        texts += [r.text, json.dumps(dict(r.headers))]
    texts.append(post(env, hook, {"scale": "smoke"}).text)
    from mlsys_flows.webhooks import WebhookService

    service = WebhookService(env.config, env.api)
    for bad in ("no-such-block", ):  # a missing block: the error names the block, not a value
        try:
            env.api.read_secret(bad)
        except Exception as exc:  # noqa: BLE001
            texts.append(repr(exc) + str(exc))
    texts += [repr(env.config), env.config.model_dump_json(), repr(service), repr(env.api.__dict__)]
    texts += [rec.getMessage() + (rec.exc_text or "") for rec in caplog.records]
    blob = "\n".join(texts)
    for secret in env.secrets.values():
        assert secret not in blob
