"""Chat completions from SmolLM2-135M-Instruct run by the project's own forward (``smollm2``): the
interface of the OpenAI-compatible clients in ``systems.common.llm`` (``complete(prompt, max_tokens,
system) -> str`` and a ``calls`` counter), offline, for agents that need a real language model and no
endpoint (the embodied family's planner).

Greedy decoding (temperature 0, as the benchmarks' endpoints are called), the model's own chat template
(``smollm2.chat_prompt``), and two things an HTTP endpoint does not offer: ``prefix``, text the assistant
turn is forced to start with (the reply returned starts with it), and ``stop``, strings that end the
completion where they first appear (the returned text ends with the stop string). Greedy decoding is
deterministic, so identical requests are answered from a memo (``memo_hits`` counts them): the replies
are the model's either way, only the cost changes. ``prompt_tokens`` and ``output_tokens`` count what
the model actually ran.
"""
from __future__ import annotations

import time

import torch

from .kv_pool import KVPool


class SmolLM2Chat:
    """Greedy chat completions of SmolLM2 (loaded once per process: ``smollm2.pretrained``)."""

    name = "SmolLM2-135M-Instruct"

    def __init__(self, model=None, tokenizer=None, threads: int | None = 1, memo: bool = True):
        from .smollm2 import pretrained, tokenizer as load_tokenizer

        self.model = model if model is not None else pretrained()
        self.tok = tokenizer if tokenizer is not None else load_tokenizer()
        self.threads, self.memo = threads, {} if memo else None
        self.calls = self.memo_hits = self.prompt_tokens = self.output_tokens = self.truncated = 0
        self.generate_s = 0.0

    def complete(self, prompt: str, max_tokens: int = 64, system: str | None = None, *, prefix: str = "",
                 stop: tuple[str, ...] = ()) -> str:
        """The assistant's reply to one user turn: ``prefix`` plus up to ``max_tokens`` greedy tokens,
        cut after the first ``stop`` string (or at the end-of-sequence token)."""
        from .smollm2 import chat_prompt

        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1 (got {max_tokens})")
        self.calls += 1
        key = (system, prompt, prefix, max_tokens, tuple(stop))
        if self.memo is not None and key in self.memo:
            self.memo_hits += 1
            return self.memo[key]
        text = (chat_prompt(prompt, system) if system is not None else chat_prompt(prompt)) + prefix
        ids = self.tok.encode(text, add_special_tokens=False).ids
        started = time.perf_counter()
        out, cut = self._greedy(ids, max_tokens, stop)
        self.generate_s += time.perf_counter() - started
        self.prompt_tokens += len(ids)
        self.output_tokens += len(out)
        reply = prefix + cut
        if self.memo is not None:
            self.memo[key] = reply
        return reply

    def _greedy(self, ids: list[int], max_new: int, stop: tuple[str, ...]) -> tuple[list[int], str]:
        m, eos = self.model, self.model.cfg.eos
        if len(ids) + max_new > m.cfg.max_positions:
            raise ValueError(f"prompt of {len(ids)} tokens + {max_new} new exceeds {m.cfg.max_positions} positions")
        threads = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            n = len(ids)
            pool = KVPool(m.cfg, n + max_new)
            slots = torch.arange(n + max_new)
            out = [int(m.prefill(pool, ids, 0, slots[:n]).argmax())]
            while True:
                if out[-1] == eos:
                    return out, self.tok.decode(out[:-1])
                text = self.tok.decode(out)
                hit = [text.index(s) + len(s) for s in stop if s in text]
                if hit:
                    return out, text[:min(hit)]
                if len(out) >= max_new:
                    self.truncated += 1
                    return out, text
                p = n + len(out) - 1
                out.append(int(m.decode(pool, [out[-1]], [p], slots[None, :p + 1]).argmax()))
        finally:
            torch.set_num_threads(threads)

    def stats(self) -> dict:
        return {"requests": self.calls, "memo_hits": self.memo_hits, "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens, "truncated": self.truncated, "generate_s": self.generate_s}
