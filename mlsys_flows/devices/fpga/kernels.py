"""Diagnostic kernels, used by tests and by a pool's self-check: :func:`diagnostic_image` declares
them, and none returns a key; :func:`occupancy_job` is one job that runs :func:`occupancy` on a board."""
from __future__ import annotations

import os
import time
from typing import Any

from .board import build_image, device_kernel, open_board
from .software import board_memory, board_session_key
from .state import _file_lock


def diagnostic_image() -> bytes:
    """An image that declares this module's diagnostic kernels (and nothing that touches a key)."""
    return build_image(f"{__name__}:{k}" for k in ("echo", "busy", "occupancy", "interval", "read_region",
                                                   "has_session_key"))


@device_kernel
def echo(*args: Any, **kwargs: Any) -> dict:
    """Returns the device process's pid and its arguments."""
    return {"pid": os.getpid(), "args": args, "kwargs": kwargs}


@device_kernel
def busy(seconds: float) -> float:
    """Spins on the device for ``seconds``; returns the time it took."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pass
    return time.perf_counter() - t0


@device_kernel
def occupancy(counter_path: str, seconds: float) -> int:
    """Marks one job active in a shared counter file for ``seconds``; returns the peak seen, so
    tests can check how many jobs ran on a device at once (across threads and processes)."""
    def bump(delta: int) -> int:
        with _file_lock(counter_path + ".lock"):
            try:
                with open(counter_path) as f:
                    cur, peak = (int(x) for x in f.read().split())
            except (FileNotFoundError, ValueError):
                cur, peak = 0, 0
            cur += delta
            peak = max(peak, cur)
            with open(counter_path, "w") as f:
                f.write(f"{cur} {peak}")
            return peak
    peak = bump(1)
    time.sleep(seconds)
    return max(peak, bump(-1))


@device_kernel
def interval(seconds: float) -> tuple[float, float]:
    """Sleeps on the device; returns the wall-clock (time.time) start and end."""
    t0 = time.time()
    time.sleep(seconds)
    return t0, time.time()


@device_kernel
def read_region(region: str, offset: int, length: int) -> bytes:
    """Reads a region through the device-side memory view (bounds-checked like the host's read)."""
    return bytes(board_memory().buffer(region, offset, length))


@device_kernel
def has_session_key() -> bool:
    """Whether the board holds a 32-byte session key (never returns the key itself)."""
    return len(board_session_key()) == 32


def occupancy_job(device: str, counter_path: str, seconds: float, **options: Any) -> int:
    """One job: open ``device`` (takes a slot), run :func:`occupancy` on it, close; returns the peak."""
    with open_board(device, **options) as board:
        board.load_image(diagnostic_image())
        return board.run(f"{__name__}:occupancy", counter_path, seconds)
