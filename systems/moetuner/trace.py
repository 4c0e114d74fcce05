"""Routing traces: which experts each token visits in every MoE layer, and their profile.

A trace is one integer array ``experts`` of shape ``(tokens, layers, k)``: ``experts[t, l]`` holds the
``k`` distinct experts (ids in ``[0, num_experts)``) the router chose for token ``t`` in MoE layer ``l``.
That is exactly what a model's router emits (e.g. ``torch.topk(logits, k).indices`` stacked over
layers), so a trace recorded from a real model (the SwiftMoE model, Mixtral, ...) is used as is; on
storage it is an ``.npz`` with the array ``experts`` and optionally the scalar ``num_experts``.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from mlsys_flows.errors import MlsysError


class TraceError(MlsysError, ValueError):
    """A routing trace was rejected; ``field`` names the offending array or value."""

    def __init__(self, field: str, problem: str):
        self.field = field
        super().__init__(f"routing trace: '{field}': {problem}")


@dataclass(frozen=True)
class RoutingTrace:
    experts: np.ndarray  # (tokens, layers, k) int32
    num_experts: int

    @classmethod
    def from_arrays(cls, experts, num_experts: int | None = None) -> "RoutingTrace":
        """Validate a trace given as arrays; raises TraceError naming the field."""
        arr = np.asarray(experts)
        if arr.ndim != 3:
            raise TraceError("experts", f"must have shape (tokens, layers, k), got {arr.shape}")
        if not np.issubdtype(arr.dtype, np.integer):
            raise TraceError("experts", f"must hold integer expert ids, got dtype {arr.dtype}")
        tokens, layers, k = arr.shape
        if tokens < 2 or layers < 2:
            raise TraceError("experts", f"needs at least 2 tokens and 2 layers, got shape {arr.shape}")
        if arr.min() < 0:
            raise TraceError("experts", f"expert ids must be >= 0, found {int(arr.min())}")
        n = int(arr.max()) + 1 if num_experts is None else int(num_experts)
        if n < 2 or n < k:
            raise TraceError("num_experts", f"must be >= 2 and >= k={k}, got {n}")
        if arr.max() >= n:
            raise TraceError("experts", f"expert id {int(arr.max())} out of range for num_experts={n}")
        if k > 1:
            s = np.sort(arr, axis=2)
            if (s[..., 1:] == s[..., :-1]).any():
                raise TraceError("experts", "the k experts of a token in a layer must be distinct")
        return cls(experts=np.ascontiguousarray(arr, dtype=np.int32), num_experts=n)

    @property
    def tokens(self) -> int:
        return self.experts.shape[0]

    @property
    def layers(self) -> int:
        return self.experts.shape[1]

    @property
    def top_k(self) -> int:
        return self.experts.shape[2]

    def split(self, profile_fraction: float, seed: int) -> tuple["RoutingTrace", "RoutingTrace"]:
        """A random ``profile_fraction`` of tokens to profile on, the rest held out for evaluation."""
        order = np.random.default_rng(seed).permutation(self.tokens)
        cut = min(max(1, int(round(profile_fraction * self.tokens))), self.tokens - 1)
        return (RoutingTrace(self.experts[np.sort(order[:cut])], self.num_experts),
                RoutingTrace(self.experts[np.sort(order[cut:])], self.num_experts))

    def to_npz(self) -> bytes:
        buf = io.BytesIO()
        np.savez_compressed(buf, experts=self.experts, num_experts=np.int64(self.num_experts))
        return buf.getvalue()

    @classmethod
    def from_npz(cls, data: bytes) -> "RoutingTrace":
        with np.load(io.BytesIO(data)) as z:
            if "experts" not in z.files:
                raise TraceError("experts", f"array missing from the .npz (found {z.files})")
            n = int(z["num_experts"]) if "num_experts" in z.files else None
            return cls.from_arrays(z["experts"], n)


def zipf_weights(n: int, s: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()


def synthetic_trace(tokens: int, layers: int, num_experts: int, top_k: int, zipf_s: float,
                    affinity: float, fanout: int, seed: int, successors_by_popularity: bool = True) -> RoutingTrace:
    """Top-k routing with Zipf expert popularity (a fresh random ranking per layer) and sparse
    layer-to-layer transitions: expert e of layer l hands its tokens mostly (``affinity``) to ``fanout``
    successors in layer l+1 (drawn with the next layer's popularity and weighted by it; with
    ``successors_by_popularity=False`` drawn uniformly and weighted equally, so that load rank says nothing
    about where a token goes next); the rest follow popularity."""
    rng = np.random.default_rng(seed)
    pop = np.stack([zipf_weights(num_experts, zipf_s)[rng.permutation(num_experts)] for _ in range(layers)])
    succ = np.zeros((layers - 1, num_experts, num_experts))
    for l in range(layers - 1):
        for e in range(num_experts):
            if successors_by_popularity:
                targets = rng.choice(num_experts, size=fanout, replace=False, p=pop[l + 1])
                succ[l, e, targets] = pop[l + 1, targets] / pop[l + 1, targets].sum()
            else:
                targets = rng.choice(num_experts, size=fanout, replace=False)
                succ[l, e, targets] = 1.0 / fanout
    out = np.empty((tokens, layers, top_k), np.int32)
    chunk = 1 << 15  # bounds the (tokens x experts) working set at full scale
    for lo in range(0, tokens, chunk):
        n = min(chunk, tokens - lo)
        p = np.broadcast_to(pop[0], (n, num_experts))
        for l in range(layers):
            if l > 0:
                p = affinity * succ[l - 1][out[lo:lo + n, l - 1]].mean(axis=1) + (1 - affinity) * pop[l]
            # Gumbel-top-k == sampling k distinct experts without replacement from p
            keys = np.log(p + 1e-30) + rng.gumbel(size=(n, num_experts))
            out[lo:lo + n, l] = np.argsort(-keys, axis=1)[:, :top_k]
    return RoutingTrace(out, num_experts)


@dataclass(frozen=True)
class Profile:
    load: np.ndarray         # (layers, E): token-expert assignments per expert
    transitions: np.ndarray  # (layers-1, E, E): tokens with e among layer l's experts and f among layer l+1's


def profile(trace: RoutingTrace) -> Profile:
    """Count tokens per (layer, expert) and expert-to-expert transitions between consecutive layers."""
    e, n = trace.experts, trace.num_experts
    load = np.stack([np.bincount(e[:, l].ravel(), minlength=n) for l in range(trace.layers)]).astype(float)
    trans = np.empty((trace.layers - 1, n, n))
    for l in range(trace.layers - 1):
        pairs = e[:, l, :, None] * n + e[:, l + 1, None, :]  # every (expert in l, expert in l+1) of a token
        trans[l] = np.bincount(pairs.ravel(), minlength=n * n).reshape(n, n)
    return Profile(load=load, transitions=trans)
