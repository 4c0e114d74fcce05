"""Operator graphs of a transformer model's layers (forward, backward, backward with recomputation)
under tensor parallelism, with roofline latencies on one accelerator design.

Three block styles, each a graph with the branches of the architecture it stands for:
``gpt`` (GPT-3/OPT: LayerNorm, separate Q/K/V projections, GeLU MLP, two residual branches),
``llama`` (Llama 2: RMSNorm, Q/K/V projections with rotary embeddings on Q and K, a gated SiLU MLP
whose gate and up projections are parallel) and ``parallel`` (GPT-J/PaLM: attention and MLP both
read the one normalized input and meet in one all-reduce and one residual add).

Units: ``tensor`` (all systolic arrays work on one matmul, its tiles spread over the arrays),
``vector`` (all vector cores on one elementwise/reduction op) and ``net`` (the chip's links, for
tensor-parallel all-reduces). Ops on different units may overlap where the graph leaves them
independent; the scheduling ILP decides how.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .arch import Arch, Tech

BYTES = 2  # bf16 activations and weights
STYLES = ("gpt", "llama", "parallel")


@dataclass(frozen=True)
class Op:
    name: str
    unit: str                      # "tensor" | "vector" | "net"
    duration: float                # seconds
    deps: tuple[str, ...] = ()


@dataclass(frozen=True)
class Model:
    """A transformer stack: embedding, ``layers`` blocks of ``style``, final norm + LM head + loss."""
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    style: str = "gpt"

    def __post_init__(self):
        if self.style not in STYLES:
            raise ValueError(f"style: {self.style!r} is not one of {STYLES}")

    def ffn(self) -> int:
        """MLP width: 4h, or Llama's 8h/3 rounded up to a multiple of 256 (Llama 2 7B: 11008)."""
        if self.style == "llama":
            return 256 * math.ceil(8 * self.hidden / 3 / 256)
        return 4 * self.hidden

    def block_params(self) -> int:
        h, f = self.hidden, self.ffn()
        if self.style == "llama":                       # no biases, two RMSNorm weights
            return 4 * h * h + 3 * h * f + 2 * h
        norms = 4 * h if self.style == "gpt" else 2 * h  # LayerNorm weight + bias, two or one
        return 4 * h * h + 2 * h * f + 4 * h + f + h + norms

    def embed_params(self) -> int:
        # rotary embeddings have no learned positions
        return self.vocab * self.hidden + (0 if self.style == "llama" else self.seq * self.hidden)

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

    def vector(self, elements: int, flops_per_element: float, operands: int = 1) -> float:
        compute = elements * flops_per_element / (self.arch.vector_cores * self.arch.vc_lanes *
                                                  self.tech.vector_flops_per_lane_cycle * self.tech.clock_ghz * 1e9)
        return max(compute, self._memory(BYTES * elements * operands, BYTES * elements, 0))

    def allreduce(self, nbytes: float, group: int) -> float:
        if group <= 1:
            return 0.0
        return (2 * (group - 1) / group * nbytes / (self.tech.link_gb_s * 1e9)
                + 2 * (group - 1) * self.tech.link_latency_us * 1e-6)


def drop_ops(ops: list[Op], gone: set[str]) -> list[Op]:
    """The graph without the ops in ``gone``: a successor of a dropped op waits on that op's own
    dependencies instead (so a missing all-reduce at t = 1 keeps every ordering it implied)."""
    deps_of = {o.name: o.deps for o in ops}

    def resolve(d: str) -> tuple[str, ...]:
        return tuple(x for p in deps_of[d] for x in resolve(p)) if d in gone else (d,)

    return [Op(o.name, o.unit, o.duration, tuple(dict.fromkeys(x for d in o.deps for x in resolve(d))))
            for o in ops if o.name not in gone]


def _no_net_at_t1(ops: list[Op], tp: int) -> list[Op]:
    return drop_ops(ops, {o.name for o in ops if o.unit == "net"}) if tp == 1 else ops


def _dims(mdl: Model, tp: int, mb: int):
    s, h, a, t = mdl.seq, mdl.hidden, mdl.heads, tp
    return s, h, h // a, mb * s, mb * a // t, mdl.ffn() // t


