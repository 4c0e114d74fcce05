"""Results of offloaded chunks through shared memory (pure).

A worker process that ran a chunk returns a list of samples. Pickled whole, the large arrays in it
(decoded images, float32 crops) are copied into the pickle, pushed through the pool's pipe 64 KiB at
a time and copied again on the other side. Here, as torch's DataLoader does with its shared-memory
tensors, the worker writes the result's large numpy arrays (and CPU torch tensors) into one
shared-memory segment (a file in ``/dev/shm``) and returns a small :class:`SharedResult`: the
segment's name and size, where each array lies in it, and the result with placeholders, which is
all that is pickled through the pipe. The main process opens the segment, **unlinks its name at
once**, maps it and rebuilds the result around arrays that are views of the mapping; the memory
goes back to the system when the last of those arrays is freed. A result whose large arrays total
less than ``MIN_TOTAL_BYTES`` is returned as it is (pickled, as before), and so is every result when
shared memory is unavailable (no ``/dev/shm``, or it is full).

Segments are released deterministically: on receipt (the name is unlinked before anything else);
results never received (an early stop, an exception in another chunk) are waited for and unlinked
by :meth:`SharedMemoryChannel.discard`; and :meth:`SharedMemoryChannel.close` removes whatever is
left under the channel's own prefix (a worker killed while writing).

What comes back equals what pickling gives: same structure, dtypes, shapes and values; arrays that
were Fortran-ordered stay Fortran-ordered, other non-contiguous arrays arrive C-contiguous (as
unpickled ones do), and an array object that appears twice in a result comes back as one object.
"""
from __future__ import annotations

import itertools
import mmap
import os
import sys
import threading
import uuid
from concurrent.futures import wait
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

SHM_DIR = "/dev/shm"
MIN_ARRAY_BYTES = 4096          # an array at least this large may travel through shared memory...
MIN_TOTAL_BYTES = 256 * 1024    # ...when the result's such arrays total at least this much
ALIGN = 64                      # byte alignment of each array in a segment
DISCARD_WAIT_S = 10.0           # how long discarding an unreceived result waits for its worker

_counter = itertools.count()


def available(shm_dir: str = SHM_DIR) -> bool:
    """Whether this machine offers shared memory as a writable folder (Linux: ``/dev/shm``)."""
    return os.path.isdir(shm_dir) and os.access(shm_dir, os.W_OK | os.X_OK)


def new_prefix() -> str:
    """A name prefix for one channel's segments: the main process's pid and a random token."""
    return f"cedar-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class _Slot:
    """Where the i-th array of a SharedResult goes in its skeleton."""

    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i

    def __reduce__(self):
        return (_Slot, (self.i,))


@dataclass(frozen=True)
class ArraySpec:
    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran: bool = False   # bytes in Fortran order (the array was F- and not C-contiguous)
    torch: bool = False     # a torch tensor: rebuilt with torch.from_numpy


@dataclass(frozen=True)
class SharedResult:
    """What crosses the pipe instead of a result with large arrays."""

    name: str
    size: int
    specs: tuple[ArraySpec, ...]
    skeleton: Any


def _torch_array(x: Any) -> np.ndarray | None:
    """A CPU torch tensor as a numpy view (None when it is not one numpy can share)."""
    torch = sys.modules.get("torch")
    if torch is None or type(x) is not torch.Tensor:
        return None
    try:
        if x.device.type != "cpu" or x.requires_grad or x.layout != torch.strided or x.is_conj() or x.is_neg():
            return None
        return x.numpy()
    except (TypeError, RuntimeError):  # dtypes numpy lacks (bfloat16), quantized tensors
        return None


def _leaves(x: Any):
    """The leaves of ``x`` (the values inside nested dicts, lists and tuples)."""
    t = type(x)
    if t is dict:
        for v in x.values():
            yield from _leaves(v)
    elif t is list or t is tuple:
        for v in x:
            yield from _leaves(v)
    else:
        yield x


def _map_leaves(x: Any, fn) -> Any:
    """``x`` with every leaf replaced by ``fn(leaf)`` (dicts, lists and tuples rebuilt)."""
    t = type(x)
    if t is dict:
        return {k: _map_leaves(v, fn) for k, v in x.items()}
    if t is list:
        return [_map_leaves(v, fn) for v in x]
    if t is tuple:
        return tuple(_map_leaves(v, fn) for v in x)
    return fn(x)


