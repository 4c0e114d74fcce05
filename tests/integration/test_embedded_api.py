"""The CLI's default API: with no server running, `mlsys-flows run` starts the embedded API first (it
boots while the flow is imported), runs the flow against it and stops it on exit."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from faultkit import survivors

pytestmark = pytest.mark.integration

SERVER = "server start"  # the embedded API is `prefect server start` (server.EmbeddedAPI)


def _api_servers(home: Path) -> set[int]:
    """Embedded API processes started for ``home`` (their MLSYS_FLOWS_HOME): other processes on the
    machine, another test's or a developer's, are not this command's."""
    found = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if SERVER in " ".join(p.info["cmdline"] or []) and p.environ().get("MLSYS_FLOWS_HOME") == str(home):
                found.add(p.info["pid"])
        except psutil.Error:
            pass
    return found


def _group(pgid: int) -> list:
    """The live processes of process group ``pgid``."""
    found = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                found.append(p)
        except (ProcessLookupError, psutil.Error):
            pass
    return found


def test_cli_run_starts_the_embedded_api_early_and_stops_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(MLSYS_FLOWS_HOME=str(tmp_path / "home"), PREFECT_LOGGING_LEVEL="WARNING")
    cli = str(Path(sys.executable).parent / "mlsys-flows")
    proc = subprocess.run([cli, "run", "moetuner", "--scale", "smoke"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Prefect API: embedded, temporary" in proc.stdout
    assert "moetuner finished" in proc.stdout
    log = tmp_path / "home" / "prefect" / "embedded-api.log"
    assert log.exists()  # the server this command started, not Prefect's on-demand one
    assert not _api_servers(tmp_path / "home"), "the embedded API outlived the command"


def test_ctrl_c_stops_a_cli_run_in_flight(tmp_path):
    """`mlsys-flows run` started with SIGINT ignored (as a background job of a script starts it),
    interrupted once its flow's first task runs on its Dask workers, while another process keeps a core busy:
    within 10 s the command, its embedded API and its Dask cluster are gone, and the run and the task
    it had in flight read Crashed (or Cancelled) in the API's database, not Running."""
    import contextlib
    import signal
    import sqlite3
    import time

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(MLSYS_FLOWS_HOME=str(tmp_path / "home"), PREFECT_LOGGING_LEVEL="WARNING")
    cli = str(Path(sys.executable).parent / "mlsys-flows")
    # output to a file, not a pipe: a stray that inherited a pipe would keep a read of it waiting forever
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([cli, "run", "cedar", "--scale", "smoke"], cwd=tmp_path, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))

    def a_task_is_running() -> bool:  # read from the embedded API's database while it writes it
        if not db_path.exists():  # connecting would create an empty file where the API's database goes
            return False
        try:
            with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=1)) as db:
                # a pipeline benchmark (seconds long), not the workload task that may end the next instant
                return bool(db.execute("SELECT count(*) FROM task_run WHERE state_type = 'RUNNING' AND name LIKE "
                                       "'cedar-benchmark%'").fetchone()[0])
        except sqlite3.Error:  # not migrated yet, or busy this instant
            return False

    db_path = tmp_path / "home" / "prefect" / "prefect.db"
    deadline = time.monotonic() + 300  # a hang guard, not the test's moment
    while not a_task_is_running():  # the moment: a task of the run in flight
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, "the flow's first task never started"
        time.sleep(0.1)
    family = psutil.Process(proc.pid).children(recursive=True)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        started = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=90)
        finally:
            elapsed = time.monotonic() - started
            for p in [*family, psutil.Process(proc.pid)] if proc.poll() is None else []:
                p.kill()
    finally:
        busy.kill()
        busy.wait()
    out = log.read_text(errors="replace")
    print(f"\nCtrl-C with a run in flight: `mlsys-flows run` stopped in {elapsed:.1f} s")
    # its processes: those seen while the task ran, and any in its process group now (one started
    # later, e.g. a pool process of the task, is in the group even once orphaned)
    strays = survivors(family + _group(proc.pid))
    for p in strays:
        with contextlib.suppress(psutil.Error):
            p.kill()
    assert not strays, [p.cmdline() for p in strays]
    assert elapsed < 10, f"stopping took {elapsed:.1f} s:\n{out[-2000:]}"
    assert proc.returncode == 130, out[-3000:]  # interrupted, as a shell reports Ctrl-C
    with contextlib.closing(sqlite3.connect(db_path)) as db:
        states = [s for (s,) in db.execute("SELECT state_type FROM flow_run")]
        tasks = dict(db.execute("SELECT name, state_type FROM task_run"))
    assert states and all(s in ("CRASHED", "CANCELLED") for s in states), states
    # the task in flight is Crashed too, not Running forever (issue 52 item 2)
    assert "CRASHED" in tasks.values() and all(s in ("COMPLETED", "CRASHED", "FAILED", "CANCELLED")
                                               for s in tasks.values()), tasks
