"""The software board (``"fpga-sw:N"``, :class:`SoftwareBoard`; see the package docstring): device
slots (:class:`SlotLock`), the device side that runs in the board's own process (its memory, the
loaded image's kernels, the accessors a kernel calls, the request loop), and the host side that
starts that process and talks to it over a pipe."""
from __future__ import annotations

import concurrent.futures
import fcntl
import hashlib
import io
import itertools
import multiprocessing
import os
import pickle
import re
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Iterator

from .attestation import AttestationReport, _manufacture, report_payload, session_key_from
from .board import FpgaBoard, _resolve, _scheme, check_kernel_name, read_image, software_device
from .errors import BoundsError, FpgaError, KernelError, KernelRefused, SlotTimeout
from .state import _device_dir


# ---------------------------------------------------------------------------------------------
# slots


class SlotLock:
    """One of a device's ``slots`` job slots: an exclusive flock on ``slot-<i>.lock``.

    ``enforce=False`` skips the lock (only for tests that show the check is what bounds concurrency).
    """

    def __init__(self, device: str, slots: int = 1, timeout: float = 60.0, root: str | None = None,
                 enforce: bool = True):
        if slots < 1:
            raise FpgaError(f"{device}: slots must be >= 1, got {slots}")
        self.device, self.slots, self.timeout, self.enforce = device, slots, timeout, enforce
        self.dir = _device_dir(device, root)
        self.slot: int | None = None
        self._fd: int | None = None

    def acquire(self) -> int:
        if not self.enforce:
            self.slot = -1
            return -1
        deadline = time.monotonic() + self.timeout
        delay = 0.005
        while True:
            for i in range(self.slots):
                fd = os.open(os.path.join(self.dir, f"slot-{i}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self._fd, self.slot = fd, i
                return i
            if time.monotonic() >= deadline:
                raise SlotTimeout(f"device {self.device}: all {self.slots} slot(s) stayed busy for "
                                  f"{self.timeout:g} s (another job holds the board)")
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        self.slot = None

    def busy(self) -> int:
        """Slots held right now (a probe; it may change the moment it returns)."""
        held = 0
        for name in os.listdir(self.dir):
            if not (name.startswith("slot-") and name.endswith(".lock")):
                continue
            fd = os.open(os.path.join(self.dir, name), os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
            except BlockingIOError:
                held += 1
            finally:
                os.close(fd)
        return held


def pick_device(devices: list[str], root: str | None = None) -> str:
    """The device of ``devices`` with the fewest slots held now (ties: inventory order). A hint for
    load balancing: the slot lock taken when the board is opened is what bounds concurrency."""
    best, best_busy = devices[0], None
    for d in devices:
        try:
            busy = SlotLock(software_device(d), root=root).busy()
        except (FpgaError, OSError):
            continue
        if best_busy is None or busy < best_busy:
            best, best_busy = d, busy
    return software_device(best) if _scheme(best) in ("fpga", "fpga-sw") else best


# ---------------------------------------------------------------------------------------------
# device side (runs in the board's process)


class BoardMemory:
    """The board's memory: named regions with bounds, ``capacity`` bytes in all."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._regions: dict[str, bytearray] = {}

    @property
    def used(self) -> int:
        return sum(len(r) for r in self._regions.values())

    def alloc(self, region: str, size: int) -> None:
        if not isinstance(size, int) or size <= 0:
            raise BoundsError(f"region {region!r}: size must be a positive int, got {size!r}")
        if region in self._regions:
            raise FpgaError(f"region {region!r} is already allocated")
        if self.used + size > self.capacity:
            raise BoundsError(f"region {region!r}: {size} bytes exceed the board's free memory "
                              f"({self.capacity - self.used} of {self.capacity} bytes)")
        self._regions[region] = bytearray(size)

    def size(self, region: str) -> int:
        return len(self._get(region))

    def _get(self, region: str) -> bytearray:
        try:
            return self._regions[region]
        except KeyError:
            raise FpgaError(f"no region {region!r} on the board (allocated: {sorted(self._regions)})") from None

    def _check(self, region: str, offset: int, length: int) -> bytearray:
        buf = self._get(region)
        if offset < 0 or length < 0 or offset + length > len(buf):
            raise BoundsError(f"region {region!r}: access [{offset}, {offset + length}) outside its bounds "
                              f"[0, {len(buf)})")
        return buf

    def write(self, region: str, offset: int, data: bytes) -> None:
        buf = self._check(region, offset, len(data))
        buf[offset:offset + len(data)] = data

    def read(self, region: str, offset: int, length: int) -> bytes:
        buf = self._check(region, offset, length)
        return bytes(buf[offset:offset + length])

    def buffer(self, region: str, offset: int = 0, length: int | None = None) -> memoryview:
        """A zero-copy, bounds-checked view of (part of) a region (device side only)."""
        length = self.size(region) - offset if length is None else length
        buf = self._check(region, offset, length)
        return memoryview(buf)[offset:offset + length]


class _DeviceState:
    """The device: its key material (made at the "factory", kept for the board's life) and what one
    loaded image owns (memory, kernels, measurement, session key, the kernels' on-chip store), which
    :meth:`fresh` drops wholesale: every ``load_image`` starts from a blank device."""

    def __init__(self, device: str, root: str | None, memory_bytes: int):
        self.device = device
        self.key, self.cert = _manufacture(device, root)
        self.public_key = self.key.public_key().public_bytes_raw()
        self.memory_bytes = memory_bytes
        self.fresh()

    def fresh(self) -> None:
        self.memory = BoardMemory(self.memory_bytes)
        self.measurement: bytes | None = None
        self.debug = False
        self.session_key: bytes | None = None
        self.store: dict[str, Any] = {}  # the loaded image's on-chip state (board_store())
        self.kernels: dict[str, Callable] = {}  # the loaded image's manifest, resolved


_DEVICE: _DeviceState | None = None  # set in the board's process only


def _on_device() -> _DeviceState:
    if _DEVICE is None:
        raise FpgaError("board state is only reachable from a kernel running on the device "
                        "(board.run(...)), not from the host")
    return _DEVICE


def board_memory() -> BoardMemory:
    """Device side: the memory regions of the board this kernel runs on."""
    return _on_device().memory


def board_session_key() -> bytes:
    """Device side: the 32-byte session key of the board's last attestation."""
    st = _on_device()
    if st.session_key is None:
        raise FpgaError(f"{st.device}: no session key (attest first)")
    return st.session_key


def board_measurement() -> bytes:
    """Device side: the loaded image's measurement."""
    st = _on_device()
    if st.measurement is None:
        raise FpgaError(f"{st.device}: no image loaded")
    return st.measurement


def board_store() -> dict[str, Any]:
    """Device side: the loaded image's on-chip store, a dict the kernels keep their state in (keys
    they unwrapped, configurations, counters). It is empty after every ``load_image``: state kept
    here never outlives the image it was set up for."""
    st = _on_device()
    if st.measurement is None:
        raise FpgaError(f"{st.device}: no image loaded")
    return st.store


def _load_image(st: _DeviceState, image: bytes) -> bytes:
    """Reconfigure: the device starts blank (memory, session key, kernels and their store of the
    old image go first, so a failed load leaves none), then takes the image's kernels, each only
    when it is shipped code whose hash matches the image's record."""
    st.fresh()
    parsed = read_image(image)
    kernels = {k: _resolve(k, parsed.code.get(k)) for k in parsed.kernels}
    st.kernels, st.debug, st.measurement = kernels, parsed.debug, hashlib.sha256(image).digest()
    return st.measurement


def _kernel(st: _DeviceState, kernel: Any) -> Callable:
    """The loaded image's kernel ``kernel``; anything else is refused without importing anything."""
    check_kernel_name(kernel)
    if st.measurement is None:
        raise KernelRefused(f"{st.device}: kernel {kernel!r}: no image loaded (load an image that declares it)")
    fn = st.kernels.get(kernel)
    if fn is None:
        raise KernelRefused(f"{st.device}: kernel {kernel!r} is not declared in the loaded image's manifest "
                            f"(declared: {sorted(st.kernels) or 'none'})")
    return fn


# What the host may send: plain data (no globals needed) and numpy arrays. Unpickling calls the
# globals a pickle names, so any other global would let the host run code on the device.
_HOST_GLOBALS = frozenset(
    {("builtins", n) for n in ("bytearray", "set", "frozenset", "complex", "slice")}
    | {(m, n) for m in ("numpy._core.multiarray", "numpy.core.multiarray") for n in ("_reconstruct", "scalar")}
    | {(m, "_frombuffer") for m in ("numpy._core.numeric", "numpy.core.numeric")}
    | {("numpy", "ndarray"), ("numpy", "dtype")})


class _HostUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _HOST_GLOBALS:
            raise KernelRefused(f"the host sent an object of {module}.{name}: only plain data and numpy "
                                "arrays cross to the device")
        return super().find_class(module, name)


def _attest(st: _DeviceState, nonce: bytes, session_public_key: bytes) -> AttestationReport:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

    if st.measurement is None:
        raise FpgaError(f"{st.device}: no image loaded; nothing to attest")
    eph = X25519PrivateKey.generate()
    eph_pub = eph.public_key().public_bytes_raw()
    shared = eph.exchange(X25519PublicKey.from_public_bytes(bytes(session_public_key)))
    st.session_key = session_key_from(shared, nonce, st.measurement)
    sig = st.key.sign(report_payload(st.device, st.measurement, nonce, session_public_key, eph_pub, st.debug))
    return AttestationReport(st.device, st.measurement, bytes(nonce), bytes(session_public_key), eph_pub,
                             st.public_key, st.cert, sig, st.debug)


def _device_main(conn, device: str, root: str | None, memory_bytes: int) -> None:
    """The board's process: answer (id, op, args, kwargs) requests in order until close or EOF."""
    global _DEVICE
    try:
        _DEVICE = st = _DeviceState(device, root, memory_bytes)
        conn.send((0, True, os.getpid()))
    except BaseException as e:  # noqa: BLE001 - report any start-up failure to the host
        conn.send((0, False, (f"{type(e).__name__}: {e}", traceback.format_exc(), None)))
        return
    while True:
        try:
            raw = conn.recv_bytes()
        except (EOFError, OSError):
            return  # the host is gone
        rid, op = int.from_bytes(raw[:8], "big"), None
        try:
            op, args, kwargs = _HostUnpickler(io.BytesIO(raw[8:])).load()
            if op == "close":
                conn.send((rid, True, None))
                return
            if op == "load_image":
                out: Any = _load_image(st, bytes(args[0]))
            elif op == "attest":
                out = _attest(st, *args)
            elif op == "alloc":
                out = st.memory.alloc(*args)
            elif op == "write":
                out = st.memory.write(*args)
            elif op == "read":
                out = st.memory.read(*args)
            elif op == "run":
                out = _kernel(st, args[0])(*args[1:], **kwargs)
            elif op == "pid":
                out = os.getpid()
            else:
                raise KernelRefused(f"unknown board operation {op!r}")
            reply = (rid, True, out)
        except BaseException as e:  # noqa: BLE001 - every error goes back to the caller
            try:  # send the exception itself when it pickles (BoundsError etc.), else its text
                pickle.dumps(e)
                exc = e
            except Exception:  # noqa: BLE001
                exc = None
            reply = (rid, False, (f"{type(e).__name__}: {e}", traceback.format_exc(), exc))
        try:
            conn.send(reply)
        except Exception as e:  # noqa: BLE001 - an unpicklable result
            conn.send((rid, False, (f"result of {op} does not pickle: {e}", traceback.format_exc(), None)))


# ---------------------------------------------------------------------------------------------
# host side


_START_LOCK = threading.Lock()
_TRUSTED_START = threading.local()  # set while this thread starts a board's process (_starting_board)


def _install_trusted_spawn() -> None:
    """Wrap two functions of ``multiprocessing.spawn`` (once per process) so that a board's process,
    started by this thread inside :func:`_starting_board`, runs only trusted code: its interpreter
    starts isolated (``-I``: no ``PYTHONPATH``/``PYTHONHOME`` or other ``PYTHON*`` variables, no user
    site-packages, neither the current directory nor a script's directory on the path), so its
    ``sys.path`` is the interpreter's own (the standard library and site-packages, where the project
    is installed), and the preparation data carries none of the host's: no ``sys.path`` (spawn would
    otherwise copy the host's, with whatever the host put first on it), no ``sys.argv``, and no
    ``__main__`` to re-run. Any other spawn (another thread, another library) is passed through as is."""
    from multiprocessing import spawn

    if getattr(spawn.get_command_line, "_fpga_board", False):
        return
    prep, cmd = spawn.get_preparation_data, spawn.get_command_line

    def get_preparation_data(name):
        data = prep(name)
        if getattr(_TRUSTED_START, "on", False):
            for k in ("sys_path", "sys_argv", "init_main_from_name", "init_main_from_path"):
                data.pop(k, None)
        return data

    def get_command_line(**kwds):
        line = cmd(**kwds)
        if getattr(_TRUSTED_START, "on", False) and not getattr(sys, "frozen", False):
            line = line[:1] + ["-I"] + line[1:]
        return line

    get_command_line._fpga_board = True  # type: ignore[attr-defined]
    spawn.get_preparation_data, spawn.get_command_line = get_preparation_data, get_command_line


@contextmanager
def _starting_board() -> Iterator[None]:
    """Around ``Process.start()``: (1) the board's process gets a trusted ``sys.path`` and never
    runs the host's ``__main__`` (:func:`_install_trusted_spawn`): a module the host writes on its
    own path or in ``PYTHONPATH``, a shadow of a standard-library module included, is never imported
    on the device; (2) Dask worker processes are daemonic and multiprocessing refuses children of a
    daemonic process; the board's process is a child of the job, so lift the flag."""
    with _START_LOCK:
        _install_trusted_spawn()
        proc = multiprocessing.current_process()
        was = proc._config.get("daemon")
        proc._config["daemon"] = False
        _TRUSTED_START.on = True
        try:
            yield
        finally:
            _TRUSTED_START.on = False
            if was is not None:
                proc._config["daemon"] = was


class SoftwareBoard(FpgaBoard):
    """A board in its own process (see the module docstring). Opening one takes a device slot."""

    def __init__(self, device: str = "fpga-sw:0", slots: int = 1, slot_timeout: float = 600.0,
                 memory_bytes: int = 1 << 30, state: str | None = None, start_timeout: float = 120.0,
                 enforce_slots: bool = True):
        if _scheme(device) != "fpga-sw" or not re.fullmatch(r"fpga-sw:\d+", device):
            raise FpgaError(f"{device!r} is not a software board name (expected 'fpga-sw:N')")
        self.device = device
        self.slots = slots
        self._lock = SlotLock(device, slots, slot_timeout, state, enforce_slots)
        self._lock.acquire()
        self._ids = itertools.count(1)
        self._pending: dict[int, concurrent.futures.Future] = {}
        self._send_lock = threading.Lock()
        self._closed = False
        try:
            ctx = multiprocessing.get_context("spawn")
            self._conn, child = ctx.Pipe()
            self._proc = ctx.Process(target=_device_main, args=(child, device, state, memory_bytes),
                                     name=f"fpga-board-{device}", daemon=True)
            with _starting_board():
                self._proc.start()
            child.close()
            if not self._conn.poll(start_timeout):
                raise FpgaError(f"{device}: the board's process did not start within {start_timeout:g} s")
            _, ok, out = self._conn.recv()
            if not ok:
                raise FpgaError(f"{device}: the board failed to start: {out[0]}\n{out[1]}")
            self.pid: int = out
        except BaseException:
            self._kill()
            self._lock.release()
            raise
        self._reader = threading.Thread(target=self._read_replies, name=f"fpga-{device}-replies", daemon=True)
        self._reader.start()

    @property
    def slot(self) -> int | None:
        """The device slot this board holds (-1 when slots are not enforced)."""
        return self._lock.slot

    def _read_replies(self) -> None:
        while True:
            try:
                rid, ok, out = self._conn.recv()
            except (EOFError, OSError):
                break
            fut = self._pending.pop(rid, None)
            if fut is None:
                continue
            if ok:
                fut.set_result(out)
            else:
                message, remote, exc = out
                if isinstance(exc, FpgaError):
                    fut.set_exception(exc)
                else:
                    fut.set_exception(KernelError(f"{self.device}: {message}", remote, exc))
        for rid in list(self._pending):
            fut = self._pending.pop(rid, None)
            if fut is not None and not fut.done():
                fut.set_exception(FpgaError(f"{self.device}: the board's process exited"))

    def _call(self, op: str, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        if self._closed:
            raise FpgaError(f"{self.device}: board is closed")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._send_lock:
            rid = next(self._ids)
            self._pending[rid] = fut
            try:  # the id travels outside the pickle, so the device can answer a request it refuses to unpickle
                self._conn.send_bytes(rid.to_bytes(8, "big") + bytes(ForkingPickler.dumps((op, args, kwargs))))
            except Exception as e:  # noqa: BLE001
                self._pending.pop(rid, None)
                raise FpgaError(f"{self.device}: cannot send {op} to the board: {e}") from e
        return fut

    def load_image(self, image: bytes) -> bytes:
        return self._call("load_image", bytes(image)).result()

    def attest(self, nonce: bytes, session_public_key: bytes) -> AttestationReport:
        return self._call("attest", bytes(nonce), bytes(session_public_key)).result()

    def alloc(self, region: str, size: int) -> None:
        self._call("alloc", region, size).result()

    def write(self, region: str, offset: int, data: bytes) -> None:
        self._call("write", region, offset, bytes(data)).result()

    def read(self, region: str, offset: int, length: int) -> bytes:
        return self._call("read", region, offset, length).result()

    def run_async(self, kernel: str, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        return self._call("run", check_kernel_name(kernel), *args, **kwargs)

    def _kill(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.pid is not None:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)

    def close(self) -> None:
        if self._closed:
            return
        try:
            fut = self._call("close")
            fut.result(timeout=30)
        except Exception:  # noqa: BLE001 - closing a dead board still releases the slot
            pass
        self._closed = True
        try:
            self._kill()
            self._conn.close()
        finally:
            self._lock.release()

    def __del__(self) -> None:
        try:
            if not self._closed and self._lock.slot is not None:
                self.close()
        except Exception:  # noqa: BLE001
            pass
