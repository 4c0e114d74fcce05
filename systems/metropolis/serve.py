"""A real small LLM behind the agents' calls: a continuous-batching server (pure torch, no prefect/dask).

The model is all-MiniLM-L6-v2's weights run as a causal decoder with a slot-indexed KV pool (the
model the RadixAttention system serves, ``systems/llm_serving/causal_minilm.py``). One server thread owns it. Up to ``k``
requests are active at once (the serving engine's slots); every step it admits waiting requests,
lagging agents first (priority = the call's simulated time step), prefills each newcomer's prompt,
then decodes one token for every active request in one batched forward pass, and retires the ones
that have produced their tokens. A caller blocks until its request is done, so a cluster step waits
for real generation, and the more calls the schedule keeps in flight, the fuller each batched step.

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

from mlsys_flows.systems.llm_serving.causal_minilm import FIRST_WORD_ID, KVPool, pretrained


@dataclass(frozen=True)
class ServeConfig:
    """The generation each LLM call runs."""
    prompt_tokens: int = 32       # prompt tokens prefilled per call
    tokens_median: int = 8        # output tokens of a call with the median latency
    max_new_tokens: int = 64      # cap on a call's output tokens

    def new_tokens(self, latency: float, latency_median: float) -> int:
        return int(min(self.max_new_tokens, max(1, round(self.tokens_median * latency / latency_median))))


@dataclass(order=True)
class _Request:
    priority: float
    seq: int
    prompt: list[int] = field(compare=False)
    new_tokens: int = field(compare=False)
    done: threading.Event = field(compare=False, default_factory=threading.Event)
    slots: list[int] = field(compare=False, default_factory=list)
    out: list[int] = field(compare=False, default_factory=list)  # the tokens produced (the last is fed next)


class ModelServer:
    """``k`` concurrent requests on one real model, batched token by token (see the module doc)."""

    def __init__(self, k: int, cfg: ServeConfig, model=None):
        self.k, self.cfg = k, cfg
        self.model = model if model is not None else pretrained()
        row = cfg.prompt_tokens + cfg.max_new_tokens
        if row > self.model.cfg.max_positions:
            raise ValueError(f"prompt_tokens + max_new_tokens ({row}) exceed the model's "
                             f"{self.model.cfg.max_positions} positions")
        self.pool = KVPool(self.model.cfg, k * row, batch_tokens=k * row)
        self._waiting: list[_Request] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._error: BaseException | None = None
        # counters: decode steps, prefills, tokens generated, slot-seconds busy (active x step time)
        self.steps = self.prefills = self.tokens = 0
        self.busy_slot_s = 0.0
        self.prefill_s = self.decode_s = 0.0           # the server thread's compute, by kind
        self.step_log: list[tuple[int, float]] = []   # (requests in the batch, seconds) per decode step
        self._thread = threading.Thread(target=self._serve, name="llm-server", daemon=True)
        self._thread.start()

    def generate(self, prompt: list[int], new_tokens: int, priority: float) -> list[int]:
        """Block until ``new_tokens`` tokens after ``prompt`` are generated; returns them."""
        req = _Request(priority, next(self._seq), prompt, new_tokens)
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
        """A seeded prompt of wordpiece ids (real words, no special tokens) for a call's key."""
        g = np.random.default_rng(key)
        return g.integers(FIRST_WORD_ID, self.model.cfg.vocab, self.cfg.prompt_tokens).tolist()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

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
                for req in admitted:
                    self._prefill(req)
                self.prefill_s += time.perf_counter() - t0
                active = self._retire(active)
                if active:
                    t1 = time.perf_counter()
                    self._decode(active)
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

    def _prefill(self, req: _Request) -> None:
        req.slots = self.pool.alloc(len(req.prompt) + req.new_tokens)
        logits = self.model.prefill(self.pool, req.prompt, 0, torch.tensor(req.slots[:len(req.prompt)]))
        req.out.append(int(logits.argmax()))
        self.prefills += 1
        self.tokens += 1

    def _decode(self, active: list[_Request]) -> None:
        positions = [len(r.prompt) + len(r.out) - 1 for r in active]
        rows = torch.zeros(len(active), max(positions) + 1, dtype=torch.long)
        for b, r in enumerate(active):
            rows[b, :positions[b] + 1] = torch.tensor(r.slots[:positions[b] + 1])
        logits = self.model.decode(self.pool, [r.out[-1] for r in active], positions, rows)
        for r, tok in zip(active, logits.argmax(dim=-1).tolist()):
            r.out.append(tok)
        self.steps += 1
        self.tokens += len(active)

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
            if len(r.out) >= r.new_tokens:
                self.pool.release(r.slots)
                r.done.set()
            else:
                still.append(r)
        return still
