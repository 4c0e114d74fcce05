"""How the held-out target's ``target_fraction`` is chosen: on calibration seeds, never the evaluated run.

For each calibration seed the two distinct trainings of the headline (KJT batches in arrival order, and
the IKJT batches of the clustered samples; ``kjt_clustered`` and ``ikjt_arrival`` repeat their math) run
with held-out evaluation after every turn, and each reports the largest fraction of the gap between the
base rate's held-out logloss and the generator's own that it closed. A declared ``target_fraction``
below the smallest of them is one every trainer reached on every calibration seed. Pure: no
prefect/dask imports. Run: ``python -m mlsys_flows.systems.recd.calibrate --scale quick --seeds 1 2``.
"""
from __future__ import annotations

import argparse

import numpy as np

from . import Params
from .pipeline import table_batches, train_interleaved
from .workload import Schema, arrival_order, generate_split, logloss


def fractions_closed(p: Params) -> dict[str, float]:
    """Per trainer ("kjt", "ikjt") of one seed: the largest share of the gap from the base rate's held-out
    logloss to the generator's own that its held-out logloss reached during the run."""
    train, held, prob = generate_split(p)
    labels = held.column(Schema.of(p).label).to_numpy()
    base = logloss(labels, np.full(len(labels), labels.mean()))
    bayes = logloss(labels, prob)
    batches = {"kjt": table_batches(arrival_order(train, p.seed), p, dedup=False),
               "ikjt": table_batches(train, p, dedup=True)}
    out = train_interleaved(batches, p, heldout=table_batches(held, p, dedup=True))
    return {n: (base - min(l for _, l in r["evals"])) / (base - bayes) for n, r in out.items()}


def main(argv: list[str] | None = None) -> dict[int, dict[str, float]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", default="quick")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args(argv)
    found = {}
    for seed in args.seeds:
        found[seed] = fractions_closed(Params.for_scale(args.scale, seed=seed))
        print(f"seed {seed}: " + ", ".join(f"{n} {f:.3f}" for n, f in found[seed].items()))
    print(f"smallest over trainers and seeds: {min(min(f.values()) for f in found.values()):.3f}")
    return found


if __name__ == "__main__":
    main()
