"""The harness every system flow shares.

A system module writes only its body: ``@system_flow("name")`` on a function that takes a
:class:`RunContext` and returns a :class:`SystemResult` (variants, every metric's kind, the samples
of repeated metrics, the assumptions of modelled ones). The harness makes the Prefect flow users
deploy (parameters ``scale``, ``overrides``, ``storage``, ``cluster``, ``run_key``), validates the
parameters before any work, runs the body as a subflow on the cluster's ``DaskTaskRunner``,
computes every claim of the system's spec into the RunReport (``build_report``), and publishes it.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Literal

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from mlsys_flows import registry
from mlsys_flows.flow_params import RUN_KEY
from mlsys_flows.blocks import CheckpointStore, DaskCluster, ObjectStorage, ResourcePool
from mlsys_flows.runtime import shared_api
from mlsys_flows.systems.common.environment import capture, load_average
from mlsys_flows.systems.common.params import ParamsError, SystemParams
from mlsys_flows.systems.common.report import SystemResult, build_report
from mlsys_flows.systems.common.spec import SystemSpec
from mlsys_flows.tasks.common import publish_report

__all__ = ["RunContext", "SystemResult", "system_flow"]


@dataclass
class RunContext:
    spec: SystemSpec
    params: Any  # the system's validated SystemParams subclass
    storage: ObjectStorage
    cluster: DaskCluster
    gpus: ResourcePool
    run_id: str
    # Names a resumable training run across flow runs; None (the default) means not resumable.
    run_key: str | None = None

    @property
    def checkpoints(self) -> CheckpointStore:
        """Checkpoints of this system on the run's storage. When ``run_key`` is set, a training
        task starts with ``ctx.checkpoints.resume(ctx.run_key, default)`` and saves with
        ``ctx.checkpoints.save(ctx.run_key, step, state)``, so a rerun with the same run key
        continues from the last complete checkpoint."""
        return CheckpointStore(storage=self.storage, prefix=f"checkpoints/{self.spec.name}")

    def key(self, *parts: str) -> str:
        """A storage key private to this run: runs/<system>/<run_id>/<parts...>."""
        return "/".join(["runs", self.spec.name, self.run_id, *parts])

    @property
    def repeats(self) -> int:
        """Samples of every timed metric, variants interleaved (the ``repeats`` parameter)."""
        return self.params.repeats


def resolve_storage(storage: str | ObjectStorage | None) -> ObjectStorage:
    if isinstance(storage, ObjectStorage):
        return storage
    return ObjectStorage.load(storage) if storage else ObjectStorage()


def resolve_cluster(cluster: str | DaskCluster | None) -> DaskCluster:
    if isinstance(cluster, DaskCluster):
        return cluster
    return DaskCluster.load(cluster) if cluster else DaskCluster()


def system_flow(name: str) -> Callable[[Callable[[RunContext], SystemResult]], Any]:
    spec = registry.get(name)
    params_model: type[SystemParams] = spec.params_model()

    def decorate(body: Callable[[RunContext], SystemResult]):
        inner = flow(name=f"{name}-body", validate_parameters=False, log_prints=True)(body)

        def run(scale: Literal["smoke", "quick", "full"] = "quick", overrides: dict[str, Any] | None = None,
                storage: str | ObjectStorage | None = None, cluster: str | DaskCluster | None = None,
                run_key: str | None = None) -> dict:
            logger = get_run_logger()
            params = params_model.for_scale(scale, **(overrides or {}))  # fails before any work
            if run_key is not None and not RUN_KEY.fullmatch(str(run_key)):
                raise ParamsError(name, "run_key", f"must be 1-128 letters, digits, '.', '_' or '-' (got {run_key!r})")
            store = resolve_storage(storage).check()
            dask_cluster = resolve_cluster(cluster)
            run_id = str(flow_run.get_id() or uuid.uuid4())
            ctx = RunContext(spec=spec, params=params, storage=store, cluster=dask_cluster,
                             gpus=ResourcePool(kind="gpu"), run_id=run_id, run_key=run_key)
            logger.info("%s at scale %s on %s cluster; storage %s", name, scale, dask_cluster.mode, store.root_url)
            environment = capture(name)
            started = time.perf_counter()
            with shared_api():
                result: SystemResult = inner.with_options(task_runner=dask_cluster.task_runner())(ctx)
            environment.load_after = load_average()
            report = build_report(spec, params=params.model_dump(mode="json"), result=result, run_id=run_id,
                                  environment=environment, wall_time_s=time.perf_counter() - started)
            publish_report(report, store)
            h = report.headline
            logger.info("%s headline %s: %s vs %s = %s (paper %s); vs strongest (%s): %s", name, h.metric,
                        h.technique, h.baseline, h.label(), f"{h.paper:.2f}x" if h.paper else "n/a",
                        h.vs_strongest.baseline, h.vs_strongest.label())
            return report.model_dump(mode="json")

        run.__name__ = name
        run.__doc__ = f"{spec.title} ({spec.paper}): {spec.headline.statement}. Runs the technique and its " \
                      f"baselines on the same workload and reports each claim's ratio."
        return flow(name=name, description=run.__doc__, log_prints=True)(run)

    return decorate
