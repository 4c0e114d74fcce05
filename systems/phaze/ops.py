"""Operator graphs of a GPT-style model's layers (forward, backward, backward with recomputation)
under tensor parallelism, with roofline latencies on one accelerator design.

Units: ``tensor`` (all systolic arrays work on one matmul, its tiles spread over the arrays),
``vector`` (all vector cores on one elementwise/reduction op) and ``net`` (the chip's links, for
tensor-parallel all-reduces). Ops on different units may overlap; the scheduling ILP decides how.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .arch import Arch, Tech

BYTES = 2  # bf16 activations and weights


@dataclass(frozen=True)
class Op:
    name: str
    unit: str                      # "tensor" | "vector" | "net"
    duration: float                # seconds
    deps: tuple[str, ...] = ()


@dataclass(frozen=True)
class Model:
    """A GPT-style stack: embedding, ``layers`` transformer blocks, final norm + LM head + loss."""
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int

    def block_params(self) -> int:
        return 12 * self.hidden ** 2 + 13 * self.hidden

    def embed_params(self) -> int:
        return self.vocab * self.hidden + self.seq * self.hidden

    def head_params(self) -> int:
        return self.vocab * self.hidden + 2 * self.hidden

    def total_params(self) -> int:
        return self.layers * self.block_params() + self.embed_params() + self.head_params()


@dataclass
class Roofline:
    """Roofline latencies of single operators on one design. An operator whose operands and result fit
    in the on-chip buffer together moves its activations at SRAM bandwidth (the producer left its input
    there); otherwise activations go through HBM, and a matmul whose weights exceed half the buffer
    re-streams its input once per weight block that fits. Weights always come from HBM."""
    arch: Arch
    tech: Tech

    def _memory(self, act_in: float, act_out: float, weights: float) -> float:
        sram = self.arch.sram_mib * 2 ** 20
        hbm = self.arch.hbm_gb_s(self.tech) * 1e9
        if act_in + act_out + weights <= sram:
            return weights / hbm + (act_in + act_out) / (self.tech.sram_gb_s * 1e9)
        passes = max(1, math.ceil(weights / (sram / 2))) if weights else 1
        return (weights + act_out + act_in * passes) / hbm

    def matmul(self, m: int, k: int, n: int, batch: int = 1, weight: bool = True) -> float:
        """(batch of) [m,k] x [k,n]: weight-stationary tiles of tc_dim^2, each streaming m rows plus
        the array's fill and drain; tiles spread over the tensor cores."""
        w = self.arch.tc_dim
        tiles = batch * math.ceil(k / w) * math.ceil(n / w)
        cycles = math.ceil(tiles / self.arch.tensor_cores) * (m + 2 * w)
        compute = cycles / (self.tech.clock_ghz * 1e9)
        act_in = BYTES * batch * (m * k + (0 if weight else k * n))
        return max(compute, self._memory(act_in, BYTES * batch * m * n, BYTES * k * n if weight else 0))

    def vector(self, elements: int, flops_per_element: float) -> float:
        compute = elements * flops_per_element / (self.arch.vector_cores * self.arch.vc_lanes *
                                                  self.tech.vector_flops_per_lane_cycle * self.tech.clock_ghz * 1e9)
        return max(compute, self._memory(BYTES * elements, BYTES * elements, 0))

    def allreduce(self, nbytes: float, group: int) -> float:
        if group <= 1:
            return 0.0
        return (2 * (group - 1) / group * nbytes / (self.tech.link_gb_s * 1e9)
                + 2 * (group - 1) * self.tech.link_latency_us * 1e-6)


def _chain(ops: list[tuple[str, str, float]], first_deps: tuple[str, ...] = ()) -> list[Op]:
    out, prev = [], first_deps
    for name, unit, d in ops:
        out.append(Op(name, unit, d, prev))
        prev = (name,)
    return out


