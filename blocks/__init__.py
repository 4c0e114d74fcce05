"""Prefect blocks shared by every flow. Register with ``prefect block register -m mlsys_flows.blocks``."""
from .checkpoint import CheckpointStore
from .cluster import DaskCluster
from .resources import ResourcePool
from .storage import ObjectStorage, StorageError

__all__ = ["ObjectStorage", "StorageError", "CheckpointStore", "DaskCluster", "ResourcePool"]