def _attention_fwd(r: Roofline, mdl: Model, tp: int, mb: int, src: str) -> list[Op]:
    """Q, K and V projections as three parallel matmuls from ``src``; Llama rotates Q and K (vector
    ops that overlap the next projection); V is needed only after the softmax."""
    s, h, dh, bs, g, _ = _dims(mdl, tp, mb)
    ht = h // tp
    ops = [Op(x, "tensor", r.matmul(bs, h, ht), (src,)) for x in ("q", "k", "v")]
    qk = ("q", "k")
    if mdl.style == "llama":
        ops += [Op(f"rope_{x}", "vector", r.vector(bs * ht, 6), (x,)) for x in ("q", "k")]
        qk = ("rope_q", "rope_k")
    return ops + [Op("score", "tensor", r.matmul(s, dh, s, batch=g, weight=False), qk),
                  Op("softmax", "vector", r.vector(g * s * s, 5), ("score",)),
                  Op("ctx", "tensor", r.matmul(s, s, dh, batch=g, weight=False), ("softmax", "v")),
                  Op("proj", "tensor", r.matmul(bs, ht, h), ("ctx",))]


def _mlp_fwd(r: Roofline, mdl: Model, tp: int, mb: int, src: str) -> list[Op]:
    """GeLU MLP (a chain), or Llama's gated MLP: gate and up in parallel, SiLU on the gate while the
    up projection runs, their product into the down projection."""
    _, h, _, bs, _, ft = _dims(mdl, tp, mb)
    if mdl.style == "llama":
        return [Op("gate", "tensor", r.matmul(bs, h, ft), (src,)), Op("up", "tensor", r.matmul(bs, h, ft), (src,)),
                Op("silu", "vector", r.vector(bs * ft, 5), ("gate",)),
                Op("mul", "vector", r.vector(bs * ft, 1, operands=2), ("silu", "up")),
                Op("down", "tensor", r.matmul(bs, ft, h), ("mul",))]
    return [Op("fc1", "tensor", r.matmul(bs, h, ft), (src,)), Op("gelu", "vector", r.vector(bs * ft, 8), ("fc1",)),
            Op("fc2", "tensor", r.matmul(bs, ft, h), ("gelu",))]


def block_forward(r: Roofline, mdl: Model, tp: int, mb: int) -> list[Op]:
    _, h, _, bs, _, _ = _dims(mdl, tp, mb)
    norm = 4 if mdl.style == "llama" else 8          # RMSNorm has no mean pass
    ar = r.allreduce(BYTES * bs * h, tp)
    add = r.vector(bs * h, 1, operands=2)             # residual: the block's input plus the branch
    if mdl.style == "parallel":
        return _no_net_at_t1([Op("ln", "vector", r.vector(bs * h, norm)), *_attention_fwd(r, mdl, tp, mb, "ln"),
                              *_mlp_fwd(r, mdl, tp, mb, "ln"),
                              Op("sum", "vector", r.vector(bs * h, 1, operands=2), ("proj", "fc2")),
                              Op("ar", "net", ar, ("sum",)), Op("res", "vector", add, ("ar",))], tp)
    return _no_net_at_t1([Op("ln1", "vector", r.vector(bs * h, norm)), *_attention_fwd(r, mdl, tp, mb, "ln1"),
                          Op("ar1", "net", ar, ("proj",)), Op("res1", "vector", add, ("ar1",)),
                          Op("ln2", "vector", r.vector(bs * h, norm), ("res1",)),
                          *_mlp_fwd(r, mdl, tp, mb, "ln2"),
                          Op("ar2", "net", ar, ("down" if mdl.style == "llama" else "fc2",)),
                          Op("res2", "vector", add, ("ar2",))], tp)


def _attention_bwd(r: Roofline, mdl: Model, tp: int, mb: int, src: str) -> list[Op]:
    """From the gradient at the attention output back to the three input gradients (Q, K, V each a
    data-gradient matmul, accumulated into one) and the weight gradients."""
    s, h, dh, bs, g, _ = _dims(mdl, tp, mb)
    ht, mm = h // tp, r.matmul
    ops = [Op("proj_dgrad", "tensor", mm(bs, h, ht), (src,)), Op("proj_wgrad", "tensor", mm(ht, bs, h), (src,)),
           Op("ctx_dgrad_p", "tensor", mm(s, dh, s, batch=g, weight=False), ("proj_dgrad",)),
           Op("ctx_dgrad_v", "tensor", mm(s, s, dh, batch=g, weight=False), ("proj_dgrad",)),
           Op("softmax_b", "vector", r.vector(g * s * s, 6), ("ctx_dgrad_p",)),
           Op("score_dgrad_q", "tensor", mm(s, s, dh, batch=g, weight=False), ("softmax_b",)),
           Op("score_dgrad_k", "tensor", mm(s, s, dh, batch=g, weight=False), ("softmax_b",))]
    into = {"q": "score_dgrad_q", "k": "score_dgrad_k", "v": "ctx_dgrad_v"}
    if mdl.style == "llama":
        ops += [Op("rope_q_b", "vector", r.vector(bs * ht, 6), ("score_dgrad_q",)),
                Op("rope_k_b", "vector", r.vector(bs * ht, 6), ("score_dgrad_k",))]
        into |= {"q": "rope_q_b", "k": "rope_k_b"}
    for x in ("v", "q", "k"):
        ops += [Op(f"{x}_dgrad", "tensor", mm(bs, ht, h), (into[x],)),
                Op(f"{x}_wgrad", "tensor", mm(h, bs, ht), (into[x],))]
    return ops


