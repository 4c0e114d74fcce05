"""Prefect tasks of the vCache flow: build the two prompt streams, replay them through the caches."""
from __future__ import annotations

import io
import time

import numpy as np
from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.vcache import (Params, Stream, calibration, corpus_stream, evaluate_policies, evaluate_seed,
                                       paraphrase_corpus, regime_point)
from mlsys_flows.tasks.common import llm_client


def _save(storage: ObjectStorage, key: str, stream: Stream) -> str:
    buf = io.BytesIO()
    np.savez_compressed(buf, vectors=stream.vectors, labels=stream.labels, name=stream.name)
    storage.write_bytes(key, buf.getvalue())
    return key


def _load(storage: ObjectStorage, key: str) -> Stream:
    z = np.load(io.BytesIO(storage.read_bytes(key)))
    return Stream(z["vectors"], z["labels"], str(z["name"]))


@task(name="vcache-calibrate")
def calibrate(p: Params, i: int) -> dict[str, float]:
    """The deployable static thresholds for the evaluated stream of seed p.seed + i, chosen on held-out
    traffic of the same world."""
    out = calibration(p, i)
    get_run_logger().info("static thresholds calibrated on held-out traffic of seed %d: %s", p.seed + i, out)
    return out


@task(name="vcache-sphere-seed")
def sphere_seed(p: Params, i: int, thresholds: dict[str, float]) -> dict:
    """Every sphere variant on the evaluated stream of seed p.seed + i."""
    started = time.perf_counter()
    out = evaluate_seed(p, i, thresholds)
    log = get_run_logger()
    for v, m in out.items():
        if not v.startswith("_"):
            log.info("sphere seed %d %s: hit rate %.4f, error rate %.4f", p.seed + i, v, m["hit_rate"], m["error_rate"])
    log.info("sphere seed %d took %.1f s", p.seed + i, time.perf_counter() - started)
    return out


@task(name="vcache-regime")
def regime(p: Params, near_dup: float) -> dict:
    """One point of the regime sweep: vCache, its ablation and the calibrated static threshold at class
    confusion ``near_dup`` (the share of near-duplicate classes)."""
    out = regime_point(p, near_dup)
    get_run_logger().info("near_dup_share %.2f: %s", near_dup, {v: round(m["hit_rate"], 4) for v, m in out.items()})
    return out


@task(name="vcache-minilm-stream")
def minilm_stream(p: Params, storage: ObjectStorage, key: str) -> str:
    """Paraphrase prompts embedded by the real MiniLM model (loaded offline from its package), or by
    the configured OpenAI-compatible endpoint."""
    texts, labels = paraphrase_corpus(p.minilm_classes, p.minilm_per_class, p.zipf_s, p.seed)
    started = time.perf_counter()
    if p.embed_base_url:
        with llm_client(p.embed_base_url, p.embed_model, p.api_key_secret) as client:
            vecs = np.concatenate([client.embed(texts[i:i + 256]) for i in range(0, len(texts), 256)])
        embedder = f"{p.embed_model} at {p.embed_base_url}"
    else:
        from mlsys_flows.systems.common.text_embed import embed

        vecs = embed(texts)
        embedder = "MiniLM (packaged, offline)"
    get_run_logger().info("%s: embedded %d paraphrases of %d classes in %.1f s", embedder, len(texts),
                          len(np.unique(labels)), time.perf_counter() - started)
    storage.write_bytes(key.replace(".npz", "_texts.txt"), "\n".join(texts).encode())
    return _save(storage, key, corpus_stream(vecs, labels))


@task(name="vcache-replay")
def replay(p: Params, storage: ObjectStorage, key: str, which: str) -> dict:
    """Replay one stream through one policy family ('static' sweep or 'vcache' per delta)."""
    stream = _load(storage, key)
    started = time.perf_counter()
    out = evaluate_policies(stream, p, which)
    log = get_run_logger()
    for v, m in out.items():
        if not v.startswith("_"):
            log.info("%s %s: hit rate %.4f, error rate %.4f", stream.name, v, m["hit_rate"], m["error_rate"])
    log.info("%s %s replay took %.1f s", stream.name, which, time.perf_counter() - started)
    return out
