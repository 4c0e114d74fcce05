"""Free loopback ports for servers and subprocesses started by flows, the platform and tests (pure stdlib)."""
from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1", span: int = 0) -> int:
    """A port free on ``host`` now; with ``span``, port+span is free too (a service that also binds an
    offset port, e.g. SeaweedFS's gRPC port = HTTP port + 10000). Another process may take it before
    it is bound: callers bind soon after."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if not span or (port + span < 65536 and _is_free(host, port + span)):
            return port
    raise RuntimeError(f"no free port p with p+{span} also free on {host}")


def _is_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False
