"""`mlsys-flows server` started as a user starts it, for the integration tests (the session's one
server is the ``user_server`` fixture of tests/integration/conftest.py)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from faultkit import survivors

from mlsys_flows.platform.server import state_file


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class ServerCLI:
    """`mlsys-flows server` started the way a CI runner, a supervisor or `cmd &` in a script starts
    it: SIGINT ignored (inherited across exec), in a process group of its own so that a SIGINT to
    the group reaches it alone, like Ctrl-C at its terminal."""

    def __init__(self, root: Path, port: int):
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env["MLSYS_FLOWS_HOME"] = str(root)
        root.mkdir(parents=True, exist_ok=True)
        self.log = root.parent / "server-cli.log"
        self.proc = subprocess.Popen([str(Path(sys.executable).parent / "mlsys-flows"), "server", "--port", str(port),
                                      "--worker-query-seconds", "1"], env=env, stdout=open(self.log, "wb"),
                                     stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_ignore_sigint)
        self.state = state_file(root)

    def family(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def ctrl_c(self) -> tuple[float, list[psutil.Process]]:
        """SIGINT to the group, as Ctrl-C sends it; (seconds until the command exited, every process it
        had started that is still alive then). Kills what is left after 90 s, and fails."""
        family = self.family()
        started = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:  # a failed stop: clean up, then fail
            for p in [psutil.Process(self.proc.pid), *family]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
            self.proc.wait(timeout=10)
            raise AssertionError(f"SIGINT did not stop `mlsys-flows server` in 90 s:\n{self.log.read_text()[-3000:]}")
        elapsed = time.monotonic() - started
        strays = survivors(family)
        return elapsed, strays
