"""DaskCluster: where a flow's tasks run. Embedded LocalCluster by default."""
from __future__ import annotations

import functools
import importlib
import ipaddress
from typing import Any, Callable
from urllib.parse import urlparse

from prefect.blocks.core import Block
from pydantic import Field, SecretStr, field_validator

from ._docs import DOCS_URL


class DaskCluster(Block):
    """The Dask cluster a flow's tasks run on, as a Prefect ``DaskTaskRunner``.

    Exactly one of three modes: an embedded ``LocalCluster`` (the default, nothing to set up);
    ``address`` of a running scheduler (``tcp://host:8786``); or ``cluster_class`` with
    ``cluster_kwargs`` for dask-kubernetes ``KubeCluster``, dask-cloudprovider or Coiled.
    Secrets the cluster class needs (a cloud token) go in ``cluster_secrets``: stored encrypted,
    shown masked, merged into ``cluster_kwargs`` only when the cluster starts. A TLS scheduler
    (``tls://``) takes the CA, certificate and key from Prefect Secret blocks (``tls_*_secret``:
    each holds the PEM text or a file path on the machine that runs the flow).

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
    cluster_kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of cluster_class "
                                                                          "(no secrets: see cluster_secrets).")
    cluster_secrets: dict[str, SecretStr] = Field(default_factory=dict, description="Secret keyword arguments of "
                                                  "cluster_class (a cloud token), merged into cluster_kwargs when "
                                                  "the cluster starts; stored encrypted, never shown.")
    client_kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the Dask Client, "
                                                                         "e.g. {'timeout': 60}.")
    tls_ca_secret: str | None = Field(default=None, description="Name of a Prefect Secret block holding the TLS CA "
                                                                "certificate (PEM text or a path), for tls:// schedulers.")
    tls_cert_secret: str | None = Field(default=None, description="Name of a Secret block holding this client's TLS "
                                                                  "certificate (PEM text or a path).")
    tls_key_secret: str | None = Field(default=None, description="Name of a Secret block holding this client's TLS "
                                                                 "private key (PEM text or a path).")
    worker_wait_s: float = Field(default=120.0, gt=0, description="Longest a run with a devices pool waits for a "
                                 "worker advertising the pool's resource before it fails (workers start late).")
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

    def is_remote(self) -> bool:
        """Whether its workers may run on other machines: a scheduler address other than loopback, or
        a cluster class other than LocalCluster."""
        if self.address:
            return not _loopback(urlparse(self.address).hostname)
        return bool(self.cluster_class) and self.cluster_class != "distributed.LocalCluster"

    def check_api_reachable(self, api_url: str | None) -> None:
        """Fail before any work when remote workers could not report to the Prefect API: its URL is
        loopback (``api_url`` None: the embedded API, on 127.0.0.1)."""
        if self.is_remote() and (api_url is None or _loopback(urlparse(api_url).hostname)):
            raise ValueError(f"cluster {self.address or self.cluster_class}: its workers run on other machines but "
                             f"the Prefect API is {api_url or 'the embedded one on 127.0.0.1'}, which only this "
                             f"machine reaches; start a server on an address the workers reach (`prefect server "
                             f"start --host 0.0.0.0`, with auth) and set PREFECT_API_URL=http://<this host's "
                             f"name>:4200/api, or run on the embedded LocalCluster (no cluster parameter)")

    def security(self):
        """``distributed.Security`` from the TLS Secret blocks; None when none is named."""
        # block field -> Security argument
        fields = {"tls_ca_secret": "tls_ca_file", "tls_cert_secret": "tls_client_cert",
                  "tls_key_secret": "tls_client_key"}
        named = {f: getattr(self, f) for f in fields if getattr(self, f)}
        if not named:
            return None
        missing = [f for f in ("tls_ca_secret", "tls_cert_secret") if f not in named]
        if missing:
            raise ValueError(f"TLS needs {' and '.join(missing)} too (a Secret block name each)")
        from distributed.security import Security
        from prefect.blocks.system import Secret

        values = {}
        for field, name in named.items():
            try:
                values[fields[field]] = str(Secret.load(name).get())
            except ValueError as exc:
                raise ValueError(f"{field}: no Secret block named {name!r}") from exc
        return Security(require_encryption=True, **values)

    def _cluster_spec(self) -> tuple[str, dict[str, Any]]:
        if self.cluster_class:
            module, _, attr = self.cluster_class.rpartition(".")
            try:
                getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError, ValueError):
                raise ValueError(f"cluster_class {self.cluster_class!r} cannot be imported; install its package "
                                 f"(dask-kubernetes, dask-cloudprovider, coiled)") from None
            return self.cluster_class, {**self.cluster_kwargs, **self._secret_kwargs()}
        # the scheduler's HTTP routes (health, metrics, /status) on a free loopback port, not on 8787,
        # which a second run or a user's own cluster holds ("Port 8787 is already in use"); /status is
        # the dashboard with bokeh installed, else distributed's page saying to install it: the link
        # DaskTaskRunner logs answers either way (without the dashboard it was a 404, issue 52)
        kwargs = {"n_workers": self.n_workers, "threads_per_worker": self.threads_per_worker,
                  "processes": self.processes, "dashboard_address": None,
                  "scheduler_kwargs": {"dashboard_address": "127.0.0.1:0", "dashboard": True}}
        if self.worker_resources:
            kwargs["resources"] = dict(self.worker_resources)
        return "distributed.LocalCluster", {**kwargs, **self.cluster_kwargs, **self._secret_kwargs()}

    def _secret_kwargs(self) -> dict[str, str]:
        return {k: v.get_secret_value() for k, v in self.cluster_secrets.items()}

    def task_runner(self, prepare_task: Callable[[Any], Any] | None = None):
        """A fresh ``prefect_dask.DaskTaskRunner`` for this cluster; ``prepare_task`` maps each task
        submitted to it first (the harness sets retries and timeouts there)."""
        client_kwargs = dict(self.client_kwargs)
        security = self.security()
        if security is not None:
            client_kwargs["security"] = security
        if self.address:
            return _runner_class()(address=self.address, client_kwargs=client_kwargs, prepare_task=prepare_task)
        cls, kwargs = self._cluster_spec()
        adapt = None
        if self.adapt_min is not None and self.adapt_max is not None:
            adapt = {"minimum": self.adapt_min, "maximum": self.adapt_max}
        return _runner_class()(cluster_class=cls, cluster_kwargs=kwargs, adapt_kwargs=adapt,
                               client_kwargs=client_kwargs, prepare_task=prepare_task)


def _loopback(host: str | None) -> bool:
    if not host or host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # a host name other than localhost
        return False
    return address.is_loopback or address.is_unspecified  # 0.0.0.0 in a URL reaches this machine only


@functools.cache
def _runner_class():
    """DaskTaskRunner that maps each submitted task through ``prepare_task`` (made on first use:
    importing the block must not import prefect_dask)."""
    from prefect_dask import DaskTaskRunner

    class PreparingTaskRunner(DaskTaskRunner):
        def __init__(self, *args: Any, prepare_task: Callable[[Any], Any] | None = None, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.prepare_task = prepare_task

        def submit(self, task, *args: Any, **kwargs: Any):
            return super().submit(self.prepare_task(task) if self.prepare_task else task, *args, **kwargs)

        def duplicate(self):
            copy = super().duplicate()
            copy.prepare_task = self.prepare_task
            return copy

    return PreparingTaskRunner
