"""DataStates-LLM (HPDC 2024): lazy asynchronous checkpointing, vs synchronous torch.save and an
eager asynchronous snapshot, on a real training loop. The savers are the CheckpointStore block's
(blocks/checkpoint.py); this package holds the training loop and the workload (torch imported lazily)."""
from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from mlsys_flows.systems.common.params import SystemParams
from mlsys_flows.systems.common.spec import Claim, SystemSpec

# variant -> (asynchronous, lazy); "none" trains without checkpoints (the floor every overhead is measured from)
MODES: dict[str, tuple[bool, bool] | None] = {
    "none": None, "sync": (False, False), "async_eager": (True, False), "async": (True, True)}
CHECKPOINTED = ("sync", "async_eager", "async")


class Params(SystemParams):
    SYSTEM: ClassVar[str] = "checkpoint"
    PRESETS: ClassVar[dict] = {
        "smoke": dict(width=768, depth=4, batch_size=32, steps=8, every=2),
        "quick": dict(width=2048, depth=4, batch_size=32, steps=12, every=4),
        "full": dict(width=4096, depth=8, batch_size=64, steps=40, every=5, repeats=5),
    }

    width: int = Field(2048, ge=16, le=16_384, description="Width of the MLP's square layers (its state is 3 x 4 x depth x width^2 bytes: fp32 weights and Adam's two moments).")
    depth: int = Field(4, ge=1, le=64, description="Linear layers of the MLP.")
    batch_size: int = Field(32, ge=1, le=65_536, description="Samples per training step.")
    steps: int = Field(12, ge=2, le=100_000, description="Optimizer steps of every training run.")
    every: int = Field(4, ge=1, le=100_000, description="Checkpoint after every N-th optimizer step.")
    keep_last: int = Field(2, ge=1, le=100, description="Checkpoints kept per training run (older ones are deleted after each save).")
    train_threads: int = Field(1, ge=1, le=64, description="torch threads of the training loop; the background flush runs beside them (2 cores here: 1).")

    @model_validator(mode="after")
    def _consistent(self):
        if self.every > self.steps:
            raise ValueError(f"every ({self.every}) must not exceed steps ({self.steps}): no checkpoint would be taken")
        return self

    @property
    def state_mb(self) -> float:
        from .train import state_bytes

        return state_bytes(self.width, self.depth) / 1e6


SPEC = SystemSpec(
    name="checkpoint", title="DataStates-LLM: lazy asynchronous checkpointing", paper="DataStates-LLM (HPDC 2024)",
    family="parallelism", params=Params, baselines=("sync", "async_eager"),
    claims=(
        Claim("stall_s_per_iter", "sync", "async", "lower", 48.0,
              "up to 48x faster checkpointing than state-of-the-art approaches (time checkpointing blocks "
              "training, per iteration)", headline=True),
        Claim("iter_time_s", "sync", "async", "lower", 2.2,
              "up to 2.2x faster end-to-end training than state-of-the-art checkpointing"),
        Claim("stall_s_per_iter", "async_eager", "async", "lower",
              statement="what the lazy copy (during the next forward/backward) saves over copying the snapshot "
                        "at save time"),
        Claim("iter_time_s", "async_eager", "async", "lower",
              statement="end-to-end iteration time, lazy vs eager snapshot"),
    ),
)

__all__ = ["Params", "SPEC", "MODES", "CHECKPOINTED"]
