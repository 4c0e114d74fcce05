"""Retrain arguments through shared memory: the host copies a retrain's arrays into one POSIX
shared-memory segment and sends the board only a small descriptor (pure; stdlib + numpy).

Why: pickling a merged group (hundreds of KB) through the board's pipe, whose kernel buffer is
smaller than that, blocks the host's submit while the board is busy with the previous kernel. With
the arrays in a segment, the pipe carries a few hundred bytes, so a submission never waits on the
board. The segment is unlinked when the retrain's result (or error) is back; :meth:`SharedSubmit.close`
unlinks any still outstanding (a board that died, an exception on the host), so none outlives a run.

Device side, :func:`attach` maps the descriptor back to numpy views; the kernel copies nothing.
"""
from __future__ import annotations

import concurrent.futures
import os
import threading
from contextlib import contextmanager
from multiprocessing import shared_memory
from typing import Any, Callable, Iterator

import numpy as np

# segment names start with this, so a test (or an operator) can tell this system's segments in /dev/shm
PREFIX = "mlsys_sia_"
_MARK = "__sia_shm__"  # a descriptor's tag: a plain tuple, so it passes the board's plain-data loader
_ALIGN = 64


def _layout(arrays: list[np.ndarray]) -> tuple[list[int], int]:
    offsets, pos = [], 0
    for a in arrays:
        offsets.append(pos)
        pos += -(-a.nbytes // _ALIGN) * _ALIGN
    return offsets, max(pos, 1)


class SharedSubmit:
    """A ``submit`` for :class:`~.index.Server` that wraps a board's ``run_async``: every numpy argument
    of a call goes into one segment and ``kernel`` is replaced by its ``_shared`` twin (the same
    computation, arguments read from the segment). A segment is released when its retrain's result (or
    error) is back; up to ``keep`` released segments are kept for reuse (a fresh segment's pages fault in
    on every first write, a reused one's do not), the rest unlinked at once, and :meth:`close` unlinks
    all, in flight or idle. Counts the calls and the bytes copied."""

    def __init__(self, run_async: Callable[..., concurrent.futures.Future], keep: int = 4):
        self.run_async, self.keep = run_async, keep
        self.busy: dict[str, shared_memory.SharedMemory] = {}
        self.idle: list[shared_memory.SharedMemory] = []
        self._lock = threading.Lock()   # results arrive on the board's reader thread
        self.calls = 0
        self.shared_bytes = 0
        self.created = 0

    def _take(self, size: int) -> shared_memory.SharedMemory:
        with self._lock:
            for i, shm in enumerate(self.idle):
                if shm.size >= size:
                    shm = self.idle.pop(i)
                    self.busy[shm.name] = shm
                    return shm
        # headroom: a group's merged array grows by a buffer's worth per retrain
        size = 1 << max(12, (size + size // 4 - 1).bit_length())
        shm = shared_memory.SharedMemory(name=f"{PREFIX}{os.getpid()}_{os.urandom(6).hex()}", create=True, size=size)
        with self._lock:
            self.busy[shm.name] = shm
        self.created += 1
        return shm

    def __call__(self, kernel: str, *args: Any) -> concurrent.futures.Future:
        arrays = [np.ascontiguousarray(a) for a in args if isinstance(a, np.ndarray)]
        offsets, size = _layout(arrays)
        shm = self._take(size)
        try:
            desc, k = [], 0
            for a in args:
                if isinstance(a, np.ndarray):
                    a = arrays[k]
                    np.ndarray(a.shape, a.dtype, buffer=shm.buf, offset=offsets[k])[...] = a
                    desc.append((_MARK, shm.name, offsets[k], tuple(a.shape), a.dtype.str))
                    k += 1
                else:
                    desc.append(a)
            fut = self.run_async(f"{kernel}_shared", *desc)
        except BaseException:
            self._release(shm.name, reuse=False)
            raise
        self.calls += 1
        self.shared_bytes += sum(a.nbytes for a in arrays)
        fut.add_done_callback(lambda f, name=shm.name: self._release(name, reuse=f.exception() is None))
        return fut

    def _release(self, name: str, reuse: bool = True) -> None:
        with self._lock:
            shm = self.busy.pop(name, None)
            if shm is None:
                return
            if reuse and len(self.idle) < self.keep:
                self.idle.append(shm)
                return
            # under the lock: a close() racing this release (the board's reader thread runs it after the
            # host already has the result) returns only once the segment is gone from /dev/shm
            _unlink(shm)

    def close(self) -> None:
        """Unlink every segment, idle or still out (errors, an abandoned run)."""
        with self._lock:
            out = list(self.busy.values()) + self.idle
            self.busy, self.idle = {}, []
        for shm in out:
            _unlink(shm)

    def __enter__(self) -> "SharedSubmit":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _unlink(shm: shared_memory.SharedMemory) -> None:
    try:
        shm.close()
    except BufferError:  # pragma: no cover - a view still alive here; the mapping goes with the process
        pass
    try:
        shm.unlink()
    except FileNotFoundError:
        pass


@contextmanager
def attach(args: tuple) -> Iterator[list]:
    """Device side: ``args`` with every shared-memory descriptor replaced by a read-only numpy view of
    its segment; the segments are closed (not unlinked: the host owns them) on exit."""
    opened: dict[str, shared_memory.SharedMemory] = {}
    out: list = []
    try:
        for a in args:
            if isinstance(a, tuple) and len(a) == 5 and a[0] == _MARK:
                _, name, offset, shape, dtype = a
                if not (isinstance(name, str) and name.startswith(PREFIX)):
                    raise ValueError(f"shared argument names segment {name!r}, not one of this system's")
                shm = opened.get(name) or opened.setdefault(name, _open(name))
                view = np.ndarray(shape, np.dtype(dtype), buffer=shm.buf, offset=offset)
                view.flags.writeable = False
                out.append(view)
            else:
                out.append(a)
        yield out
    finally:
        out.clear()
        for shm in opened.values():
            shm.close()


def _open(name: str) -> shared_memory.SharedMemory:
    # Attaching registers the name with the resource tracker again; the board's process is spawned by
    # the host and shares its tracker, so that is a no-op, and the host's unlink unregisters it once.
    return shared_memory.SharedMemory(name=name)


def leftover_segments() -> list[str]:
    """This system's segments present in /dev/shm now (Linux), for leak checks."""
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(PREFIX))
    except FileNotFoundError:  # pragma: no cover - no /dev/shm on this OS
        return []
