"""Prefect tasks of the ERA flow: one coarse task per (level, seed) trains and evaluates the three
variants (prior learning, RL from scratch, prior + RL) and saves the full result on storage."""
from __future__ import annotations

import json

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.era import Params, run_cell


@task(name="era-cell")
def train_and_evaluate(p: Params, level: str, seed_index: int, storage: ObjectStorage, key: str) -> dict:
    """Prior learning, PPO from scratch and PPO from the prior on ``level`` with seed ``seed_index``;
    success on the held-out test tasks. The result (curves included) is also written at ``key``."""
    log = get_run_logger()
    out = run_cell(p, level, seed_index)
    storage.write_bytes(key, json.dumps(out).encode())
    prior = out.get("prior", {})
    log.info("%s seed %d: %d train / %d test tasks, %d demo steps (BC accuracy %.2f); success %s", level, seed_index,
             out["train_tasks"], out["test_tasks"], prior.get("demo_steps", 0), prior.get("bc_accuracy", float("nan")),
             ", ".join(f"{v} {r['success_rate']:.2f}" for v, r in out["variants"].items()))
    return out