def _find(x: Any, min_array: int, found: dict[int, tuple[Any, np.ndarray, bool]]) -> None:
    """Collect the large arrays of ``x`` (inside dicts, lists and tuples), by object identity."""
    for leaf in _leaves(x):
        t = type(leaf)
        if t is np.ndarray:
            if leaf.nbytes >= min_array and not leaf.dtype.hasobject and id(leaf) not in found:
                found[id(leaf)] = (leaf, leaf, False)
        elif t.__module__ == "torch":
            a = _torch_array(leaf)
            if a is not None and a.nbytes >= min_array and id(leaf) not in found:
                found[id(leaf)] = (leaf, a, True)


def _strip(x: Any, slots: dict[int, int]) -> Any:
    """``x`` with each array that went to the segment replaced by its slot."""
    return _map_leaves(x, lambda v: v if id(v) not in slots else _Slot(slots[id(v)]))


def _fill(x: Any, arrays: list) -> Any:
    """The inverse of :func:`_strip`: each slot replaced by its array from the segment."""
    return _map_leaves(x, lambda v: arrays[v.i] if type(v) is _Slot else v)


def _bytes_of(a: np.ndarray) -> tuple[memoryview, bool]:
    """The array's bytes as a flat view (copying a non-contiguous array into C order), and
    whether they are in Fortran order."""
    if a.flags.f_contiguous and not a.flags.c_contiguous:
        return memoryview(a.T.reshape(-1).view(np.uint8)), True
    return memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)), False