def _mlp_bwd(r: Roofline, mdl: Model, tp: int, mb: int, src: str) -> tuple[list[Op], tuple[str, ...]]:
    """The MLP's backward and the ops whose results form its input gradient."""
    _, h, _, bs, _, ft = _dims(mdl, tp, mb)
    mm = r.matmul
    if mdl.style == "llama":
        return [Op("down_dgrad", "tensor", mm(bs, h, ft), (src,)), Op("down_wgrad", "tensor", mm(ft, bs, h), (src,)),
                Op("mul_b", "vector", r.vector(bs * ft, 2, operands=3), ("down_dgrad",)),
                Op("up_dgrad", "tensor", mm(bs, ft, h), ("mul_b",)),
                Op("up_wgrad", "tensor", mm(h, bs, ft), ("mul_b",)),
                Op("silu_b", "vector", r.vector(bs * ft, 8, operands=2), ("mul_b",)),
                Op("gate_dgrad", "tensor", mm(bs, ft, h), ("silu_b",)),
                Op("gate_wgrad", "tensor", mm(h, bs, ft), ("silu_b",))], ("up_dgrad", "gate_dgrad")
    return [Op("fc2_dgrad", "tensor", mm(bs, h, ft), (src,)), Op("fc2_wgrad", "tensor", mm(ft, bs, h), (src,)),
            Op("gelu_b", "vector", r.vector(bs * ft, 10), ("fc2_dgrad",)),
            Op("fc1_dgrad", "tensor", mm(bs, ft, h), ("gelu_b",)),
            Op("fc1_wgrad", "tensor", mm(h, bs, ft), ("gelu_b",))], ("fc1_dgrad",)


def block_backward(r: Roofline, mdl: Model, tp: int, mb: int, after: tuple[str, ...] = ()) -> list[Op]:
    """Backward of a block: every weight matmul splits into a data-gradient (on the critical path) and a
    weight-gradient matmul (needed only at the end), which the schedule may defer to fill idle arrays;
    the branches of the forward graph are branches here too."""
    _, h, _, bs, _, _ = _dims(mdl, tp, mb)
    norm = 6 if mdl.style == "llama" else 12
    ar = r.allreduce(BYTES * bs * h, tp)
    attn_in = ("v_dgrad", "q_dgrad", "k_dgrad")
    if mdl.style == "parallel":
        mlp, mlp_in = _mlp_bwd(r, mdl, tp, mb, "res_b")
        return _no_net_at_t1([Op("res_b", "vector", r.vector(bs * h, 1), after), *mlp,
                              *_attention_bwd(r, mdl, tp, mb, "res_b"),
                              Op("ar_b", "net", ar, (*mlp_in, *attn_in)),
                              Op("ln_b", "vector", r.vector(bs * h, norm, operands=2), ("ar_b",))], tp)
    mlp, mlp_in = _mlp_bwd(r, mdl, tp, mb, "res2_b")
    return _no_net_at_t1([Op("res2_b", "vector", r.vector(bs * h, 1), after), *mlp,
                          Op("ar2_b", "net", ar, mlp_in),
                          Op("ln2_b", "vector", r.vector(bs * h, norm, operands=2), ("ar2_b",)),
                          Op("res1_b", "vector", r.vector(bs * h, 1, operands=2), ("ln2_b",)),
                          *_attention_bwd(r, mdl, tp, mb, "res1_b"),
                          Op("ar1_b", "net", ar, attn_in),
                          Op("ln1_b", "vector", r.vector(bs * h, norm, operands=2), ("ar1_b",))], tp)


