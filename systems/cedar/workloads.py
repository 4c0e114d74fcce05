"""The three benchmark pipelines, their data, and the DataLoader baseline (pure).

Image: PNGs made at run time, read -> decode -> drop unlabelled images -> random crop -> flip ->
color jitter -> normalize -> batch, written the way a user naturally writes it (the label filter
after the decode, like a torchvision ``__getitem__`` followed by a check).
Text: a parquet file of documents, tokenize -> filter by length -> pad -> batch.
Audio: WAV clips made at run time, read -> decode -> resample -> log-mel spectrogram ->
normalize (a deterministic, cacheable prefix) -> SpecAugment masks -> random time crop (random,
redrawn every epoch) -> batch, shaped like the paper's speech pipeline.

The DataLoader baseline runs the *same* functions in the order written inside an
``IterableDataset`` (round-robin shards per worker) with torch's batching and collation, one
DataLoader kept across epochs (persistent workers), set up the way a careful user tunes it; its
caching variant (``cache=True``) also keeps the outputs of the deterministic prefix in memory after
the first epoch, as tf.data's ``.cache()`` placed there.
"""
from __future__ import annotations

import io
import re
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlsys_flows.systems.cedar.api import Pipeline
from mlsys_flows.systems.cedar.pipeline import apply_op, deterministic_prefix

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


# ----- audio data and operators ---------------------------------------------------------------

def make_clip(rng: np.random.Generator, label: int, seconds: float, rate: int) -> np.ndarray:
    """A speech-like clip of class ``label``: a harmonic tone whose pitch depends on the class,
    with a slow pitch glide, syllable-like amplitude bursts and background noise; int16 PCM."""
    n = max(1, int(round(seconds * rate)))
    t = np.arange(n, dtype=np.float64) / rate
    f0 = 110.0 * 2 ** (label / 6) * (1 + 0.05 * np.sin(2 * np.pi * rng.uniform(0.2, 1.0) * t))
    phase = 2 * np.pi * np.cumsum(f0) / rate
    wave = sum(rng.uniform(0.2, 1.0) / k * np.sin(k * phase + rng.uniform(0, 2 * np.pi)) for k in range(1, 6))
    bursts = 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(2, 5) * t + rng.uniform(0, 2 * np.pi)) ** 2
    wave = wave * bursts + rng.normal(0, 0.05, n)
    return np.clip(wave / np.abs(wave).max() * 0.8 * 32767, -32768, 32767).astype(np.int16)


def encode_wav(pcm: np.ndarray, rate: int) -> bytes:
    """Mono 16-bit PCM WAV (the standard library's ``wave`` writer)."""
    import wave

    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.astype("<i2").tobytes())
    return buf.getvalue()


def decode_wav(s: dict) -> dict:
    """WAV bytes -> float32 waveform in [-1, 1] and its sample rate."""
    import wave

    with wave.open(io.BytesIO(s["data"]), "rb") as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1:
            raise ValueError(f"expected mono 16-bit PCM, got {w.getnchannels()} channels of {w.getsampwidth()} bytes")
        rate, frames = w.getframerate(), w.readframes(w.getnframes())
    wave_ = np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768.0
    return {k: v for k, v in s.items() if k != "data"} | {"wave": wave_, "rate": rate}


@dataclass(frozen=True)
class Resample:
    """Polyphase resampling to ``rate`` (scipy ``resample_poly`` with its default Kaiser
    low-pass, designed once per source rate and reused)."""

    rate: int

    def __post_init__(self):
        object.__setattr__(self, "filters", {})

    def __call__(self, s: dict) -> dict:
        from math import gcd

        from scipy.signal import firwin, resample_poly

        src = int(s["rate"])
        if src == self.rate:
            return s
        g = gcd(src, self.rate)
        up, down = self.rate // g, src // g
        h = self.filters.get((up, down))
        if h is None:  # what resample_poly designs on every call
            half_len = 10 * max(up, down)
            h = self.filters[(up, down)] = firwin(2 * half_len + 1, 1.0 / max(up, down),
                                                  window=("kaiser", 5.0)).astype(np.float32)
        out = resample_poly(s["wave"], up, down, window=h).astype(np.float32)
        return s | {"wave": out, "rate": self.rate}


