"""cedar (arXiv:2401.08895): composable input pipelines with a profiler and an optimizer (pure).

Library: :class:`Pipeline` (sources, map/filter/flat_map/batch/shuffle, marks), ``optimize()``
(reorder, fuse, cache, offload, prefetch; every decision logged), ``explain()``.
Benchmark: an image and a text pipeline, each run with torch DataLoader (best num_workers),
cedar as written and cedar optimized on the same data.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from mlsys_flows.systems.cedar.api import Pipeline
from mlsys_flows.systems.cedar.pipeline import DirStore, OperatorError, WorkerDied
from mlsys_flows.systems.common.params import SystemParams
from mlsys_flows.systems.common.spec import Claim, SystemSpec


class Params(SystemParams):
    SYSTEM: ClassVar[str] = "cedar"
    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "smoke": {"n_images": 32, "image_size": 64, "crop_size": 48, "n_docs": 200, "epochs": 2,
                  "profile_samples": 12, "workers_grid": [0, 1]},
        "quick": {},
        "full": {"n_images": 20000, "image_size": 256, "crop_size": 224, "n_docs": 200000, "epochs": 5,
                 "profile_samples": 128},
    }

    n_images: int = Field(320, ge=8, le=1_000_000, description="PNG images generated for the image pipeline.")
    image_size: int = Field(160, ge=16, le=2048, description="Side of the generated square images, pixels.")
    crop_size: int = Field(128, ge=8, le=2048, description="Side of the random crop, pixels (<= image_size).")
    unlabelled_fraction: float = Field(0.3, ge=0.0, le=0.9, description="Fraction of images without a label "
                                       "(label -1), dropped by the pipeline's filter.")
    n_docs: int = Field(8000, ge=8, le=10_000_000, description="Documents in the text pipeline's parquet file.")
    doc_words: int = Field(90, ge=2, le=4096, description="Mean words per document (log-normal lengths).")
    vocab_size: int = Field(8000, ge=16, le=1_000_000, description="Distinct words of the synthetic corpus.")
    min_tokens: int = Field(16, ge=1, le=8192, description="Documents with fewer tokens are filtered out.")
    max_tokens: int = Field(160, ge=2, le=8192, description="Documents with more tokens are filtered out; "
                            "the rest are padded to this length.")
    row_group_rows: int = Field(256, ge=1, le=1_000_000, description="Rows per parquet row group.")
    batch_size: int = Field(32, ge=1, le=4096, description="Samples per batch in both pipelines.")
    epochs: int = Field(3, ge=1, le=100, description="Passes over the data per measured run.")
    profile_samples: int = Field(32, ge=4, le=10_000, description="Source items the profiler runs.")
    workers_grid: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1, max_length=8,
                                    description="DataLoader num_workers tried; the fastest is the baseline.")
    cache: Literal["local", "storage"] = Field("local", description="Where cedar caches a deterministic prefix: "
                                               "local disk of the worker, or the run's ObjectStorage.")

    @model_validator(mode="after")
    def _check(self) -> "Params":
        if self.crop_size > self.image_size:
            raise ValueError(f"crop_size ({self.crop_size}) must be <= image_size ({self.image_size})")
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        if any(w < 0 or w > 64 for w in self.workers_grid):
            raise ValueError(f"workers_grid values must be in 0..64 (got {self.workers_grid})")
        return self


def make_workload(p: Params, store: Any, prefix: str) -> dict:
    """Write the PNGs and the parquet corpus to ``store`` (anything with write_bytes and
    write_parquet, e.g. ObjectStorage); returns the manifest the pipelines are built from."""
    import pyarrow as pa

    from mlsys_flows.systems.cedar.workloads import encode_png, make_documents, make_image, make_vocabulary

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
    return {"images": keys, "labels": labels, "text": text_key, "vocab": vocab}


def pipelines(p: Params, store: Any, manifest: dict) -> dict:
    """name -> builder(limit) of the benchmark pipelines over the manifest's data."""
    from mlsys_flows.systems.cedar.workloads import image_pipeline, text_pipeline

    def image(limit: int | None) -> Pipeline:
        n = limit or len(manifest["images"])
        return image_pipeline(store, manifest["images"][:n], manifest["labels"][:n], p.crop_size, p.batch_size, p.seed)

    def text(limit: int | None) -> Pipeline:
        pipe = text_pipeline(store, manifest["text"], manifest["vocab"], p.min_tokens, p.max_tokens, p.batch_size, p.seed)
        if limit:  # the first row groups holding ~limit rows
            groups = max(1, -(-limit // p.row_group_rows))
            pipe = Pipeline(replace(pipe.source, refs=pipe.source.refs[:groups]), pipe.ops, pipe.seed)
        return pipe

    return {"image": image, "text": text}


__all__ = ["Params", "Pipeline", "DirStore", "OperatorError", "WorkerDied", "make_workload", "pipelines"]


PIPELINES = ("image", "text")


def _per_pipeline(name: str) -> tuple[Claim, ...]:
    return (Claim("samples_per_s", f"{name}/dataloader", f"{name}/cedar_optimized", "higher", 2.74,
                  f"{name} pipeline; the paper's 2.74x is its average over six pipelines"),
            Claim("samples_per_s", f"{name}/dataloader", f"{name}/cedar", "higher",
                  statement=f"{name} pipeline, cedar as written (no optimization)"),
            Claim("samples_per_s", f"{name}/cedar", f"{name}/cedar_optimized", "higher",
                  statement=f"{name} pipeline, what the optimizer adds"))


SPEC = SystemSpec(
    name="cedar", title="cedar: composable, optimized ML input pipelines", paper="arXiv:2401.08895",
    family="input-data", params=Params, baselines=("dataloader", "cedar"),
    claims=(Claim("samples_per_s", "dataloader", "cedar_optimized", "higher", 2.74,
                  "2.74x vs PyTorch DataLoader (average of six pipelines); 2.49x vs tf.data, 2.18x vs Ray Data",
                  headline=True),
            *(c for name in PIPELINES for c in _per_pipeline(name))),
)
