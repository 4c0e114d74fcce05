"""The harness every system flow shares.

A system module writes only its body: ``@system_flow("name")`` on a function that takes a
:class:`RunContext` and returns a :class:`SystemResult`. The harness makes the Prefect flow
users deploy (parameters ``scale``, ``overrides``, ``storage``, ``cluster``), validates the
parameters before any work, runs the body as a subflow on the cluster's ``DaskTaskRunner``,
builds the RunReport with the headline oriented by the registry's claim, and publishes it.
"""
from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from mlsys_flows import registry
from mlsys_flows.blocks import CheckpointStore, DaskCluster, ObjectStorage, ResourcePool
from mlsys_flows.runtime import shared_api
from mlsys_flows.systems.common.environment import capture
from mlsys_flows.systems.common.params import ParamsError, SystemParams
from mlsys_flows.systems.common.report import Curve, Ratio, RunReport
from mlsys_flows.tasks.common import publish_report


@dataclass
class SystemResult:
    """What a system body measured. ``variants`` maps each variant (technique and baselines) to
    its metrics; the registry claim's metric must be present for its baseline and technique."""

    variants: dict[str, dict[str, float]]
    ratios: list[Ratio] = field(default_factory=list)
    curves: list[Curve] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Metrics that depend only on the parameters and seed (counts, bytes, losses): equal in every
    # run with the same parameters, a worker fault included. None: every metric whose name does
    # not look timing-derived (see ``timing_metric``).
    deterministic: set[str] | None = None


# Name parts of metrics derived from clocks (times, rates, throughputs); they differ run to run.
_TIMING_PARTS = {"s", "ms", "us", "ns", "sec", "secs", "seconds", "time", "times", "latency", "throughput",
                 "speedup", "wall", "elapsed", "duration", "qps", "rps", "tps", "util", "utilization",
                 "overhead", "stall", "idle", "busy", "bandwidth", "gbps", "mbps", "flops", "gflops", "tflops"}


def timing_metric(name: str) -> bool:
    """True for metric names like samples_per_s, time_to_target_s, p99_latency_ms, throughput."""
    return any(part in _TIMING_PARTS for part in re.split(r"[^a-z0-9]+", name.lower()))


def deterministic_metrics(result: SystemResult) -> list[str]:
    names = {m for metrics in result.variants.values() for m in metrics}
    chosen = result.deterministic if result.deterministic is not None else {m for m in names if not timing_metric(m)}
    return sorted(names & set(chosen))


_RUN_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass
class RunContext:
    spec: registry.SystemSpec
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

    def ratio(self, variants: dict[str, dict[str, float]], metric: str, baseline: str, technique: str,
              better: Literal["higher", "lower"], paper_ratio: float | None = None) -> Ratio:
        return Ratio.of(variants, metric, baseline, technique, better, paper_ratio)


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
            if run_key is not None and not _RUN_KEY.match(str(run_key)):
                raise ParamsError(name, "run_key", f"must be 1-128 letters, digits, '.', '_' or '-' (got {run_key!r})")
            store = resolve_storage(storage).check()
            dask_cluster = resolve_cluster(cluster)
            run_id = str(flow_run.get_id() or uuid.uuid4())
            ctx = RunContext(spec=spec, params=params, storage=store, cluster=dask_cluster,
                             gpus=ResourcePool(kind="gpu"), run_id=run_id, run_key=run_key)
            logger.info("%s at scale %s on %s cluster; storage %s", name, scale, dask_cluster.mode, store.root_url)
            started = time.perf_counter()
            with shared_api():
                result: SystemResult = inner.with_options(task_runner=dask_cluster.task_runner())(ctx)
            claim = spec.claim
            report = RunReport(
                system=name, title=spec.title, paper=spec.paper, scale=scale, run_id=run_id,
                parameters=params.model_dump(mode="json"), variants=result.variants,
                headline=Ratio.of(result.variants, claim.metric, claim.baseline, claim.technique,
                                  claim.better, claim.paper_ratio),
                ratios=result.ratios, curves=result.curves, notes=result.notes,
                deterministic_metrics=deterministic_metrics(result),
                environment=capture(), wall_time_s=time.perf_counter() - started)
            publish_report(report, store)
            h = report.headline
            logger.info("%s headline %s: %.3fx measured (paper %s)", name, h.metric, h.measured_ratio,
                        f"{h.paper_ratio:.2f}x" if h.paper_ratio else "n/a")
            return report.model_dump(mode="json")

        run.__name__ = name
        run.__doc__ = f"{spec.title} ({spec.paper}): {spec.claim.statement}. Runs the technique and its " \
                      f"baseline on the same workload and reports the measured ratio."
        return flow(name=name, description=run.__doc__, log_prints=True)(run)

    return decorate
