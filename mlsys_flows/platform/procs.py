"""Child processes that stop cleanly: each in its own process group, stopped TERM -> INT -> KILL.

`prefect server start`, `prefect worker start` and `dask worker` spawn children of their own
(uvicorn, flow-run processes, nannies); some ignore the first signal (docs/platform.md, section 1:
the worker may need TERM then INT). Signalling the whole group, then sweeping every descendant recorded
before the first signal, leaves no strays even when a child started a session of its own.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Mapping, Sequence

import psutil

STOP_SEQUENCE = (signal.SIGTERM, signal.SIGINT, signal.SIGKILL)
HURRY = threading.Event()  # set by a second Ctrl-C during a stop: skip the grace periods


class Proc:
    """One started command; ``log`` receives its stdout and stderr."""

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
                 cwd: str | Path | None = None, log: Path | None = None):
        self.name, self.argv, self.log_path = name, list(argv), log
        out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - closed in stop()
        self._out = out
        self.popen = subprocess.Popen(self.argv, env=dict(env) if env is not None else None, cwd=cwd,
                                      stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, n: int = 40) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self, grace_s: float = 10.0) -> None:
        """TERM, then INT, then KILL the process group, waiting ``grace_s`` between steps."""
        family = self.descendants()
        for sig in STOP_SEQUENCE:
            if not self.alive() and not _any_alive(family):
                break
            _signal_group(self.pid, sig)
            for p in family:  # children that moved to a group of their own
                _signal(p, sig)
            deadline = time.monotonic() + (grace_s if sig != signal.SIGKILL else 5.0)
            while time.monotonic() < deadline and (self.alive() or _any_alive(family)):
                if HURRY.is_set() and sig != signal.SIGKILL:
                    break
                time.sleep(0.1)
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if self._out is not subprocess.DEVNULL:
            self._out.close()


def _any_alive(procs: list[psutil.Process]) -> bool:
    return any(_running(p) for p in procs)


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the group id equals the leader's pid (start_new_session=True)
    except (ProcessLookupError, PermissionError):
        pass


def _signal(p: psutil.Process, sig: int) -> None:
    try:
        if _running(p):
            p.send_signal(sig)
    except psutil.NoSuchProcess:
        pass


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def stop_on_signals() -> dict:
    """Ctrl-C (SIGINT) and SIGTERM raise KeyboardInterrupt in the main thread, however this process
    was started. A background job of a non-interactive shell (CI runners, supervisors, ``nohup``,
    ``cmd &`` in a script) starts with SIGINT *ignored*, and Python then installs no handler of its
    own: without this, Ctrl-C would do nothing. Returns the previous handlers."""
    return {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}


def stop_all(procs: Sequence[Proc], grace_s: float = 10.0) -> None:
    """Stop in reverse start order (the worker before the server it talks to). In the main
    thread, Ctrl-C or SIGTERM during the stop cannot abort it; they only skip the waiting."""
    main = threading.current_thread() is threading.main_thread()
    previous = {}
    if main:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: HURRY.set())
    try:
        for proc in reversed(procs):
            proc.stop(grace_s)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        HURRY.clear()
