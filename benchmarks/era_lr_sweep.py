"""ERA: the learning-rate calibration of the flow, run alone (issue 50; first written for issue 31).

    .venv/bin/python -m benchmarks.era_lr_sweep                       # the quick preset's grids and budget
    .venv/bin/python -m benchmarks.era_lr_sweep --calibration-seeds 3 # more training seeds per rate

The ERA flow calibrates each RL variant's PPO learning rate per level before the evaluated run
(``systems/era/calibrate.py``) and lists the sweep in the report's notes. This script runs the same
calibration with the same rule alone, e.g. with more calibration seeds than the preset, and writes it
out: for each variant, level and rate of the variant's grid, ``calibration_seeds`` cells train at the
preset's RL budget on the tasks of generator seed ``seed + calibration_offset`` (never the evaluated
test set; overlaps with it are counted) and report held-out calibration success. The rule: the best
mean held-out success; ties go to the RL run's own training success over its last quarter, then its
shaped return there, then the middle rate. Success is ``counted`` (greedy episodes solved),
deterministic for given parameters (one torch thread). Writes benchmarks/results/era-lr-sweep.json.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from pathlib import Path

from mlsys_flows.systems.common.environment import capture
from mlsys_flows.systems.era import Params
from mlsys_flows.systems.era import calibrate as cal

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "era-lr-sweep.json"


def sweep(scale: str = "quick", **overrides) -> dict:
    p = Params.for_scale(scale, **overrides)
    started = time.perf_counter()
    cells = []
    for run in cal.runs(p):
        out = cal.run_one(p, *run)
        cells.append(out)
        print(f"{out['variant']:10s} lr {out['lr']:g} {out['level']:4s} seed {out['seed_index']}: held-out "
              f"calibration success {out['success_rate']:.3f}", flush=True)
    return {"what": "PPO learning rate per RL variant and level on calibration tasks (greedy success, counted)",
            "scale": scale, "rl_env_steps": p.rl_env_steps, "calibration_task_seed": p.seed + p.calibration_offset,
            "evaluated_seed": p.seed, "calibration_seeds": p.calibration_seeds,
            "grids": {v: cal.grid(p, v) for v in cal.RL_VARIANTS}, "cells": cells, "choice": cal.choose(p, cells),
            "overlap_with_evaluated_test_tasks": cal.overlap(p), "kind": "counted",
            "seconds": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", default="quick")
    ap.add_argument("--calibration-seeds", type=int, default=None, help="training seeds per level and rate")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    overrides = {} if a.calibration_seeds is None else {"calibration_seeds": a.calibration_seeds}
    env = capture("era")
    result = sweep(a.scale, **overrides)
    result |= {"created_at": dt.datetime.now(dt.timezone.utc).isoformat(), "environment": env.model_dump(mode="json")}
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    for variant, per_level in result["choice"].items():
        for lvl, c in per_level.items():
            table = ", ".join(f"{lr}: {m:.3f}" for lr, m in c["mean_success"].items())
            print(f"{variant} {lvl}: chose {c['lr']:g} by {c['by']}; mean held-out success {table}")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
