"""The KV pool of the LLM-serving family: K and V of every layer for a fixed number of token slots
(the layout of SGLang's token-level pool), a free list, and reused scratch buffers. Model-agnostic:
a model's config gives ``layers`` and ``kv_dim`` (the width of one token's K or V row: kv heads x
head dim)."""
from __future__ import annotations

import torch

from mlsys_flows.errors import MlsysError


class ModelWeightsMissing(MlsysError, RuntimeError):
    """The package with the pretrained weights is not installed (or its file is not what is expected)."""


class KVPool:
    """K and V of every layer for ``size`` token slots ([layers, slots, kv_heads x head_dim]: one row
    per token, so a gather is one ``index_select``), and the free list of slots."""

    def __init__(self, cfg, size: int, batch_tokens: int = 0):
        """``batch_tokens``: the most slot-row entries a decode batch will gather (batch x longest
        row); its buffers are allocated and touched here, before any timed work. ``cfg``: any model
        config with ``layers`` and ``kv_dim``."""
        self.size = size
        # zeros, not empty: padded decode rows read slot 0 under the mask, and 0 x NaN would leak
        self.k = torch.zeros(cfg.layers, size, cfg.kv_dim)
        self.v = torch.zeros(cfg.layers, size, cfg.kv_dim)
        self._free = list(range(size - 1, -1, -1))  # pop() hands out low slots first
        self._scratch: dict[str, torch.Tensor] = {}
        if batch_tokens:
            self.scratch("rows", batch_tokens, cfg.kv_dim).zero_()
            for name in ("batch_k", "batch_v"):
                self.scratch(name, cfg.layers, batch_tokens, cfg.kv_dim).zero_()

    def scratch(self, name: str, *shape: int) -> torch.Tensor:
        """A reused contiguous buffer of ``shape`` (contents undefined): fresh large tensors cost a
        page fault per 4 KiB on every allocation, which would dominate the batch gathers."""
        n = 1
        for d in shape:
            n *= d
        buf = self._scratch.get(name)
        if buf is None or buf.numel() < n:
            buf = self._scratch[name] = torch.empty(max(n, 2 * (buf.numel() if buf is not None else 0)))
        return buf[:n].view(*shape)

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
