"""Servers refuse a non-loopback interface without authentication unless --allow-insecure (issue 35).

Each CLI case holds the port it asks for (listening on 0.0.0.0), so a command that got past the
check fails at once on the busy port instead of serving: nothing here starts a server."""
from __future__ import annotations

import socket
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import yaml
from typer.testing import CliRunner

from mlsys_flows.cli import app
from mlsys_flows.platform.server import PlatformError, check_binding, is_loopback

runner = CliRunner()


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.8.0.1", True), ("localhost", True),
                                            ("::1", True), ("[::1]", True), ("0.0.0.0", False), ("::", False),
                                            ("192.168.1.5", False), ("example.org", False)])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_check_binding_refuses_warns_or_passes():
    assert check_binding("127.0.0.1", "the API", "no auth") is None
    assert check_binding("0.0.0.0", "the API", None) is None  # authenticated: any interface
    with pytest.raises(PlatformError, match="refusing to bind: the API on 0.0.0.0 .* no auth.*--allow-insecure"):
        check_binding("0.0.0.0", "the API", "no auth")
    assert "no auth" in check_binding("0.0.0.0", "the API", "no auth", allow_insecure=True)


@contextmanager
def busy_port():
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture
def isolated_home(tmp_path, monkeypatch):
    """The CLI sets Prefect's environment defaults: keep them inside this test."""
    monkeypatch.setenv("MLSYS_FLOWS_HOME", str(tmp_path))
    for name, value in {"PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("PREFECT_SERVER_API_AUTH_STRING", raising=False)
    return tmp_path


def test_server_refuses_a_public_interface_without_auth(isolated_home, monkeypatch):
    with busy_port() as port:
        refused = runner.invoke(app, ["server", "--host", "0.0.0.0", "--port", str(port)])
        insecure = runner.invoke(app, ["server", "--host", "0.0.0.0", "--port", str(port), "--allow-insecure"])
        monkeypatch.setenv("PREFECT_SERVER_API_AUTH_STRING", "admin:a-long-password")
        authenticated = runner.invoke(app, ["server", "--host", "0.0.0.0", "--port", str(port)])
    assert refused.exit_code == 2 and "refusing to bind" in refused.output, refused.output
    assert "PREFECT_SERVER_API_AUTH_STRING" in refused.output and "in use" not in refused.output
    for passed in (insecure, authenticated):  # past the check: the busy port stops it
        assert passed.exit_code == 2 and "in use" in passed.output, passed.output
    assert "insecure binding" in insecure.output and "insecure" not in authenticated.output


class _NoDeployments(BaseHTTPRequestHandler):
    """A Prefect API that has no deployment: answers 404 at once."""

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(404)
        self.end_headers()

    def log_message(self, *_):
        pass


def test_webhooks_serve_refuses_a_public_interface_with_a_weak_secret(isolated_home, monkeypatch):
    api = HTTPServer(("127.0.0.1", 0), _NoDeployments)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    config = isolated_home / "hooks.yaml"
    config.write_text(yaml.safe_dump({"hooks": {"h": {"params_model": "mlsys_flows.flow_params:Nothing",
                                                       "deployment": "f/d", "secret_env": "HOOK_SECRET"}}}))
    args = ["webhooks", "serve", "--config", str(config), "--api-url", f"http://127.0.0.1:{api.server_port}/api"]
    try:
        with busy_port() as port:
            serve = args + ["--host", "0.0.0.0", "--port", str(port)]
            monkeypatch.setenv("HOOK_SECRET", "s3cr3t")
            refused = runner.invoke(app, serve)
            insecure = runner.invoke(app, serve + ["--allow-insecure"])
            monkeypatch.setenv("HOOK_SECRET", "a-secret-of-32-characters-or-so!")
            strong = runner.invoke(app, serve)
    finally:
        api.shutdown()
    assert refused.exit_code == 2 and "refusing to bind" in refused.output, refused.output
    assert "['h']" in refused.output and "s3cr3t" not in refused.output  # names the hook, never the secret
    for passed in (insecure, strong):  # past the check: uvicorn cannot bind the busy port
        assert passed.exit_code != 0 and "already in use" in passed.output, passed.output
    assert "insecure binding" in insecure.output and "insecure" not in strong.output


def test_the_rank_rendezvous_store_listens_on_its_host_only():
    """torch's TCPStore, given a host, still listens on every interface ([::]); master_store binds the
    socket itself and hands it over, so the store that runs the ranks' rendezvous is on loopback."""
    import os

    import psutil

    from mlsys_flows.systems.common.distributed import master_store, peer_store

    store = master_store("127.0.0.1", 2, timeout_s=10)
    peer = peer_store("127.0.0.1", store.port, 2, timeout_s=10)
    peer.set("key", "value")
    assert store.get("key") == b"value"
    listening = {(c.laddr.ip, c.laddr.port) for c in psutil.Process(os.getpid()).net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == store.port}
    assert listening == {("127.0.0.1", store.port)}
    del peer, store
