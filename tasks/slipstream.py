"""Prefect tasks of the slipstream flow: the family's dataset and training tasks (tasks/recsys_embeddings.py)
with slipstream's variants."""
from __future__ import annotations

from mlsys_flows.tasks.recsys_embeddings import make_dataset, train

VARIANTS = ["hybrid", "fae", "hotline", "slipstream"]
__all__ = ["VARIANTS", "make_dataset", "train"]
