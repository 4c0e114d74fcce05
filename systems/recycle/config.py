"""The configuration every real multi-rank ReCycle run shares (pure, no torch import)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunConfig:
    """The transformer stages and micro-batches a real multi-rank run trains (pairrun, failover)."""
    d_model: int = 128
    heads: int = 4
    micro_batch: int = 4
    seq: int = 64
    microbatches: int = 8                # per pipeline per iteration
    calibration_reps: int = 5            # timed repetitions of each operation before the plan is made
    seed: int = 0
