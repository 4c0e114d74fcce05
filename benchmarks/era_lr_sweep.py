"""ERA: the PPO learning rate of each RL variant, swept on validation tasks (issue 31's era item).

    .venv/bin/python -m benchmarks.era_lr_sweep                 # quick budget, both levels
    .venv/bin/python -m benchmarks.era_lr_sweep --seeds 2     # fewer training seeds

A careful user tunes RL from scratch as well as RL from the prior, on tasks other than the test set.
For each variant (``rl_scratch``, ``prior_rl``) and each learning rate of its grid, one ERA cell per
level and seed trains at the quick budget with the generator seed ``--validation-seed`` (its own
training and test tasks: none of the evaluated run's test tasks, which come from seed 0, are
used; overlaps are counted in the output) and reports validation success. The learning rate with
the best mean success over levels and seeds is the variant's choice; a tie keeps ``Params``' default
when it is among the best, else goes to the smaller rate (the gentler update). Success is ``counted`` (greedy episodes solved), deterministic for given
parameters (one torch thread), so the load of the machine does not change it. Writes
benchmarks/results/era-lr-sweep.json with the grid, every cell, the choices, the defaults of
``Params`` they are compared with, and the machine and code (git sha, era's code hash).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import time
from pathlib import Path

from mlsys_flows.systems.common.environment import capture
from mlsys_flows.systems.era import Params
from mlsys_flows.systems.era.episodes import task_signature, task_sets
from mlsys_flows.systems.era.run import run_cell

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "era-lr-sweep.json"
GRIDS = {"rl_scratch": (3e-4, 1e-3, 3e-3), "prior_rl": (1e-5, 3e-5, 1e-4, 3e-4)}
FIELD = {"rl_scratch": "lr_scratch", "prior_rl": "lr_prior_rl"}
LEVELS = ("high", "low")


def overlap(base: Params, validation: Params, level: str) -> int:
    """Validation test tasks that are also test tasks of the evaluated run (by signature)."""
    test = {task_signature(t) for t in task_sets(level, base.train_per_subset, base.test_per_subset, base.seed).test}
    val = task_sets(level, validation.train_per_subset, validation.test_per_subset, validation.seed).test
    return sum(task_signature(t) in test for t in val)


def sweep(validation_seed: int, seeds: int, scale: str = "quick") -> dict:
    base = Params.for_scale(scale)
    cells, started = [], time.perf_counter()
    for variant, grid in GRIDS.items():
        for lr in grid:
            p = Params.for_scale(scale, seed=validation_seed, **{FIELD[variant]: lr})
            for level in LEVELS:
                for k in range(seeds):
                    out = run_cell(p, level, k, variants=(variant,))
                    success = out["variants"][variant]["success_rate"]
                    cells.append({"variant": variant, "lr": lr, "level": level, "seed_index": k,
                                  "success_rate": success, "cpu_s": round(out["cpu_s"], 2)})
                    print(f"{variant:10s} lr {lr:g} {level:4s} seed {k}: validation success {success:.3f}",
                          flush=True)
    choice = {}
    for variant, grid in GRIDS.items():
        means = {lr: statistics.mean(c["success_rate"] for c in cells if c["variant"] == variant and c["lr"] == lr)
                 for lr in grid}
        best, default = max(means.values()), getattr(base, FIELD[variant])
        tied = [lr for lr, m in means.items() if m == best]
        choice[variant] = {"lr": default if default in tied else min(tied), "tied": len(tied) > 1,
                           "mean_success": means, "default": default}
    return {"what": "PPO learning rate per RL variant on validation tasks (greedy success, counted)",
            "scale": scale, "rl_env_steps": base.rl_env_steps, "validation_seed": validation_seed,
            "evaluated_seed": base.seed, "seeds": seeds, "grids": GRIDS, "cells": cells, "choice": choice,
            "overlap_with_evaluated_test_tasks": {
                lvl: overlap(base, Params.for_scale(scale, seed=validation_seed), lvl) for lvl in LEVELS},
            "kind": "counted", "seconds": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--validation-seed", type=int, default=1, help="generator seed of the validation tasks")
    ap.add_argument("--seeds", type=int, default=4, help="training seeds per level and learning rate")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    env = capture("era")
    result = sweep(a.validation_seed, a.seeds)
    result |= {"created_at": dt.datetime.now(dt.timezone.utc).isoformat(), "environment": env.model_dump(mode="json")}
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    for variant, c in result["choice"].items():
        table = ", ".join(f"{lr:g}: {m:.3f}" for lr, m in c["mean_success"].items())
        print(f"{variant}: chose {c['lr']:g} (default {c['default']:g}); mean validation success {table}")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
