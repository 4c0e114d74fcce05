"""DaskCluster: where a flow's tasks run. Embedded LocalCluster by default."""
from __future__ import annotations

import importlib
from typing import Any

from prefect.blocks.core import Block
from pydantic import Field, field_validator

from ._docs import DOCS_URL


class DaskCluster(Block):
    """The Dask cluster a flow's tasks run on, as a Prefect ``DaskTaskRunner``.

    Exactly one of three modes: an embedded ``LocalCluster`` (the default, nothing to set up);
    ``address`` of a running scheduler (``tcp://host:8786``); or ``cluster_class`` with
    ``cluster_kwargs`` for dask-kubernetes ``KubeCluster``, dask-cloudprovider or Coiled.

    Example:
        ```python
        from mlsys_flows.blocks import DaskCluster

        DaskCluster(address="tcp://10.0.0.5:8786").save("BLOCK_NAME")
        cluster = DaskCluster.load("BLOCK_NAME")
        runner = cluster.task_runner()
        ```
    """

    _block_type_name = "mlsys DaskCluster"
    _block_type_slug = "mlsys-dask-cluster"
    _documentation_url = DOCS_URL + "#daskcluster"
    _description = "An embedded LocalCluster, a scheduler address, or a cluster class (Kubernetes, cloud, Coiled)."

    address: str | None = Field(default=None, description="Address of an existing scheduler, e.g. tcp://127.0.0.1:8786.")
    cluster_class: str | None = Field(default=None, description="Import path of a cluster class, e.g. "
                                                                "dask_kubernetes.operator.KubeCluster.")
    cluster_kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of cluster_class.")
    n_workers: int = Field(default=2, ge=1, le=256, description="Workers of the embedded LocalCluster.")
    threads_per_worker: int = Field(default=1, ge=1, le=64, description="Threads per embedded worker.")
    processes: bool = Field(default=True, description="Embedded workers as processes (True) or threads in this process.")
    worker_resources: dict[str, float] = Field(default_factory=dict, description="Abstract resources of each embedded "
                                                                                 "worker, e.g. {'GPU': 1}.")
    adapt_min: int | None = Field(default=None, ge=0, description="With adapt_max: adaptive scaling lower bound.")
    adapt_max: int | None = Field(default=None, ge=1, description="With adapt_min: adaptive scaling upper bound.")
    warm_workers: bool = Field(default=True, description="When a run starts, import the flow's modules on every "
                                                         "worker at once, rather than on each worker's first task "
                                                         "(a cold worker stalls the run in the middle).")

    @field_validator("address")
    @classmethod
    def _check_address(cls, v: str | None) -> str | None:
        if v is not None and "://" not in v:
            raise ValueError(f"address must look like tcp://host:port (got {v!r})")
        return v

    @property
    def mode(self) -> str:
        return "address" if self.address else ("class" if self.cluster_class else "local")

    def _cluster_spec(self) -> tuple[str, dict[str, Any]]:
        if self.cluster_class:
            module, _, attr = self.cluster_class.rpartition(".")
            try:
                getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError, ValueError):
                raise ValueError(f"cluster_class {self.cluster_class!r} cannot be imported; install its package "
                                 f"(dask-kubernetes, dask-cloudprovider, coiled)") from None
            return self.cluster_class, dict(self.cluster_kwargs)
        kwargs = {"n_workers": self.n_workers, "threads_per_worker": self.threads_per_worker,
                  "processes": self.processes, "dashboard_address": None}
        if self.worker_resources:
            kwargs["resources"] = dict(self.worker_resources)
        return "distributed.LocalCluster", {**kwargs, **self.cluster_kwargs}

    def task_runner(self):
        """A fresh ``prefect_dask.DaskTaskRunner`` for this cluster."""
        from prefect_dask import DaskTaskRunner

        if self.address:
            return DaskTaskRunner(address=self.address)
        cls, kwargs = self._cluster_spec()
        adapt = None
        if self.adapt_min is not None and self.adapt_max is not None:
            adapt = {"minimum": self.adapt_min, "maximum": self.adapt_max}
        return DaskTaskRunner(cluster_class=cls, cluster_kwargs=kwargs, adapt_kwargs=adapt)
