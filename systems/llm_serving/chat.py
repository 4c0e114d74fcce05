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

Two more things a local engine can do cheaply:
- **constrained decoding** (``int_list``): the completion after ``prefix`` may only continue a JSON list
  of the given integers -- digits that form one of them, ``", "`` between two, ``"]"`` to close -- by
  masking every other token out of the greedy argmax (grammar-constrained decoding, as practitioners run
  small models: llama.cpp's GBNF grammars, Outlines, vLLM's guided decoding). The model still chooses
  which ids, and when to close; it can no longer copy a placeholder or write prose.
- **a cached system turn**: the K/V of the chat template's system turn (``<|im_start|>system ...
  <|im_end|>``, a special-token boundary, so tokenising it apart changes nothing) are computed once per
  distinct system prompt and copied into each request's pool (``cached_prompt_tokens`` counts the tokens
  not rerun).
"""
from __future__ import annotations

import time

import torch

from .kv_pool import KVPool

#: the characters a token of a JSON integer list may hold
_LIST_CHARS = frozenset("0123456789, ]")


def int_list_prefix_ok(text: str, ids: frozenset[str], prefixes: frozenset[str]) -> bool:
    """Whether ``text`` can begin ``id(, id)*]`` where each id is one of the decimal strings ``ids``
    (``prefixes``: every prefix of them)."""
    cur, state = "", "id"
    for ch in text:
        if state == "id":
            if ch.isdigit():
                cur += ch
                if cur not in prefixes:
                    return False
            elif ch in ",]":
                if cur not in ids:
                    return False
                cur, state = "", ("space" if ch == "," else "end")
            else:
                return False
        elif state == "space":
            if ch != " ":
                return False
            state = "id"
        else:
            return False
    return True


class SmolLM2Chat:
    """Greedy chat completions of SmolLM2 (loaded once per process: ``smollm2.pretrained``)."""

    name = "SmolLM2-135M-Instruct"

    def __init__(self, model=None, tokenizer=None, threads: int | None = 1, memo: bool = True,
                 cache_system: bool = True):
        from .smollm2 import pretrained, tokenizer as load_tokenizer

        self.model = model if model is not None else pretrained()
        self.tok = tokenizer if tokenizer is not None else load_tokenizer()
        self.threads, self.memo, self.cache_system = threads, {} if memo else None, cache_system
        self.calls = self.memo_hits = self.prompt_tokens = self.output_tokens = self.truncated = 0
        self.cached_prompt_tokens = 0
        self.generate_s = 0.0
        self._system_kv: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        self._list_tokens: list[tuple[int, str]] | None = None

    def complete(self, prompt: str, max_tokens: int = 64, system: str | None = None, *, prefix: str = "",
                 stop: tuple[str, ...] = (), int_list=None) -> str:
        """The assistant's reply to one user turn: ``prefix`` plus up to ``max_tokens`` greedy tokens,
        cut after the first ``stop`` string (or at the end-of-sequence token). ``int_list`` (integers):
        constrained decoding, the completion can only continue a JSON list of these (see the module
        docstring); ``prefix`` should then end where the list's first id goes (e.g. with ``[``)."""
        from .smollm2 import chat_prompt

        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1 (got {max_tokens})")
        allowed = None
        if int_list is not None:
            allowed = frozenset(str(int(i)) for i in int_list)
            if not allowed or any(i.startswith("-") for i in allowed):
                raise ValueError(f"int_list must hold non-negative integers (got {sorted(allowed)[:5]})")
        self.calls += 1
        key = (system, prompt, prefix, max_tokens, tuple(stop), tuple(sorted(allowed, key=int)) if allowed else None)
        if self.memo is not None and key in self.memo:
            self.memo_hits += 1
            return self.memo[key]
        text = (chat_prompt(prompt, system) if system is not None else chat_prompt(prompt)) + prefix
        head, sep, tail = text.partition("<|im_start|>user")
        head_ids = self.tok.encode(head, add_special_tokens=False).ids if sep and self.cache_system else []
        ids = head_ids + self.tok.encode(sep + tail if head_ids else text, add_special_tokens=False).ids
        started = time.perf_counter()
        out, cut = self._greedy(ids, max_tokens, stop, len(head_ids), allowed)
        self.generate_s += time.perf_counter() - started
        self.prompt_tokens += len(ids)
        self.output_tokens += len(out)
        reply = prefix + cut
        if self.memo is not None:
            self.memo[key] = reply
        return reply

    def list_tokens(self) -> list[tuple[int, str]]:
        """(token id, text) of every vocabulary token made only of digits, ',', ' ' and ']' (the tokens
        a JSON integer list can use), found once."""
        if self._list_tokens is None:
            out = []
            for i in range(self.tok.get_vocab_size()):
                t = self.tok.decode([i])
                if t and set(t) <= _LIST_CHARS:
                    out.append((i, t))
            self._list_tokens = out
        return self._list_tokens

    def _pick(self, logits: torch.Tensor, text: str, allowed: frozenset[str] | None) -> int | None:
        """The greedy token; with ``allowed``, the best among those that keep ``text`` a prefix of a
        JSON list of those ids (None: no token may follow)."""
        logits = logits.reshape(-1)
        if allowed is None:
            return int(logits.argmax())
        prefixes = frozenset(i[:k] for i in allowed for k in range(1, len(i) + 1))
        # after ", " the grammar is where it started: only the text since the last one matters
        tail = text[text.rfind(", ") + 2:] if ", " in text else text
        ok = [tid for tid, t in self.list_tokens() if int_list_prefix_ok(tail + t, allowed, prefixes)]
        if not ok:
            return None
        ok_t = torch.tensor(ok)
        return int(ok_t[int(logits[ok_t].argmax())])

    def _system_cache(self, pool: KVPool, ids: list[int], h: int) -> int:
        """Copy the cached K/V of the system turn ``ids[:h]`` into ``pool`` (computing them the first
        time); returns how many positions are now cached."""
        m = self.model
        key = tuple(ids[:h])
        if h < 2:
            return 0
        if key not in self._system_kv:
            scratch = KVPool(m.cfg, h)
            m.prefill(scratch, list(key), 0, torch.arange(h))
            self._system_kv[key] = (scratch.k.clone(), scratch.v.clone())
        k, v = self._system_kv[key]
        pool.k[:, :h] = k
        pool.v[:, :h] = v
        return h

    def _greedy(self, ids: list[int], max_new: int, stop: tuple[str, ...], head: int = 0,
                allowed: frozenset[str] | None = None) -> tuple[list[int], str]:
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
            cached = self._system_cache(pool, ids, head) if head < n else 0
            self.cached_prompt_tokens += cached
            first = self._pick(m.prefill(pool, ids[cached:], cached, slots[:n]), "", allowed)
            out = [] if first is None else [first]
            while True:
                if not out:
                    return out, ""
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
                nxt = self._pick(m.decode(pool, [out[-1]], [p], slots[None, :p + 1]), text, allowed)
                if nxt is None:   # the grammar allows nothing more (cannot happen before "]" ends the list)
                    return out, text
                out.append(nxt)
        finally:
            torch.set_num_threads(threads)

    def stats(self) -> dict:
        return {"requests": self.calls, "memo_hits": self.memo_hits, "prompt_tokens": self.prompt_tokens,
                "cached_prompt_tokens": self.cached_prompt_tokens, "output_tokens": self.output_tokens,
                "truncated": self.truncated, "generate_s": self.generate_s}
