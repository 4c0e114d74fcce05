"""How the held-out target's ``target_fraction`` is chosen: on calibration seeds, never an evaluated one.

For each calibration seed (``CALIBRATION_SEEDS``, 1000-1002: three, none of them evaluated) the two distinct
trainings of the headline (KJT batches in arrival order, and the IKJT batches of the clustered samples;
``kjt_clustered`` and ``ikjt_arrival`` repeat their math) run exactly as an evaluated seed does, with held-out
evaluation after every turn, and each reports the share of the gap between the base rate's held-out logloss
and the generator's own that the mean of its last ``FINAL_EVALS`` evaluations closed: where its curve
flattened, not its single best (noisy) point. The declared ``target_fraction`` is ``MARGIN`` times the
smallest of them: a target every trainer passed on every calibration seed with room to spare, so that the
crossing of the smoothed curve is not a noise dip. Pure: no prefect/dask imports.
Run: ``python -m mlsys_flows.systems.recd.calibrate --scale quick``.
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from . import CALIBRATION_SEEDS, Params
from .pipeline import FINAL_EVALS, SMOOTH_EVALS, samples_to_target, smoothed_evals

MARGIN = 0.5  # the target closes at most half of the smallest final-window share found on the calibration seeds
# what `python -m mlsys_flows.systems.recd.calibrate --scale quick` found at quick's parameters (lr 0.005, 800
# sessions, 2-step turns): the final-window shares per seed and trainer. quick's target_fraction is at most
# choose(QUICK_CALIBRATION); rerun and update both when a parameter of the training changes
QUICK_CALIBRATION = {1000: {"kjt": {"final": 0.085}, "ikjt": {"final": 0.056}},
                     1001: {"kjt": {"final": 0.156}, "ikjt": {"final": 0.105}},
                     1002: {"kjt": {"final": 0.046}, "ikjt": {"final": 0.061}}}
TRAINERS = ("kjt", "ikjt")  # the two distinct maths of the four trainers


FINAL_SHARE = 0.25  # the final window: the last quarter of the run's evaluations (at least FINAL_EVALS)


def closed(evals: list, base: float, bayes: float) -> dict[str, float]:
    """Shares of the gap base -> bayes closed by a held-out curve: over its final window (the mean of the last
    quarter of its evaluations, at least FINAL_EVALS of them) and at its smoothed best."""
    k = max(FINAL_EVALS, round(FINAL_SHARE * len(evals)))
    final = float(np.mean([l for _, l in evals[-k:]]))
    best = min(l for _, l in smoothed_evals(evals, SMOOTH_EVALS))
    return {"final": (base - final) / (base - bayes), "best_smoothed": (base - best) / (base - bayes)}


def fractions_closed(p: Params, runs: list | None = None) -> dict[str, dict[str, float]]:
    """Per trainer ("kjt", "ikjt") of one seed: the shares closed (:func:`closed`); the run is appended to
    ``runs`` when given."""
    from .seeds import train_seed  # seeds imports this package's Params; keep the import cheap

    run = train_seed(p, trainers=TRAINERS)
    if runs is not None:
        runs.append(run)
    return {n: closed(r["evals"], run["heldout_base_logloss"], run["heldout_bayes_logloss"])
            for n, r in run["trainers"].items()}


def choose(found: dict[int, dict[str, dict[str, float]]], margin: float = MARGIN) -> float:
    """The target fraction: ``margin`` times the smallest final-window share over trainers and seeds (raises
    ValueError where a trainer closed none of the gap: no target is safe then)."""
    low = min(f["final"] for per_seed in found.values() for f in per_seed.values())
    if low <= 0:
        raise ValueError(f"a calibration trainer closed none of the gap at the end of its run ({low:.3f}): "
                         "train longer or change lr before declaring a target")
    return margin * low


def check_reached(found_runs: list[dict], fraction: float) -> list[str]:
    """Which (seed, trainer) of ``found_runs`` (:func:`seeds.train_seed` records) never reach ``fraction`` on
    their smoothed curve: the misses a declared target would have there."""
    misses = []
    for run in found_runs:
        target = run["heldout_base_logloss"] - fraction * (run["heldout_base_logloss"] - run["heldout_bayes_logloss"])
        for n, r in run["trainers"].items():
            if samples_to_target(smoothed_evals(r["evals"]), target) is None:
                misses.append(f"seed {run['seed']} {n}")
    return misses


def main(argv: list[str] | None = None) -> dict[int, dict[str, dict[str, float]]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", default="quick")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(CALIBRATION_SEEDS))
    ap.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE", help="parameter overrides (e.g. lr=0.02)")
    ap.add_argument("--json", help="write every calibration run's held-out curves here")
    args = ap.parse_args(argv)
    overrides = dict(kv.split("=", 1) for kv in args.set)
    found, runs = {}, []
    for seed in args.seeds:
        # eval_seeds=1: a calibration seed is trained alone, exactly as one evaluated seed is
        found[seed] = fractions_closed(Params.for_scale(args.scale, **{**overrides, "seed": seed, "eval_seeds": 1}), runs)
        print(f"seed {seed}: " + ", ".join(f"{n} final {f['final']:.3f} (best smoothed {f['best_smoothed']:.3f})"
                                           for n, f in found[seed].items()), flush=True)
    fraction = choose(found)
    print(f"target_fraction = {MARGIN} x smallest final-window share = {fraction:.4f}; smoothed curves that never "
          f"reach it: {check_reached(runs, fraction) or 'none'}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(runs, fh)
    return found


if __name__ == "__main__":
    main()
