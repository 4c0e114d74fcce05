"""The FPGA device interface behind ``ResourcePool(kind="fpga")``, and a software board (pure).

Interface (:class:`FpgaBoard`), what every board driver implements::

    board = open_board("fpga-sw:0")           # holds one of the device's job slots until close()
    image = build_image(["pkg.module:function"], payload)   # a manifest of its kernels + the accelerator
    measurement = board.load_image(image)     # configure the board; returns sha256(image)
    report = board.attest(nonce, user_pub)    # signed {device, measurement, nonce, session keys}
    board.alloc("table", 1 << 20)             # a device memory region with bounds
    board.write("table", 0, data); board.read("table", 0, 64)
    out = board.run("pkg.module:function", x, y=2)          # blocking
    fut = board.run_async("pkg.module:function", x)         # concurrent.futures.Future
    board.close()                             # also ``with open_board(...) as board:``

Kernel calling convention: ``run(kernel, *args, **kwargs)`` calls ``function(*args, **kwargs)``
*inside the device process* -- plain arguments, plain result, both crossing the host-device pipe by
pickle (numpy arrays in, numpy arrays out work as they are). The board runs only the kernels the
loaded image declares in its manifest (:func:`build_image`): ``load_image`` imports each declared
``package.module`` on the device and accepts only functions marked :func:`device_kernel`; ``run``
refuses (:class:`KernelRefused`, before any import) a name the manifest does not declare, a dotted
attribute path and a private (``_``) name. What the host sends is unpickled on the device by a
loader that admits plain data and numpy arrays only, since a pickle can call any function it names.
A kernel that needs the board's own state calls the device-side accessors of this module from
inside the kernel: :func:`board_memory` (the board's memory regions: ``read``/``write``/``buffer``),
:func:`board_session_key` (the session key the last attestation established) and
:func:`board_measurement` (the loaded image's measurement). They raise :class:`FpgaError` on the
host: only code running on the device sees the device's memory and keys (and they are no kernels).
Kernels run one at a time per board, in submission order (one command queue); ``run_async`` lets
the host work meanwhile.

Software board (``"fpga-sw:N"``, :class:`SoftwareBoard`): a separate process (multiprocessing
*spawn* context, so host and device really run side by side on different cores) that holds

- key material: an Ed25519 device key certified (signed) by a manufacturer root key. The software
  "factory" keeps the root key and each board's key and certificate under the state directory
  (``$MLSYS_FPGA_SW_DIR``, default ``<tmp>/mlsys-fpga-sw-<uid>``); only the device process loads a
  device's private key. :func:`manufacturer_root_public_key` is what a remote verifier trusts.
- memory regions with bounds (``alloc``; every read and write is bounds-checked, out-of-bounds
  access raises :class:`BoundsError`; total capacity ``memory_bytes``);
- the loaded image's kernels and its measurement (sha256), signed into attestation reports together
  with the caller's nonce, the caller's ephemeral X25519 public key and the board's own ephemeral
  X25519 public key; the board derives the session key (X25519 + HKDF-SHA256) and keeps it on the device;
- a kernel runner (above).

Device slots: a board allows ``slots`` concurrent jobs (option, default 1). Opening a board takes a
slot: an exclusive ``fcntl.flock`` on one of ``slots`` lock files under the state directory, keyed
by the device name, so threads and processes on this machine never hold more than ``slots`` boards
of one device at once; a job waits for a free slot up to ``slot_timeout`` seconds (default 600), then raises
:class:`SlotTimeout`. Every opener of a device must pass the same ``slots`` (the pool's setting).
The lock dies with its holder, so a killed job never leaks a slot.

A real driver (AWS F1 via the aws-fpga SDK / XRT, Intel OFS via OPAE) implements the same class:
``load_image`` loads an AFI / green bitstream (``fpga-load-local-image``, ``fpgaReconfigureSlot``)
and returns the measurement its security kernel reports; ``attest`` asks the security kernel (a
soft core in the static region holding the device key fused or provisioned by the manufacturer) to
sign the report; ``alloc``/``read``/``write`` map to device DRAM buffers (XRT buffer objects, OPAE
shared buffers, DMA); ``run`` starts a compute unit with the buffers as arguments and waits on its
completion (``run_async`` waits on a thread). Register it with
``register_driver("f1", F1Board)`` so ``open_board("f1:0")`` and a pool with devices
``["f1:0"]`` reach it; the slot discipline (:class:`SlotLock`) applies unchanged.
"""
from __future__ import annotations

import abc
import concurrent.futures
import fcntl
import hashlib
import importlib
import io
import itertools
import json
import multiprocessing
import os
import pickle
import re
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Iterable, Iterator

