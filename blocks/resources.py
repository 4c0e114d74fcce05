"""ResourcePool: GPUs, FPGAs or CPU slots that tasks claim, on Dask and in Prefect."""
from __future__ import annotations

import fcntl
import logging
import os
import re
import tempfile
import time
from contextlib import contextmanager
from typing import Iterator, Literal

from prefect.blocks.core import Block
from pydantic import Field, model_validator

from ._docs import DOCS_URL

log = logging.getLogger("mlsys_flows.resources")

_RESOURCE_NAMES = {"gpu": "GPU", "fpga": "FPGA", "cpu": "CPU"}


class ResourcePool(Block):
    """A pool of devices that tasks claim: ``kind`` gpu, fpga or cpu, its ``devices`` and each
    task's ``per_task`` demand.

    It becomes (1) Dask worker ``resources`` (``worker_resources()``) plus
    ``dask.annotate(resources=...)`` around the submissions that need a device (``annotate()``),
    so only workers that own a device run them; and (2) a Prefect global concurrency limit of
    ``len(devices)`` slots (``claim()``), so no more tasks hold a device than exist. A GPU pool
    on a machine without CUDA falls back to the CPU with a logged warning. An FPGA pool's
    ``claim()`` also takes one free device of its inventory under an exclusive file lock on this
    machine (waiting while all are taken) and yields its board name: ``fpga:N`` entries are the
    software device backend's ``fpga-sw:N`` (``systems/common/fpga.py``, ``open_board(device)``);
    other names (``f1:0``) go to a registered board driver as they are. The board itself also
    bounds its concurrent jobs (its slots) when it is opened.

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

    @model_validator(mode="after")
    def _demand_fits(self) -> "ResourcePool":
        if self.per_task > len(self.devices):
            raise ValueError(f"per_task ({self.per_task}) exceeds the pool's {len(self.devices)} devices")
        return self

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
        """Create or update the Prefect global concurrency limit (slots = number of devices)."""
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
        from prefect.exceptions import ObjectNotFound

        slots = len(self.devices)
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
    def claim(self) -> Iterator[str]:
        """Inside a task: hold one slot of the Prefect limit and yield the device to use (an FPGA
        pool: a device of its inventory no other claim on this machine holds, see ``_fpga_device``)."""
        with self._held_slot():
            if self.kind != "fpga":
                yield self.device()
                return
            with self._fpga_device() as device:
                yield device

    @contextmanager
    def _held_slot(self) -> Iterator[None]:
        if not self.limit_concurrency:
            yield
            return
        from prefect.concurrency.sync import concurrency

        with concurrency(self.concurrency_limit_name, occupy=1, strict=False):
            yield

    @contextmanager
    def _fpga_device(self) -> Iterator[str]:
        """An exclusive flock on ``<tmp>/mlsys-fpga-pool-<uid>/<pool>/<device>.lock`` of the first free
        device (waits while all are held; the lock dies with its holder, so a killed task frees it)."""
        root = os.path.join(tempfile.gettempdir(), f"mlsys-fpga-pool-{os.getuid()}", self.name)
        os.makedirs(root, mode=0o700, exist_ok=True)
        delay, waiting_since = 0.005, None
        while True:
            for dev in self.devices:
                fd = os.open(os.path.join(root, re.sub(r"[^A-Za-z0-9_.-]", "_", dev) + ".lock"),
                             os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                try:
                    yield _board_name(dev)
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    os.close(fd)
                return
            if waiting_since is None:
                waiting_since = time.monotonic()
                log.info("ResourcePool %r: all %d FPGA device(s) busy; waiting", self.name, len(self.devices))
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def device(self) -> str:
        """The device a task should use; falls back to the CPU (with a warning) when absent. An
        FPGA pool: its first board's name (``claim()`` picks a free one)."""
        if self.kind == "gpu":
            try:
                import torch

                if torch.cuda.is_available():  # a worker per GPU sees its own as cuda:0 (CUDA_VISIBLE_DEVICES)
                    return f"cuda:{torch.cuda.current_device()}"
            except ImportError:
                pass
            log.warning("ResourcePool %r: no CUDA device on this worker; falling back to CPU", self.name)
            return "cpu"
        return _board_name(self.devices[0]) if self.kind == "fpga" else "cpu"


def _board_name(device: str) -> str:
    """``fpga:N`` (no board driver named) is the software board ``fpga-sw:N``; other names as they are."""
    return "fpga-sw:" + device.split(":", 1)[1] if re.fullmatch(r"fpga:\d+", device) else device
