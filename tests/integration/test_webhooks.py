"""The webhook over real HTTP on 127.0.0.1 against a real Prefect API: every bad request is
refused with its status and creates no run; a good one creates exactly one; replays none."""
from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from types import SimpleNamespace

import httpx
import pytest
from webhook_fixtures import ServerThread, hook_env, systems  # noqa: F401 (fixture)

from mlsys_flows import registry
from mlsys_flows.integrations.webhooks import DELIVERY_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, create_app, signed_headers

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
    # a captured request re-sent verbatim: the delivery id is reserved, 409 naming the run
    payload = json.dumps(body).encode()
    headers = signed_headers(env.secrets[hook], payload, delivery)
    replay = httpx.post(f"{env.url}/hooks/{hook}", content=payload, headers=headers)
    assert replay.status_code == 409 and replay.json()["flow_run_id"] == run_id
    # ... or under a fresh delivery id: the signature covers the id, so it no longer matches
    headers[DELIVERY_HEADER] = "fresh-" + uuid.uuid4().hex
    assert httpx.post(f"{env.url}/hooks/{hook}", content=payload, headers=headers).status_code == 401
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
        "signature of another delivery id": (401, lambda: post(env, hook, good, headers={
            DELIVERY_HEADER: "not-the-signed-one"})),
        # an old signature kept, its timestamp moved to now (both inside the window): the signature covers it
        "signature of another timestamp": (401, lambda: post(env, hook, good, ts=int(time.time()) - 10, headers={
            TIMESTAMP_HEADER: str(int(time.time()))})),
        "missing signature": (401, lambda: httpx.post(f"{env.url}/hooks/{hook}", json=good)),
        "stale timestamp": (401, lambda: post(env, hook, good, ts=int(time.time()) - 360)),
        "future timestamp": (401, lambda: post(env, hook, good, ts=int(time.time()) + 360)),
        "timestamp not a number": (401, lambda: post(env, hook, good, ts=None, headers={TIMESTAMP_HEADER: "soon"})),
        "unknown hook": (401, lambda: post(env, "no-such-hook", good, secret=secret)),
        "body too big": (413, lambda: post(env, hook, {"scale": "smoke", "pad": "x" * 5000})),
        "body too big, chunked": (413, lambda: httpx.post(
            f"{env.url}/hooks/{hook}", content=iter([b"{" + b" " * 3000, b" " * 3000 + b"}"]),
            headers=signed_headers(secret, b"", "chunked"))),
        "missing delivery id": (400, lambda: httpx.post(  # signed with an empty id
            f"{env.url}/hooks/{hook}", content=b"{}", headers=signed_headers(secret, b"{}", ""))),
        "bad delivery id": (400, lambda: post(env, hook, good, delivery="no spaces/or slashes")),
        "not JSON": (400, lambda: post(env, hook, None, raw=b"scale=smoke")),
        "not an object": (400, lambda: post(env, hook, ["smoke"])),
        "unknown body field": (422, lambda: post(env, hook, {"scale": "smoke", "scael": "quick"})),
        "bad scale": (422, lambda: post(env, hook, {"scale": "huge"})),
        "overrides not an object": (422, lambda: post(env, hook, {"overrides": "seed=1"})),
    }


