"""The continuous-batching core both LLM-serving systems run (radix's offline engine, metropolis's
model server): requests prefilled together, a persistent batch K/V updated incrementally, seeded
sampling, and a logit-level check of the served logits against a pool-free recomputation.

What stays with each system is *which* requests enter and when (radix: its prefix cache, eviction
and longest-prefix-match-first order; metropolis: lagging agents first, from caller threads). What
is here is *how* admitted requests run:

- ``Batch.admit``: every newcomer's uncomputed prompt tokens go through one ``prefill_batch`` call
  (projections and MLP as one packed matrix, attention per request over its own slots), then each
  newcomer's K/V rows are gathered alone into a free lane of the batch buffers.
- ``LaneKV``: K and V of the running batch in fixed-capacity lanes ``[layers, lanes, kv_heads,
  Lcap, hd]``. A finishing request's lane receives the last active lane (one lane copied), so the
  active requests are always lanes ``0..B-1``; decode reads views sliced to ``B`` lanes and to the
  longest active length, and writes each new token's K/V into them in place (``model.decode``).
  Nothing is re-gathered when the batch changes: only newcomers are gathered, only one lane moves
  per departure.
- ``Sampler``: greedy (temperature 0) or temperature / top-k sampling with one ``torch.Generator``
  per request seeded from (run seed, request key), so requests differ and a rerun reproduces.
- ``logit_check``: the last logits a request was served, against ``full_logits`` of its whole
  sequence (no pool, no cache, no batch): max abs difference over the reference's scale.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from mlsys_flows.errors import MlsysError

from .kv_pool import KVPool

LOGIT_REL_BOUND = 1e-3   # max |served - recomputed| / max |recomputed| a run accepts


class LogitCheckError(MlsysError, RuntimeError):
    """The logits a request was served differ from a pool-free recomputation beyond the bound."""


# --- sampling --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sampler:
    """``temperature`` 0: greedy (argmax). Otherwise softmax(logits / temperature) over the ``top_k``
    largest logits (0: all), drawn with the request's own generator."""
    temperature: float = 0.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (got {self.temperature})")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (got {self.top_k})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generator(self, key: int) -> torch.Generator | None:
        """The request's generator: seeded from (run seed, request key); None when greedy."""
        if self.greedy:
            return None
        g = torch.Generator()
        entropy = [int(self.seed) & 0xFFFFFFFF, int(key) & 0xFFFFFFFFFFFF]
        state = np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)
        g.manual_seed(int(state[0]) >> 1)
        return g

    def sample(self, logits: torch.Tensor, gens: list[torch.Generator | None]) -> list[int]:
        """One token per row of ``logits`` [B, vocab]."""
        if self.greedy:
            return logits.argmax(-1).tolist()
        scaled = logits / self.temperature
        if self.top_k and self.top_k < scaled.shape[-1]:
            vals, idx = scaled.topk(self.top_k, dim=-1)
        else:
            vals, idx = scaled, None
        probs = torch.softmax(vals, dim=-1)
        out = []
        for b, g in enumerate(gens):
            j = int(torch.multinomial(probs[b], 1, generator=g))
            out.append(int(idx[b, j]) if idx is not None else j)
        return out


# --- the persistent batch K/V ----------------------------------------------------------------------
class LaneKV:
    """K/V and slot rows of up to ``lanes`` running requests, each in its own lane (see the module doc)."""

    def __init__(self, cfg, lanes: int, cap: int):
        self.cfg, self.lanes, self.cap = cfg, lanes, cap
        shape = (cfg.layers, lanes, cfg.kv_heads, cap, cfg.head_dim)
        # zeros, touched before any timed work; padding positions are masked (0 x NaN would leak)
        self.k, self.v = torch.zeros(shape), torch.zeros(shape)
        self.rows = torch.zeros(lanes, cap, dtype=torch.long)
        self.n = 0
        self.moves = 0       # lanes copied on departures (counted)
        self.gathered = 0    # newcomers gathered (counted)

    def add(self, pool: KVPool, slots: torch.Tensor, known: int) -> int:
        """Put a newcomer in the next lane: ``slots`` (its positions' slots, up to ``cap``) as its row,
        the K/V of its first ``known`` positions gathered from the pool. Returns the lane."""
        if self.n >= self.lanes:
            raise RuntimeError(f"all {self.lanes} lanes of the batch are taken")
        if len(slots) > self.cap:
            raise ValueError(f"a request of {len(slots)} positions does not fit lanes of {self.cap}")
        lane, c = self.n, self.cfg
        self.rows[lane, :len(slots)] = slots
        self.rows[lane, len(slots):] = 0
        idx = slots[:known]
        for layer in range(c.layers):
            for buf, table in ((self.k, pool.k), (self.v, pool.v)):
                buf[layer, lane, :, :known].copy_(table[layer].index_select(0, idx)
                                                  .view(known, c.kv_heads, c.head_dim).transpose(0, 1))
        self.n += 1
        self.gathered += 1
        return lane

    def remove(self, lane: int, length: int) -> int | None:
        """Free ``lane``: the last active lane (its first ``length`` positions) moves into it. Returns
        the lane that moved (now at ``lane``), or None when ``lane`` was the last."""
        last = self.n - 1
        self.n -= 1
        if lane == last:
            return None
        self.k[:, lane, :, :length].copy_(self.k[:, last, :, :length])
        self.v[:, lane, :, :length].copy_(self.v[:, last, :, :length])
        self.rows[lane].copy_(self.rows[last])
        self.moves += 1
        return last

    def views(self, width: int) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Slot rows [B, width] and K, V [layers, B, kv_heads, width, hd] of the active lanes: views, no copy."""
        return self.rows[:self.n, :width], (self.k[:, :self.n, :, :width], self.v[:, :self.n, :, :width])


# --- one running request ---------------------------------------------------------------------------
@dataclass(eq=False)
class Seq:
    """A request the batch runs: ``prompt`` (its whole prompt), ``start`` leading positions whose K/V
    the pool already holds (a cached prefix), ``slots`` of positions 0..len(prompt)+max_new-2, and
    what it produced. ``tag``: the driver's own object (the batch never reads it)."""
    key: int
    prompt: list[int]
    max_new: int
    slots: torch.Tensor
    start: int = 0
    tag: object = None
    keep_logits: bool = False          # keep the logits of its last token (for ``logit_check``)
    output: list[int] = field(default_factory=list)
    last_logits: torch.Tensor | None = None
    lane: int = -1
    gen: torch.Generator | None = None

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_new

    @property
    def length(self) -> int:
        """Positions whose K/V exist: the prompt and every output token fed back."""
        return len(self.prompt) + len(self.output) - 1


