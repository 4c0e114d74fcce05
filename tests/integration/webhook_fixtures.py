"""Shared by the webhook tests: a real Prefect API (the session harness), a deployment and a
Secret block per implemented system, and the webhook app served by uvicorn on 127.0.0.1."""
from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass

import pytest

from mlsys_flows import registry
from mlsys_flows.systems.common.net import free_port


class ServerThread:
    """uvicorn in a thread (no signal handlers there); ``stop()`` joins it."""

    def __init__(self, app, port: int | None = None):
        import uvicorn

        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off", access_log=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self, timeout_s: float = 30) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("webhook server did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


@dataclass
class HookEnv:
    api_url: str
    url: str                  # base URL of the webhook app
    secrets: dict[str, str]   # hook -> secret value (to sign, and to look for leaks)
    deployments: dict[str, str]  # hook -> deployment id
    config: object
    api: object

    def runs(self, hook: str) -> int:
        return self.api.count_flow_runs(self.deployments[hook])


def systems() -> list[str]:
    return registry.names()


@pytest.fixture(scope="module")
def hook_env(prefect_api, tmp_path_factory):
    """A hook per implemented system, each with its own deployment (no work pool: runs stay
    Scheduled, nothing executes) and its own Secret block. The rate limit is lifted (the load test
    sends hundreds of requests to one hook); test_webhooks.py tests it on a receiver of its own."""
    from prefect.blocks.system import Secret
    from prefect.settings import PREFECT_API_URL

    from mlsys_flows.platform.prefect_rest import PrefectREST
    from mlsys_flows.integrations.webhooks import WebhookConfig, create_app

    names = systems()
    api_url = PREFECT_API_URL.value()
    api = PrefectREST(api_url)
    tag = uuid.uuid4().hex[:8]
    secrets, deployments, hooks = {}, {}, {}
    for name in names:
        flow_id = api.request("POST", "flows/", json={"name": name}).json()["id"]
        dep = api.request("POST", "deployments/", json={"name": f"hooks-{tag}", "flow_id": flow_id,
                                                      "entrypoint": registry.get(name).entrypoint,
                                                      "parameters": {"scale": "quick"}}).json()
        secrets[name] = f"whsec-{uuid.uuid4().hex}"
        Secret(value=secrets[name]).save(f"hook-{name}-{tag}", overwrite=True)
        deployments[name] = dep["id"]
        hooks[name] = {"system": name, "deployment": f"{name}/hooks-{tag}", "secret_block": f"hook-{name}-{tag}"}
    config = WebhookConfig.model_validate({"hooks": hooks, "tolerance_s": 300, "max_body_bytes": 4096,
                                           "rate_per_s": 100000, "rate_burst": 100000,
                                           "replay_store": str(tmp_path_factory.mktemp("hooks") / "replays.sqlite")})
    server = ServerThread(create_app(config, api)).start()
    try:
        yield HookEnv(api_url, server.url, secrets, deployments, config, api)
    finally:
        server.stop()
        api.close()