def block_forward(r: Roofline, mdl: Model, tp: int, mb: int) -> list[tuple[str, str, float]]:
    s, h, a, t = mdl.seq, mdl.hidden, mdl.heads, tp
    dh, bs, g = h // a, mb * s, mb * a // t
    ops = [("ln1", "vector", r.vector(bs * h, 8)),
           ("qkv", "tensor", r.matmul(bs, h, 3 * h // t)),
           ("score", "tensor", r.matmul(s, dh, s, batch=g, weight=False)),
           ("softmax", "vector", r.vector(g * s * s, 5)),
           ("ctx", "tensor", r.matmul(s, s, dh, batch=g, weight=False)),
           ("proj", "tensor", r.matmul(bs, h // t, h)),
           ("ar1", "net", r.allreduce(BYTES * bs * h, t)),
           ("res1", "vector", r.vector(bs * h, 1)),
           ("ln2", "vector", r.vector(bs * h, 8)),
           ("fc1", "tensor", r.matmul(bs, h, 4 * h // t)),
           ("gelu", "vector", r.vector(bs * 4 * h // t, 8)),
           ("fc2", "tensor", r.matmul(bs, 4 * h // t, h)),
           ("ar2", "net", r.allreduce(BYTES * bs * h, t)),
           ("res2", "vector", r.vector(bs * h, 1))]
    return [o for o in ops if not (o[1] == "net" and t == 1)]


def block_backward(r: Roofline, mdl: Model, tp: int, mb: int, after: tuple[str, ...] = ()) -> list[Op]:
    """Backward of a block: every weight matmul splits into a data-gradient (on the critical path) and a
    weight-gradient matmul (needed only at the end), which the schedule may defer to fill idle arrays."""
    s, h, a, t = mdl.seq, mdl.hidden, mdl.heads, tp
    dh, bs, g = h // a, mb * s, mb * a // t
    mm = r.matmul
    ops = [
        Op("res2_b", "vector", r.vector(bs * h, 1), after),
        Op("fc2_dgrad", "tensor", mm(bs, h, 4 * h // t), ("res2_b",)),
        Op("fc2_wgrad", "tensor", mm(4 * h // t, bs, h), ("res2_b",)),
        Op("gelu_b", "vector", r.vector(bs * 4 * h // t, 10), ("fc2_dgrad",)),
        Op("fc1_dgrad", "tensor", mm(bs, 4 * h // t, h), ("gelu_b",)),
        Op("fc1_wgrad", "tensor", mm(h, bs, 4 * h // t), ("gelu_b",)),
        Op("ar2_b", "net", r.allreduce(BYTES * bs * h, t), ("fc1_dgrad",)),
        Op("ln2_b", "vector", r.vector(bs * h, 12), ("ar2_b",)),
        Op("res1_b", "vector", r.vector(bs * h, 1), ("ln2_b",)),
        Op("proj_dgrad", "tensor", mm(bs, h, h // t), ("res1_b",)),
        Op("proj_wgrad", "tensor", mm(h // t, bs, h), ("res1_b",)),
        Op("ctx_dgrad_p", "tensor", mm(s, dh, s, batch=g, weight=False), ("proj_dgrad",)),
        Op("ctx_dgrad_v", "tensor", mm(s, s, dh, batch=g, weight=False), ("proj_dgrad",)),
        Op("softmax_b", "vector", r.vector(g * s * s, 6), ("ctx_dgrad_p",)),
        Op("score_dgrad_q", "tensor", mm(s, s, dh, batch=g, weight=False), ("softmax_b",)),
        Op("score_dgrad_k", "tensor", mm(s, s, dh, batch=g, weight=False), ("softmax_b",)),
        Op("qkv_dgrad", "tensor", mm(bs, 3 * h // t, h), ("score_dgrad_q", "score_dgrad_k", "ctx_dgrad_v")),
        Op("qkv_wgrad", "tensor", mm(h, bs, 3 * h // t), ("score_dgrad_q", "score_dgrad_k", "ctx_dgrad_v")),
        Op("ar1_b", "net", r.allreduce(BYTES * bs * h, t), ("qkv_dgrad",)),
        Op("ln1_b", "vector", r.vector(bs * h, 12), ("ar1_b",)),
    ]
    if t == 1:  # no all-reduce: its successor waits on the all-reduce's own predecessor
        drop = {"ar2_b": ("fc1_dgrad",), "ar1_b": ("qkv_dgrad",)}
        ops = [Op(o.name, o.unit, o.duration, tuple(x for d in o.deps for x in drop.get(d, (d,))))
               for o in ops if o.name not in drop]
    return ops


def embed_forward(r: Roofline, mdl: Model, tp: int, mb: int) -> list[tuple[str, str, float]]:
    bs, h = mb * mdl.seq, mdl.hidden
    ops = [("lookup", "vector", r.vector(bs * h, 2)), ("ar_emb", "net", r.allreduce(BYTES * bs * h, tp))]
    return [o for o in ops if not (o[1] == "net" and tp == 1)]


def embed_backward(r: Roofline, mdl: Model, tp: int, mb: int, after: tuple[str, ...] = ()) -> list[Op]:
    bs, h = mb * mdl.seq, mdl.hidden
    return [Op("scatter_add", "vector", r.vector(bs * h, 2), after)]


def head_forward(r: Roofline, mdl: Model, tp: int, mb: int) -> list[tuple[str, str, float]]:
    bs, h, v = mb * mdl.seq, mdl.hidden, mdl.vocab
    ops = [("lnf", "vector", r.vector(bs * h, 8)),
           ("logits", "tensor", r.matmul(bs, h, v // tp)),
           ("xent", "vector", r.vector(bs * v // tp, 6)),
           ("ar_loss", "net", r.allreduce(BYTES * bs * 4, tp))]
    return [o for o in ops if not (o[1] == "net" and tp == 1)]


def head_backward(r: Roofline, mdl: Model, tp: int, mb: int, after: tuple[str, ...] = ()) -> list[Op]:
    bs, h, v = mb * mdl.seq, mdl.hidden, mdl.vocab
    ops = [Op("xent_b", "vector", r.vector(bs * v // tp, 3), after),
           Op("logits_dgrad", "tensor", r.matmul(bs, v // tp, h), ("xent_b",)),
           Op("logits_wgrad", "tensor", r.matmul(h, bs, v // tp), ("xent_b",)),
           Op("ar_head_b", "net", r.allreduce(BYTES * bs * h, tp), ("logits_dgrad",)),
           Op("lnf_b", "vector", r.vector(bs * h, 12), ("ar_head_b",) if tp > 1 else ("logits_dgrad",))]
    return [o for o in ops if not (o.unit == "net" and tp == 1)]


LAYER_KINDS = {"embed": (embed_forward, embed_backward), "block": (block_forward, block_backward),
               "head": (head_forward, head_backward)}


def activation_bytes(kind: str, mdl: Model, tp: int, mb: int) -> tuple[float, float]:
    """(stashed activations of one micro-batch for backward, the layer's input kept when recomputing),
    per chip, bytes; block: Korthikanti et al. (2022) with tensor parallelism, no sequence parallelism."""
    s, h, a, t, b = mdl.seq, mdl.hidden, mdl.heads, tp, mb
    inp = BYTES * s * b * h
    if kind == "block":
        return s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), inp
    if kind == "head":
        return BYTES * s * b * mdl.vocab / t + inp, inp
    return inp, BYTES * s * b * 4


def layer_graphs(kind: str, arch: Arch, tech: Tech, mdl: Model, tp: int, mb: int) -> dict[str, list[Op]]:
    """'fwd', 'bwd' and 'bwd_recompute' (forward re-run, then backward) graphs of one layer."""
    fwd_fn, bwd_fn = LAYER_KINDS[kind]
    r = Roofline(arch, tech)
    fwd = _chain(fwd_fn(r, mdl, tp, mb))
    refwd = _chain([("re_" + n, u, d) for n, u, d in fwd_fn(r, mdl, tp, mb)])
    return {"fwd": fwd, "bwd": bwd_fn(r, mdl, tp, mb),
            "bwd_recompute": refwd + bwd_fn(r, mdl, tp, mb, after=(refwd[-1].name,))}
