"""The software boards' state directory (``$MLSYS_FPGA_SW_DIR``, default
``<tmp>/mlsys-fpga-sw-<uid>``): the factory's root key, each board's folder (its device key and
certificate, its slot locks), and the file helpers the factory and the slots use."""
from __future__ import annotations

import fcntl
import os
import re
import tempfile
from contextlib import contextmanager
from typing import Iterator


def state_dir(path: str | None = None) -> str:
    """The software boards' state directory (keys, certificates, slot locks)."""
    root = path or os.environ.get("MLSYS_FPGA_SW_DIR") or os.path.join(
        tempfile.gettempdir(), f"mlsys-fpga-sw-{os.getuid()}")
    os.makedirs(root, mode=0o700, exist_ok=True)
    return root


def _device_dir(device: str, root: str | None = None) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", device)
    d = os.path.join(state_dir(root), "boards", safe)
    os.makedirs(d, mode=0o700, exist_ok=True)
    return d


@contextmanager
def _file_lock(path: str) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _write_private(path: str, data: bytes) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
