"""A parent that imports a Dask worker's heavy modules once, then forks `dask worker` processes.

The fault tests SIGKILL a worker in every system's run and start a replacement each time. A worker
started with `dask worker` re-imports torch (and torch._dynamo, which an optimizer's first use pulls
in), Prefect, scipy and matplotlib before it runs its first task: 5-10 s of CPU per replacement on
these machines, minutes over a session of kills. Forked from this parent, a replacement shares those
imports and starts in well under a second; it is still a separate `dask worker` process, with its
own PID, scheduler connection and death. (The multiprocessing forkserver does the same for Dask's
own nannies.)

Protocol (line-based, on stdin/stdout): the parent reads a JSON list ``[args, log_path]`` per line,
forks a child that runs ``dask worker *args`` (args after the `worker` subcommand) with stderr appended to ``log_path`` in a session of
its own, and answers the child's PID. SIGCHLD is ignored, so the kernel reaps children the moment
they exit: their parent never collects a status (``ForkedWorker.poll`` sees the PID gone). The
parent exits when stdin closes.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import threading

# What a worker running this project's Prefect tasks imports anyway; a module missing here is skipped.
PRELOAD = ("distributed.cli.dask_worker", "torch", "torch._dynamo", "torch.fx.experimental.symbolic_shapes",
           "numpy", "scipy.optimize", "scipy.sparse", "pandas", "pyarrow", "matplotlib", "matplotlib.pyplot",
           "prefect", "prefect.flows", "prefect.task_engine", "prefect.task_runners", "mlsys_flows.tasks",
           "mlsys_flows.systems.common.report")


def _child(args: list[str], log_path: str) -> None:
    os.setsid()  # a session of its own, as `start_new_session=True` gives the other processes
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the worker's own children are reaped by the worker
    devnull = os.open(os.devnull, os.O_RDWR)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.dup2(log, 2)
    from distributed.cli.dask_worker import main

    sys.argv = ["dask-worker", *args]
    code = 1
    try:
        main()  # click: exits through SystemExit
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    os.environ.setdefault("MPLBACKEND", "Agg")
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a missing optional module only costs its import later
            print(f"dask_zygote: skipped preloading {name}: {exc!r}", file=sys.stderr, flush=True)
    if threading.active_count() != 1:  # forking a process with threads can copy a held lock
        print(f"dask_zygote: {threading.active_count()} threads after the imports", file=sys.stderr, flush=True)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    print("ready", flush=True)
    for line in sys.stdin:
        args, log_path = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(args, log_path)
        print(pid, flush=True)


if __name__ == "__main__":
    main()
