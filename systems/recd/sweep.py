"""How RecD's training gain depends on the model: the user/item lookup mix swept.

IKJT saves only on the features whose lists repeat within a batch (user features, constant within
a session); item features vary per sample and cost a KJT and an IKJT trainer the same. At each
point of ``mix_sweep`` the list lengths are re-chosen (:func:`workload.at_mix`) so that the given
share of all looked-up ids are user-feature ids, with the ids per sample held at the headline
workload's, and a short training run (``sweep_steps`` steps per trainer, a warm-up turn and one
turn per repeat) times the headline's three trainers on the same samples: the paper's baseline
(KJT batches in arrival order), KJT batches clustered by session, and RecD (IKJT batches of the
clustered samples). Each point also counts its duplicated share (the share of a KJT trainer's
looked-up ids that the IKJT leaves out): the regime parameter of the report. Pure: no prefect/dask imports.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from mlsys_flows.systems.common.report import oriented_ratio

from . import Params
from .pipeline import check_same_samples, duplicated_share, table_batches, throughput_samples, train_interleaved
from .workload import Schema, arrival_order, at_mix, expected_user_share, generate, user_id_share


TRAINERS = ("kjt", "kjt_clustered", "ikjt")
# the headline run trains one more: the mechanism's ablation, the IKJT on arrival-order batches
# (every in-batch repeat found by hashing, but the samples not clustered by session)
ABLATION = "ikjt_arrival"
HEADLINE_TRAINERS = (*TRAINERS, ABLATION)


def variant_name(technique: str, share: float) -> str:
    """Report variant of one trainer at one sweep point, e.g. ``ikjt@mix0.75``."""
    return f"{technique}@mix{share:g}"


def mix_tables(p: Params, share: float) -> tuple[Params, pa.Table, pa.Table]:
    """(parameters at ``share``, clustered table, arrival-order table) of exactly
    ``sweep_steps * batch_size`` samples: the same rows in both orders."""
    samples = p.sweep_steps * p.batch_size
    q = at_mix(p, share, samples=samples)
    clustered = generate(q).slice(0, samples).combine_chunks()
    return q, clustered, arrival_order(clustered, q.seed)


def sweep_turn_steps(p: Params) -> int:
    """Steps per turn at a sweep point: ``sweep_steps`` in a warm-up turn plus one per repeat."""
    return max(1, p.sweep_steps // (p.repeats + 1))


def mix_point(p: Params, share: float, device: str = "cpu") -> dict[str, Any]:
    """One sweep point: the counted mix and each trainer's per-turn samples/s and losses."""
    q, clustered, arrival = mix_tables(p, share)
    q = type(q).model_validate({**q.model_dump(), "chunk_steps": sweep_turn_steps(p)})
    batches = dict(zip(TRAINERS, (table_batches(arrival, q, dedup=False), table_batches(clustered, q, dedup=False),
                                  table_batches(clustered, q, dedup=True))))
    digest = check_same_samples(batches)
    trained = train_interleaved(batches, q, device)
    out: dict[str, Any] = {"share": share, "user_id_share": user_id_share(clustered, Schema.of(q)),
                           "duplicated_share": duplicated_share(batches["kjt_clustered"], batches["ikjt"]),
                           "expected_share": expected_user_share(q), "user_list_len": q.user_list_len,
                           "item_list_len": q.item_list_len, "samples": clustered.num_rows, "digest": digest}
    for n, r in trained.items():
        out[n] = {"rates": throughput_samples(r["chunk_rates"], p.repeats), "losses": r["losses"]}
    return out


def ratio_points(points: list[dict[str, Any]], baseline: str = "kjt") -> dict[str, list[float]]:
    """Per point (in order): the counted share, the ratio of the median samples/s (ikjt over
    ``baseline``) and its min and max over the repeats (pairwise: the trainers take turns)."""
    out: dict[str, list[float]] = {"share": [], "ratio": [], "low": [], "high": []}
    for pt in points:
        k, i = pt[baseline]["rates"], pt["ikjt"]["rates"]
        pairwise = [oriented_ratio(a, b, "higher") for a, b in zip(k, i)]
        out["share"].append(pt["user_id_share"])
        out["ratio"].append(oriented_ratio(float(np.median(k)), float(np.median(i)), "higher"))
        out["low"].append(min(pairwise))
        out["high"].append(max(pairwise))
    return out
