"""The board interface every driver implements (:class:`FpgaBoard`), the images a board loads (a
manifest of kernel entry points with their code hashes, then the accelerator: :func:`build_image`,
:func:`read_image`), the kernel modules a device ships (:data:`SHIPPED_KERNEL_MODULES`, the only code
it runs; debug modules marked), the mark that makes a function a kernel entry point
(:func:`device_kernel`) and its code hash (:func:`kernel_code_hash`), device names, and the drivers
that open boards by name (:func:`register_driver`, :func:`open_board`).

The built-in driver ``fpga-sw`` is the software board of :mod:`.software` (which builds on this
module); it is imported when the first software board is opened."""
from __future__ import annotations

import abc
import concurrent.futures
import hashlib
import importlib
import inspect
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from .attestation import AttestationReport
from .errors import FpgaError, KernelRefused


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
    """A parsed image: the kernel entry points its manifest declares, each kernel's code hash (as
    the image records it), and the accelerator itself."""

    kernels: tuple[str, ...]
    payload: bytes
    code: dict[str, str] = field(default_factory=dict)

    @property
    def debug(self) -> bool:
        """Whether the image declares a debug kernel (one of a :data:`SHIPPED_KERNEL_MODULES` debug module)."""
        return any(SHIPPED_KERNEL_MODULES.get(k.partition(":")[0], False) for k in self.kernels)


def build_image(kernels: Iterable[str], payload: bytes = b"") -> bytes:
    """An image: a manifest declaring its kernel entry points with each one's code hash
    (:func:`kernel_code_hash`), then ``payload`` (the accelerator, e.g. its bitstream). The board
    measures the whole, so the manifest (names and code hashes) is part of the measurement. Only
    kernels of :data:`SHIPPED_KERNEL_MODULES` can be declared (:class:`KernelRefused` otherwise)."""
    names = sorted({check_kernel_name(k) for k in kernels})
    code = {k: kernel_code_hash(k) for k in names}
    manifest = json.dumps({"kernels": names, "code": code}, separators=(",", ":")).encode()
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
        manifest = json.loads(image[head:head + size])
        kernels, code = manifest["kernels"], manifest.get("code", {})
        if not isinstance(kernels, list):
            raise ValueError("'kernels' is not a list")
        if not isinstance(code, dict) or not all(isinstance(v, str) for v in code.values()):
            raise ValueError("'code' is not a map of kernel names to code hashes")
    except (ValueError, KeyError, TypeError) as e:
        raise FpgaError(f"the image's manifest is malformed ({e}); build images with build_image()") from None
    return Image(tuple(check_kernel_name(k) for k in kernels), image[head + size:], dict(code))


# ---------------------------------------------------------------------------------------------
# kernel entry points: the only functions an image's manifest may declare

# The kernel modules the device ships (its "firmware"): a board runs code from these modules only,
# whatever a manifest names, and imports nothing else for a manifest. True marks a debug module:
# its kernels hand plaintext to the host or take it from the host, so an image declaring any of
# them is a debug image, which the device says in its attestation report (a verifier refuses it).
SHIPPED_KERNEL_MODULES: dict[str, bool] = {
    "mlsys_flows.devices.fpga.kernels": False,   # diagnostics (no key, no plaintext)
    "mlsys_flows.systems.shef.accel": False,     # ShEF's accelerator (production)
    "mlsys_flows.systems.shef.debug": True,      # ShEF's spot checks that read/write plaintext (debug only)
    "mlsys_flows.systems.sia.train": False,      # SIA's retrain kernels
}

_DEVICE_KERNELS: dict[int, Callable] = {}  # id -> function: identity, so no look-alike object passes


def device_kernel(fn: Callable) -> Callable:
    """Marks ``fn`` as a kernel entry point: an image's manifest may declare it when its module is
    one of :data:`SHIPPED_KERNEL_MODULES` (nothing else runs on the board, whatever a host-built
    manifest names). The function itself is unchanged."""
    _DEVICE_KERNELS[id(fn)] = fn
    return fn


