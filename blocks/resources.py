"""ResourcePool: GPUs, FPGAs or CPU slots that tasks claim, on Dask and in Prefect."""
from __future__ import annotations

import fcntl
import logging
import os
import re
import tempfile
import time
from contextlib import ExitStack, contextmanager
from typing import Iterator, Literal

from prefect.blocks.core import Block
from pydantic import Field, model_validator

from mlsys_flows.errors import MlsysError

from ._docs import DOCS_URL

log = logging.getLogger("mlsys_flows.resources")

_RESOURCE_NAMES = {"gpu": "GPU", "fpga": "FPGA", "cpu": "CPU"}


class ResourcePool(Block):
    """A pool of devices that tasks claim: ``kind`` gpu, fpga or cpu, its ``devices`` and each
    task's ``per_task`` demand.

    It becomes (1) Dask worker ``resources`` (``worker_resources()``) plus
    ``dask.annotate(resources=...)`` around the submissions that need a device (``annotate()``),
    so only workers that own a device run them; and (2) a Prefect global concurrency limit of
    ``len(devices) / per_task`` claims at a time (``claim()``), so no more tasks hold a device than
    exist. ``claim()`` also takes ``per_task`` free devices of the inventory (a fraction ``1/k``: a
    share of one device, k claims per device) under exclusive file locks on this machine, so
    concurrent claims on a multi-GPU worker get distinct devices, and yields the first (all of them
    in ``.devices``). List the devices as the worker sees them: with one worker per GPU (dask-cuda,
    ``CUDA_VISIBLE_DEVICES``) each worker sees its GPU as ``cuda:0``. A GPU pool on a worker without
    CUDA falls back to the CPU with a logged warning (no device to assign). An FPGA pool yields the
    board name: ``fpga:N`` entries are the software device backend's ``fpga-sw:N``
    (``mlsys_flows/devices/fpga/``, ``open_board(device)``); other names (``f1:0``) go to a registered
    board driver as they are. The board itself also bounds its concurrent jobs when it is opened.
    A claim waits at most ``claim_timeout_s`` in all (for a slot, then for devices) and then fails
    with :class:`ClaimTimeout`, naming the pool, what it waited for and how long.

    Example:
        ```python
        from mlsys_flows.blocks import ResourcePool

        ResourcePool(kind="gpu", devices=["cuda:0", "cuda:1"], name="lab").save("BLOCK_NAME")
        pool = ResourcePool.load("BLOCK_NAME")
        # flows: run with devices="BLOCK_NAME"; a flow body submits a device task with
        # ctx.submit(task, ..., ctx.devices, device="gpu"), and the task holds a device with
        with pool.claim() as device:
            ...
        ```
    """

    _block_type_name = "mlsys ResourcePool"
    _block_type_slug = "mlsys-resource-pool"
    _documentation_url = DOCS_URL + "#resourcepool"
    _description = "GPU/FPGA/CPU device inventory mapped to Dask worker resources and a Prefect concurrency limit."

    kind: Literal["gpu", "fpga", "cpu"] = Field(default="gpu", description="Device kind: gpu, fpga or cpu.")
    devices: list[str] = Field(default_factory=lambda: ["cuda:0"], min_length=1,
                               description="Device inventory, e.g. ['cuda:0', 'cuda:1'], or FPGA boards "
                               "['fpga-sw:0', 'fpga-sw:1'] (fpga:N means the software board fpga-sw:N).")
    per_task: float = Field(default=1.0, gt=0, description="Devices one task claims (Dask resource units).")
    name: str = Field(default="default", pattern=r"^[a-z0-9][a-z0-9-]*$",
                      description="Pool name, part of the Prefect concurrency limit's name.")
    limit_concurrency: bool = Field(default=True, description="Whether claim() holds a slot of the pool's Prefect "
                                    "concurrency limit (off for a worker's own devices, shared with nobody).")
    claim_timeout_s: float = Field(default=3600.0, gt=0, description="Longest a claim() waits for a slot and free "
                                   "devices before it fails naming the pool (other tasks held them all).")

    @model_validator(mode="after")
    def _demand_fits(self) -> "ResourcePool":
        if self.per_task > len(self.devices):
            raise ValueError(f"per_task ({self.per_task}) exceeds the pool's {len(self.devices)} devices")
        whole = self.per_task >= 1 and float(self.per_task).is_integer()
        if not whole and not (self.per_task < 1 and (1 / self.per_task).is_integer()):
            raise ValueError(f"per_task must be a whole number of devices or a share 1/k of one "
                             f"(0.5, 0.25, ...); got {self.per_task}")
        return self

    @property
    def shares(self) -> int:
        """Claims one device holds at once: k for ``per_task`` = 1/k, else 1."""
        return 1 if self.per_task >= 1 else round(1 / self.per_task)

    @property
    def slots(self) -> int:
        """Slots of the Prefect limit: a share of a device each."""
        return len(self.devices) * self.shares

    @property
    def slots_per_claim(self) -> int:
        return max(1, int(self.per_task))

    @property
    def resource_name(self) -> str:
        return _RESOURCE_NAMES[self.kind]

    @property
    def concurrency_limit_name(self) -> str:
        return f"mlsys-{self.kind}-{self.name}"

    def worker_resources(self) -> dict[str, float]:
        """Resources a Dask worker that owns this pool's devices advertises (``--resources``)."""
        return {self.resource_name: float(len(self.devices))}

    def annotate(self):
        """``dask.annotate`` context: submissions inside it need ``per_task`` of this resource."""
        import dask

        return dask.annotate(resources={self.resource_name: self.per_task})

    def ensure_concurrency_limit(self) -> None:
        """Create or update the Prefect global concurrency limit (``slots``: devices x shares)."""
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
        from prefect.exceptions import ObjectNotFound

        slots = self.slots
        with get_client(sync_client=True) as client:
            try:
                current = client.read_global_concurrency_limit_by_name(self.concurrency_limit_name)
                if current.limit != slots or not current.active:
                    client.update_global_concurrency_limit(
                        self.concurrency_limit_name, GlobalConcurrencyLimitUpdate(limit=slots, active=True))
            except ObjectNotFound:
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=self.concurrency_limit_name, limit=slots, active=True))

    @contextmanager
    def claim(self, timeout_s: float | None = None) -> Iterator["Device"]:
        """Inside a task: hold ``per_task`` slots of the Prefect limit and as many devices of this
        machine no other claim holds; yields the device to use (``.devices``: all of them). Waits at
        most ``timeout_s`` (default ``claim_timeout_s``) in all, then raises :class:`ClaimTimeout`."""
        timeout = self.claim_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        with self._held_slot(timeout):
            if self.kind == "cpu" or (self.kind == "gpu" and not _cuda_count()):
                yield Device(self.device())  # nothing to assign: the CPU (a GPU pool warns)
                return
            with self.lease(max(0.0, deadline - time.monotonic()), waited_s=timeout) as held:
                yield Device(self._usable(held[0]), devices=tuple(self._usable(d) for d in held))

    @contextmanager
    def _held_slot(self, timeout_s: float) -> Iterator[None]:
        if not self.limit_concurrency:
            yield
            return
        from prefect.concurrency.sync import concurrency

        with ExitStack() as stack:  # a TimeoutError of the body is not the slot's
            try:
                stack.enter_context(concurrency(self.concurrency_limit_name, occupy=self.slots_per_claim,
                                                timeout_seconds=timeout_s, strict=False))
            except TimeoutError:
                raise ClaimTimeout(f"ResourcePool {self.name!r} ({self.kind}): no free slot of Prefect concurrency "
                                   f"limit {self.concurrency_limit_name!r} ({self.slots} slots, this claim needs "
                                   f"{self.slots_per_claim}) within {timeout_s:g} s: other tasks held them all; "
                                   f"raise claim_timeout_s or add devices") from None
            yield

    @contextmanager
    def lease(self, timeout_s: float, waited_s: float | None = None) -> Iterator[list[str]]:
        """``per_task`` devices of the inventory (a share of one when ``per_task`` < 1) that no other
        lease on this machine holds, as exclusive flocks on
        ``<tmp>/mlsys-device-pool-<uid>/<kind>-<name>/<device>.<share>.lock`` (a lock dies with its
        holder, so a killed task frees its devices); released on exit. Waits while too few are free,
        at most ``timeout_s``, then raises :class:`ClaimTimeout`."""
        root = os.path.join(tempfile.gettempdir(), f"mlsys-device-pool-{os.getuid()}", f"{self.kind}-{self.name}")
        os.makedirs(root, mode=0o700, exist_ok=True)
        need, deadline, delay, logged = self.slots_per_claim, time.monotonic() + timeout_s, 0.005, False
        while True:
            held: list[tuple[str, int]] = []
            for dev in self.devices:
                fd = _try_lock(root, dev, self.shares)
                if fd is not None:
                    held.append((dev, fd))
                    if len(held) == need:
                        break
            if len(held) == need:
                try:
                    yield [dev for dev, _ in held]
                finally:
                    _unlock(fd for _, fd in held)
                return
            _unlock(fd for _, fd in held)
            if time.monotonic() >= deadline:
                raise ClaimTimeout(f"ResourcePool {self.name!r} ({self.kind}): its devices ({', '.join(self.devices)}) "
                                   f"stayed held by other claims on this machine for "
                                   f"{timeout_s if waited_s is None else waited_s:g} s (this claim needs {need}); "
                                   f"raise claim_timeout_s or add devices")
            if not logged:
                logged = True
                log.info("ResourcePool %r: all %d %s device(s) busy; waiting", self.name, len(self.devices), self.kind)
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.1)

    def _usable(self, device: str) -> str:
        """A leased inventory entry as the task uses it; a CUDA device this worker cannot see fails
        naming the pool (the inventory lists devices as the worker sees them)."""
        if self.kind == "fpga":
            return _board_name(device)
        match = re.fullmatch(r"cuda:(\d+)", device)
        if match and int(match.group(1)) >= _cuda_count():
            raise ValueError(f"ResourcePool {self.name!r}: device {device} is not visible on this worker (it sees "
                             f"{_cuda_count()} CUDA device(s)); list the devices as the worker sees them")
        return device

    def device(self) -> str:
        """The device a task should use outside a claim (``claim()`` assigns a free one); falls back to
        the CPU (with a warning) when absent. An FPGA pool: its first board's name."""
        if self.kind == "gpu":
            try:
                import torch

                if torch.cuda.is_available():  # outside a claim: the current device, as torch sees it
                    return f"cuda:{torch.cuda.current_device()}"
            except ImportError:
                pass
            log.warning("ResourcePool %r: no CUDA device on this worker; falling back to CPU", self.name)
            return "cpu"
        return _board_name(self.devices[0]) if self.kind == "fpga" else "cpu"


def _board_name(device: str) -> str:
    """``fpga:N`` (no board driver named) is the software board ``fpga-sw:N``; other names as they are."""
    return "fpga-sw:" + device.split(":", 1)[1] if re.fullmatch(r"fpga:\d+", device) else device


class ClaimTimeout(MlsysError, TimeoutError):
    """A claim waited ``claim_timeout_s`` for a slot or for free devices; the message names the pool."""


class Device(str):
    """The device a claim yields (use it as a string: ``tensor.to(device)``); ``devices`` lists every
    device the claim holds (``per_task`` > 1)."""

    devices: tuple[str, ...]

    def __new__(cls, device: str, devices: tuple[str, ...] = ()):
        obj = super().__new__(cls, device)
        obj.devices = devices or (device,)
        return obj


def _cuda_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _try_lock(root: str, device: str, shares: int) -> int | None:
    """An fd holding an exclusive flock on one free share of ``device``; None when all are held."""
    for share in range(shares):
        fd = os.open(os.path.join(root, f"{re.sub(r'[^A-Za-z0-9_.-]', '_', device)}.{share}.lock"),
                     os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            os.close(fd)
    return None


def _unlock(fds) -> None:
    for fd in fds:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
