"""Where the two-tier trainer's tensors live, and how rows cross between the host and the device
(torch + numpy; pure: no prefect/dask imports).

:func:`resolve_device` is the one place that turns the requested device into the one the trainer
uses: ``"cpu"`` always works; ``"auto"`` is CUDA when this process sees a CUDA device, else the CPU;
``"cuda"``/``"cuda:N"`` is that CUDA device when it is visible, else the CPU with a logged warning
(the convention of ``ResourcePool.device()``: a GPU pool on a worker without CUDA falls back to the
CPU). Anything else fails naming the parameter ``device``.

:class:`Placement` holds the resolved device and the copies: the dense model, the fast tier (hot
rows and their Adagrad state) and the prepared inputs live on the device; the slow tier stays in
host memory behind its process, so the rows it returns are copied host-to-device
(:meth:`Placement.to_device`) and the gradients and rows sent back to it device-to-host
(:meth:`Placement.to_host`). On CUDA both copies go through reusable pinned (page-locked) host
buffers with ``non_blocking=True`` copies: host-to-device returns at once (the copy is ordered on
the stream before the kernels that read it), and a staging buffer is reused only after an event says
its previous copy finished; device-to-host waits for its copy (the bytes are sent to the slow tier
at once). On the CPU with ``staged=False`` (the default there) the copies are no-ops
(``torch.from_numpy``, ``Tensor.numpy``), so CPU results are the same bit for bit as before the
device path existed; ``staged=True`` on the CPU routes the same copies through the staging buffers
(not pinned: pinning needs CUDA), which is how the tests exercise the path without a GPU.
"""
from __future__ import annotations

import logging
import re

import numpy as np
import torch

log = logging.getLogger("mlsys_flows.recsys_embeddings")

_CUDA = re.compile(r"cuda(?::(\d+))?")


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """The device to train on for the requested ``device`` (see the module's docstring)."""
    name = "auto" if device is None else str(device).strip().lower()
    if name == "cpu":
        return torch.device("cpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if name == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if count else torch.device("cpu")
    m = _CUDA.fullmatch(name)
    if m is None:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N' (got {device!r})")
    index = int(m.group(1)) if m.group(1) is not None else (torch.cuda.current_device() if count else 0)
    if index < count:
        return torch.device("cuda", index)
    log.warning("device %r requested but this process sees %d CUDA device(s); training on cpu", str(device), count)
    return torch.device("cpu")


class _Staging:
    """A growable host buffer of float32 (pinned on CUDA) and the event of the last copy that used it."""

    def __init__(self, pin: bool):
        self.pin, self.buf, self.event = pin, torch.empty(0), None

    def take(self, numel: int) -> torch.Tensor:
        """``numel`` elements of the buffer, once the previous copy from or into it has finished."""
        if self.event is not None:
            self.event.synchronize()
            self.event = None
        if self.buf.numel() < numel:
            size = 1 << max(10, (numel - 1).bit_length())  # grow by powers of two: few (pinned) allocations
            self.buf = torch.empty(size, pin_memory=self.pin)
        return self.buf[:numel]

    def record(self) -> None:
        if self.pin:
            self.event = torch.cuda.Event()
            self.event.record()


class Placement:
    """The trainer's device and its host<->device copies (see the module's docstring). Counts the
    copies and the rows they moved (``h2d_copies``, ``h2d_rows``, ``d2h_copies``, ``d2h_rows``)."""

    def __init__(self, device: torch.device | str = "cpu", staged: bool | None = None):
        self.device = device if isinstance(device, torch.device) else resolve_device(device)
        self.cuda = self.device.type == "cuda"
        self.staged = self.cuda if staged is None else bool(staged)
        if self.cuda and not self.staged:
            raise ValueError("a CUDA placement copies through its staging buffers (staged=True)")
        self._h2d, self._d2h = _Staging(self.cuda), _Staging(self.cuda)
        self.h2d_copies = self.h2d_rows = self.d2h_copies = self.d2h_rows = 0

    @classmethod
    def for_device(cls, device: str | torch.device | None) -> "Placement":
        return cls(resolve_device(device))

    def __str__(self) -> str:
        if self.cuda:
            return f"{self.device} ({torch.cuda.get_device_name(self.device)})"
        return str(self.device)

    # ----- tensors that live on the device ---------------------------------------------------
    def put(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor (model, inputs, index tensors) on the device; the tensor itself on the CPU."""
        return t.to(self.device, non_blocking=True) if self.cuda else t

    def empty(self, *shape: int) -> torch.Tensor:
        return torch.empty(*shape, device=self.device)

    def zeros(self, *shape: int) -> torch.Tensor:
        return torch.zeros(*shape, device=self.device)

    # ----- the slow tier's rows ---------------------------------------------------------------
    def to_device(self, rows: np.ndarray) -> torch.Tensor:
        """Rows the slow tier returned (host float32 [n, w]) as a device tensor."""
        rows = np.ascontiguousarray(rows, np.float32)
        self.h2d_copies += 1
        self.h2d_rows += len(rows)
        if not self.staged:
            return torch.from_numpy(rows)
        host = self._h2d.take(rows.size).view(rows.shape)
        host.copy_(torch.from_numpy(rows))
        out = torch.empty(rows.shape, device=self.device)
        out.copy_(host, non_blocking=True)
        self._h2d.record()  # the buffer is reused only once this copy finished
        return out

    def to_host(self, t: torch.Tensor) -> np.ndarray:
        """A device tensor (gradients, rows) as host float32 numpy, for the slow tier. On a staged
        placement the array is a view of the staging buffer: valid until the next ``to_host``."""
        t = t.detach()
        self.d2h_copies += 1
        self.d2h_rows += t.shape[0] if t.dim() else 1
        if not self.staged:
            return t.numpy()
        host = self._d2h.take(t.numel()).view(t.shape)
        host.copy_(t, non_blocking=True)
        if self.cuda:
            self._d2h.record()
            self._d2h.event.synchronize()  # the bytes go to the slow tier at once
            self._d2h.event = None
        return host.numpy()

    def to_numpy(self, t: torch.Tensor) -> np.ndarray:
        """A device tensor as a host numpy array of its own (evaluation, not the slow tier's path)."""
        return t.detach().cpu().numpy()

    def sync(self) -> None:
        """Wait for the device's queued work (before a training clock is read); nothing on the CPU."""
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def describe(self) -> dict:
        return {"device": str(self), "staged": self.staged, "pinned": self.cuda, "h2d_copies": self.h2d_copies,
                "h2d_rows": self.h2d_rows, "d2h_copies": self.d2h_copies, "d2h_rows": self.d2h_rows}


__all__ = ["Placement", "resolve_device"]