def _shipped(kernel: str) -> tuple[Any, Callable]:
    """The shipped module and marked function ``kernel`` names; refused before any import unless
    its module is shipped."""
    module_name, _, name = check_kernel_name(kernel).partition(":")
    if module_name not in SHIPPED_KERNEL_MODULES:
        raise KernelRefused(f"kernel {kernel!r}: module {module_name!r} is not a kernel module the device ships "
                            f"(shipped: {', '.join(sorted(SHIPPED_KERNEL_MODULES))}); nothing else is imported")
    try:
        module = importlib.import_module(module_name)
        fn = getattr(module, name)
    except (ImportError, AttributeError) as e:
        raise KernelRefused(f"kernel {kernel!r}: the device cannot find it: {e}") from None
    if _DEVICE_KERNELS.get(id(fn)) is not fn or getattr(fn, "__module__", None) != module_name:
        raise KernelRefused(f"kernel {kernel!r} is not a device kernel of {module_name} "
                            "(only functions it defines and marks @device_kernel are)")
    return module, fn


def kernel_code_hash(kernel: str) -> str:
    """The code hash of a shipped kernel: sha256 over its name and the source of the module that
    defines it (the function and the module-level helpers it calls), hex. ``build_image`` records
    it in the manifest; the device recomputes it from the code it ships and refuses a mismatch."""
    module, _ = _shipped(kernel)
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError) as e:
        raise KernelRefused(f"kernel {kernel!r}: the source of {module.__name__} is unreadable: {e}") from None
    return hashlib.sha256(b"mlsys-fpga-kernel-v1\0" + kernel.encode() + b"\0" + source.encode()).hexdigest()


def _resolve(kernel: str, code_hash: Any) -> Callable:
    """Device side, at load: the shipped, marked function a manifest entry names, when the code
    hash the image records for it is the hash of the device's own code."""
    _, fn = _shipped(kernel)
    if not isinstance(code_hash, str):
        raise KernelRefused(f"the image records no code hash for kernel {kernel!r} (build images with build_image())")
    if code_hash != kernel_code_hash(kernel):
        raise KernelRefused(f"the image's code hash for kernel {kernel!r} ({code_hash[:16]}...) is not the hash of "
                            "the code the device ships: the device runs only its own code")
    return fn


# ---------------------------------------------------------------------------------------------
# the interface


class FpgaBoard(abc.ABC):
    """One job's handle on an FPGA board (see the package docstring for the calling convention)."""

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
# device names and drivers


def _scheme(device: str) -> str:
    return device.split(":", 1)[0]


def software_device(device: str) -> str:
    """``fpga:N`` (a pool entry with no driver configured) -> ``fpga-sw:N``; others unchanged."""
    return "fpga-sw:" + device.split(":", 1)[1] if _scheme(device) == "fpga" and ":" in device else device


def _software_board(device: str, **options: Any) -> FpgaBoard:
    """The built-in driver ``fpga-sw``: a :class:`~.software.SoftwareBoard`."""
    from .software import SoftwareBoard

    return SoftwareBoard(device, **options)


_DRIVERS: dict[str, Callable[..., FpgaBoard]] = {"fpga-sw": _software_board}


def register_driver(scheme: str, factory: Callable[..., FpgaBoard]) -> None:
    """Make ``open_board("<scheme>:N")`` open boards with ``factory(device, **options)``."""
    _DRIVERS[scheme] = factory


def open_board(device: str = "fpga-sw:0", **options: Any) -> FpgaBoard:
    """Open ``device`` (waits for a free slot): ``fpga-sw:N`` (or a pool's ``fpga:N``) is a
    :class:`~.software.SoftwareBoard`; other schemes need a registered driver. Options go to the driver
    (software board: ``slots``, ``slot_timeout``, ``memory_bytes``, ``state``)."""
    device = software_device(device)
    factory = _DRIVERS.get(_scheme(device))
    if factory is None:
        raise FpgaError(f"no FPGA driver for {device!r} (registered: {sorted(_DRIVERS)}); a real board "
                        "needs register_driver(scheme, BoardClass)")
    return factory(device, **options)
