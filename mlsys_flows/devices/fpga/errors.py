"""The errors of the FPGA board interface: every board operation raises :class:`FpgaError` or one
of its subclasses (they pickle, so a device-side error reaches the host as itself)."""
from __future__ import annotations

from mlsys_flows.errors import MlsysError


class FpgaError(MlsysError, RuntimeError):
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
