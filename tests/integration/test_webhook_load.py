"""Bounded load on the webhook (`make test-load`): 500 signed requests from 20 concurrent
clients over loopback, a mix of valid deliveries, replays of valid ones, bad signatures and
invalid parameters. Every valid delivery creates exactly one run; nothing else creates one."""
from __future__ import annotations

import json
import random
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from webhook_fixtures import hook_env  # noqa: F401 (fixture)

from mlsys_flows.integrations.webhooks import signed_headers

pytestmark = [pytest.mark.load, pytest.mark.integration]

REQUESTS, CLIENTS = 500, 20


def test_webhook_under_load(hook_env):
    env = hook_env
    hook = next(iter(env.secrets))
    rng = random.Random(0)
    before = env.runs(hook)
    # plan: 350 valid deliveries, 50 replays of valid ones (sent after), 50 bad signatures, 50 invalid params
    valid = [(f"load-{uuid.uuid4().hex}", {"scale": "smoke", "overrides": {"seed": i}}) for i in range(350)]
    plan = [("valid", d, b, env.secrets[hook]) for d, b in valid]
    plan += [("bad_signature", uuid.uuid4().hex, {"scale": "smoke"}, "wrong-secret") for _ in range(50)]
    plan += [("invalid", uuid.uuid4().hex, {"scale": "smoke", "overrides": {"no_such_param": i}}, env.secrets[hook])
             for i in range(50)]
    rng.shuffle(plan)
    replays = [("replay", d, b, env.secrets[hook]) for d, b in rng.sample(valid, 50)]
    assert len(plan) + len(replays) == REQUESTS

    clients = [httpx.Client(base_url=env.url, timeout=60) for _ in range(CLIENTS)]

    def send(i_item):
        i, (kind, delivery, body, secret) = i_item
        payload = json.dumps(body).encode()
        started = time.perf_counter()
        r = clients[i % CLIENTS].post(f"/hooks/{hook}", content=payload, headers=signed_headers(secret, payload, delivery))
        return kind, delivery, r.status_code, r.json().get("flow_run_id"), time.perf_counter() - started

    started = time.perf_counter()
    with ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(send, enumerate(plan)))
        results += list(pool.map(send, enumerate(replays)))  # after their originals
    elapsed = time.perf_counter() - started
    for c in clients:
        c.close()

    expected = {"valid": 202, "replay": 409, "bad_signature": 401, "invalid": 422}
    wrong = [(k, s) for k, _, s, _, _ in results if s != expected[k]]
    assert not wrong, f"{len(wrong)} unexpected statuses, e.g. {wrong[:5]}"
    first_run = {d: run for k, d, _, run, _ in results if k == "valid"}
    assert len(set(first_run.values())) == len(valid)  # one distinct run per valid delivery
    assert all(first_run[d] == run for k, d, _, run, _ in results if k == "replay")  # replays name that run
    assert env.runs(hook) == before + len(valid)  # and no other run was created

    latencies = sorted(r[-1] for r in results)
    p50, p99 = latencies[len(latencies) // 2], latencies[int(0.99 * (len(latencies) - 1))]
    print(f"\nwebhook load: {REQUESTS} requests, {CLIENTS} clients, {REQUESTS / elapsed:.1f} req/s, "
          f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms")
