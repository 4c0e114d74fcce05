"""Debug kernels of the ShEF accelerator: one read or write of plaintext through a Shield, for tests.

They hand the host plaintext (:func:`shield_read`) or take it from the host (:func:`shield_write`),
so only the debug image (``workload.debug_image``) declares them: its manifest names a debug module
of ``SHIPPED_KERNEL_MODULES``, so it has its own measurement, the board's attestation report says
``debug``, and the user's policy (``RemoteUser.verify``) refuses to provision a data key to it.
"""
from __future__ import annotations

from mlsys_flows.devices.fpga import device_kernel

from .accel import _shield


@device_kernel
def shield_read(variant: str, region: str, offset: int, length: int) -> bytes:
    """One read through the Shield: plaintext to the host (debug image only)."""
    return _shield(variant, region).read(offset, length)


@device_kernel
def shield_write(variant: str, region: str, offset: int, data: bytes) -> None:
    """One write of host plaintext through the Shield (debug image only)."""
    _shield(variant, region).write(offset, data)
