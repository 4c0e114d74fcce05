"""A real small LLM behind the agents' calls: a continuous-batching server (pure torch, no prefect/dask).

The model is SmolLM2-135M-Instruct (``systems/llm_serving/smollm2.py``, the model the RadixAttention
system serves) run by the serving family's batching core (``systems/llm_serving/engine.py``, the
one radix's engine runs). One server thread owns it. Up to ``k`` requests are active at once (the
serving engine's slots); every step it admits waiting requests, lagging agents first (priority =
the call's simulated time step), prefills all the newcomers' prompts in one packed call, gathers
each newcomer's K/V into a free lane of the persistent batch K/V, then decodes one token for every
active request in one batched forward pass, and retires the ones that have produced their tokens
(the last lane moves into a retired one's lane: nothing else is copied). Tokens are sampled
(temperature, top-k) with a generator per request seeded from (run seed, call key), so calls differ
and a rerun reproduces. A caller blocks until its request is done, so a cluster step waits for real
generation, and the more calls the schedule keeps in flight, the fuller each batched step.

A call's output length stands for its latency in the workload: ``tokens_median`` tokens at the
median latency, proportionally more or fewer for slower or faster calls (the same lognormal shape).
"""
from __future__ import annotations

import heapq
import itertools
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from mlsys_flows.systems.llm_serving.engine import Batch, LogitCheckError, Sampler, Seq, check_logits
from mlsys_flows.systems.llm_serving.kv_pool import KVPool
from mlsys_flows.systems.llm_serving.model_card import SMOLLM2_TOKEN_IDS


@dataclass(frozen=True)
class ServeConfig:
    """The generation each LLM call runs."""
    prompt_tokens: int = 32       # prompt tokens prefilled per call
    tokens_median: int = 8        # output tokens of a call with the median latency
    max_new_tokens: int = 64      # cap on a call's output tokens
    temperature: float = 0.7      # 0: greedy
    top_k: int = 50               # 0: the whole vocabulary
    seed: int = 0                 # the run's sampling seed (with each call's key)
    check: int = 2                # the run's first calls of more than one token whose last logits are recomputed
                                  # without pool or batch after the run (one admitted into the largest batch besides)

    def new_tokens(self, latency: float, latency_median: float) -> int:
        return int(min(self.max_new_tokens, max(1, round(self.tokens_median * latency / latency_median))))


@dataclass(order=True)
class _Request:
    priority: float
    seq: int
    prompt: list[int] = field(compare=False)
    new_tokens: int = field(compare=False)
    key: int = field(compare=False, default=0)
    done: threading.Event = field(compare=False, default_factory=threading.Event)
    run: Seq | None = field(compare=False, default=None)
    out: list[int] = field(compare=False, default_factory=list)  # the tokens produced


