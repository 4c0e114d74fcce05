"""The FPGA device interface behind ``ResourcePool(kind="fpga")``, and a software board (pure).

Interface (:class:`FpgaBoard`), what every board driver implements::

    board = open_board("fpga-sw:0")           # holds one of the device's job slots until close()
    image = build_image(["pkg.module:function"], payload)   # its kernels (of shipped modules) and their
                                              # code hashes, then the accelerator
    measurement = board.load_image(image)     # a blank device with this image; returns sha256(image)
    report = board.attest(nonce, user_pub)    # signed {device, measurement, nonce, session keys, debug}
    board.alloc("table", 1 << 20)             # a device memory region with bounds
    board.write("table", 0, data); board.read("table", 0, 64)
    out = board.run("pkg.module:function", x, y=2)          # blocking
    fut = board.run_async("pkg.module:function", x)         # concurrent.futures.Future
    board.close()                             # also ``with open_board(...) as board:``

Kernel calling convention: ``run(kernel, *args, **kwargs)`` calls ``function(*args, **kwargs)``
*inside the device process* -- plain arguments, plain result, both crossing the host-device pipe by
pickle (numpy arrays in, numpy arrays out work as they are). The board runs only code it ships
(:data:`SHIPPED_KERNEL_MODULES`, the project's own kernel modules) and of that only the kernels the
loaded image declares in its manifest (:func:`build_image`, which records each kernel's code hash):
``load_image`` refuses, before any import, a kernel whose module is not shipped, and then accepts only
functions that module defines and marks :func:`device_kernel` and whose code hash
(:func:`kernel_code_hash`, recomputed on the device from its own code) is the one the image records.
Every ``load_image`` starts the device blank: memory regions, session key, the old kernels and their
on-chip store are gone. An image that declares a kernel of a debug module (which hands plaintext to
the host or takes it from the host) is a debug image, and the attestation report says so. ``run``
refuses (:class:`KernelRefused`, before any import) a name the manifest does not declare, a dotted
attribute path and a private (``_``) name. What the host sends is unpickled on the device by a
loader that admits plain data and numpy arrays only, since a pickle can call any function it names.
A kernel that needs the board's own state calls the device-side accessors of this package from
inside the kernel: :func:`board_memory` (the board's memory regions: ``read``/``write``/``buffer``),
:func:`board_session_key` (the session key the last attestation established),
:func:`board_measurement` (the loaded image's measurement) and :func:`board_store` (a dict for the
kernels' on-chip state, emptied by every ``load_image``). They raise :class:`FpgaError` on the
host: only code running on the device sees the device's memory and keys (and they are no kernels).
Kernels run one at a time per board, in submission order (one command queue); ``run_async`` lets
the host work meanwhile.

Software board (``"fpga-sw:N"``, :class:`SoftwareBoard`): a separate process (multiprocessing
*spawn* context, so host and device really run side by side on different cores; started isolated,
``python -I``, with the interpreter's own ``sys.path`` and none of the host's, so nothing the host
writes on its import path runs there) that holds

- key material: an Ed25519 device key certified (signed) by a manufacturer root key. The software
  "factory" keeps the root key and each board's key and certificate under the state directory
  (``$MLSYS_FPGA_SW_DIR``, default ``<tmp>/mlsys-fpga-sw-<uid>``); only the device process loads a
  device's private key. :func:`manufacturer_root_public_key` is what a remote verifier trusts; a
  verifier reads it once, before any board is used (:func:`trusted_root_public_key`, which prefers a
  key pinned in ``$MLSYS_FPGA_TRUSTED_ROOT``), never from the state directory while it verifies.
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

Modules (each imports only those listed before it; ``board`` reaches ``software`` only when
``open_board`` opens the first software board):

- :mod:`.errors`: :class:`FpgaError` and its subclasses;
- :mod:`.state`: the software boards' state directory (:func:`state_dir`);
- :mod:`.attestation`: the signed payloads, :class:`AttestationReport`, :func:`session_key_from`, and
  the software factory (manufacturer root key, device keys and certificates);
- :mod:`.board`: the interface :class:`FpgaBoard`, images (:func:`build_image`, :func:`read_image`),
  :func:`device_kernel`, device names, :func:`register_driver` and :func:`open_board`;
- :mod:`.software`: the software board: :class:`SlotLock`, the device side (:class:`BoardMemory`, the
  accessors, the board process's request loop) and :class:`SoftwareBoard`;
- :mod:`.kernels`: the diagnostic kernels (:func:`diagnostic_image`, :func:`occupancy_job`).

Import it as ``from mlsys_flows.devices import fpga`` (``fpga.open_board(...)``); a kernel is named by
the module that defines it, e.g. ``"mlsys_flows.devices.fpga.kernels:echo"``.
"""
from __future__ import annotations

from .errors import BoundsError, FpgaError, KernelError, KernelRefused, SlotTimeout
from .state import state_dir
from .attestation import (AttestationReport, certificate_payload, manufacturer_root_public_key, report_payload,
                          session_key_from, trusted_root_public_key)
from .board import (SHIPPED_KERNEL_MODULES, FpgaBoard, Image, build_image, check_kernel_name, device_kernel,
                    kernel_code_hash, open_board, read_image, register_driver, software_device)
from .software import (BoardMemory, SlotLock, SoftwareBoard, board_measurement, board_memory, board_session_key,
                       board_store, pick_device)
from .kernels import diagnostic_image, occupancy_job

__all__ = ["FpgaError", "BoundsError", "SlotTimeout", "KernelError", "KernelRefused", "AttestationReport", "FpgaBoard",
           "SoftwareBoard", "SlotLock", "BoardMemory", "open_board", "register_driver", "pick_device",
           "software_device", "manufacturer_root_public_key", "trusted_root_public_key", "board_memory", "board_session_key",
           "board_measurement", "board_store", "report_payload", "certificate_payload", "session_key_from", "state_dir",
           "build_image", "read_image", "Image", "device_kernel", "check_kernel_name", "kernel_code_hash",
           "SHIPPED_KERNEL_MODULES", "diagnostic_image",
           "occupancy_job"]
