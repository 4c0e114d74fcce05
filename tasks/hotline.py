"""Prefect tasks of the hotline flow: the family's dataset, training and regime tasks
(tasks/recsys_embeddings.py) with hotline's variants."""
from __future__ import annotations

from mlsys_flows.systems.hotline import REGIME_VARIANTS, VARIANTS
from mlsys_flows.tasks.recsys_embeddings import make_dataset, regime, train

__all__ = ["VARIANTS", "REGIME_VARIANTS", "make_dataset", "train", "regime"]
