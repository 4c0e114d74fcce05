"""A small random-weight decoder-only transformer whose attention reads its keys and values from a
KV pool tensor indexed by slots (the layout of SGLang's token-level KV pool): a request whose prefix
is cached computes K/V only for its new tokens and attends over the cached prefix's slots."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 512
    d_model: int = 128
    layers: int = 2
    heads: int = 4
    mlp_mult: int = 4
    max_seq_len: int = 2048


class KVPool:
    """K and V of every layer for ``size`` token slots, and the free list of slots."""

    def __init__(self, cfg: ModelConfig, size: int):
        hd = cfg.d_model // cfg.heads
        self.size = size
        self.k = torch.zeros(cfg.layers, size, cfg.heads, hd)
        self.v = torch.zeros(cfg.layers, size, cfg.heads, hd)
        self._free = list(range(size - 1, -1, -1))  # pop() hands out low slots first

    @property
    def free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        out = self._free[-n:][::-1] if n else []
        del self._free[len(self._free) - n:]
        return out

    def release(self, slots) -> None:
        self._free.extend(slots)


class TinyDecoder(torch.nn.Module):
    """Pre-norm decoder: learned token and absolute position embeddings (a token's K/V depend only
    on the tokens before it and its position, so a cached prefix is exactly reusable)."""

    def __init__(self, cfg: ModelConfig, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        g = torch.Generator().manual_seed(seed)
        d, L = cfg.d_model, cfg.layers

        def w(*shape, scale):
            return torch.nn.Parameter(torch.randn(*shape, generator=g) * scale, requires_grad=False)

        self.tok = w(cfg.vocab, d, scale=1.0)
        self.pos = w(cfg.max_seq_len, d, scale=0.5)
        self.qkv = torch.nn.ParameterList([w(d, 3 * d, scale=1 / math.sqrt(d)) for _ in range(L)])
        self.out = torch.nn.ParameterList([w(d, d, scale=1 / math.sqrt(d)) for _ in range(L)])
        self.up = torch.nn.ParameterList([w(d, cfg.mlp_mult * d, scale=1 / math.sqrt(d)) for _ in range(L)])
        self.down = torch.nn.ParameterList([w(cfg.mlp_mult * d, d, scale=1 / math.sqrt(cfg.mlp_mult * d)) for _ in range(L)])
        self.head = w(d, cfg.vocab, scale=1 / math.sqrt(d))

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:  # [..., d] -> [..., heads, hd]
        return x.unflatten(-1, (self.cfg.heads, self.cfg.d_model // self.cfg.heads))

    @torch.inference_mode()
    def prefill(self, pool: KVPool, tokens: list[int], start: int, slots: torch.Tensor) -> torch.Tensor:
        """Run ``tokens`` (positions start..start+n-1) of one request. ``slots`` holds the slots of
        all its positions 0..start+n-1: the first ``start`` already hold the cached prefix's K/V,
        the last n receive the new K/V. Returns the logits of the last token."""
        n, d = len(tokens), self.cfg.d_model
        x = self.tok[torch.tensor(tokens)] + self.pos[start:start + n]
        new = slots[start:]
        # causal mask with the prefix in front: query i (position start+i) sees keys 0..start+i
        mask = torch.ones(n, start + n, dtype=torch.bool).tril(diagonal=start)
        for layer in range(self.cfg.layers):
            h = F.layer_norm(x, (d,))
            q, k, v = (h @ self.qkv[layer]).split(d, dim=-1)
            pool.k[layer, new] = self._split_heads(k)
            pool.v[layer, new] = self._split_heads(v)
            keys = pool.k[layer, slots].transpose(0, 1)[None]    # [1, heads, start+n, hd]: 4-d inputs
            vals = pool.v[layer, slots].transpose(0, 1)[None]    # take torch's fused CPU attention kernel
            att = F.scaled_dot_product_attention(self._split_heads(q).transpose(0, 1)[None], keys, vals, attn_mask=mask)
            x = x + att[0].transpose(0, 1).flatten(-2) @ self.out[layer]
            x = x + F.gelu(F.layer_norm(x, (d,)) @ self.up[layer]) @ self.down[layer]
        return F.layer_norm(x[-1], (d,)) @ self.head

    @torch.inference_mode()
    def decode(self, pool: KVPool, tokens: list[int], positions: list[int], slot_rows: torch.Tensor) -> torch.Tensor:
        """One decoding step of a batch: request b feeds ``tokens[b]`` at ``positions[b]``;
        ``slot_rows[b, :positions[b] + 1]`` are its slots (the rest is padding). Returns logits [B, vocab]."""
        d = self.cfg.d_model
        pos = torch.tensor(positions)
        x = self.tok[torch.tensor(tokens)] + self.pos[pos]
        rows = torch.arange(len(tokens))
        new = slot_rows[rows, pos]
        mask = (torch.arange(slot_rows.shape[1])[None, :] <= pos[:, None])[:, None, None, :]  # [B, 1, 1, Lmax]
        for layer in range(self.cfg.layers):
            h = F.layer_norm(x, (d,))
            q, k, v = (h @ self.qkv[layer]).split(d, dim=-1)
            pool.k[layer, new] = self._split_heads(k)
            pool.v[layer, new] = self._split_heads(v)
            keys = pool.k[layer][slot_rows].transpose(1, 2)   # [B, heads, Lmax, hd]
            vals = pool.v[layer][slot_rows].transpose(1, 2)
            att = F.scaled_dot_product_attention(self._split_heads(q)[:, :, None, :], keys, vals, attn_mask=mask)
            x = x + att.flatten(1) @ self.out[layer]
            x = x + F.gelu(F.layer_norm(x, (d,)) @ self.up[layer]) @ self.down[layer]
        return F.layer_norm(x, (d,)) @ self.head

    @torch.inference_mode()
    def full_logits(self, tokens: list[int]) -> torch.Tensor:
        """Reference without any pool: logits of every position of ``tokens`` (for tests)."""
        n, d = len(tokens), self.cfg.d_model
        x = self.tok[torch.tensor(tokens)] + self.pos[:n]
        for layer in range(self.cfg.layers):
            h = F.layer_norm(x, (d,))
            q, k, v = (self._split_heads(t).transpose(0, 1)[None] for t in (h @ self.qkv[layer]).split(d, dim=-1))
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + att[0].transpose(0, 1).flatten(-2) @ self.out[layer]
            x = x + F.gelu(F.layer_norm(x, (d,)) @ self.up[layer]) @ self.down[layer]
        return F.layer_norm(x, (d,)) @ self.head