class ModelServer:
    """``k`` concurrent requests on one real model, batched token by token (see the module doc)."""

    def __init__(self, k: int, cfg: ServeConfig, model=None):
        self.k, self.cfg = k, cfg
        if model is None:
            from mlsys_flows.systems.llm_serving.smollm2 import pretrained

            model = pretrained()
        self.model = model
        row = cfg.prompt_tokens + cfg.max_new_tokens
        if row > self.model.cfg.max_positions:
            raise ValueError(f"prompt_tokens + max_new_tokens ({row}) exceed the model's "
                             f"{self.model.cfg.max_positions} positions")
        self.pool = KVPool(self.model.cfg, k * row)
        # the lanes (k requests x row positions) are allocated and touched here, before the run's clock
        self.batch = Batch(self.model, self.pool, lanes=k, cap=row,
                           sampler=Sampler(cfg.temperature, cfg.top_k, cfg.seed))
        self._waiting: list[_Request] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._error: BaseException | None = None
        self._kept: list[Seq] = []   # the run's first calls whose logits the check recomputes
        self._largest: tuple[int, Seq | None] = (0, None)   # (batch size, call): one admitted into the largest batch
        # counters: decode steps, prefills, tokens generated, slot-seconds busy (active x step time)
        self.steps = self.prefills = self.prefill_calls = self.tokens = 0
        self.busy_slot_s = 0.0
        self.prefill_s = self.decode_s = 0.0           # the server thread's compute, by kind
        self.step_log: list[tuple[int, float]] = []   # (requests in the batch, seconds) per decode step
        self._thread = threading.Thread(target=self._serve, name="llm-server", daemon=True)
        self._thread.start()

    def generate(self, prompt: list[int], new_tokens: int, priority: float, key: int | None = None) -> list[int]:
        """Block until ``new_tokens`` tokens after ``prompt`` are generated; returns them. ``key``
        seeds the call's sampling (with the run's seed); None: its arrival number."""
        n = next(self._seq)
        req = _Request(priority, n, list(prompt), new_tokens, n if key is None else key)
        with self._cond:
            if self._error is not None or self._closed:
                raise RuntimeError("the model server has stopped") from self._error
            heapq.heappush(self._waiting, req)
            self._cond.notify_all()
        req.done.wait()
        if self._error is not None:
            raise RuntimeError("the model server failed") from self._error
        return req.out

    def prompt_for(self, key: int) -> list[int]:
        """A seeded prompt of ordinary BPE token ids (no control tokens) for a call's key."""
        g = np.random.default_rng(key)
        return g.integers(SMOLLM2_TOKEN_IDS.start, min(SMOLLM2_TOKEN_IDS.stop, self.model.cfg.vocab),
                          self.cfg.prompt_tokens).tolist()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    def check_logits(self) -> tuple[float, int]:
        """After the run (untimed): the kept calls' last served logits (the run's first ``check``
        calls of more than one token and one admitted in the step that first reached the run's largest batch)
        against a full causal pass over each call's whole sequence without pool or batch; returns
        (max |difference| / scale, calls checked). Raises ``LogitCheckError`` past the bound, and
        also when no call was checked (no call of the run had a decode step): a check of nothing
        must not pass."""
        seqs = list({id(s): s for s in self._kept + [self._largest[1]] if s is not None and s.done}.values())
        if not seqs:
            raise LogitCheckError("metropolis model server: no call had more than one token, so no served decode "
                                  "logits were checked (raise tokens_median or the run's length)")
        return check_logits(self.model, seqs, "metropolis model server"), len(seqs)

    # --- the server thread -----------------------------------------------------------------------
    def _serve(self) -> None:
        active: list[_Request] = []
        try:
            while True:
                with self._cond:
                    while not self._waiting and not active and not self._closed:
                        self._cond.wait()
                    if self._closed and not self._waiting and not active:
                        return
                    admitted = [heapq.heappop(self._waiting) for _ in range(min(self.k - len(active), len(self._waiting)))]
                t0 = time.perf_counter()
                active += admitted   # before the prefills: a failure must wake these callers too
                if admitted:
                    self._prefill(admitted, len(active))
                self.prefill_s += time.perf_counter() - t0
                active = self._retire(active)
                if active:
                    t1 = time.perf_counter()
                    self.batch.step()
                    self.steps += 1
                    self.tokens += len(active)
                    self.step_log.append((len(active), time.perf_counter() - t1))
                    self.decode_s += self.step_log[-1][1]
                    self.busy_slot_s += len(active) * (time.perf_counter() - t0)
                    active = self._retire(active)
        except BaseException as exc:  # wake every caller: none may wait forever on a dead server
            self._error = exc
            with self._cond:
                stranded = active + self._waiting
                self._waiting = []
            for req in stranded:
                req.done.set()

    def _prefill(self, admitted: list[_Request], batch: int) -> None:
        """Prefill the step's newcomers (``batch``: the requests active with them) in one packed call."""
        seqs, largest = [], None
        for req in admitted:
            slots = self.pool.alloc(len(req.prompt) + req.new_tokens - 1)   # the last token is never fed back
            if slots is None:
                raise RuntimeError(f"the KV pool ({self.pool.size} slots) cannot hold a request of "
                                   f"{len(req.prompt)} + {req.new_tokens} tokens")
            first = req.new_tokens > 1 and len(self._kept) < self.cfg.check   # a decode step's logits are checked
            req.run = Seq(key=req.key, prompt=req.prompt, max_new=req.new_tokens,
                          slots=torch.tensor(slots, dtype=torch.long), keep_logits=first)
            if first:
                self._kept.append(req.run)
            elif req.new_tokens > 1:
                largest = req.run
            seqs.append(req.run)
        if largest is not None and batch > self._largest[0]:
            old = self._largest[1]   # no longer the largest batch's call: stop keeping its logits
            if old is not None:
                old.keep_logits, old.last_logits = False, None
            largest.keep_logits = True
            self._largest = (batch, largest)
        self.batch.admit(seqs)
        self.prefills += len(seqs)
        self.prefill_calls += 1
        self.tokens += len(seqs)

    def step_cost(self) -> tuple[float, float]:
        """(a, b): the least-squares fit of a decode step's seconds as a + b x requests in the batch.
        b near a: the step's cost grows in proportion to the batch (compute-bound, as on this CPU),
        so a fuller batch saves nothing; b near 0: a flat step (a GPU engine below saturation)."""
        if len({n for n, _ in self.step_log}) < 2:
            return (float(np.mean([t for _, t in self.step_log])) if self.step_log else 0.0, 0.0)
        n, t = np.array(self.step_log, dtype=float).T
        b, a = np.polyfit(n, t, 1)
        return float(a), float(b)

    def _retire(self, active: list[_Request]) -> list[_Request]:
        still = []
        for r in active:
            if r.run is not None and r.run.done:
                self.pool.release(r.run.slots.tolist())
                r.out = list(r.run.output)
                r.done.set()
            else:
                still.append(r)
        return still
