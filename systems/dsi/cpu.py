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


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [threading.get_native_id()]


@contextmanager
def pinned(cores: list[int] | None, whole_process: bool = True) -> Iterator[list[int]]:
    """Run the block on ``cores`` (None: unchanged); restore every thread's affinity afterwards.

    Threads that started inside the block and still run get the calling thread's old mask."""
    if cores is None or not HAS_AFFINITY:
        yield available_cores()
        return
    mask = set(cores)
    me = threading.get_native_id()
    tids = _threads() if whole_process else [me]
    before: dict[int, set[int]] = {}
    for tid in tids:
        try:
            before[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, mask)
        except (ProcessLookupError, PermissionError):  # the thread ended meanwhile
            continue
    try:
        yield sorted(mask)
    finally:
        default = before.get(me, set(available_cores()))
        for tid in (_threads() if whole_process else [me]):
            try:
                os.sched_setaffinity(tid, before.get(tid, default))
            except (ProcessLookupError, PermissionError, OSError):
                continue