def pack(result: Any, prefix: str, min_array: int = MIN_ARRAY_BYTES, min_total: int = MIN_TOTAL_BYTES,
         shm_dir: str = SHM_DIR) -> Any:
    """In the worker: ``result`` with its large arrays written to a new shared-memory segment
    (a :class:`SharedResult`), or ``result`` itself when they total less than ``min_total`` or
    shared memory is unavailable."""
    found: dict[int, tuple[Any, np.ndarray, bool]] = {}
    _find(result, min_array, found)
    if not found or sum(a.nbytes for _, a, _ in found.values()) < min_total:
        return result
    name = f"{prefix}-{os.getpid()}-{next(_counter)}"
    path = os.path.join(shm_dir, name)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError:  # no shared memory here: pickle
        return result
    slots: dict[int, int] = {}
    specs: list[ArraySpec] = []
    end = 0
    try:
        for key, (_, a, is_torch) in found.items():
            offset = -(-end // ALIGN) * ALIGN
            data, fortran = _bytes_of(a)
            done = 0
            while done < len(data):
                done += os.pwrite(fd, data[done:], offset + done)
            slots[key] = len(specs)
            specs.append(ArraySpec(offset, tuple(a.shape), a.dtype, fortran, is_torch))
            end = offset + len(data)
        skeleton = _strip(result, slots)
    except OSError:  # /dev/shm full (ENOSPC): this result is pickled
        _unlink(path)
        return result
    except BaseException:
        _unlink(path)
        raise
    finally:
        os.close(fd)
    return SharedResult(name, end, tuple(specs), skeleton)


def receive(x: Any, shm_dir: str = SHM_DIR) -> Any:
    """In the main process: the result a worker returned, rebuilt from its segment when it came
    through shared memory (the segment's name is unlinked before it is mapped)."""
    if type(x) is not SharedResult:
        return x
    path = os.path.join(shm_dir, x.name)
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        raise RuntimeError(f"shared-memory segment {path} of an offloaded result is gone (removed while the "
                           f"result was in flight)") from None
    try:
        os.unlink(path)
        mm = mmap.mmap(fd, x.size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                       prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    arrays: list[Any] = []
    for s in x.specs:
        a = np.ndarray(s.shape, s.dtype, buffer=mm, offset=s.offset, order="F" if s.fortran else "C")
        if s.torch:
            import torch

            a = torch.from_numpy(a)
        arrays.append(a)
    return _fill(x.skeleton, arrays)


def release(x: Any, shm_dir: str = SHM_DIR) -> None:
    """Free a result that will not be received (unlink its segment, if it has one)."""
    if type(x) is SharedResult:
        _unlink(os.path.join(shm_dir, x.name))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def leftovers(prefix: str, shm_dir: str = SHM_DIR) -> list[str]:
    """Names of segments under ``prefix`` still present."""
    try:
        return sorted(n for n in os.listdir(shm_dir) if n.startswith(prefix + "-"))
    except OSError:
        return []


def remove_leftovers(prefix: str, shm_dir: str = SHM_DIR) -> None:
    """Unlink every segment under ``prefix`` (what a crashed worker or a failed receipt left)."""
    for name in leftovers(prefix, shm_dir):
        _unlink(os.path.join(shm_dir, name))


def run_packed(prefix: str, min_array: int, min_total: int, fn: Callable, *args) -> Any:
    """In the worker: ``fn(*args)``, its result packed for shared memory."""
    return pack(fn(*args), prefix, min_array, min_total)


# ----- the main process's side: submitting, receiving, counting, releasing -----------------------

@dataclass
class TransferStats:
    """Counted: chunk results received through shared memory (and their segments' bytes) and
    pickled (too small for shared memory, or none available)."""

    shared: int = 0
    shared_bytes: int = 0
    pickled: int = 0

    def copy(self) -> "TransferStats":
        return TransferStats(self.shared, self.shared_bytes, self.pickled)

    def since(self, before: "TransferStats") -> "TransferStats":
        return TransferStats(self.shared - before.shared, self.shared_bytes - before.shared_bytes,
                             self.pickled - before.pickled)

    def text(self) -> str:
        return (f"{self.shared} results through shared memory ({self.shared_bytes / 1e6:.1f} MB), "
                f"{self.pickled} pickled")


class SharedMemoryFuture:
    """A pool future whose result may lie in shared memory; ``result()`` receives it."""

    def __init__(self, fut, channel: "SharedMemoryChannel"):
        self.fut, self.channel = fut, channel

    def result(self, timeout: float | None = None) -> Any:
        try:
            raw = self.fut.result(timeout)
        finally:
            if self.fut.done():
                self.channel._forget(self)
        self.channel._count(raw)
        return receive(raw, self.channel.shm_dir)

    def cancel(self) -> bool:
        ok = self.fut.cancel()
        if ok:
            self.channel._forget(self)
        return ok

    def done(self) -> bool:
        return self.fut.done()

    def discard(self, timeout: float = DISCARD_WAIT_S) -> None:
        """This result will not be received: free its segment once the worker has returned it
        (waiting up to ``timeout``; later, from the pool's thread, if it takes longer)."""
        if not self.fut.cancel():
            wait([self.fut], timeout)
            if self.fut.done():
                self.channel._release_done(self.fut)
            else:
                self.fut.add_done_callback(self.channel._release_done)
        self.channel._forget(self)


@dataclass
class SharedMemoryChannel:
    """Shared-memory results of one runtime: a prefix naming its segments, the results in flight,
    and counts of how results travelled."""

    prefix: str = field(default_factory=new_prefix)
    shm_dir: str = SHM_DIR
    min_array: int = MIN_ARRAY_BYTES
    min_total: int = MIN_TOTAL_BYTES
    stats: TransferStats = field(default_factory=TransferStats)

    def __post_init__(self):
        self._lock = threading.Lock()
        self._in_flight: set[SharedMemoryFuture] = set()
        self._used = False

    def submitter(self, submit: Callable) -> Callable:
        """``submit(fn, *args)`` of a process pool, with results through shared memory."""
        def shared_submit(fn, *args):
            fut = SharedMemoryFuture(submit(run_packed, self.prefix, self.min_array, self.min_total, fn, *args), self)
            with self._lock:
                self._used = True
                self._in_flight.add(fut)
            return fut
        return shared_submit

    def _forget(self, fut: SharedMemoryFuture) -> None:
        with self._lock:
            self._in_flight.discard(fut)

    def _count(self, raw: Any) -> None:
        if type(raw) is not SharedResult and not isinstance(raw, list):
            return  # not a chunk's samples (a warm-up's count, a round trip's number)
        with self._lock:
            if type(raw) is SharedResult:
                self.stats.shared += 1
                self.stats.shared_bytes += raw.size
            else:
                self.stats.pickled += 1

    def _release_done(self, fut) -> None:
        if not fut.cancelled() and fut.exception() is None:
            release(fut.result(), self.shm_dir)

    def leftovers(self) -> list[str]:
        return leftovers(self.prefix, self.shm_dir)

    def close(self, timeout: float = DISCARD_WAIT_S) -> None:
        """Discard results still in flight, then remove any segment left under this prefix."""
        with self._lock:
            in_flight, used = list(self._in_flight), self._used
        for fut in in_flight:
            fut.discard(timeout)
        if used:
            remove_leftovers(self.prefix, self.shm_dir)


__all__ = ["SHM_DIR", "MIN_ARRAY_BYTES", "MIN_TOTAL_BYTES", "available", "pack", "receive", "release",
           "leftovers", "remove_leftovers", "run_packed", "SharedResult", "SharedMemoryChannel", "SharedMemoryFuture", "TransferStats"]
