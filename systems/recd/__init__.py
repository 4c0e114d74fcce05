"""RecD (arXiv 2211.05239): deduplicated recommendation training data.

Session-clustered storage plus the InverseKeyedJaggedTensor (IKJT), against the baseline of
arrival-order storage and KeyedJaggedTensor (KJT) batches. Pure: no prefect/dask imports.
"""
from __future__ import annotations

from typing import ClassVar

from pydantic import Field, ValidationInfo, field_validator, model_validator

from mlsys_flows.systems.common.params import SystemParams
from mlsys_flows.systems.common.spec import Claim, SystemSpec


class Params(SystemParams):
    SYSTEM: ClassVar[str] = "recd"
    PRESETS: ClassVar[dict] = {
        "smoke": dict(sessions=80, user_list_len=40, item_features=2, table_rows=5_000, embedding_dim=16,
                      batch_size=64, batches_per_row_group=4, chunk_steps=2),
        "quick": dict(),
        "full": dict(sessions=200_000, user_list_len=600, user_features=4, item_features=8, table_rows=5_000_000,
                     embedding_dim=128, batch_size=2048, chunk_steps=20),
    }

    sessions: int = Field(1_600, ge=1, le=5_000_000, description="User sessions generated (each yields session_min..session_max samples).")
    session_min: int = Field(8, ge=1, le=1024, description="Fewest samples of one session.")
    session_max: int = Field(16, ge=1, le=1024, description="Most samples of one session.")
    user_features: int = Field(2, ge=1, le=16, description="Sparse user features: id lists constant within a session.")
    user_list_len: int = Field(400, ge=1, le=8192, description="Mean length of a user-feature id list (uniform in [L/2, 3L/2]).")
    item_features: int = Field(4, ge=1, le=32, description="Sparse item features: short id lists that vary per sample.")
    item_list_len: int = Field(3, ge=1, le=256, description="Mean length of an item-feature id list.")
    dense_features: int = Field(13, ge=1, le=512, description="Dense float features (half per session, half per sample).")
    table_rows: int = Field(200_000, ge=16, le=50_000_000, description="Rows of each embedding table (ids are hashed into them).")
    embedding_dim: int = Field(64, ge=2, le=1024, description="Embedding dimension (also the bottom MLP output).")
    batch_size: int = Field(256, ge=8, le=65_536, description="Samples per training and preprocessing batch.")
    batches_per_row_group: int = Field(16, ge=1, le=4096, description="Parquet row-group size in batches.")
    lr: float = Field(0.01, gt=0, le=10, description="Adagrad learning rate (dense and sparse parameters).")
    chunk_steps: int = Field(5, ge=1, le=10_000, description="Training steps per turn when KJT and IKJT trainers alternate.")
    train_threads: int = Field(1, ge=1, le=256, description="torch CPU threads per trainer (1 is steadier on a shared CPU).")

    @field_validator("session_max")
    @classmethod
    def _session_range(cls, v: int, info: ValidationInfo) -> int:
        low = info.data.get("session_min")
        if low is not None and v < low:
            raise ValueError(f"must be at least session_min ({low})")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "Params":
        if self.sessions * self.session_min < self.batch_size:
            raise ValueError(f"sessions ({self.sessions}) x session_min ({self.session_min}) yields fewer samples "
                             f"than one batch (batch_size {self.batch_size})")
        return self


SPEC = SystemSpec(
    name="recd", title="RecD: deduplicated recommendation training data (IKJT)", paper="arXiv:2211.05239",
    family="input-data", params=Params, baselines=("kjt",),
    claims=(
        Claim("train_samples_per_s", "kjt", "ikjt", "higher", 2.48,
              "up to 2.48x training throughput, 1.79x preprocessing throughput, 3.71x storage efficiency",
              headline=True),
        Claim("stored_bytes", "kjt", "ikjt", "lower", 3.71, "3.71x storage efficiency"),
        Claim("preprocess_batches_per_s", "kjt", "ikjt", "higher", 1.79, "1.79x preprocessing throughput"),
        Claim("preprocess_batches_per_s", "kjt_clustered", "ikjt", "higher",
              statement="the reader's dedup alone, both reading the clustered file"),
    ),
)

__all__ = ["Params", "SPEC"]
