"""The parameters every member system shares, and their smoke and full presets (pure)."""
from __future__ import annotations

from pydantic import Field, model_validator

from mlsys_flows.systems.common.params import SystemParams


class HarnessParams(SystemParams):
    """Parameters every member system shares (workload, model, training, parity)."""

    samples: int = Field(40_000, ge=256, le=50_000_000, description="Training samples (a fixed split; the test set follows them).")
    test_samples: int = Field(10_000, ge=256, le=5_000_000, description="Held-out samples for test logloss and AUC.")
    num_tables: int = Field(26, ge=2, le=256, description="Sparse features, one embedding table and one id per sample each (Criteo: 26).")
    rows_max: int = Field(10_000, ge=16, le=50_000_000, description="Rows of the largest table; the others follow Criteo Kaggle's table "
                          "sizes compressed on a log scale.")
    coverage: float = Field(0.5, gt=0, le=1, description="Share of a large table's rows (over 1000 rows) that hashing can reach.")
    hot_share: float = Field(0.76, gt=0.07, lt=1, description="Skew: share of a table's accesses taken by its hottest 7% of rows (Zipf calibrated).")
    signal: float = Field(1.5, gt=0, le=10, description="Standard deviation of the hidden logistic model's summed row effects (label signal).")
    dense_features: int = Field(13, ge=1, le=512, description="Dense float features (Criteo: 13).")
    embedding_dim: int = Field(32, ge=2, le=512, description="Embedding dimension (also the bottom MLP output).")
    batch_size: int = Field(1024, ge=8, le=65_536, description="Samples per mini-batch.")
    epochs: int = Field(2, ge=1, le=100, description="Training epochs, the same for every variant.")
    lr: float = Field(0.05, gt=0, le=10, description="SGD learning rate of the dense (MLP) parameters.")
    emb_lr: float = Field(0.02, gt=0, le=10, description="Row-wise Adagrad learning rate of the embedding rows (in either tier).")
    evals_per_epoch: int = Field(4, ge=1, le=100, description="Test evaluations per epoch (not timed); time to a logloss is interpolated between them.")
    profile_fraction: float = Field(0.05, gt=0, le=1, description="Share of the training inputs profiled to find the hot rows.")
    hot_budget_mb: float = Field(0.5, gt=0, le=1e6, description="Fast-tier memory budget for hot rows, in MB of float32 rows.")
    fae_phases: int = Field(4, ge=1, le=10_000, description="FAE: hot/cold phase pairs per epoch (two hot-row syncs each).")
    parity_gap: float = Field(0.003, gt=0, le=1, description="Largest allowed test-logloss gap of any variant to the hybrid baseline; "
                              "the run fails when it is exceeded.")
    train_threads: int = Field(1, ge=1, le=64, description="torch CPU threads of the trainer (1 is steadier on a shared CPU).")

    @model_validator(mode="after")
    def _consistent(self) -> "HarnessParams":
        if self.samples < 2 * self.batch_size:
            raise ValueError(f"samples ({self.samples}) must be at least two batches (batch_size {self.batch_size})")
        if self.profile_fraction * self.samples < 1:
            raise ValueError("profile_fraction x samples profiles no input")
        return self


SMOKE = dict(samples=5_000, test_samples=1_000, rows_max=2_000, batch_size=512, epochs=1, evals_per_epoch=2,
             hot_budget_mb=0.1, parity_gap=0.02, embedding_dim=16, fae_phases=2)
FULL = dict(samples=2_000_000, test_samples=200_000, rows_max=2_000_000, embedding_dim=64, batch_size=4096, epochs=2,
            hot_budget_mb=64.0, fae_phases=8)

__all__ = ["HarnessParams", "SMOKE", "FULL"]
