"""A tiny MoE transformer whose expert layers are executed by a pluggable backend (pure torch).

The dense part (embedding, causal attention, router, norms, LM head) is an ordinary
``nn.Module``. Expert weights are *not* module parameters: each MoE layer hands its routed
token rows to an :class:`ExpertBackend`, which owns the expert weights and decides where
(which simulated worker, which replica) each row is computed, or whether it is dropped. Every
placement policy therefore runs the same dense math and differs only in what it really does
with the experts.

Each expert's weights live in one flat fp32 vector (:class:`ExpertLayout`) so that optimizer
state can be sharded by slicing and byte counts come straight from the tensors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class MoEConfig:
    vocab: int = 512
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    n_experts: int = 8
    d_ff: int = 128
    top_k: int = 1
    seq_len: int = 32


@dataclass(frozen=True)
class ExpertLayout:
    """Flat layout of one expert FFN: w1 [d, f], b1 [f], w2 [f, d], b2 [d]."""

    d_model: int
    d_ff: int

    @property
    def numel(self) -> int:
        return 2 * self.d_model * self.d_ff + self.d_ff + self.d_model

    def views(self, flat: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        d, f = self.d_model, self.d_ff
        w1, b1, w2, b2 = torch.split(flat, [d * f, f, f * d, d])
        return w1.view(d, f), b1, w2.view(f, d), b2

    def init(self, gen: torch.Generator) -> Tensor:
        d, f = self.d_model, self.d_ff
        w1 = torch.randn(d, f, generator=gen) / math.sqrt(d)
        w2 = torch.randn(f, d, generator=gen) / math.sqrt(f)
        return torch.cat([w1.flatten(), torch.zeros(f), w2.flatten(), torch.zeros(d)])


def expert_ffn(x: Tensor, flat: Tensor, layout: ExpertLayout) -> Tensor:
    w1, b1, w2, b2 = layout.views(flat)
    return F.gelu(x @ w1 + b1) @ w2 + b2


class ExpertBackend(Protocol):
    def __call__(self, layer: int, x: Tensor, expert: Tensor, n_tokens: int) -> Tensor:
        """Expert outputs for routed rows: ``x`` [M, d], ``expert`` [M] (rows are ordered first
        choices then second choices, each in token order; the row's token is ``row % n_tokens``).
        A dropped row's output is zero, so it adds nothing to the loss and gets no gradient."""


def initial_experts(cfg: MoEConfig, seed: int) -> list[list[Tensor]]:
    """Per layer, per expert: the initial flat weights (the same for every policy)."""
    gen = torch.Generator().manual_seed(seed + 7919)
    layout = ExpertLayout(cfg.d_model, cfg.d_ff)
    return [[layout.init(gen) for _ in range(cfg.n_experts)] for _ in range(cfg.n_layers)]


class _Block(nn.Module):
    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.cfg = cfg
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.router = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)

    def attention(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.cfg.n_heads, d // self.cfg.n_heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return x + self.proj(y.transpose(1, 2).reshape(b, t, d))

    def route(self, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Top-k softmax gating: (expert [N, k], gate [N, k], probs [N, E])."""
        probs = F.softmax(self.router(h), dim=-1)
        gate, expert = probs.topk(self.cfg.top_k, dim=-1)
        if self.cfg.top_k > 1:
            gate = gate / gate.sum(-1, keepdim=True)
        return expert, gate, probs


class TinyMoE(nn.Module):
    """Decoder-only LM: embedding, ``n_layers`` x (causal attention + top-k MoE FFN), LM head."""

    def __init__(self, cfg: MoEConfig, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        torch.manual_seed(seed)
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Parameter(torch.randn(cfg.seq_len, cfg.d_model) * 0.02)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab)
        self.aux_loss = torch.zeros(())  # set by every forward

    def forward(self, tokens: Tensor, backend: ExpertBackend | None) -> tuple[Tensor, list[Tensor]]:
        """Logits [B, T, V] and, per layer, the router's expert choices [N, k].
        ``backend=None`` skips the experts (used to time the dense part alone)."""
        b, t = tokens.shape
        x = self.embed(tokens) + self.pos[:t]
        choices = []
        aux = []
        for layer, blk in enumerate(self.blocks):
            x = blk.attention(x)
            h = blk.ln2(x).reshape(b * t, -1)
            expert, gate, probs = blk.route(h)
            choices.append(expert.detach())
            aux.append(load_balancing_loss(probs, expert, self.cfg.n_experts))
            if backend is None:
                continue
            n, k = expert.shape
            rows = torch.arange(n, device=h.device).repeat(k)  # first choices first, then second
            out = backend(layer, h[rows], expert.T.reshape(-1), n)
            y = torch.zeros_like(h).index_add_(0, rows, out * gate.T.reshape(-1, 1))
            x = x + y.view(b, t, -1)
        # the auxiliary load-balancing loss of the last forward, summed over the MoE layers as Switch and
        # DeepSpeed-MoE do (``l_aux``): a trainer adds ``coef * model.aux_loss`` to its LM loss
        self.aux_loss = torch.stack(aux).sum()
        return self.head(self.ln_f(x)), choices


def load_balancing_loss(probs: Tensor, expert: Tensor, n_experts: int) -> Tensor:
    """Switch/GShard auxiliary load-balancing loss of one MoE layer: ``E * sum_e f_e * P_e`` with
    ``f_e`` the fraction of routed rows (all top-k choices, before any capacity drop) sent to expert e
    (no gradient) and ``P_e`` the mean router probability of e (the gradient flows through it). It is
    1 for a perfectly balanced router and grows as the router concentrates its tokens."""
    f = torch.bincount(expert.reshape(-1), minlength=n_experts).to(probs.dtype) / expert.numel()
    return n_experts * (f * probs.mean(0)).sum()


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class LocalExperts:
    """Single-process reference backend: one full copy of every expert, plain torch Adam.
    Computes every routed row (no capacity, no replicas)."""

    def __init__(self, cfg: MoEConfig, weights: list[list[Tensor]], lr: float):
        self.layout = ExpertLayout(cfg.d_model, cfg.d_ff)
        self.weights = [[w.clone().requires_grad_(True) for w in layer] for layer in weights]
        self.opt = torch.optim.Adam([w for layer in self.weights for w in layer], lr=lr, foreach=False)

    def __call__(self, layer: int, x: Tensor, expert: Tensor, n_tokens: int) -> Tensor:
        out = torch.zeros_like(x)
        for e, w in enumerate(self.weights[layer]):
            idx = (expert == e).nonzero().squeeze(1)
            if idx.numel():
                out = out.index_put((idx,), expert_ffn(x[idx], w, self.layout))
        return out

    def step(self) -> None:
        for layer in self.weights:  # an expert that got no rows still steps (zero gradient), as on a cluster
            for w in layer:
                if w.grad is None:
                    w.grad = torch.zeros_like(w)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def expert_weights(self) -> list[list[Tensor]]:
        return [[w.detach() for w in layer] for layer in self.weights]
