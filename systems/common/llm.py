"""A small OpenAI-compatible client (chat completions and embeddings) over httpx, and the offline
default every flow falls back to when no endpoint is configured.

The task layer resolves the API key (a Prefect ``Secret`` block named by a parameter) and passes it
here as a plain string; this module never logs it, never puts it in an error message, and keeps it
out of ``repr``. Any server that speaks ``POST {base_url}/chat/completions`` and
``POST {base_url}/embeddings`` works (vLLM, llama.cpp server, Ollama's OpenAI API, OpenAI itself).
Pure: no prefect/dask imports.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import httpx
import numpy as np

from mlsys_flows.errors import MlsysError


class LLMError(MlsysError, RuntimeError):
    """The endpoint failed or answered something that is not an OpenAI-style reply."""


@dataclass(frozen=True)
class LLMConfig:
    """Where the model lives. ``base_url`` ends before ``/chat/completions`` (e.g.
    ``http://127.0.0.1:8000/v1``)."""

    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 30.0
    max_retries: int = 1
    temperature: float = 0.0

    def __post_init__(self):
        if not re.match(r"^https?://[^\s/]+", self.base_url or ""):
            raise ValueError(f"base_url must be an http(s) URL (got {self.base_url!r})")
        if not self.model:
            raise ValueError("model must be a non-empty model name")
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be positive")


class OpenAICompatibleClient:
    """Chat completions and embeddings against one OpenAI-compatible endpoint."""

    def __init__(self, config: LLMConfig, transport: httpx.BaseTransport | None = None):
        self.config = config
        headers = {"Content-Type": "application/json"}
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        self._http = httpx.Client(base_url=config.base_url.rstrip("/"), headers=headers,
                                  timeout=config.timeout_s, transport=transport)
        self.calls = 0

    def __repr__(self) -> str:
        return f"OpenAICompatibleClient(base_url={self.config.base_url!r}, model={self.config.model!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        last: Exception | None = None
        for _ in range(self.config.max_retries + 1):
            try:
                resp = self._http.post(path, json=body)
            except httpx.TimeoutException as exc:
                last = LLMError(f"{self.config.base_url}{path}: no reply within {self.config.timeout_s} s")
                continue
            except httpx.HTTPError as exc:
                last = LLMError(f"{self.config.base_url}{path}: {type(exc).__name__}: {exc}")
                continue
            self.calls += 1
            if resp.status_code >= 500:
                last = LLMError(f"{self.config.base_url}{path}: HTTP {resp.status_code}")
                continue
            if resp.status_code >= 400:
                detail = resp.text[:200].replace(self.config.api_key or "\0", "***")
                raise LLMError(f"{self.config.base_url}{path}: HTTP {resp.status_code}: {detail}")
            try:
                data = resp.json()
            except ValueError:
                raise LLMError(f"{self.config.base_url}{path}: reply is not JSON: {resp.text[:120]!r}") from None
            if not isinstance(data, dict):
                raise LLMError(f"{self.config.base_url}{path}: reply is not a JSON object")
            return data
        raise last  # type: ignore[misc]

    def chat(self, messages: Sequence[dict[str, str]], max_tokens: int = 64, **extra: Any) -> str:
        """The first choice's message content."""
        body = {"model": self.config.model, "messages": list(messages), "max_tokens": max_tokens,
                "temperature": self.config.temperature, **extra}
        data = self._post("/chat/completions", body)
        try:
            content = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise LLMError(f"malformed chat reply (no choices[0].message.content): keys {sorted(data)}") from None
        if not isinstance(content, str):
            raise LLMError(f"malformed chat reply: content is {type(content).__name__}, not a string")
        return content

    def complete(self, prompt: str, max_tokens: int = 64, system: str | None = None) -> str:
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        return self.chat(msgs, max_tokens=max_tokens)

    def embed(self, texts: Sequence[str], model: str | None = None) -> np.ndarray:
        """float32 [len(texts), dim], L2-normalized, in input order (the reply's ``index`` decides)."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, 0), np.float32)
        data = self._post("/embeddings", {"model": model or self.config.model, "input": texts})
        rows = data.get("data")
        if not isinstance(rows, list) or len(rows) != len(texts):
            raise LLMError(f"malformed embeddings reply: expected {len(texts)} rows in 'data'")
        try:
            ordered = sorted(rows, key=lambda r: r.get("index", 0))
            arr = np.asarray([r["embedding"] for r in ordered], dtype=np.float32)
        except (KeyError, TypeError, ValueError, AttributeError):
            raise LLMError("malformed embeddings reply: rows need a numeric 'embedding' list of equal length") from None
        if arr.ndim != 2 or not np.isfinite(arr).all():
            raise LLMError("malformed embeddings reply: embeddings are not a finite 2-D array")
        norms = np.linalg.norm(arr, axis=1, keepdims=True)
        return arr / np.maximum(norms, 1e-12)


RELEVANCE_PROMPT = ("Rate how relevant the passage is to the query on a scale from 0 (irrelevant) to 10 "
                    "(answers it). Reply with the number only.\n\nQuery: {query}\n\nPassage: {passage}")


def parse_score(text: str, scale: float = 10.0) -> float:
    """The first number in a model's reply, clipped to [0, scale] and divided by it."""
    m = re.search(r"-?\d+(?:\.\d+)?", text or "")
    if not m:
        raise LLMError(f"relevance reply holds no number: {text[:80]!r}")
    return float(min(max(float(m.group()), 0.0), scale) / scale)


def llm_relevance(client: OpenAICompatibleClient, query: str, passage: str) -> float:
    """Relevance in [0, 1] scored by the model behind ``client`` (one chat call)."""
    return parse_score(client.complete(RELEVANCE_PROMPT.format(query=query, passage=passage), max_tokens=8))


def normalize_answer(text: str) -> str:
    """Lower case, punctuation and extra spaces removed: the exact-match judge's view of an answer."""
    return " ".join(re.sub(r"[^\w\s]", " ", (text or "").lower()).split())


class OfflineModel:
    """The offline default: a deterministic "model" whose answer to a prompt is a label the workload
    knows (an equivalence class, a relevance grade). ``calls`` counts the model calls a run paid."""

    def __init__(self, answers: dict[str, str] | None = None):
        self.answers = dict(answers or {})
        self.calls = 0

    def complete(self, prompt: str, max_tokens: int = 64, system: str | None = None) -> str:
        self.calls += 1
        try:
            return self.answers[prompt]
        except KeyError:
            raise LLMError(f"offline model has no answer for prompt {prompt[:60]!r}") from None
