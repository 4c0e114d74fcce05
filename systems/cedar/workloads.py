"""The two benchmark pipelines, their data, and the DataLoader baseline (pure).

Image: PNGs made at run time, read -> decode -> drop unlabelled images -> random crop -> flip ->
color jitter -> normalize -> batch, written the way a user naturally writes it (the label filter
after the decode, like a torchvision ``__getitem__`` followed by a check).
Text: a parquet file of documents, tokenize -> filter by length -> pad -> batch.

The DataLoader baseline runs the *same* functions in the order written inside an
``IterableDataset`` (round-robin shards per worker) with torch's batching and collation.
"""
from __future__ import annotations

import io
import re
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlsys_flows.systems.cedar.api import Pipeline
from mlsys_flows.systems.cedar.pipeline import apply_op

# ----- image data and operators ---------------------------------------------------------------


def make_image(rng: np.random.Generator, size: int) -> np.ndarray:
    """A photo-like image: smooth colour gradients, a few shapes, sensor noise."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    base = np.stack([a * x + b * y + c for a, b, c in rng.uniform(-80, 80, (3, 3)) + [0, 0, 128]], axis=-1)
    for _ in range(int(rng.integers(2, 6))):
        cy, cx, r = rng.uniform(0, 1, 3) * [1, 1, 0.3]
        mask = (x - cx) ** 2 + (y - cy) ** 2 < r ** 2
        base[mask] = rng.uniform(0, 255, 3)
    base += rng.normal(0, 6, base.shape)
    return np.clip(base, 0, 255).astype(np.uint8)


def encode_png(img: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()


def decode(s: dict) -> dict:
    from PIL import Image

    img = np.asarray(Image.open(io.BytesIO(s["data"])).convert("RGB"))
    return {k: v for k, v in s.items() if k != "data"} | {"image": img}


def is_labelled(s: dict) -> bool:
    return s["label"] >= 0


@dataclass(frozen=True)
class RandomCrop:
    size: int

    def __call__(self, s: dict, rng: np.random.Generator) -> dict:
        img = s["image"]
        h, w = img.shape[:2]
        if h < self.size or w < self.size:
            raise ValueError(f"image {h}x{w} is smaller than the crop {self.size}")
        top, left = int(rng.integers(0, h - self.size + 1)), int(rng.integers(0, w - self.size + 1))
        return s | {"image": img[top:top + self.size, left:left + self.size]}


def random_flip(s: dict, rng: np.random.Generator) -> dict:
    return s | {"image": s["image"][:, ::-1]} if rng.random() < 0.5 else s


LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def color_jitter(s: dict, rng: np.random.Generator) -> dict:
    """Brightness, contrast and saturation, each by a factor in [0.8, 1.2] (as torchvision does
    them: contrast around the mean luminance, saturation towards the luminance)."""
    b, c, sat = (float(v) for v in rng.uniform(0.8, 1.2, 3))  # Python floats keep float32 arrays float32
    f = s["image"].astype(np.float32) * b
    m = float((f @ LUMA).mean())
    f = (f - m) * c + m
    gray = (f @ LUMA)[..., None]
    f = (f - gray) * sat + gray
    return s | {"image": np.clip(f, 0, 255)}


MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32) * 255
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32) * 255


def normalize(s: dict) -> dict:
    """Per-channel standardization, HWC -> CHW float32."""
    chw = np.ascontiguousarray(s["image"].transpose(2, 0, 1), dtype=np.float32)  # a fresh CHW copy
    chw -= MEAN[:, None, None]
    chw *= (1 / STD)[:, None, None]
    return s | {"image": chw}


def image_pipeline(store: Any, keys: list[str], labels: list[int], crop: int, batch: int, seed: int) -> Pipeline:
    return (Pipeline.from_storage(store, keys, meta=[{"label": int(lb)} for lb in labels], seed=seed)
            .map(decode, reads=("data",), writes=("data", "image"))
            .filter(is_labelled, name="labelled", reads=("label",))
            .map(RandomCrop(crop), name="random_crop", random=True, reads=("image",), writes=("image",))
            .map(random_flip, random=True, reads=("image",), writes=("image",))
            .map(color_jitter, random=True, reads=("image",), writes=("image",))
            .map(normalize, reads=("image",), writes=("image",))
            .batch(batch))


# ----- text data and operators ----------------------------------------------------------------

def make_vocabulary(rng: np.random.Generator, size: int) -> list[str]:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = {"".join(rng.choice(letters, int(rng.integers(2, 10)))) for _ in range(size * 2)}
    return sorted(words)[:size]


def make_documents(rng: np.random.Generator, n: int, vocab: list[str], mean_words: int) -> list[str]:
    """Zipf-distributed words, log-normal document lengths, some punctuation."""
    ranks = np.arange(1, len(vocab) + 1)
    probs = 1.0 / ranks ** 1.1
    probs /= probs.sum()
    lengths = np.maximum(1, rng.lognormal(np.log(mean_words), 0.6, n).astype(int))
    words = np.array(vocab)[rng.choice(len(vocab), int(lengths.sum()), p=probs)]
    docs, pos = [], 0
    for ln in lengths:
        w = words[pos:pos + ln].tolist()
        pos += ln
        docs.append(" ".join(x + ("." if i % 13 == 12 else ",") if i % 7 == 6 else x.capitalize() if i % 13 == 0 else x
                             for i, x in enumerate(w)))
    return docs


TOKEN = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True)
class Tokenize:
    """Lower-case word/punctuation tokens -> ids; unknown words hash into ``oov`` buckets."""

    vocab: tuple[str, ...]
    oov: int = 1000

    def __post_init__(self):
        object.__setattr__(self, "table", {w: i + self.oov for i, w in enumerate(self.vocab)})

    def __call__(self, s: dict) -> dict:
        t = self.table
        ids = [t.get(w, zlib.crc32(w.encode()) % self.oov) for w in TOKEN.findall(s["text"].lower())]
        return {"id": s["id"], "tokens": np.asarray(ids, dtype=np.int32)}


@dataclass(frozen=True)
class LengthBetween:
    low: int
    high: int

    def __call__(self, s: dict) -> bool:
        return self.low <= len(s["tokens"]) <= self.high


@dataclass(frozen=True)
class Pad:
    length: int
    pad_id: int = 0

    def __call__(self, s: dict) -> dict:
        t = s["tokens"]
        out = np.full(self.length, self.pad_id, dtype=np.int32)
        out[:len(t)] = t
        mask = np.zeros(self.length, dtype=np.uint8)
        mask[:len(t)] = 1
        return {"id": s["id"], "tokens": out, "mask": mask}


def text_pipeline(store: Any, key: str, vocab: list[str], min_tokens: int, max_tokens: int, batch: int,
                  seed: int) -> Pipeline:
    return (Pipeline.from_parquet(key, store=store, columns=["id", "text"], seed=seed)
            .map(Tokenize(tuple(vocab)), name="tokenize", reads=("text",), writes=("text", "tokens"))
            .filter(LengthBetween(min_tokens, max_tokens), name="length_filter", reads=("tokens",))
            .map(Pad(max_tokens), name="pad", reads=("tokens",), writes=("tokens", "mask"))
            .batch(batch))


# ----- the DataLoader baseline ------------------------------------------------------------------

def _torch_dataset_class():
    from torch.utils.data import IterableDataset, get_worker_info

    class PipelineDataset(IterableDataset):
        """The per-sample functions applied in the order written, on this worker's shard."""

        def __init__(self, refs, ops, seed: int, epoch: int):
            self.refs, self.ops, self.seed, self.epoch = refs, ops, seed, epoch

        def __iter__(self):
            info = get_worker_info()
            wid, nw = (info.id, info.num_workers) if info else (0, 1)
            items = (((i,), r) for i, r in enumerate(self.refs) if i % nw == wid)
            for op in self.ops:
                items = apply_op(op, items, self.seed, self.epoch)
            for _, x in items:
                yield x

    return PipelineDataset


