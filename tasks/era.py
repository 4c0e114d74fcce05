"""Prefect tasks of the ERA flow: the learning-rate calibration cells (one per variant, rate, level and
calibration seed), then one coarse task per (level, seed) that trains and evaluates the three variants
(prior learning, RL from scratch, prior + RL) with the calibration's learning rates and saves the full
result on storage."""
from __future__ import annotations

import json

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.era import Params, run_cell
from mlsys_flows.systems.era import calibrate as cal


@task(name="era-calibrate")
def calibrate(p: Params, variant: str, lr: float, level: str, seed_index: int) -> dict:
    """``variant`` with learning rate ``lr`` on the calibration tasks (never the evaluated test set):
    held-out calibration success and the RL run's own training success."""
    out = cal.run_one(p, variant, lr, level, seed_index)
    get_run_logger().info("calibration %s lr %g %s seed %d: held-out success %.3f", variant, lr, level, seed_index,
                          out["success_rate"])
    return out


@task(name="era-cell")
def train_and_evaluate(p: Params, level: str, seed_index: int, storage: ObjectStorage, key: str,
                       lrs: dict[str, float] | None = None) -> dict:
    """Prior learning, PPO from scratch and PPO from the prior on ``level`` with seed ``seed_index``
    (``lrs``: each RL variant's calibrated learning rate on this level); success on the held-out test
    tasks. The result (curves included) is also written at ``key``."""
    log = get_run_logger()
    out = run_cell(p, level, seed_index, lrs=lrs)
    storage.write_bytes(key, json.dumps(out).encode())
    prior = out.get("prior", {})
    log.info("%s seed %d: %d train / %d test tasks, %d demo steps (BC accuracy %.2f); success %s", level, seed_index,
             out["train_tasks"], out["test_tasks"], prior.get("demo_steps", 0), prior.get("bc_accuracy", float("nan")),
             ", ".join(f"{v} {r['success_rate']:.2f}" for v, r in out["variants"].items()))
    return out