def embed_forward(r: Roofline, mdl: Model, tp: int, mb: int) -> list[Op]:
    bs, h = mb * mdl.seq, mdl.hidden
    return _no_net_at_t1([Op("lookup", "vector", r.vector(bs * h, 2)),
                          Op("ar_emb", "net", r.allreduce(BYTES * bs * h, tp), ("lookup",))], tp)


def embed_backward(r: Roofline, mdl: Model, tp: int, mb: int, after: tuple[str, ...] = ()) -> list[Op]:
    bs, h = mb * mdl.seq, mdl.hidden
    return [Op("scatter_add", "vector", r.vector(bs * h, 2), after)]


def head_forward(r: Roofline, mdl: Model, tp: int, mb: int) -> list[Op]:
    bs, h, v = mb * mdl.seq, mdl.hidden, mdl.vocab
    return _no_net_at_t1([Op("lnf", "vector", r.vector(bs * h, 4 if mdl.style == "llama" else 8)),
                          Op("logits", "tensor", r.matmul(bs, h, v // tp), ("lnf",)),
                          Op("xent", "vector", r.vector(bs * v // tp, 6), ("logits",)),
                          Op("ar_loss", "net", r.allreduce(BYTES * bs * 4, tp), ("xent",))], tp)


def head_backward(r: Roofline, mdl: Model, tp: int, mb: int, after: tuple[str, ...] = ()) -> list[Op]:
    bs, h, v = mb * mdl.seq, mdl.hidden, mdl.vocab
    return _no_net_at_t1([Op("xent_b", "vector", r.vector(bs * v // tp, 3), after),
                          Op("logits_dgrad", "tensor", r.matmul(bs, v // tp, h), ("xent_b",)),
                          Op("logits_wgrad", "tensor", r.matmul(h, bs, v // tp), ("xent_b",)),
                          Op("ar_head_b", "net", r.allreduce(BYTES * bs * h, tp), ("logits_dgrad",)),
                          Op("lnf_b", "vector", r.vector(bs * h, 12), ("ar_head_b",))], tp)


LAYER_KINDS = {"embed": (embed_forward, embed_backward), "block": (block_forward, block_backward),
               "head": (head_forward, head_backward)}


def activation_bytes(kind: str, mdl: Model, tp: int, mb: int) -> tuple[float, float]:
    """(stashed activations of one micro-batch for backward, the layer's input kept when recomputing),
    per chip, bytes; the GPT block: Korthikanti et al. (2022) with tensor parallelism, no sequence
    parallelism; Llama and parallel blocks: the same accounting over their own tensors (below)."""
    s, h, a, t, b = mdl.seq, mdl.hidden, mdl.heads, tp, mb
    inp = BYTES * s * b * h
    if kind == "block":
        if mdl.style == "llama":
            # two RMSNorm inputs + attention and MLP inputs (8 sbh, replicated); Q, K, V and the output
            # projection's input (8 sbh), gate and up outputs, SiLU output and the product (8 sbf),
            # softmax output (2 a s^2 b); no dropout
            return s * b * (8 * h + (8 * h + 8 * mdl.ffn()) / t) + 2 * a * s * s * b / t, inp
        if mdl.style == "parallel":
            # Korthikanti's GPT block with one LayerNorm and one shared input instead of two
            return s * b * h * (6 + 24 / t + 5 * a * s / (h * t)), inp
        return s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), inp
    if kind == "head":
        return BYTES * s * b * mdl.vocab / t + inp, inp
    return inp, BYTES * s * b * 4


def sinks(ops: list[Op]) -> tuple[str, ...]:
    used = {d for o in ops for d in o.deps}
    return tuple(o.name for o in ops if o.name not in used)


def layer_graphs(kind: str, arch: Arch, tech: Tech, mdl: Model, tp: int, mb: int) -> dict[str, list[Op]]:
    """'fwd', 'bwd' and 'bwd_recompute' (forward re-run, then backward once it has ended) graphs of
    one layer."""
    fwd_fn, bwd_fn = LAYER_KINDS[kind]
    r = Roofline(arch, tech)
    fwd = fwd_fn(r, mdl, tp, mb)
    refwd = [Op("re_" + o.name, o.unit, o.duration, tuple("re_" + d for d in o.deps)) for o in fwd]
    return {"fwd": fwd, "bwd": bwd_fn(r, mdl, tp, mb),
            "bwd_recompute": refwd + bwd_fn(r, mdl, tp, mb, after=sinks(refwd))}
