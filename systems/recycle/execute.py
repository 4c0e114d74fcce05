"""Executing a simulator plan for real: one rank runs its worker's operation order (torch.distributed).

The simulator (``sim.simulate``) lists, per worker, the order of its forward (F), backward-input
(Bi), backward-weight (Bw), fused backward (B) and optimizer-step (sync) operations. ``run_step``
runs one worker's list with real tensors: activations and input gradients travel between the
ranks of a micro-batch's route by send and receive (tagged with the micro-batch), the last stage of
a route computes the loss (mean of y^2), and ``sync`` all-reduces the gradients of every layer this
rank shares with other ranks (one all-reduce per set of sharers, in layer order on every rank, so
no two ranks wait on each other crosswise), then steps the optimizer. Sends are asynchronous and
complete before the step returns. Callers time whatever span they need around it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist

from .sim import Plan
from .stage import Stage, backward_fused, backward_input, backward_weight


@dataclass
class Shared:
    """A block of this rank's parameters that other ranks also hold: all-reduced over ``group``."""

    group: Any                    # a torch.distributed process group of the sharers (this rank included)
    params: list[torch.Tensor]
    sharers: int


@dataclass
class Worker:
    """What one rank needs to run its worker of a plan."""

    me: int                       # this rank's worker index in the plan
    ranks: list[int]              # global rank of every worker of the plan
    stage: Stage                  # this worker's layers
    optimizer: torch.optim.Optimizer
    shape: tuple[int, ...]        # one micro-batch's activation shape
    inputs: Callable[[int], torch.Tensor]  # the input of micro-batch j (first stage of its route)
    group: Any = None             # the process group the sends and receives use (None: the default)
    shared: list[Shared] = field(default_factory=list)


def run_step(plan: Plan, order: list[tuple[str, int]], w: Worker) -> None:
    """One training iteration of worker ``w.me``: its operations in ``order`` (from the plan's schedule)."""
    xs: dict[int, torch.Tensor] = {}
    ys: dict[int, torch.Tensor] = {}
    sends: list[tuple[Any, torch.Tensor]] = []
    for kind, mb in order:
        if kind == "sync":
            _sync(w)
            continue
        route = plan.microbatches[mb].route
        pos = route.index(w.me)
        prev = w.ranks[route[pos - 1]] if pos > 0 else None
        nxt = w.ranks[route[pos + 1]] if pos + 1 < len(route) else None
        if kind == "F":
            if prev is None:
                x = w.inputs(mb)
            else:
                x = torch.empty(w.shape)
                dist.recv(x, src=prev, group=w.group, tag=mb)
                x.requires_grad_(True)
            y = w.stage(x)
            xs[mb], ys[mb] = x, y
            if nxt is not None:
                out = y.detach().contiguous()
                sends.append((dist.isend(out, dst=nxt, group=w.group, tag=mb), out))
        elif kind in ("Bi", "B"):
            y = ys.pop(mb)
            if nxt is None:
                dy = 2.0 * y.detach() / y.numel()  # loss = mean(y^2)
            else:
                dy = torch.empty_like(y)
                dist.recv(dy, src=nxt, group=w.group, tag=mb)
            x = xs.pop(mb)
            dx = backward_input(w.stage, x, y, dy, mb) if kind == "Bi" else backward_fused(w.stage, x, y, dy)
            if prev is not None:
                dx = dx.contiguous()
                sends.append((dist.isend(dx, dst=prev, group=w.group, tag=mb), dx))
        elif kind == "Bw":
            backward_weight(w.stage, mb)
        else:
            raise ValueError(f"unknown operation {kind!r} in the plan's order")
    for handle, _ in sends:
        handle.wait()


def _sync(w: Worker) -> None:
    for block in w.shared:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in block.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=block.group)
        flat /= block.sharers
        offset = 0
        for p, g in zip(block.params, grads):
            p.grad = flat[offset:offset + g.numel()].view_as(g)
            offset += g.numel()
    w.optimizer.step()
    w.optimizer.zero_grad(set_to_none=True)


def layer_params(stage: Stage, first: int, count: int) -> list[torch.Tensor]:
    """The parameters of ``count`` of ``stage``'s blocks from block ``first`` on, in module order."""
    return [p for blk in list(stage.blocks)[first:first + count] for p in blk.parameters()]
