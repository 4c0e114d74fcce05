"""The OpenAI-compatible client (systems/common/llm.py) against a small local server that speaks the
OpenAI API (http.server on 127.0.0.1, a free port, started and stopped here): chat completions,
embeddings, the bearer key, malformed replies, HTTP errors and timeouts; and the task layer's
resolution of the key from a Prefect Secret block."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from mlsys_flows.systems.common.llm import LLMConfig, LLMError, OpenAICompatibleClient, llm_relevance, parse_score

KEY = "sk-test-not-a-real-key-123"


class _Handler(BaseHTTPRequestHandler):
    mode = "ok"          # ok | malformed | notjson | slow | error
    seen: list = []

    def log_message(self, *args):  # keep test output quiet
        pass

    def _send(self, code: int, body: bytes, ctype="application/json"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        type(self).seen.append((self.path, self.headers.get("Authorization"), body))
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            return self._send(401, json.dumps({"error": {"message": "invalid api key"}}).encode())
        mode = type(self).mode
        if mode == "slow":
            time.sleep(1.0)
        if mode == "error":
            return self._send(500, b"{}")
        if mode == "notjson":
            return self._send(200, b"<html>oops</html>", "text/html")
        if self.path == "/v1/chat/completions":
            if mode == "malformed":
                return self._send(200, json.dumps({"choices": []}).encode())
            user = body["messages"][-1]["content"]
            answer = "7" if "Rate how relevant" in user else f"echo: {user}"
            return self._send(200, json.dumps({"id": "x", "object": "chat.completion", "model": body["model"],
                                               "choices": [{"index": 0, "message": {"role": "assistant",
                                                                                    "content": answer}}]}).encode())
        if self.path == "/v1/embeddings":
            if mode == "malformed":
                return self._send(200, json.dumps({"data": [{"index": 0}]}).encode())
            rows = [{"object": "embedding", "index": i, "embedding": [float(len(t)), 1.0, 0.0]}
                    for i, t in enumerate(body["input"])]
            return self._send(200, json.dumps({"object": "list", "data": rows[::-1]}).encode())  # out of order
        self._send(404, b"{}")


@pytest.fixture()
def server():
    _Handler.mode, _Handler.seen = "ok", []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def _client(url, **kw):
    return OpenAICompatibleClient(LLMConfig(base_url=url, model="tiny", api_key=kw.pop("key", KEY), **kw))


def test_chat_and_embeddings(server):
    with _client(server) as c:
        assert c.complete("hello") == "echo: hello"
        path, auth, body = _Handler.seen[-1]
        assert path == "/v1/chat/completions" and auth == f"Bearer {KEY}" and body["model"] == "tiny"
        e = c.embed(["a", "abcd"])
        assert e.shape == (2, 3) and np.allclose(np.linalg.norm(e, axis=1), 1.0)
        assert e[1, 0] > e[0, 0]  # rows put back in input order by 'index'
        assert llm_relevance(c, "q", "p") == pytest.approx(0.7)
    assert KEY not in repr(c) and KEY not in repr(c.config)


def test_wrong_key_is_an_error_that_does_not_leak_the_key(server):
    with _client(server, key="sk-wrong-key") as c, pytest.raises(LLMError) as err:
        c.complete("hi")
    assert "401" in str(err.value) and "sk-wrong-key" not in str(err.value)


@pytest.mark.parametrize("mode, match", [("malformed", "malformed"), ("notjson", "not JSON"), ("error", "HTTP 500")])
def test_bad_replies_raise_clear_errors(server, mode, match):
    _Handler.mode = mode
    with _client(server) as c:
        with pytest.raises(LLMError, match=match):
            c.complete("hi")
        if mode == "malformed":
            with pytest.raises(LLMError, match="malformed embeddings"):
                c.embed(["x"])


def test_timeout(server):
    _Handler.mode = "slow"
    with _client(server, timeout_s=0.2, max_retries=0) as c, pytest.raises(LLMError, match="no reply within"):
        c.complete("hi")


def test_config_is_validated():
    with pytest.raises(ValueError):
        LLMConfig(base_url="not a url", model="m")
    with pytest.raises(ValueError):
        LLMConfig(base_url="http://x", model="")
    with pytest.raises(LLMError):
        parse_score("no number here")


def test_task_layer_resolves_the_key_from_a_secret_block(server, prefect_api):
    from prefect.blocks.system import Secret

    from mlsys_flows.tasks.vcache import llm_client

    Secret(value=KEY).save("llm-test-key", overwrite=True)
    with llm_client(server, "tiny", "llm-test-key") as c:
        assert c.complete("x") == "echo: x"
    with pytest.raises(ValueError, match="no Secret block"):
        llm_client(server, "tiny", "no-such-secret-block")