def dataloader(pipeline: Pipeline, num_workers: int, epoch: int):
    """``torch.utils.data.DataLoader`` over the pipeline's per-sample functions, as a user writes it:
    an IterableDataset applying them in the order written, round-robin shards per worker, torch's
    own batching and collation. Workers fork, the Linux default (a Dask worker process would
    otherwise hand its 'spawn' setting down)."""
    import multiprocessing as mp

    from torch.utils.data import DataLoader

    ops = list(pipeline.ops)
    batch_op = ops[-1]
    if batch_op.kind != "batch" or not all(o.per_sample for o in ops[:-1]):
        raise ValueError("the DataLoader baseline needs per-sample operators followed by one batch")
    dataset = _torch_dataset_class()(pipeline.source.refs, ops[:-1], pipeline.seed, epoch)
    ctx = mp.get_context("fork") if num_workers and "fork" in mp.get_all_start_methods() else None
    return DataLoader(dataset, batch_size=batch_op.size, num_workers=num_workers, drop_last=batch_op.drop_last,
                      multiprocessing_context=ctx)


def count(batch: Any) -> int:
    """Samples in a batch (a dict of arrays/tensors/lists, an array or a list)."""
    if isinstance(batch, dict):
        return count(next(iter(batch.values())))
    return int(batch.shape[0]) if hasattr(batch, "shape") else len(batch)


def unbatch(batch: Any) -> list[dict]:
    """A batch (dict of stacked fields) -> per-sample dicts of numpy arrays, to compare outputs."""
    n = count(batch)
    cols = {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in batch.items()}
    return [{k: (np.asarray(v[i]) if not isinstance(v, list) else v[i]) for k, v in cols.items()} for i in range(n)]


def sample_digest(s: dict) -> str:
    import hashlib

    h = hashlib.sha1()
    for k in sorted(s):
        v = s[k]
        h.update(k.encode())
        h.update(np.ascontiguousarray(v).tobytes() if isinstance(v, np.ndarray) else repr(v).encode())
    return h.hexdigest()


def multiset(batches: Any) -> dict[str, int]:
    from collections import Counter

    return dict(Counter(sample_digest(s) for b in batches for s in unbatch(b)))