__all__ = ["FpgaError", "BoundsError", "SlotTimeout", "KernelError", "KernelRefused", "AttestationReport", "FpgaBoard",
           "SoftwareBoard", "SlotLock", "BoardMemory", "open_board", "register_driver", "pick_device",
           "software_device", "manufacturer_root_public_key", "board_memory", "board_session_key",
           "board_measurement", "report_payload", "certificate_payload", "session_key_from", "state_dir",
           "build_image", "read_image", "Image", "device_kernel", "check_kernel_name", "diagnostic_image"]


class FpgaError(RuntimeError):
    """A board operation failed (no image loaded, unknown region, device process gone, ...)."""


class BoundsError(FpgaError, IndexError):
    """A memory region accessed outside its bounds, or an allocation beyond the board's memory."""


class SlotTimeout(FpgaError, TimeoutError):
    """Every slot of the device stayed busy for ``slot_timeout`` seconds."""


class KernelError(FpgaError):
    """A kernel raised on the device; ``remote`` holds the device-side traceback."""

    def __init__(self, message: str, remote: str = "", cause: BaseException | None = None):
        super().__init__(message)
        self.remote = remote
        self.cause = cause


class KernelRefused(FpgaError):
    """The board refused a kernel or a request: not declared by the loaded image, not a kernel entry
    point (dotted, private or unmarked name), or an argument that is not plain data."""


# ---------------------------------------------------------------------------------------------
# images and their kernel manifest


_IMAGE_MAGIC = b"mlsys-fpga-image-v1\n"


def check_kernel_name(kernel: Any) -> str:
    """``kernel`` when it names a module-level public function as ``package.module:function``;
    raises :class:`KernelRefused` for anything else (no import happens here)."""
    if not isinstance(kernel, str):
        raise KernelRefused(f"kernel {kernel!r}: a kernel is named by a string 'package.module:function', "
                            f"not a {type(kernel).__name__}")
    module, sep, name = kernel.partition(":")
    if not sep or not module or not name:
        raise KernelRefused(f"kernel {kernel!r}: expected 'package.module:function'")
    if "." in name or ":" in name:
        raise KernelRefused(f"kernel {kernel!r}: a dotted attribute path is not a kernel entry point "
                            "(name a module-level function)")
    parts = module.split(".") + [name]
    if not all(part.isidentifier() for part in parts):
        raise KernelRefused(f"kernel {kernel!r}: expected 'package.module:function' made of Python names")
    if any(part.startswith("_") for part in parts):
        raise KernelRefused(f"kernel {kernel!r}: a private ('_') name is not a kernel entry point")
    return kernel


@dataclass(frozen=True)
class Image:
    """A parsed image: the kernel entry points its manifest declares, and the accelerator itself."""

    kernels: tuple[str, ...]
    payload: bytes


def build_image(kernels: Iterable[str], payload: bytes = b"") -> bytes:
    """An image: a manifest declaring its kernel entry points, then ``payload`` (the accelerator,
    e.g. its bitstream). The board measures the whole, so the manifest is part of the measurement."""
    names = sorted({check_kernel_name(k) for k in kernels})
    manifest = json.dumps({"kernels": names}, separators=(",", ":")).encode()
    return _IMAGE_MAGIC + len(manifest).to_bytes(4, "big") + manifest + bytes(payload)


def read_image(image: bytes) -> Image:
    """The manifest and payload of ``image``. Bytes without the image header are an image that
    declares no kernels (it loads and attests; nothing runs on it)."""
    image = bytes(image)
    if not image.startswith(_IMAGE_MAGIC):
        return Image((), image)
    head = len(_IMAGE_MAGIC) + 4
    size = int.from_bytes(image[len(_IMAGE_MAGIC):head], "big")
    try:
        if len(image) < head + size:
            raise ValueError("truncated")
        kernels = json.loads(image[head:head + size])["kernels"]
        if not isinstance(kernels, list):
            raise ValueError("'kernels' is not a list")
    except (ValueError, KeyError, TypeError) as e:
        raise FpgaError(f"the image's manifest is malformed ({e}); build images with build_image()") from None
    return Image(tuple(check_kernel_name(k) for k in kernels), image[head + size:])


# ---------------------------------------------------------------------------------------------
# attestation report


def _encode(tag: bytes, *fields: bytes) -> bytes:
    """Canonical, unambiguous encoding: a domain tag, then each field length-prefixed."""
    return tag + b"".join(len(f).to_bytes(4, "big") + f for f in fields)


def certificate_payload(device: str, device_public_key: bytes) -> bytes:
    """What the manufacturer root key signs: the device's name and its public key."""
    return _encode(b"mlsys-fpga-device-cert-v1", device.encode(), device_public_key)


