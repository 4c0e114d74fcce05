"""The headline's evaluated seeds (issue 45): every seed its own dataset, held-out set, target and training run
of the four trainers, so that the time to the held-out target is paired by seed and the verdict rests on
independent pairs (``verdict.MIN_PAIRS``). The calibration seeds, on which ``target_fraction`` is chosen
(:mod:`.calibrate`), are never evaluated. Pure: no prefect/dask imports."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from mlsys_flows.systems.common.params import ParamsError

from . import CALIBRATION_SEEDS, Params
from .pipeline import Batch, check_same_samples, heldout_target, table_batches, train_interleaved
from .sweep import ABLATION, HEADLINE_TRAINERS
from .workload import Schema, arrival_order, generate_split, logloss

__all__ = ["CALIBRATION_SEEDS", "evaluated_seeds", "heldout_refs", "seed_inputs", "train_seed"]


def evaluated_seeds(p: Params) -> list[int]:
    """The seeds the headline is evaluated on: ``p.seed``, ``p.seed + 1``, ... (``p.eval_seeds`` of them);
    ``p.seed``'s run is the one whose files, reader timings and curves the report shows. Raises
    ParamsError (field ``seed``) when one of them is a calibration seed: the flow checks it before any work."""
    seeds = [p.seed + i for i in range(p.eval_seeds)]
    taken = sorted(set(seeds) & set(CALIBRATION_SEEDS))
    if taken:
        raise ParamsError("recd", "seed", f"seed {p.seed} with eval_seeds {p.eval_seeds} evaluates calibration "
                          f"seed(s) {taken}: target_fraction was chosen on {list(CALIBRATION_SEEDS)}, which must "
                          "stay unseen")
    return seeds


def heldout_refs(labels: np.ndarray, prob: np.ndarray, fraction: float) -> dict[str, float]:
    """The held-out set's references: the base rate's logloss, the generator's own, and the target
    ``fraction`` of the way from the first to the second (properties of the held-out set alone)."""
    base = logloss(labels, np.full(len(labels), float(np.mean(labels))))
    bayes = logloss(labels, prob)
    return {"heldout_samples": int(len(labels)), "heldout_base_logloss": base, "heldout_bayes_logloss": bayes,
            "target_logloss": heldout_target(base, bayes, fraction)}


def seed_inputs(p: Params, trainers: Sequence[str] = HEADLINE_TRAINERS
                ) -> tuple[dict[str, list[Batch]], list[Batch], dict[str, float]]:
    """For ``p.seed``: each trainer's batches (in memory, the same preprocessing as the flow's files),
    the held-out batches and the held-out references."""
    train, held, prob = generate_split(p)
    arrival = arrival_order(train, p.seed)
    make = {"kjt": lambda: table_batches(arrival, p, dedup=False),
            "kjt_clustered": lambda: table_batches(train, p, dedup=False),
            "ikjt": lambda: table_batches(train, p, dedup=True),
            ABLATION: lambda: table_batches(arrival, p, dedup=True, adjacent=False)}
    batches = {n: make[n]() for n in trainers}
    refs = heldout_refs(held.column(Schema.of(p).label).to_numpy(), prob, p.target_fraction)
    return batches, table_batches(held, p, dedup=True), refs


def train_seed(p: Params, device: str = "cpu", trainers: Sequence[str] = HEADLINE_TRAINERS) -> dict[str, Any]:
    """One evaluated (or calibration) seed: the trainers on the same samples, taking turns, held-out logloss
    after every turn. Returns the seed, its held-out references and per trainer ``evals``, ``chunk_rates``
    and ``samples``."""
    batches, heldout, refs = seed_inputs(p, trainers)
    digest = check_same_samples(batches)
    out = train_interleaved(batches, p, device, heldout=heldout)
    return {"seed": p.seed, "digest": digest, **refs,
            "trainers": {n: {k: r[k] for k in ("evals", "chunk_rates", "samples")} for n, r in out.items()}}
