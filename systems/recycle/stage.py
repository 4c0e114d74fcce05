"""A small transformer pipeline stage with a decoupled backward (torch, imported lazily by callers).

Backward is split the way ReCycle (and Zero Bubble) split it: ``backward_input`` propagates the
gradient to the stage's input (the only part the previous stage waits for) and stashes, for every
linear layer, the pair (layer input, output gradient); ``backward_weight`` later turns the stash of one
micro-batch into the linear layers' weight and bias gradients (dW = dY^T X, db = sum dY). LayerNorm
parameters are small and get their gradients during ``backward_input``.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class WeightGradStore:
    """Stashed (layer, input, output-gradient) triples per micro-batch, flushed by ``backward_weight``."""

    def __init__(self) -> None:
        self.defer = False
        self.current: object | None = None
        self.pending: dict[object, list[tuple["DeferredLinear", torch.Tensor, torch.Tensor]]] = {}

    def push(self, layer: "DeferredLinear", x: torch.Tensor, dy: torch.Tensor) -> None:
        self.pending.setdefault(self.current, []).append((layer, x, dy))

    def flush(self, key: object) -> None:
        for layer, x, dy in self.pending.pop(key):
            x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
            gw, gb = dy2.t() @ x2, dy2.sum(0)
            layer.weight.grad = gw if layer.weight.grad is None else layer.weight.grad + gw
            layer.bias.grad = gb if layer.bias.grad is None else layer.bias.grad + gb


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, layer):
        ctx.save_for_backward(x, weight)
        ctx.layer = layer
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dx = dy @ weight
        store = ctx.layer.store
        if store.defer:  # weight gradient later, from the stash
            store.push(ctx.layer, x.detach(), dy.detach())
            return dx, None, None, None
        x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
        return dx, dy2.t() @ x2, dy2.sum(0), None


class DeferredLinear(nn.Linear):
    """nn.Linear whose weight gradient can be deferred into a WeightGradStore."""

    def __init__(self, d_in: int, d_out: int, store: WeightGradStore):
        super().__init__(d_in, d_out)
        object.__setattr__(self, "store", store)  # not a submodule

    def forward(self, x):
        return _LinearFn.apply(x, self.weight, self.bias, self)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, store: WeightGradStore):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = DeferredLinear(d, 3 * d, store), DeferredLinear(d, d, store)
        self.fc1, self.fc2 = DeferredLinear(d, 4 * d, store), DeferredLinear(4 * d, d, store)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Stage(nn.Module):
    """``layers`` transformer blocks of width ``d``: one pipeline stage."""

    def __init__(self, d: int = 128, heads: int = 4, layers: int = 2):
        super().__init__()
        self.store = WeightGradStore()
        self.blocks = nn.ModuleList(Block(d, heads, self.store) for _ in range(layers))

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return x

    def param_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())


def backward_input(stage: Stage, x: torch.Tensor, y: torch.Tensor, dy: torch.Tensor, key: object):
    """B_input of one micro-batch: the input gradient (None when the input needs none) and the LayerNorm
    parameters' gradients; the linear layers' weight-gradient work is stashed under ``key``."""
    stage.store.defer, stage.store.current = True, key
    try:
        torch.autograd.backward(y, dy, inputs=[x, *_small_params(stage)] if x.requires_grad else _small_params(stage))
    finally:
        stage.store.defer = False
    return x.grad if x.requires_grad else None


def _small_params(stage: Stage) -> list[torch.Tensor]:
    return [p for m in stage.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()]


def backward_weight(stage: Stage, key: object) -> None:
    """B_weight of one micro-batch: the deferred weight gradients, accumulated into ``.grad``."""
    stage.store.flush(key)


def backward_fused(stage: Stage, x: torch.Tensor, y: torch.Tensor, dy: torch.Tensor):
    """The ordinary backward: input and every parameter gradient in one pass."""
    torch.autograd.backward(y, dy, inputs=[x, *stage.parameters()] if x.requires_grad else list(stage.parameters()))
    return x.grad if x.requires_grad else None


@dataclass(frozen=True)
class StageTimes:
    """Seconds per micro-batch on one stage, and the stage's sizes."""

    forward: float
    backward_input: float
    backward_weight: float
    backward_fused: float
    optimizer: float
    param_bytes: int
    activation_bytes: int


def _median_time(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def calibrate(d: int, heads: int, layers: int, micro_batch: int, seq: int, reps: int = 5, seed: int = 0,
              threads: int = 1) -> StageTimes:
    """Time forward, B_input, B_weight, the fused backward and an Adam step of one stage (median of
    ``reps`` after a warm-up), on ``threads`` torch threads (one device per pipeline worker)."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(seed)
        stage = Stage(d, heads, layers)
        opt = torch.optim.Adam(stage.parameters(), lr=1e-4)
        x = torch.randn(micro_batch, seq, d, requires_grad=True)
        dy = torch.randn(micro_batch, seq, d)

        def fwd():
            return stage(x)

        def one_split():
            y = stage(x)
            t0 = time.perf_counter()
            backward_input(stage, x, y, dy, 0)
            t1 = time.perf_counter()
            backward_weight(stage, 0)
            t2 = time.perf_counter()
            x.grad = None
            return t1 - t0, t2 - t1

        def one_fused():
            y = stage(x)
            t0 = time.perf_counter()
            backward_fused(stage, x, y, dy)
            x.grad = None
            return time.perf_counter() - t0

        for _ in range(2):  # warm-up
            one_split(), one_fused()
        f = _median_time(fwd, reps)
        split = [one_split() for _ in range(reps)]
        fused = [one_fused() for _ in range(reps)]
        o = _median_time(opt.step, reps)
        return StageTimes(forward=f, backward_input=statistics.median(s[0] for s in split),
                          backward_weight=statistics.median(s[1] for s in split),
                          backward_fused=statistics.median(fused), optimizer=o,
                          param_bytes=stage.param_bytes(), activation_bytes=micro_batch * seq * d * 4)
    finally:
        torch.set_num_threads(old)
