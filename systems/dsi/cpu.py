"""The trainer host's CPU budget: which cores the trainer and DPP's workers get, and pinning.

The comparison is the same hardware arranged two ways. The trainer process and its on-host loader
threads are pinned to one core (the trainer host's budget); DPP's workers are separate processes
pinned to the remaining cores. With a single core available nothing can be split: both share it
and :func:`split_cores` says so.

:func:`pinned` pins every thread of the calling process (Linux applies ``sched_setaffinity`` per
thread; threads started inside inherit the mask) or just the calling thread, and restores each
thread's previous mask on exit. Where the OS has no affinity call it is a no-op.
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Iterator

HAS_AFFINITY = hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


def available_cores() -> list[int]:
    """Cores this process may run on (all CPUs where affinity is unsupported)."""
    if HAS_AFFINITY:
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def split_cores(cores: list[int]) -> tuple[list[int], list[int], str]:
    """(trainer cores, DPP worker cores, note): the trainer host gets one core, DPP the rest."""
    cores = sorted(cores)
    if not cores:
        raise ValueError("no CPU core available")
    if not HAS_AFFINITY:
        return cores, cores, "this OS cannot pin threads to cores: trainer and DPP workers share every core"
    if len(cores) == 1:
        return cores, cores, (f"only 1 core available (core {cores[0]}): the trainer, its loader threads and "
                              "DPP's workers share it, so DPP cannot add CPU and the comparison shows only "
                              "the overhead of moving the work")
    return cores[:1], cores[1:], (f"trainer host: core {cores[0]} (the trainer process and its loader threads); "
                                  f"DPP workers: core(s) {','.join(map(str, cores[1:]))} as separate processes")


def _threads(pid: int | str = "self") -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return [threading.get_native_id()] if pid == "self" else []


def pin_process(pid: int, cores: list[int]) -> dict[int, set[int]]:
    """Pin every thread of process ``pid`` to ``cores``; returns each thread's previous mask.

    A thread started by a not-yet-pinned thread while this runs would keep the old mask, so the
    thread list is read again until no new thread shows up."""
    if not HAS_AFFINITY:
        return {}
    mask, before = set(cores), {}
    for _ in range(4):
        new = [t for t in _threads(pid) if t not in before]
        if not new:
            break
        for tid in new:
            try:
                before[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, mask)
            except (ProcessLookupError, PermissionError):  # the thread ended meanwhile
                continue
    return before


def restore_process(pid: int, before: dict[int, set[int]], default: set[int] | None = None) -> None:
    """Undo :func:`pin_process`: threads started since get ``default`` (the main thread's previous mask)."""
    if not HAS_AFFINITY or not before:
        return
    default = default or before.get(pid) or next(iter(before.values()))
    for tid in _threads(pid):
        try:
            os.sched_setaffinity(tid, before.get(tid, default))
        except (ProcessLookupError, PermissionError, OSError):  # gone (a killed worker): nothing to undo
            continue


@contextmanager
def pinned(cores: list[int] | None, whole_process: bool = True) -> Iterator[list[int]]:
    """Run the block on ``cores`` (None: unchanged); restore every thread's affinity afterwards.

    Threads that started inside the block and still run get the calling thread's old mask."""
    if cores is None or not HAS_AFFINITY:
        yield available_cores()
        return
    me = threading.get_native_id()
    if whole_process:
        pid = os.getpid()
        before = pin_process(pid, cores)
        try:
            yield sorted(set(cores))
        finally:  # threads started inside get the caller's old mask
            restore_process(pid, before, default=before.get(me))
        return
    old = os.sched_getaffinity(me)
    os.sched_setaffinity(me, set(cores))
    try:
        yield sorted(set(cores))
    finally:
        os.sched_setaffinity(me, old)


# ----- which other processes leave the trainer's core ---------------------------------------------
def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])  # after "(comm)": state, ppid


def process_identity() -> dict:
    """This process: pid, its ancestors' pids (parent first) and the machine (boot id and host name),
    so that a pid seen from another process is only acted on when it is on the same machine."""
    import socket

    ancestors, pid = [], os.getpid()
    try:
        while pid > 1 and len(ancestors) < 64:
            pid = _parent(pid)
            ancestors.append(pid)
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
    except (OSError, ValueError, IndexError):  # no /proc: never the same machine as anyone
        return {"pid": os.getpid(), "ancestors": [], "machine": None}
    return {"pid": os.getpid(), "ancestors": ancestors, "machine": f"{boot}/{socket.gethostname()}"}


def helper_pins(trainer: dict, scheduler: dict, workers: dict[str, dict], trainer_worker: str,
                own_cluster: bool) -> tuple[dict[str, int], str]:
    """({label: pid} to pin off the trainer's core, note): the scheduler's process and the other Dask
    workers and the nannies, when the run's own embedded cluster started them on the trainer's machine.

    Each argument is a :func:`process_identity`. A cluster the flow did not start (an address, a warm
    server cluster) is left alone: its processes serve other work too."""
    if not own_cluster:
        return {}, "the cluster was not started by this run: its scheduler and workers are left unpinned"
    sched = scheduler["pid"]
    if scheduler["machine"] is None or scheduler["machine"] != trainer["machine"] or sched not in trainer["ancestors"]:
        if sched == trainer["pid"] and scheduler["machine"] == trainer["machine"]:
            return {}, "the Dask workers are threads of the trainer's process: nothing to pin apart"
        return {}, "the scheduler is not the parent of the trainer's worker here: nothing pinned"
    pins = {"scheduler (the flow's process)": sched}
    if trainer["ancestors"][0] != sched:
        pins["nanny of the trainer's worker"] = trainer["ancestors"][0]
    for addr, w in sorted(workers.items()):
        if addr == trainer_worker or w["pid"] == trainer["pid"]:
            continue
        if w["machine"] != trainer["machine"] or sched not in w["ancestors"]:
            continue  # joined from elsewhere: not the run's to pin
        pins[f"DPP worker {addr}"] = w["pid"]
        if w["ancestors"][0] != sched:
            pins[f"nanny of {addr}"] = w["ancestors"][0]
    return pins, "the run's embedded cluster: its scheduler, nannies and the workers other than the trainer's"


def dpp_workers_wanted(max_workers: int, trainer: list[int], dpp: list[int], per_core: int = 1) -> int:
    """DPP worker processes to offer: ``per_core`` per DPP core (preprocessing is single-threaded, so
    one per core is what adds CPU; more give the controller workers to add, sharing their core), at
    most ``max_workers``; 1 when the trainer and DPP share the cores (more would run on the trainer's)."""
    if set(dpp) == set(trainer):
        return 1
    return max(1, min(max_workers, per_core * len(dpp)))
