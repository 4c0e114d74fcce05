"""An Oobleck-style restart, measured (pure: torch and torch.distributed).

When a worker fails, Oobleck re-instantiates its pipelines: new communication groups, each stage's
state (weights and optimizer) restored from the last checkpoint, the layers a reshaped pipeline
lacks copied from a surviving replica, and the first micro-batch's forward and backward. The flow
times that on the cluster: ranks (one per stage worker, ``platform.ranks``) start fresh process
groups, restore their stage from a sharded checkpoint, receive rank 0's stage weights (the layer
copy), run one forward and backward, and meet at a barrier. The launch's wall time (scheduling,
rendezvous, group init, restore, copy, first step) is the restart; the simulator charges it to
Oobleck per failure instead of the ``restart_iterations`` constant.
"""
from __future__ import annotations

import time
from typing import Any, Callable


def build(p, seed: int):
    """One pipeline stage of the run's shape and its Adam optimizer, with Adam's state created by
    one step (a checkpoint of a training stage holds both moments)."""
    import torch

    from .stage import Stage

    torch.manual_seed(seed)
    stage = Stage(p.d_model, p.heads, p.layers_per_stage)
    opt = torch.optim.Adam(stage.parameters(), lr=1e-4)
    stage(torch.randn(p.micro_batch, p.seq, p.d_model)).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return stage, opt


def restart(rank: int, p, restore: Callable[[], Any]) -> dict[str, float]:
    """What a restarted stage worker does, each phase timed on this rank (the caller's process group is
    already up): re-instantiate, restore, copy rank 0's layers, one forward and backward, barrier."""
    import torch
    import torch.distributed as dist

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core per stage worker, as calibrated
    try:
        t0 = time.perf_counter()
        stage, opt = build(p, p.seed + rank)  # a fresh instance, then the checkpoint's state
        state = restore()
        stage.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        t1 = time.perf_counter()
        with torch.no_grad():
            for q in stage.parameters():  # the layer copy from a surviving replica
                dist.broadcast(q, src=0)
        t2 = time.perf_counter()
        x = torch.randn(p.micro_batch, p.seq, p.d_model)
        stage(x).square().mean().backward()
        dist.barrier()
        return {"restore_s": t1 - t0, "copy_s": t2 - t1, "first_step_s": time.perf_counter() - t2,
                "param_bytes": float(sum(q.numel() * q.element_size() for q in stage.parameters()))}
    finally:
        torch.set_num_threads(threads)
