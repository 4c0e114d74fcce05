"""Data-parallel training whose state is sharded across ranks (pure: torch and torch.distributed).

Every rank holds the whole MLP and computes gradients on its own batches; gradients are summed
over the ranks (one all-reduce per step) and averaged. The optimizer (SGD with momentum, buffers
kept by hand) is sharded as ZeRO-1 shards it: parameter ``i`` and its momentum belong to rank
``i % world_size``, which alone checkpoints them. A rank's checkpoint is therefore its shard, and a
restore needs every rank's shard: each owner broadcasts what it restored.

Deterministic: the same seed, world size and steps give bit-identical parameters, whether the run
was interrupted and resumed from a checkpoint or not (each step's batch is drawn from a generator
seeded by (seed, rank, step), never from a stream that a resume would have to replay).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable

LEARNING_RATE = 0.05
MOMENTUM = 0.9


@dataclass
class ShardedResult:
    rank: int
    start_step: int  # the committed step this run resumed after (-1: from scratch)
    steps: int  # optimizer steps done when it ended
    losses: list[float] = field(default_factory=list)  # this rank's, of the steps this run did
    digest: str = ""  # sha256 of every parameter and momentum buffer (equal on every rank)


def _model(width: int, depth: int, seed: int):
    import torch

    torch.manual_seed(seed)
    layers: list[Any] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1])


def _batch(width: int, batch_size: int, seed: int, rank: int, step: int):
    import torch

    g = torch.Generator().manual_seed((seed * 1_000_003 + rank * 10_007 + step) & 0x7FFF_FFFF)
    x = torch.randn(batch_size, width, generator=g)
    return x, torch.sin(x.roll(1, dims=1))  # a fixed smooth target


def digest(tensors: list[Any]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def train_sharded(rank: int, world_size: int, width: int, depth: int, batch_size: int, steps: int, every: int,
                  seed: int, resume: Callable[[dict], tuple[int, dict]], saver) -> ShardedResult:
    """Train ``steps`` steps in a process group already joined by ``world_size`` ranks; checkpoint this
    rank's shard through ``saver`` (``save(step, shard)``, ``wait()``) after every ``every``-th step.
    ``resume(default)`` gives (the committed step to continue after, this rank's shard of it) or
    (-1, default)."""
    import torch
    import torch.distributed as dist

    model = _model(width, depth, seed)
    params = list(model.parameters())
    momentum = [torch.zeros_like(p) for p in params]
    owned = [i for i in range(len(params)) if i % world_size == rank]
    start, shard = resume({})
    if start >= 0:
        with torch.no_grad():
            for i in owned:
                params[i].copy_(shard["params"][str(i)])
                momentum[i].copy_(shard["momentum"][str(i)])
            for i in range(len(params)):  # every rank gets what each owner restored
                dist.broadcast(params[i], src=i % world_size)
                dist.broadcast(momentum[i], src=i % world_size)
    result = ShardedResult(rank=rank, start_step=start, steps=start + 1)
    for step in range(start + 1, steps):
        x, y = _batch(width, batch_size, seed, rank, step)
        model.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        with torch.no_grad():
            for p, m in zip(params, momentum):
                dist.all_reduce(p.grad)
                p.grad.div_(world_size)
                m.mul_(MOMENTUM).add_(p.grad)
                p.sub_(LEARNING_RATE * m)
        result.losses.append(loss.item())
        result.steps = step + 1
        if (step + 1) % every == 0:
            saver.save(step, {"params": {str(i): params[i] for i in owned},
                              "momentum": {str(i): momentum[i] for i in owned}})
    saver.wait()
    result.digest = digest(params + momentum)
    return result