class Batch:
    """Continuous batching over one model and pool: ``admit`` prefills newcomers together and gives
    them lanes; ``step`` decodes one token for every running request and returns the finished."""

    def __init__(self, model, pool: KVPool, lanes: int, cap: int, sampler: Sampler | None = None):
        self.model, self.pool = model, pool
        self.kv = LaneKV(model.cfg, lanes, cap)
        self.sampler = sampler or Sampler()
        self.running: list[Seq] = []   # running[i].lane == i
        self.prefill_calls = 0
        self.decode_steps = 0

    def _take(self, seqs: list[Seq], logits: torch.Tensor) -> None:
        toks = self.sampler.sample(logits, [s.gen for s in seqs])
        for b, (s, t) in enumerate(zip(seqs, toks)):
            s.output.append(t)
            if s.keep_logits and s.done:   # the logits of its last token only
                s.last_logits = logits[b].clone()

    def prefill(self, seqs: list[Seq]) -> None:
        """Prefill ``seqs`` (their tokens after ``start``) in one packed call and sample each one's
        first token; they join no lane (``join`` does)."""
        if not seqs:
            return
        for s in seqs:
            if s.gen is None:
                s.gen = self.sampler.generator(s.key)
        logits = self.model.prefill_batch(self.pool, [(s.prompt[s.start:], s.start, s.slots[:len(s.prompt)])
                                                      for s in seqs])
        self.prefill_calls += 1
        self._take(seqs, logits)

    def join(self, s: Seq) -> None:
        """A prefilled request that still has tokens to produce enters the running batch."""
        s.lane = self.kv.add(self.pool, s.slots, len(s.prompt))
        self.running.append(s)

    def admit(self, seqs: list[Seq]) -> list[Seq]:
        """``prefill`` then ``join`` every newcomer not already done; returns those done at once."""
        self.prefill(seqs)
        for s in seqs:
            if not s.done:
                self.join(s)
        return [s for s in seqs if s.done]

    def step(self) -> list[Seq]:
        """One decode step of every running request; the finished leave the batch (lanes compacted)."""
        run = self.running
        if not run:
            return []
        positions = [s.length for s in run]
        rows, kv = self.kv.views(max(positions) + 1)
        logits = self.model.decode(self.pool, [s.output[-1] for s in run], positions, rows, kv)
        self.decode_steps += 1
        self._take(run, logits)
        finished = [s for s in run if s.done]
        for s in finished:
            self.leave(s)
        return finished

    def leave(self, s: Seq) -> None:
        """Take ``s`` out of the batch: the last lane moves into its lane."""
        last = self.running.pop()
        moved = self.kv.remove(s.lane, last.length)   # the moving lane's positions with K/V
        if moved is not None:
            self.running[s.lane] = last
            last.lane = s.lane
        s.lane = -1


def logit_check(model, s: Seq) -> float:
    """max |served last logits - full_logits(prompt + output[:-1])[-1]| / max |the latter| (untimed)."""
    if s.last_logits is None:
        raise ValueError("the request kept no logits (keep_logits=False)")
    ref = model.full_logits(list(s.prompt) + list(s.output[:-1]))[-1]
    return float((s.last_logits - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def check_logits(model, seqs: list[Seq], what: str) -> float:
    """The worst ``logit_check`` over ``seqs``; raises ``LogitCheckError`` past ``LOGIT_REL_BOUND``."""
    worst = max((logit_check(model, s) for s in seqs), default=0.0)
    if worst >= LOGIT_REL_BOUND:
        raise LogitCheckError(f"{what}: served logits differ from a full recomputation by {worst:.2e} of their scale "
                              f"(bound {LOGIT_REL_BOUND:g})")
    return worst