def report_payload(device: str, measurement: bytes, nonce: bytes, session_public_key: bytes,
                   device_session_public_key: bytes) -> bytes:
    """What the device key signs in an attestation report."""
    return _encode(b"mlsys-fpga-attestation-v1", device.encode(), measurement, nonce, session_public_key,
                   device_session_public_key)


@dataclass(frozen=True)
class AttestationReport:
    """A board's signed statement of what it runs, for one verifier's nonce and session key."""

    device: str
    measurement: bytes  # sha256 of the loaded image
    nonce: bytes  # the verifier's nonce, echoed
    session_public_key: bytes  # the verifier's ephemeral X25519 public key, echoed
    device_session_public_key: bytes  # the board's ephemeral X25519 public key (raw, 32 bytes)
    device_public_key: bytes  # the board's Ed25519 public key (raw)
    device_certificate: bytes  # manufacturer root's Ed25519 signature over certificate_payload()
    signature: bytes  # device key's Ed25519 signature over payload()

    def payload(self) -> bytes:
        return report_payload(self.device, self.measurement, self.nonce, self.session_public_key,
                              self.device_session_public_key)


# ---------------------------------------------------------------------------------------------
# the interface


class FpgaBoard(abc.ABC):
    """One job's handle on an FPGA board (see the module docstring for the calling convention)."""

    device: str

    @abc.abstractmethod
    def load_image(self, image: bytes) -> bytes:
        """Configure the board with ``image`` (:func:`build_image`); returns its measurement (sha256).
        From then on the board runs only the kernels the image's manifest declares."""

    @abc.abstractmethod
    def attest(self, nonce: bytes, session_public_key: bytes) -> AttestationReport:
        """A report signed by the device key over the measurement, ``nonce`` and session keys."""

    @abc.abstractmethod
    def alloc(self, region: str, size: int) -> None:
        """A device memory region of ``size`` bytes (zeroed), bounds-checked on every access."""

    @abc.abstractmethod
    def write(self, region: str, offset: int, data: bytes) -> None:
        """Write ``data`` at ``offset`` of ``region``."""

    @abc.abstractmethod
    def read(self, region: str, offset: int, length: int) -> bytes:
        """Read ``length`` bytes at ``offset`` of ``region``."""

    def run(self, kernel: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``kernel`` ("package.module:function", declared by the loaded image) and wait for its result."""
        return self.run_async(kernel, *args, **kwargs).result()

    @abc.abstractmethod
    def run_async(self, kernel: str, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        """Start ``kernel`` on the device; the Future holds its result (or raises its error). A kernel
        the loaded image's manifest does not declare is refused (:class:`KernelRefused`)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the board (and its slot)."""

    def __enter__(self) -> "FpgaBoard":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# slots


def state_dir(path: str | None = None) -> str:
    """The software boards' state directory (keys, certificates, slot locks)."""
    root = path or os.environ.get("MLSYS_FPGA_SW_DIR") or os.path.join(
        tempfile.gettempdir(), f"mlsys-fpga-sw-{os.getuid()}")
    os.makedirs(root, mode=0o700, exist_ok=True)
    return root


def _device_dir(device: str, root: str | None = None) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", device)
    d = os.path.join(state_dir(root), "boards", safe)
    os.makedirs(d, mode=0o700, exist_ok=True)
    return d


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


def _scheme(device: str) -> str:
    return device.split(":", 1)[0]


def software_device(device: str) -> str:
    """``fpga:N`` (a pool entry with no driver configured) -> ``fpga-sw:N``; others unchanged."""
    return "fpga-sw:" + device.split(":", 1)[1] if _scheme(device) == "fpga" and ":" in device else device


# ---------------------------------------------------------------------------------------------
# the software factory: manufacturer root key, device keys and certificates


@contextmanager
def _file_lock(path: str) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _write_private(path: str, data: bytes) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _root_key(root: str | None = None):
    """The software manufacturer's Ed25519 root key (created once per state directory)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    d = state_dir(root)
    path = os.path.join(d, "manufacturer-root.key")
    with _file_lock(os.path.join(d, "factory.lock")):
        if not os.path.exists(path):
            _write_private(path, Ed25519PrivateKey.generate().private_bytes_raw())
        with open(path, "rb") as f:
            return Ed25519PrivateKey.from_private_bytes(f.read())


def manufacturer_root_public_key(root: str | None = None) -> bytes:
    """The raw Ed25519 public key a remote verifier trusts for software boards."""
    return _root_key(root).public_key().public_bytes_raw()


def _manufacture(device: str, root: str | None = None):
    """The device's Ed25519 key and the root's certificate over it (made once, at the "factory")."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    d = _device_dir(device, root)
    key_path, cert_path = os.path.join(d, "device.key"), os.path.join(d, "device.cert")
    with _file_lock(os.path.join(d, "factory.lock")):
        if not (os.path.exists(key_path) and os.path.exists(cert_path)):
            key = Ed25519PrivateKey.generate()
            pub = key.public_key().public_bytes_raw()
            cert = _root_key(root).sign(certificate_payload(device, pub))
            _write_private(key_path, key.private_bytes_raw())
            _write_private(cert_path, cert)
        with open(key_path, "rb") as f:
            key = Ed25519PrivateKey.from_private_bytes(f.read())
        with open(cert_path, "rb") as f:
            cert = f.read()
    return key, cert


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
    def __init__(self, device: str, root: str | None, memory_bytes: int):
        self.device = device
        self.key, self.cert = _manufacture(device, root)
        self.public_key = self.key.public_key().public_bytes_raw()
        self.memory = BoardMemory(memory_bytes)
        self.measurement: bytes | None = None
        self.session_key: bytes | None = None
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


_DEVICE_KERNELS: dict[int, Callable] = {}  # id -> function: identity, so no look-alike object passes


def device_kernel(fn: Callable) -> Callable:
    """Marks ``fn`` as a kernel entry point: an image's manifest may declare it (nothing else runs
    on the board, whatever a host-built manifest names). The function itself is unchanged."""
    _DEVICE_KERNELS[id(fn)] = fn
    return fn


def _resolve(kernel: str) -> Callable:
    """Device side, at load: the marked function a manifest entry names (already name-checked)."""
    module, _, name = kernel.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise KernelRefused(f"the image declares kernel {kernel!r}, which the device cannot find: {e}") from None
    if _DEVICE_KERNELS.get(id(fn)) is not fn:
        raise KernelRefused(f"the image declares {kernel!r}, which is not a device kernel "
                            "(only functions marked @device_kernel are)")
    return fn


def _load_image(st: _DeviceState, image: bytes) -> bytes:
    """Reconfigure: the old image's kernels and session key go first, so a failed load leaves none."""
    st.measurement, st.session_key, st.kernels = None, None, {}
    kernels = {k: _resolve(k) for k in read_image(image).kernels}
    st.kernels, st.measurement = kernels, hashlib.sha256(image).digest()
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
    sig = st.key.sign(report_payload(st.device, st.measurement, nonce, session_public_key, eph_pub))
    return AttestationReport(st.device, st.measurement, bytes(nonce), bytes(session_public_key), eph_pub,
                             st.public_key, st.cert, sig)


def session_key_from(shared_secret: bytes, nonce: bytes, measurement: bytes) -> bytes:
    """HKDF-SHA256 of the X25519 shared secret, salted with the nonce, bound to the measurement."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=32, salt=nonce,
                info=b"mlsys-fpga-session-v1" + measurement).derive(shared_secret)


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


@contextmanager
def _starting_board() -> Iterator[None]:
    """Around ``Process.start()``: (1) Dask worker processes are daemonic and multiprocessing
    refuses children of a daemonic process; the board's process is a child of the job, so lift the
    flag; (2) spawn re-runs the host's ``__main__`` in the child unless it is guarded; the board
    needs only this module and the kernels' modules, so hide ``__main__``'s file and spec."""
    import sys

    with _START_LOCK:
        proc = multiprocessing.current_process()
        was = proc._config.get("daemon")
        proc._config["daemon"] = False
        main = sys.modules.get("__main__")
        hidden = {k: main.__dict__.pop(k) for k in ("__file__",) if main is not None and k in main.__dict__}
        spec = getattr(main, "__spec__", None) if main is not None else None
        if main is not None:
            main.__spec__ = None
        try:
            yield
        finally:
            if main is not None:
                main.__dict__.update(hidden)
                main.__spec__ = spec
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


_DRIVERS: dict[str, Callable[..., FpgaBoard]] = {"fpga-sw": SoftwareBoard}


def register_driver(scheme: str, factory: Callable[..., FpgaBoard]) -> None:
    """Make ``open_board("<scheme>:N")`` open boards with ``factory(device, **options)``."""
    _DRIVERS[scheme] = factory


def open_board(device: str = "fpga-sw:0", **options: Any) -> FpgaBoard:
    """Open ``device`` (waits for a free slot): ``fpga-sw:N`` (or a pool's ``fpga:N``) is a
    :class:`SoftwareBoard`; other schemes need a registered driver. Options go to the driver
    (software board: ``slots``, ``slot_timeout``, ``memory_bytes``, ``state``)."""
    device = software_device(device)
    factory = _DRIVERS.get(_scheme(device))
    if factory is None:
        raise FpgaError(f"no FPGA driver for {device!r} (registered: {sorted(_DRIVERS)}); a real board "
                        "needs register_driver(scheme, BoardClass)")
    return factory(device, **options)


# ---------------------------------------------------------------------------------------------
# diagnostic kernels (used by tests and by a pool's self-check)


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
