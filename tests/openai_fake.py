"""A local stand-in for an OpenAI-compatible endpoint, shared by the LLM tests: subclass ``FakeModel``,
write its ``do_POST`` (``read_json`` the request, ``send_json`` or ``send_bytes`` the reply) and
``with serve(MyModel) as base_url:`` runs it on 127.0.0.1, on a free port, until the block ends."""
from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator


class FakeModel(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep test output quiet
        pass

    def read_json(self) -> Any:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")

    def send_bytes(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_json(self, code: int, payload: Any) -> None:
        self.send_bytes(code, json.dumps(payload).encode())


@contextmanager
def serve(handler: type[FakeModel]) -> Iterator[str]:
    """The handler on a free 127.0.0.1 port; yields its base URL (``.../v1``) and stops it after."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)