CASES = ["bad signature", "signature of another body", "signature of another delivery id",
         "signature of another timestamp", "missing signature",
         "stale timestamp", "future timestamp",
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
    from mlsys_flows.integrations.webhooks import WebhookService

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


# --- issue 35: replays across replicas and restarts, unknown hooks, /health, rate limit ----------------
def _post_at_once(requests: list[tuple[str, bytes, dict]]) -> list[httpx.Response]:
    """POST every (url, body, headers) from a thread of its own, all released by one barrier."""
    barrier, responses = threading.Barrier(len(requests)), [None] * len(requests)

    def send(i: int) -> None:
        url, body, headers = requests[i]
        barrier.wait()
        responses[i] = httpx.post(url, content=body, headers=headers, timeout=60)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return responses


def test_concurrent_replays_to_two_receivers_sharing_one_store_start_one_run(hook_env):
    env, hook = hook_env, first(hook_env)
    replica = ServerThread(create_app(env.config, env.api)).start()  # same config: same replay store file
    body = json.dumps({"scale": "smoke"}).encode()
    headers = signed_headers(env.secrets[hook], body, f"race-{uuid.uuid4().hex}")
    fresh_id = {**headers, DELIVERY_HEADER: f"race-{uuid.uuid4().hex}"}  # the captured signature, a new id
    before = env.runs(hook)
    try:
        responses = _post_at_once([(f"{url}/hooks/{hook}", body, h) for url in (env.url, replica.url)
                                   for h in (headers, headers, headers, fresh_id)])
    finally:
        replica.stop()
    assert sorted(r.status_code for r in responses) == [202] + [401] * 2 + [409] * 5, [r.text for r in responses]
    run_id = next(r.json()["flow_run_id"] for r in responses if r.status_code == 202)
    assert all(r.json().get("flow_run_id", run_id) == run_id for r in responses if r.status_code == 409)
    assert env.runs(hook) == before + 1


def test_replay_after_a_receiver_restart_is_refused(hook_env):
    env, hook = hook_env, first(hook_env)
    body = json.dumps({"scale": "smoke"}).encode()
    headers = signed_headers(env.secrets[hook], body, f"restart-{uuid.uuid4().hex}")
    before = env.runs(hook)
    receiver = ServerThread(create_app(env.config, env.api)).start()
    try:
        accepted = httpx.post(f"{receiver.url}/hooks/{hook}", content=body, headers=headers, timeout=60)
    finally:
        receiver.stop()
    assert accepted.status_code == 202, accepted.text
    restarted = ServerThread(create_app(env.config, env.api)).start()  # nothing kept in memory
    try:
        replay = httpx.post(f"{restarted.url}/hooks/{hook}", content=body, headers=headers, timeout=60)
        fresh_id = httpx.post(f"{restarted.url}/hooks/{hook}", content=body, timeout=60,
                              headers={**headers, DELIVERY_HEADER: f"restart-{uuid.uuid4().hex}"})
    finally:
        restarted.stop()
    assert replay.status_code == 409 and replay.json()["flow_run_id"] == accepted.json()["flow_run_id"]
    assert "already processed" in replay.json()["detail"]  # refused by the durable store, before Prefect
    assert fresh_id.status_code == 401
    assert env.runs(hook) == before + 1


def test_unknown_hook_and_bad_signature_answer_alike(hook_env):
    env, hook = hook_env, first(hook_env)
    unknown = post(env, "no-such-hook", {"scale": "smoke"}, secret=env.secrets[hook])
    bad = post(env, hook, {"scale": "smoke"}, secret="not-the-secret")
    assert unknown.status_code == bad.status_code == 401
    assert unknown.content == bad.content
    assert {k: v for k, v in unknown.headers.items() if k != "date"} == \
        {k: v for k, v in bad.headers.items() if k != "date"}


def test_health_names_no_hook(hook_env):
    r = httpx.get(f"{hook_env.url}/health", timeout=30)
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert not any(name in r.text for name in hook_env.config.hooks)


def test_rate_limit_answers_429_with_retry_after(hook_env):
    """Two requests per hook name, then 429 (one token per 1000 s: the test never waits for one);
    a made-up name is limited alike, so a 429 does not tell which hooks exist."""
    env, hook = hook_env, first(hook_env)
    receiver = ServerThread(create_app(env.config.model_copy(update={"rate_per_s": 0.001, "rate_burst": 2}),
                                       env.api)).start()
    before = env.runs(hook)
    try:
        statuses = {}
        for name in (hook, "no-such-hook"):
            sent = [post(SimpleNamespace(url=receiver.url, secrets=env.secrets), name, {"scale": "smoke"},
                         secret=env.secrets[hook]) for _ in range(3)]
            statuses[name] = [r.status_code for r in sent]
            assert int(sent[-1].headers["retry-after"]) >= 1 and "rate limit" in sent[-1].json()["detail"]
    finally:
        receiver.stop()
    assert statuses == {hook: [202, 202, 429], "no-such-hook": [401, 401, 429]}
    assert env.runs(hook) == before + 2  # the limited request created nothing


def test_a_failed_run_creation_releases_the_delivery(hook_env):
    """The reservation precedes the run; when the run cannot be created (502) it is released, so
    the sender's retry of that delivery is tried again rather than refused as a replay."""
    env, hook = hook_env, first(hook_env)
    ghost = env.config.hooks[hook].model_copy(update={"deployment": "no-such-flow/no-such-deployment"})
    config = env.config.model_copy(update={"hooks": {**env.config.hooks, "ghost": ghost}})
    receiver = ServerThread(create_app(config, env.api)).start()
    body = json.dumps({"scale": "smoke"}).encode()
    headers = signed_headers(env.secrets[hook], body, f"ghost-{uuid.uuid4().hex}")
    try:
        statuses = [httpx.post(f"{receiver.url}/hooks/ghost", content=body, headers=headers, timeout=60).status_code
                    for _ in range(2)]
    finally:
        receiver.stop()
    assert statuses == [502, 502]


def test_the_log_tells_an_operator_each_delivery_its_status_reason_and_run(hook_env, caplog):
    """Issue 52 item 6: one line per request with hook, delivery id, status, reason and run id; a bad
    signature, a stale timestamp and a missing header read apart."""
    env, hook = hook_env, first(hook_env)
    caplog.set_level(logging.INFO, logger="mlsys_flows.integrations.webhooks")
    rejections = _rejections(env, hook)
    lines = {}
    for case in ("bad signature", "stale timestamp", "missing signature"):
        caplog.clear()
        rejections[case][1]()
        (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("hook=")]
        lines[case] = line
        assert f"hook={hook} " in line and " status=401 " in line and " run=- " in line, line
    assert "signature" in lines["bad signature"] and "tolerance" in lines["stale timestamp"] \
        and "missing" in lines["missing signature"]
    assert len({line.split("reason=")[1] for line in lines.values()}) == 3
    caplog.clear()
    r = post(env, hook, {"scale": "smoke"}, delivery="ops-log-1")
    assert r.status_code == 202, r.text
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("hook=")]
    assert f"delivery=ops-log-1 status=202 run={r.json()['flow_run_id']} reason='accepted'" in line
    from mlsys_flows.integrations.webhooks import configure_logging

    assert configure_logging().level == logging.INFO and configure_logging().handlers  # `webhooks serve` shows them