def mel_filterbank(rate: int, n_fft: int, n_mels: int) -> np.ndarray:
    """Triangular filters on the mel scale (HTK formula), shape (n_mels, n_fft // 2 + 1)."""
    def mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def hz(m):
        return 700.0 * (10 ** (m / 2595.0) - 1.0)

    edges = hz(np.linspace(mel(0.0), mel(rate / 2), n_mels + 2))
    freqs = np.linspace(0, rate / 2, n_fft // 2 + 1)
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    fb = np.maximum(0.0, np.minimum((freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)))
    return fb.astype(np.float32)


@dataclass(frozen=True)
class LogMel:
    """Short-time Fourier transform (Hann window) -> power -> mel filterbank -> log; the
    waveform is replaced by a float32 (n_mels, frames) spectrogram."""

    rate: int
    n_fft: int = 400
    hop: int = 160
    n_mels: int = 64

    def __post_init__(self):
        object.__setattr__(self, "window", np.hanning(self.n_fft + 1)[:-1].astype(np.float32))
        object.__setattr__(self, "fb", mel_filterbank(self.rate, self.n_fft, self.n_mels))

    def __call__(self, s: dict) -> dict:
        if s["rate"] != self.rate:
            raise ValueError(f"log-mel expects {self.rate} Hz audio, got {s['rate']} Hz")
        x = s["wave"]
        if len(x) < self.n_fft:
            x = np.pad(x, (0, self.n_fft - len(x)))
        frames = np.lib.stride_tricks.sliding_window_view(x, self.n_fft)[::self.hop] * self.window
        power = (np.abs(np.fft.rfft(frames, axis=1)) ** 2).astype(np.float32)
        # einsum, not a BLAS matmul: a small product that OpenBLAS would spread over a thread pool
        # per process (and spin on, with several worker processes on few cores)
        mel = np.log(np.einsum("mf,tf->mt", self.fb, power) + 1e-6)
        return {k: v for k, v in s.items() if k not in ("wave", "rate")} | {"mel": mel.astype(np.float32)}


def normalize_mel(s: dict) -> dict:
    """Per-clip mean and variance normalization of each mel band (CMVN)."""
    m = s["mel"]
    return s | {"mel": ((m - m.mean(axis=1, keepdims=True)) / (m.std(axis=1, keepdims=True) + 1e-5)).astype(np.float32)}


@dataclass(frozen=True)
class SpecAugment:
    """SpecAugment masks: ``freq_masks`` bands of up to ``max_freq`` mel bins and ``time_masks``
    spans of up to ``max_time`` frames are set to zero (the normalized mean)."""

    freq_masks: int = 2
    max_freq: int = 8
    time_masks: int = 2
    max_time: int = 12

    def __call__(self, s: dict, rng: np.random.Generator) -> dict:
        m = s["mel"].copy()
        n_mels, frames = m.shape
        for _ in range(self.freq_masks):
            w = int(rng.integers(0, self.max_freq + 1))
            f0 = int(rng.integers(0, max(1, n_mels - w + 1)))
            m[f0:f0 + w, :] = 0.0
        for _ in range(self.time_masks):
            w = int(rng.integers(0, self.max_time + 1))
            t0 = int(rng.integers(0, max(1, frames - w + 1)))
            m[:, t0:t0 + w] = 0.0
        return s | {"mel": m}


@dataclass(frozen=True)
class RandomTimeCrop:
    """A random window of ``frames`` frames (zero-padded when the clip is shorter)."""

    frames: int

    def __call__(self, s: dict, rng: np.random.Generator) -> dict:
        m = s["mel"]
        if m.shape[1] < self.frames:
            m = np.pad(m, ((0, 0), (0, self.frames - m.shape[1])))
        t0 = int(rng.integers(0, m.shape[1] - self.frames + 1))
        return s | {"mel": np.ascontiguousarray(m[:, t0:t0 + self.frames])}


def audio_pipeline(store: Any, keys: list[str], labels: list[int], rate: int, n_mels: int, crop_frames: int,
                   batch: int, seed: int) -> Pipeline:
    return (Pipeline.from_storage(store, keys, meta=[{"label": int(lb)} for lb in labels], seed=seed)
            .map(decode_wav, reads=("data",), writes=("data", "wave", "rate"))
            .map(Resample(rate), name="resample", reads=("wave", "rate"), writes=("wave", "rate"))
            .map(LogMel(rate, n_mels=n_mels), name="log_mel", reads=("wave", "rate"), writes=("wave", "rate", "mel"))
            .map(normalize_mel, reads=("mel",), writes=("mel",))
            .map(SpecAugment(), name="spec_augment", random=True, reads=("mel",), writes=("mel",))
            .map(RandomTimeCrop(crop_frames), name="time_crop", random=True, reads=("mel",), writes=("mel",))
            .batch(batch))


# ----- the regime's pipeline: a chosen CPU cost per sample -------------------------------------

FEATURE_DIM = 256


@dataclass(frozen=True)
class Featurize:
    """A deterministic feature transform of a chosen cost: ``rounds`` rounds of elementwise math on a
    256-float vector seeded by the sample's id (no BLAS, so one core per process)."""

    rounds: int

    def __call__(self, s: dict) -> dict:
        x = np.random.default_rng(int(s["id"])).standard_normal(FEATURE_DIM).astype(np.float32)
        for _ in range(self.rounds):
            x = np.tanh(x * np.float32(1.01) + np.float32(0.05))
        return {"id": s["id"], "x": x, "label": int(s["id"]) % 10}


def jitter(s: dict, rng: np.random.Generator) -> dict:
    """A cheap random augmentation (redrawn every epoch)."""
    return {**s, "x": s["x"] + rng.normal(0.0, 0.01, s["x"].shape).astype(np.float32)}


def featurize_round_us(repeats: int = 5) -> float:
    """Microseconds one round of :class:`Featurize` costs here (median of ``repeats``)."""
    import time

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        Featurize(200)({"id": 1})
        times.append((time.perf_counter() - t0) / 200)
    return 1e6 * sorted(times)[len(times) // 2]


def cost_pipeline(n: int, rounds: int, batch: int, seed: int, first: int = 0) -> Pipeline:
    """``n`` samples (ids ``first`` onwards): a deterministic featurize of ``rounds`` rounds (the
    cacheable, offloadable per-sample CPU cost), a cheap random jitter, batches."""
    return (Pipeline.from_list([{"id": i} for i in range(first, first + n)], seed=seed)
            .map(Featurize(rounds), name="featurize", reads=("id",), writes=("id", "x", "label"))
            .map(jitter, name="jitter", random=True, reads=("x",), writes=("x",))
            .batch(batch))


# ----- the DataLoader baseline ------------------------------------------------------------------

def _torch_dataset_class():
    from torch.utils.data import IterableDataset, get_worker_info

    class PipelineDataset(IterableDataset):
        """The per-sample functions applied in the order written, on this worker's shard. The
        n-th pass over the dataset is epoch ``start_epoch + n``: with persistent workers each
        worker keeps its own copy and counts its passes, so the epoch that seeds the random
        operators advances in every process alike without any message from the main process.

        ``cache_ops`` > 0: the outputs of the first ``cache_ops`` operators (a deterministic
        prefix) are kept in this copy's memory once a pass over the shard completes, and later
        passes start from them, running only the operators after the prefix: tf.data's
        in-memory ``.cache()`` placed after the deterministic prefix. Each persistent worker
        caches its own shard (the shards are the same every epoch). Like tf.data's cache, a pass
        stopped early keeps nothing, and the operators after the prefix must not modify their
        inputs in place (the cached objects are reused)."""

        def __init__(self, refs, ops, seed: int, start_epoch: int = 0, cache_ops: int = 0):
            self.refs, self.ops, self.seed = refs, ops, seed
            self.start_epoch, self.passes = start_epoch, 0
            self.cache_ops, self.cached = cache_ops, None

        def __iter__(self):
            epoch = self.start_epoch + self.passes
            self.passes += 1
            info = get_worker_info()
            wid, nw = (info.id, info.num_workers) if info else (0, 1)
            items = (((i,), r) for i, r in enumerate(self.refs) if i % nw == wid)
            ops = self.ops
            if self.cache_ops:
                prefix, ops = ops[:self.cache_ops], ops[self.cache_ops:]
                items = iter(self.cached) if self.cached is not None else self._filling(prefix, items, epoch)
            for op in ops:
                items = apply_op(op, items, self.seed, epoch)
            for _, x in items:
                yield x

        def _filling(self, prefix, items, epoch: int):
            """The prefix's outputs, kept as they stream by; the cache is set when the pass completes."""
            for op in prefix:
                items = apply_op(op, items, self.seed, epoch)
            kept = []
            for item in items:
                kept.append(item)
                yield item
            self.cached = kept

    return PipelineDataset


def _one_thread(_worker_id: int) -> None:
    """worker_init_fn: one intra-op thread per worker process, so N workers use N cores."""
    import torch

    torch.set_num_threads(1)


class TorchLoader:
    """``torch.utils.data.DataLoader`` over the pipeline's per-sample functions, set up the way a
    careful user does: an IterableDataset applying them in the order written with round-robin
    shards per worker, torch's own batching and collation, ONE DataLoader kept across epochs
    (``persistent_workers=True``: workers start once, not every epoch), ``prefetch_factor``
    batches ready per worker, one torch thread per worker (``worker_init_fn``) and, while it
    iterates, one torch thread in the main process (collation of small batches gains nothing
    from intra-op threads and loses to them on a small machine). Workers fork, the Linux
    default (a Dask worker process would otherwise hand its 'spawn' setting down).

    ``cache=True``: the caching DataLoader, what a careful user writes for a pipeline run over several
    epochs (tf.data's ``.cache()`` placed after the deterministic prefix): the outputs of the
    pipeline's deterministic prefix (``deterministic_prefix``: the operators before the first random
    one) are kept in memory by each worker (or by the main process with ``num_workers=0``) after the
    first epoch, and later epochs run only the operators after it. ``cache_ops`` says how many.

        with TorchLoader(pipe, num_workers=2) as loader:
            for epoch in range(3):
                for batch in loader.epoch(): ...
    """

    def __init__(self, pipeline: Pipeline, num_workers: int, prefetch_factor: int = 4, start_epoch: int = 0,
                 cache: bool = False):
        import multiprocessing as mp

        from torch.utils.data import DataLoader

        ops = list(pipeline.ops)
        batch_op = ops[-1]
        if batch_op.kind != "batch" or not all(o.per_sample for o in ops[:-1]):
            raise ValueError("the DataLoader baseline needs per-sample operators followed by one batch")
        self.num_workers = num_workers
        self.cache_ops = deterministic_prefix(ops[:-1]) if cache else 0
        self.dataset = _torch_dataset_class()(pipeline.source.refs, ops[:-1], pipeline.seed, start_epoch, self.cache_ops)
        extra = {}
        if num_workers:
            extra = {"persistent_workers": True, "prefetch_factor": prefetch_factor, "worker_init_fn": _one_thread,
                     "multiprocessing_context": mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None}
        self.loader = DataLoader(self.dataset, batch_size=batch_op.size, num_workers=num_workers,
                                 drop_last=batch_op.drop_last, **extra)

    def epoch(self):
        """The batches of the next epoch (epoch ``start_epoch`` first)."""
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield from self.loader
        finally:
            torch.set_num_threads(threads)

    def close(self) -> None:
        """Stop the persistent workers now (otherwise when the loader is garbage collected)."""
        it = getattr(self.loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self.loader._iterator = None

    def __enter__(self) -> "TorchLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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

