"""BAGEL's LLM scorer: an OpenAI-compatible chat model grades a (query, passage) pair from 0 to 10.

One ``LLMJudge`` per evaluation chunk keeps a cache keyed by (query, passage): every method asks the
same question about the same pair, the model answers at temperature 0, so a pair is requested once and
every method sees the same score (as the offline oracle's fixed noise draw does). Each method still
gets its own counting scorer, so the budget check counts its calls, not the cache's.

A reply that cannot be read as a grade (no number, a number outside 0..10, an HTTP or protocol error)
is a failed score: counted, logged by the caller, and replaced by ``fallback`` (0: an unreadable
grade is treated as irrelevant). The run aborts only when more than ``max_failed`` of the requests
(after ``min_requests``) failed: then the endpoint is broken, not noisy. Pure: no prefect/dask imports.
"""
from __future__ import annotations

import json
import re
from typing import Sequence

from mlsys_flows.systems.common.llm import LLMError

PROMPT = ("Rate how relevant the passage is to the query on a scale from 0 (irrelevant) to 10 (answers it). "
          "Reply with the number only.\n\nQuery: {query}\n\nPassage: {passage}")
SCALE = 10.0
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_KEYS = ("score", "relevance", "rating", "grade")


def parse_relevance(text: str) -> float:
    """A grade in [0, 1] from a reply: a bare number ("7", "7/10", "Score: 7"), or JSON holding one
    ({"score": 7}, also inside a ``` fence); a reasoning model's <think>...</think> block is skipped.
    Raises LLMError when no grade in 0..10 can be read."""
    body = re.sub(r"<think>.*?</think>", " ", text or "", flags=re.S).strip()
    body = re.sub(r"^```(?:json)?|```$", "", body.strip()).strip()
    value = None
    if body.startswith(("{", "[")) or body[:1].isdigit():
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if isinstance(data, dict):
            value = next((data[k] for k in _KEYS if isinstance(data.get(k), (int, float))
                          and not isinstance(data.get(k), bool)), None)
            if value is None:
                raise LLMError(f"relevance reply is JSON without a numeric {'/'.join(_KEYS)}: {body[:80]!r}")
        elif isinstance(data, (int, float)) and not isinstance(data, bool):
            value = data
    if value is None:
        m = _NUMBER.search(body)
        if not m:
            raise LLMError(f"relevance reply holds no number: {body[:80]!r}")
        value = float(m.group())
    value = float(value)
    if not 0.0 <= value <= SCALE:
        raise LLMError(f"relevance grade {value:g} is outside 0..{SCALE:g}")
    return value / SCALE


class LLMJudge:
    """Grades (query, passage) pairs with ``client`` (anything with ``complete(prompt, max_tokens)``),
    once per pair; counts requests and failed scores."""

    def __init__(self, client, passages: Sequence[str], fallback: float = 0.0, max_failed: float = 0.2,
                 min_requests: int = 10, max_tokens: int = 16):
        self.client, self.passages = client, passages
        self.fallback, self.max_failed, self.min_requests, self.max_tokens = fallback, max_failed, min_requests, max_tokens
        self.requests = 0
        self.failed = 0
        self.failures: list[str] = []    # the first few failure messages
        self._cache: dict[tuple[int, int], tuple[float, bool]] = {}

    def grade(self, qid: int, query: str, i: int) -> tuple[float, bool]:
        """(score in [0, 1], whether it failed) for passage ``i`` under query ``qid``."""
        key = (qid, int(i))
        if key not in self._cache:
            self.requests += 1
            try:
                reply = self.client.complete(PROMPT.format(query=query, passage=self.passages[int(i)]),
                                             max_tokens=self.max_tokens)
                self._cache[key] = (parse_relevance(reply), False)
            except LLMError as exc:
                self.failed += 1
                if len(self.failures) < 5:
                    self.failures.append(f"query {qid}, passage {i}: {exc}")
                self._cache[key] = (self.fallback, True)
                if self.requests >= self.min_requests and self.failed > self.max_failed * self.requests:
                    raise LLMError(f"{self.failed} of {self.requests} LLM scoring requests failed (more than "
                                   f"{self.max_failed:.0%}); first failures: {self.failures}") from None
        return self._cache[key]

    def scorer(self, qid: int, query: str):
        """A fresh per-method scorer for one query: ``score(i)``, with a ``calls`` counter and ``flags``
        (per call, in order: did that score fail?)."""
        def score(i: int) -> float:
            score.calls += 1
            s, bad = self.grade(qid, query, i)
            score.flags.append(bad)
            return s

        score.calls = 0
        score.flags = []
        return score

    def stats(self) -> dict:
        return {"requests": self.requests, "failed": self.failed, "failures": list(self.failures)}
