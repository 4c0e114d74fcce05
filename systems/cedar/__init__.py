"""cedar (arXiv:2401.08895): composable input pipelines with a profiler and an optimizer (pure).

Library: :class:`Pipeline` (sources, map/filter/flat_map/batch/shuffle, marks), ``optimize()``
(reorder, fuse, cache, offload, prefetch; every decision logged), ``explain()``.
Benchmark: an image, a text and an audio pipeline, each run with torch DataLoader (num_workers
chosen on a calibration split; the best in hindsight kept as an oracle; persistent workers), the
caching DataLoader (the deterministic prefix kept in memory after the first epoch, as tf.data's
.cache(); its num_workers calibrated too), cedar as written (the mechanism's ablation: the same
engine without the optimizer's rewrites) and cedar optimized on the same data. Regime: a synthetic
pipeline whose per-sample CPU cost is swept.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from mlsys_flows.systems.common.lazy import lazy_exports
from mlsys_flows.systems.common.params import SystemParams
from mlsys_flows.systems.common.spec import DIAGNOSTIC, Claim, Mechanism, Regime, SystemSpec

# the engine (numpy, pyarrow, worker processes) loads on first use, not with the spec
lazy_exports(__name__, {".api": ("Pipeline",), ".pipeline": ("DirStore", "OperatorError", "WorkerDied")})


class Params(SystemParams):
    SYSTEM: ClassVar[str] = "cedar"
    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "smoke": {"n_images": 32, "image_size": 64, "crop_size": 48, "n_docs": 200, "n_clips": 24, "epochs": 2,
                  "profile_samples": 12, "workers_grid": [0, 1], "calibrate_items": 8,
                  "regime_cost_us": [20.0, 1000.0], "regime_items": 32, "regime_repeats": 1,
                  "regime_work_ms": 5.0, "regime_calibrate_trials": 1},
        # a loss against the strongest of three deployable baselines needs 7 pairs (6 cannot decide it: the
        # Bonferroni level over 3 baselines needs every one of 7 pairs on one side); the time for them comes from
        # num_workers=1, which no quick run chose (0 or 2 on 2 cores). The pipelines (the defaults) are sized so
        # that optimize(), a fixed cost, is under a fifth of cedar optimized's run at 3 epochs (more epochs
        # would cost more: the epochs served from a cache are cheap for cedar and costly for the uncached
        # baselines, so a fifth needs fewer sample-epochs with more samples than with more epochs)
        "quick": {"repeats": 7, "workers_grid": [0, 2]},
        "full": {"n_images": 20000, "image_size": 256, "crop_size": 224, "n_docs": 200000, "n_clips": 20000,
                 "epochs": 5, "profile_samples": 128, "repeats": 7,
                 "regime_items": 20000, "regime_work_ms": 20000.0,
                 "regime_cost_us": [20.0, 200.0, 1000.0, 4000.0]},
    }

    n_images: int = Field(1600, ge=8, le=1_000_000, description="PNG images generated for the image pipeline.")
    image_size: int = Field(160, ge=16, le=2048, description="Side of the generated square images, pixels.")
    crop_size: int = Field(128, ge=8, le=2048, description="Side of the random crop, pixels (<= image_size).")
    unlabelled_fraction: float = Field(0.3, ge=0.0, le=0.9, description="Fraction of images without a label "
                                       "(label -1), dropped by the pipeline's filter.")
    n_docs: int = Field(20000, ge=8, le=10_000_000, description="Documents in the text pipeline's parquet file.")
    doc_words: int = Field(90, ge=2, le=4096, description="Mean words per document (log-normal lengths).")
    vocab_size: int = Field(8000, ge=16, le=1_000_000, description="Distinct words of the synthetic corpus.")
    min_tokens: int = Field(16, ge=1, le=8192, description="Documents with fewer tokens are filtered out.")
    max_tokens: int = Field(160, ge=2, le=8192, description="Documents with more tokens are filtered out; "
                            "the rest are padded to this length.")
    row_group_rows: int = Field(256, ge=1, le=1_000_000, description="Rows per parquet row group.")
    n_clips: int = Field(1600, ge=8, le=1_000_000, description="WAV clips generated for the audio pipeline.")
    clip_seconds: float = Field(1.0, ge=0.1, le=60.0, description="Mean clip duration, seconds (each clip "
                                "lasts 0.75-1.25 times this).")
    source_rate: int = Field(44100, ge=8000, le=192000, description="Sample rate of the generated clips, Hz.")
    target_rate: int = Field(16000, ge=4000, le=96000, description="Rate the audio pipeline resamples to, Hz.")
    n_mels: int = Field(64, ge=8, le=256, description="Mel bands of the log-mel spectrogram.")
    crop_frames: int = Field(80, ge=1, le=10_000, description="Spectrogram frames (10 ms each) of the random "
                             "time crop; shorter clips are zero-padded.")
    batch_size: int = Field(32, ge=1, le=4096, description="Samples per batch in every pipeline.")
    epochs: int = Field(3, ge=1, le=100, description="Passes over the data per measured run.")
    profile_samples: int = Field(32, ge=4, le=10_000, description="Source items the profiler runs.")
    workers_grid: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1, max_length=8,
                                    description="DataLoader num_workers tried (plain and caching); the fastest on "
                                    "the calibration split is each baseline's.")
    calibrate_items: int = Field(64, ge=1, le=1_000_000, description="Source items of the calibration split the "
                                 "DataLoader baselines' num_workers (plain and caching) are chosen on (timed apart, "
                                 "before the evaluated runs; text: the row groups holding about that many "
                                 "documents).")
    regime_cost_us: list[float] = Field(default_factory=lambda: [100.0, 400.0, 1000.0, 2000.0], min_length=2,
                                        max_length=16, description="Per-sample CPU costs (microseconds of a "
                                        "deterministic featurize, calibrated on the worker) of the regime sweep: a "
                                        "synthetic pipeline run by the DataLoader and the caching "
                                        "DataLoader (num_workers calibrated), cedar and cedar optimized, "
                                        "`regime_repeats` interleaved runs each.")
    regime_items: int = Field(2000, ge=8, le=1_000_000, description="Most samples of the regime sweep's pipeline "
                              "(at a cheap point; see regime_work_ms).")
    regime_work_ms: float = Field(750.0, ge=1.0, le=1e7, description="Featurize CPU time per epoch the regime "
                                  "aims at: each point runs min(regime_items, regime_work_ms / cost) samples (at "
                                  "least two batches), so a costly point is not a longer run than a cheap one. A point "
                                  "where optimize() is over a fifth of cedar optimized's run (median over the "
                                  "repeats) has no verdict: fixed-cost dominated.")
    regime_repeats: int = Field(7, ge=1, le=50, description="Interleaved runs of every variant at each regime "
                                "point (the first variant rotates).")
    regime_calibrate_trials: int = Field(3, ge=1, le=15, description="Whole runs of each num_workers candidate "
                                         "(plain and caching DataLoader) on a regime point's calibration split; the "
                                         "median is compared.")
    prefetch_factor: int = Field(4, ge=1, le=64, description="DataLoader batches each worker keeps ready "
                                 "(its workers persist across epochs).")
    cache: Literal["local", "storage"] = Field("local", description="Where cedar caches a deterministic prefix: "
                                               "local disk of the worker, or the run's ObjectStorage.")

    @field_validator("regime_cost_us")
    @classmethod
    def _costs(cls, v: list[float]) -> list[float]:
        if any(not 0 < c <= 1e6 for c in v) or len(set(v)) != len(v):
            raise ValueError("values must be distinct, each in (0, 1e6] microseconds")
        return sorted(v)

    @model_validator(mode="after")
    def _check(self) -> "Params":
        if self.crop_size > self.image_size:
            raise ValueError(f"crop_size ({self.crop_size}) must be <= image_size ({self.image_size})")
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        if any(w < 0 or w > 64 for w in self.workers_grid):
            raise ValueError(f"workers_grid values must be in 0..64 (got {self.workers_grid})")
        if self.target_rate > self.source_rate:
            raise ValueError(f"target_rate ({self.target_rate}) must be <= source_rate ({self.source_rate})")
        return self


def regime_items_at(p: Params, us: float) -> int:
    """Samples of the regime's pipeline at per-sample cost ``us``: about ``regime_work_ms`` of featurize
    per epoch, at most ``regime_items``, at least two batches."""
    return min(p.regime_items, max(2 * p.batch_size, round(p.regime_work_ms * 1e3 / us)))


def regime_builders(p: Params, rounds: dict[float, int]) -> tuple[Any, Any]:
    """(build(us, limit), calibrate(us)) of the regime's synthetic pipeline at per-sample cost ``us``
    (``rounds[us]`` featurize rounds): the evaluated pipeline, ``regime_items_at`` samples from id 0 with the
    run's seed; its calibration split, half as many other samples (ids from ``regime_items_at`` on) with
    another seed (seed + 1), so the loaders' num_workers is chosen on data the evaluated runs never see
    while worker start-up weighs about as it will there."""
    from mlsys_flows.systems.cedar.workloads import cost_pipeline

    def build(us: float, limit: int | None):
        return cost_pipeline(limit or regime_items_at(p, us), rounds[us], p.batch_size, p.seed)

    def calibrate(us: float):
        n = regime_items_at(p, us)
        return cost_pipeline(max(p.batch_size, n // 2), rounds[us], p.batch_size, p.seed + 1, first=n)

    return build, calibrate


def make_workload(p: Params, store: Any, prefix: str) -> dict:
    """Write the PNGs, the parquet corpus and the WAV clips to ``store`` (anything with
    write_bytes and write_parquet, e.g. ObjectStorage); returns the manifest the pipelines are
    built from."""
    import numpy as np
    import pyarrow as pa

    from mlsys_flows.systems.cedar.workloads import (encode_png, encode_wav, make_clip, make_documents, make_image,
                                                     make_vocabulary)

    rng = np.random.default_rng(p.seed)
    keys, labels = [], []
    for i in range(p.n_images):
        key = f"{prefix}/images/{i:06d}.png"
        store.write_bytes(key, encode_png(make_image(rng, p.image_size)))
        keys.append(key)
        labels.append(-1 if rng.random() < p.unlabelled_fraction else int(rng.integers(0, 10)))
    vocab = make_vocabulary(rng, p.vocab_size)
    docs = make_documents(rng, p.n_docs, vocab, p.doc_words)
    text_key = f"{prefix}/text/corpus.parquet"
    store.write_parquet(text_key, pa.table({"id": np.arange(p.n_docs), "text": docs}),
                        row_group_size=p.row_group_rows)
    clips, clip_labels = [], []
    for i in range(p.n_clips):
        key = f"{prefix}/audio/{i:06d}.wav"
        label = int(rng.integers(0, 10))
        seconds = p.clip_seconds * float(rng.uniform(0.75, 1.25))
        store.write_bytes(key, encode_wav(make_clip(rng, label, seconds, p.source_rate), p.source_rate))
        clips.append(key)
        clip_labels.append(label)
    return {"images": keys, "labels": labels, "text": text_key, "vocab": vocab, "clips": clips,
            "clip_labels": clip_labels}


def pipelines(p: Params, store: Any, manifest: dict) -> dict:
    """name -> builder(limit) of the benchmark pipelines over the manifest's data."""
    from mlsys_flows.systems.cedar.api import Pipeline
    from mlsys_flows.systems.cedar.workloads import audio_pipeline, image_pipeline, text_pipeline

    def image(limit: int | None) -> Pipeline:
        n = limit or len(manifest["images"])
        return image_pipeline(store, manifest["images"][:n], manifest["labels"][:n], p.crop_size, p.batch_size, p.seed)

    def text(limit: int | None) -> Pipeline:
        pipe = text_pipeline(store, manifest["text"], manifest["vocab"], p.min_tokens, p.max_tokens, p.batch_size, p.seed)
        if limit:  # the first row groups holding ~limit rows
            groups = max(1, -(-limit // p.row_group_rows))
            pipe = Pipeline(replace(pipe.source, refs=pipe.source.refs[:groups]), pipe.ops, pipe.seed)
        return pipe

    def audio(limit: int | None) -> Pipeline:
        n = limit or len(manifest["clips"])
        return audio_pipeline(store, manifest["clips"][:n], manifest["clip_labels"][:n], p.target_rate, p.n_mels,
                              p.crop_frames, p.batch_size, p.seed)

    return {"image": image, "text": text, "audio": audio}


__all__ = ["Params", "Pipeline", "DirStore", "OperatorError", "WorkerDied", "make_workload", "pipelines",
           "regime_builders", "regime_items_at"]


PIPELINES = ("image", "text", "audio")
# The aggregate variants ("dataloader", "cedar", "cedar_optimized") carry, per repeat, the geometric
# mean over PIPELINES of each pipeline's samples/s; a ratio of two such means is exactly the
# geometric mean of the per-pipeline ratios, the way the paper averages its pipelines.
GEOMEAN = "geomean_samples_per_s"
# cedar optimized's epochs without its optimize() (same runs, the fixed cost left out): a diagnostic variant, never
# a baseline nor deployable; its claim's statement starts with DIAGNOSTIC (the generated pages print it beside the
# headline's verdict)
OPTIMIZED_EPOCHS = "cedar_optimized_epochs"


def _per_pipeline(name: str) -> tuple[Claim, ...]:
    return (Claim("samples_per_s", f"{name}/dataloader", f"{name}/cedar_optimized", "higher", 2.74,
                  f"{name} pipeline; the paper's 2.74x is its average over six pipelines"),
            Claim("samples_per_s", f"{name}/dataloader", f"{name}/cedar", "higher",
                  statement=f"{name} pipeline, cedar as written (no optimization)"),
            Claim("samples_per_s", f"{name}/cedar", f"{name}/cedar_optimized", "higher",
                  statement=f"{name} pipeline, what the optimizer adds"),
            Claim("samples_per_s", f"{name}/dataloader_cached", f"{name}/cedar_optimized", "higher",
                  statement=f"{name} pipeline, vs the caching DataLoader"))


SPEC = SystemSpec(
    name="cedar", title="cedar: composable, optimized ML input pipelines", paper="arXiv:2401.08895",
    family="input-data", params=Params,
    baselines=("dataloader", "dataloader_cached", "cedar", "dataloader_oracle"),
    # dataloader: num_workers chosen on a calibration split, the paper's baseline; dataloader_cached: the same
    # loader caching its deterministic prefix in memory after the first epoch (tf.data's .cache() placed by a
    # careful user), num_workers chosen on the same split; cedar as written needs no tuning;
    # dataloader_oracle: the best num_workers of the plain loader in the evaluated runs themselves (hindsight)
    roles={"dataloader": ("paper", "deployable"), "dataloader_cached": ("deployable",), "cedar": ("deployable",),
           "dataloader_oracle": ("oracle",)},
    mechanism=Mechanism("cedar's optimizer: profile-driven reordering, fusion, caching of the deterministic "
                        "prefix and offload to worker processes (cost model plus a measured trial)", "cedar",
                        "cedar is the same pipeline on cedar's engine as written, with no rewrite: it keeps the "
                        "operators, the engine and its batching and removes only the optimizer's plan (its time has "
                        "no profiling either)"),
    regime=Regime("per_sample_cpu_us", unit="us per sample",
                  paper_source="the paper gives no single per-sample cost; its six pipelines (image, text, audio, "
                               "speech) span light to heavy preprocessing",
                  statement="the optimizer pays fixed costs (profiling, an offload trial, starting workers, writing "
                            "the cache); its gains (offload across the cores, the cache over epochs) scale with the "
                            "per-sample CPU cost, so it loses on cheap pipelines and may win on costly ones; a "
                            "caching DataLoader gets the cache's gain too, so against it the optimizer adds only "
                            "its reordering and where it places the work; on this machine's 2 cores offload alone "
                            "is capped near 2x"),
    # every metric is timed, and the DataLoader's num_workers is chosen by timing the candidates
    kinds={GEOMEAN: "measured", "samples_per_s": "measured", "seconds": "measured", "num_workers": "measured",
           **{f"optimize_share_{name}": "measured" for name in ("image", "text", "audio")}},
    claims=(Claim(GEOMEAN, "dataloader", "cedar_optimized", "higher", 2.74,
                  "2.74x vs PyTorch DataLoader, averaged over six pipelines (here the geometric mean of the "
                  "per-pipeline ratios over the image, text and audio pipelines); 2.49x vs tf.data, 2.18x vs Ray Data",
                  headline=True),
            Claim(GEOMEAN, "cedar", "cedar_optimized", "higher",
                  statement="what the optimizer adds, geometric mean over the pipelines"),
            Claim(GEOMEAN, "dataloader_cached", "cedar_optimized", "higher",
                  statement="vs the caching DataLoader (its deterministic prefix cached in memory after the first "
                            "epoch, as tf.data's .cache()), geometric mean over the pipelines"),
            # diagnostic only (not deployable: a real job pays optimize()): cedar optimized's epochs alone, paired
            # by repeat with the caching DataLoader's whole runs; what the verdict would be without the fixed cost
            Claim(GEOMEAN, "dataloader_cached", OPTIMIZED_EPOCHS, "higher",
                  statement=f"{DIAGNOSTIC}: cedar optimized's epochs without optimize() (its profiling, trials and "
                            "worker start-up left out) vs the caching DataLoader's whole run, geometric mean over "
                            "the pipelines"),
            *(c for name in PIPELINES for c in _per_pipeline(name))),
)
