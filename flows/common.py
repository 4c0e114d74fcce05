"""The harness every system flow shares.

A system module writes only its body: ``@system_flow("name")`` on a function that takes a
:class:`RunContext` and returns a :class:`SystemResult` (variants, every metric's kind, the samples
of repeated metrics, the assumptions of modelled ones). The harness makes the Prefect flow users
deploy (parameters ``scale``, ``overrides``, ``storage``, ``cluster``, ``run_key``), validates the
parameters before any work, runs the body in the same flow run with its tasks submitted to the
cluster's ``DaskTaskRunner`` (one run page holds the parameters, every task and the artifacts),
computes every claim of the system's spec into the RunReport (``build_report``), and publishes it.
"""
from __future__ import annotations

import functools
import logging
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import cloudpickle
from prefect import flow, get_run_logger
from pydantic import BaseModel
from prefect.context import FlowRunContext, TagsContext
from prefect.runtime import flow_run
from prefect.settings import PREFECT_API_URL
from prefect.utilities.callables import parameter_schema

from mlsys_flows import registry
from mlsys_flows.errors import MlsysError
from mlsys_flows.flow_params import PARAMETERS, RUN_KEY, schema_signature
from mlsys_flows.blocks import CheckpointStore, DaskCluster, ObjectStorage, ResourcePool
from mlsys_flows.runtime import quick_exit, shared_api, warm_workers
from mlsys_flows.settings import warm_cluster_address
from mlsys_flows.systems.common.environment import capture, load_average
from mlsys_flows.systems.common.params import ParamsError, SystemParams
from mlsys_flows.rendering import ratio_label, verdict_text
from mlsys_flows.systems.common.report import SystemResult, build_report
from mlsys_flows.systems.common.spec import SystemSpec
from mlsys_flows.tasks.common import publish_report, report_artifacts, with_policy
from mlsys_flows.platform.ranks import RanksFailed, RanksRun, run_ranks
from mlsys_flows.task_runs import crash_unfinished, echo_task_logs

__all__ = ["RunContext", "SystemResult", "system_flow"]

_log = logging.getLogger("mlsys_flows.flows")


@dataclass
class RunContext:
    spec: SystemSpec
    params: Any  # the system's validated SystemParams subclass
    storage: ObjectStorage
    cluster: DaskCluster
    run_id: str
    # The devices parameter's pool; None: device tasks run anywhere (see ``devices``, ``submit``).
    device_pool: ResourcePool | None = None
    # Names a resumable training run across flow runs; None (the default) means not resumable.
    run_key: str | None = None
    # each launch of torch.distributed ranks (``ranks``), recorded in the report's environment
    launches: list[dict[str, Any]] = field(default_factory=list)

    @property
    def checkpoints(self) -> CheckpointStore:
        """Checkpoints of this system on the run's storage. When ``run_key`` is set, a training
        task starts with ``ctx.checkpoints.resume(ctx.run_key, default)`` and saves through
        ``saver = ctx.checkpoints.saver(ctx.run_key)`` (``saver.save(step, state)``; pass
        ``asynchronous=True`` for a snapshot in host memory flushed in the background;
        ``saver.wait()`` at the end), so a rerun with the same run key
        continues from the last complete checkpoint."""
        return CheckpointStore(storage=self.storage, prefix=f"checkpoints/{self.spec.name}")

    def key(self, *parts: str) -> str:
        """A storage key private to this run: runs/<system>/<run_id>/<parts...>."""
        return "/".join(["runs", self.spec.name, self.run_id, *parts])

    @property
    def devices(self) -> ResourcePool:
        """The pool device tasks use: the ``devices`` parameter's block, else this machine's own
        devices of the kind the task asks for: its GPUs (a task falls back to the CPU with a warning
        where there is none), or for ``submit(..., device="fpga")`` its software FPGA board
        ``fpga-sw:0`` (``submit`` swaps this default pool for ``_LOCAL_FPGA``)."""
        # a worker's own devices: no shared slots (a killed run would hold one until its lease ends)
        return self.device_pool or ResourcePool(kind="gpu", name="local", limit_concurrency=False)

    def submit(self, task, *args: Any, device: Literal["gpu", "fpga"] | None = None, **kwargs: Any):
        """``task.submit(*args, **kwargs)`` on the run's cluster. ``device="gpu"`` (or ``"fpga"``) marks
        a device task: with a ``devices`` pool it carries the pool's Dask resource annotation, so only
        workers started with that resource run it. The task is passed ``ctx.devices`` and holds a
        device with ``with pool.claim() as device:`` (``per_task`` slots of the pool's Prefect
        concurrency limit and a device of this machine no other claim holds, the one to use)."""
        if device is None or self.device_pool is None:
            if device not in (None, "gpu", "fpga"):
                raise ParamsError(self.spec.name, "devices", f"task {task.name}: unknown device kind {device!r}")
            if device == "fpga":  # no pool: ctx.devices' local default becomes this machine's software board
                def local(a: Any) -> Any:
                    return _LOCAL_FPGA if isinstance(a, ResourcePool) and a == _LOCAL_GPU else a
                args, kwargs = tuple(map(local, args)), {k: local(v) for k, v in kwargs.items()}
            return task.submit(*args, **kwargs)
        pool = self.device_pool
        if pool.kind != device:
            raise ParamsError(self.spec.name, "devices", f"task {task.name} needs a {device} pool; "
                                                         f"{pool.name!r} is a {pool.kind} pool")
        with pool.annotate():
            return task.submit(*args, **kwargs)

    def ranks(self, fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 120.0,
              **kwargs: Any) -> RanksRun:
        """``fn(info, *args, **kwargs)`` as ``world_size`` torch.distributed ranks, one per worker of the
        run's cluster (``platform.ranks.run_ranks``: gloo, or nccl when every worker has a GPU); their
        results in rank order. Call it while no other task of the run occupies those workers (a rank
        queued behind one waits, and its peers time out after ``timeout_s``). The launch's world size,
        backend and workers go into the report's ``environment.distributed``."""
        runner = FlowRunContext.get().task_runner
        try:
            launch = run_ranks(runner.client, fn, world_size, *args, timeout_s=timeout_s, **kwargs)
        except RanksFailed as exc:  # recorded too: a launch that lost a rank on purpose is part of the run
            self.launches.append({"world_size": world_size, "backend": exc.backend, "workers": exc.workers,
                                  "launch_id": exc.launch_id, "store": exc.store,
                                  "lost_ranks": sorted(exc.lost), "failed_ranks": sorted(exc.failed)})
            raise
        self.launches.append(launch.describe())
        return launch

    def rank_workers(self, world_size: int, field: str, grow: bool = True) -> list[str]:
        """``world_size`` workers for a launch of ranks, in the order ranks take them: those holding
        the run's task results first, so that a launch that kills its last rank on purpose loses no
        result (Dask would recompute it during the launch). The embedded cluster grows to that many
        (new workers start idle and import the flow first); a cluster started elsewhere must have
        them (``ParamsError`` naming ``field`` otherwise). ``grow=False`` only checks, before any work:
        the embedded cluster passes (it grows when the launch comes)."""
        client = FlowRunContext.get().task_runner.client
        have = sorted(client.scheduler_info(n_workers=-1)["workers"])
        if len(have) < world_size and self.cluster.mode == "local" and getattr(client, "cluster", None) is not None:
            if not grow:
                return have
            _log.info("growing the embedded cluster from %d to %d workers for %d ranks", len(have), world_size,
                      world_size)
            client.cluster.scale(world_size)
            client.wait_for_workers(world_size, timeout=self.cluster.worker_wait_s)
            have = sorted(client.scheduler_info(n_workers=-1)["workers"])
        if len(have) < world_size:
            raise ParamsError(self.spec.name, field, f"needs {world_size} Dask workers (one rank each); the cluster "
                                                     f"has {len(have)}: start more workers or turn {field} off")
        held = client.has_what()
        return sorted(have, key=lambda w: (-len(held.get(w, ())), w))[:world_size]

    def keep_down(self, worker: str) -> None:
        """A worker of the embedded cluster that dies stays down for the rest of the run (its nanny
        does not restart it: a failed machine does not come back at once, and a restarting worker
        would take CPU from the survivors being timed). Other clusters keep their own policy."""
        if self.cluster.mode == "local":
            FlowRunContext.get().task_runner.client.run(_no_restart, workers=[worker], nanny=True)

    @property
    def repeats(self) -> int:
        """Samples of every timed metric, variants interleaved (the ``repeats`` parameter)."""
        return self.params.repeats


def _no_restart(dask_worker) -> None:
    dask_worker.close_gracefully(reason="a failed worker stays down for the rest of the run")


_LOCAL_GPU = ResourcePool(kind="gpu", name="local", limit_concurrency=False)
_LOCAL_FPGA = ResourcePool(kind="fpga", devices=["fpga-sw:0"], name="local", limit_concurrency=False)


def resolve_storage(storage: str | ObjectStorage | None) -> ObjectStorage:
    if isinstance(storage, ObjectStorage):
        return storage
    return ObjectStorage.load(storage) if storage else ObjectStorage()


def resolve_cluster(cluster: str | DaskCluster | None, shared: bool = True) -> DaskCluster:
    """The cluster named, else the warm one of the `mlsys-flows server` this run reports to (``shared``:
    the run may use a cluster other runs use too), else an embedded one."""
    if isinstance(cluster, DaskCluster):
        return cluster
    if cluster:
        return DaskCluster.load(cluster)
    address = warm_cluster_address(PREFECT_API_URL.value())
    if address and shared:
        return DaskCluster(address=address)
    if address:
        _log.info("this run kills or pins workers of its cluster on purpose: it starts one of its own instead of the "
                  "server's warm cluster at %s", address)
    return DaskCluster()


def resolve_devices(devices: str | ResourcePool | None) -> ResourcePool | None:
    if devices is None or isinstance(devices, ResourcePool):
        return devices
    return ResourcePool.load(devices)


def _pickle_by_value_if_loaded_from_a_file(body: Callable) -> None:
    module = sys.modules.get(body.__module__)
    if module is not None and not body.__module__.startswith("mlsys_flows."):
        cloudpickle.register_pickle_by_value(module)


@contextmanager
def tasks_on(cluster: DaskCluster, pool: ResourcePool | None = None, results: ObjectStorage | None = None,
             warm: str | None = None, task_timeout_s: float | None = None):
    """Tasks submitted inside this block run on ``cluster``, as task runs of the current flow run.

    The cluster is a run parameter, but a Prefect flow fixes its task runner when it is defined; so
    the harness enters the cluster's task runner itself and puts it in a copy of the flow run's
    context (``Task.submit`` reads the runner from there). No subflow: the run the user started
    shows every task. With ``results``, every task's result is persisted there (Prefect's result
    store): a task that finished on a worker lost later in the run is read back, not run again. With
    ``warm`` (a module, e.g. the flow's) and ``cluster.warm_workers``, every worker imports it first,
    also one that joins later (a worker plugin). Every task submitted gets the platform's retries on
    I/O failures and ``task_timeout_s`` (``tasks.common.with_policy``)."""
    run_context = FlowRunContext.get()
    if run_context is None:
        raise RuntimeError("tasks_on() needs a running flow")
    update: dict[str, Any] = {}
    if results is not None:
        update = {"persist_result": True, "result_store": run_context.result_store.model_copy(
            update={"result_storage": results, "metadata_storage": None})}
    runner = cluster.task_runner(prepare_task=functools.partial(with_policy, timeout_s=task_timeout_s))
    # Task runs do not inherit the run's tags ("cli", "system:<name>", a webhook's): Prefect gates a
    # task run that has tags on tag concurrency limits before it enters Running, and that gate waited
    # 2-2.5 s before about one serial task in four (measured, issue 42); the flow run keeps its tags.
    # workers that are not this process's children (a server's warm cluster) log to the API only: echo it
    echo = echo_task_logs(run_context.flow_run.id if cluster.mode != "local" else None)
    with runner, run_context.model_copy(update={"task_runner": runner, **update}), TagsContext(current_tags=set()), \
            echo:
        quick_exit(runner.client)
        if pool is not None:
            check_workers_have(runner, pool, cluster)
        if warm and cluster.warm_workers:  # every worker imports in parallel now, not when its first task comes
            warm_workers(runner.client, warm)
        try:
            yield runner
        except BaseException as exc:
            if not isinstance(exc, Exception):  # Ctrl-C, a termination signal: Prefect crashes only the flow run
                _crash_task_runs(run_context.flow_run.id, exc)
            raise


def _crash_task_runs(flow_run_id, exc: BaseException) -> None:
    try:
        n = crash_unfinished(flow_run_id, f"the flow run stopped ({type(exc).__name__}: {exc}) while this task ran")
    except Exception as err:  # noqa: BLE001 - the API may be going down too; the interrupt still propagates
        _log.warning("could not mark the run's unfinished task runs Crashed: %s", err)
        return
    if n:
        _log.info("marked %d unfinished task run(s) of the stopped flow run Crashed", n)


def check_workers_have(runner, pool: ResourcePool, cluster: DaskCluster | None = None) -> None:
    """Device tasks wait for a worker with the pool's resource: fail, naming the parameter, when the
    cluster has none (rather than hang). A cluster started elsewhere (an address, a cluster class)
    gets up to ``cluster.worker_wait_s`` for one to join (workers start late); the embedded one has
    all its workers once it started. An adaptive cluster with no minimum starts workers only for
    queued tasks: nothing to wait for here."""
    cluster = cluster or DaskCluster()
    if cluster.adapt_min == 0 and cluster.adapt_max is not None:
        _log.info("adaptive cluster (adapt_min 0): device tasks wait for a worker with %s", pool.resource_name)
        return
    wait = 0.0 if cluster.mode == "local" else cluster.worker_wait_s
    deadline, logged = time.monotonic() + wait, False
    while True:
        workers = runner.client.scheduler_info(n_workers=-1)["workers"].values()
        if any(w.get("resources", {}).get(pool.resource_name, 0) >= pool.per_task for w in workers):
            return
        if time.monotonic() >= deadline:
            within = f" within {wait:g} s (worker_wait_s)" if wait else ""
            raise ParamsError("flow", "devices", f"no worker of the cluster advertised {pool.per_task:g} "
                                                 f"{pool.resource_name}{within}; start one with `dask worker ADDRESS "
                                                 f"--resources {pool.resource_name}={len(pool.devices)}`")
        if not logged:
            logged = True
            _log.info("waiting up to %g s for a worker advertising %s", wait, pool.resource_name)
        time.sleep(0.2)  # the scheduler has no join event a client can wait on; a cheap poll


class _Deadline(MlsysError, TimeoutError):
    pass


@contextmanager
def run_deadline(name: str, params: SystemParams):
    """The run's work fails past ``flow_timeout_s``, and a task past ``task_timeout_s``, with a message
    naming the parameter. Both are parameters, so they follow the scale; Prefect's own flow timeout is
    fixed when the flow is defined."""
    from prefect.task_engine import TaskRunTimeoutError
    from prefect.utilities.timeout import timeout

    try:
        with timeout(params.flow_timeout_s, timeout_exc_type=_Deadline):
            yield
    except _Deadline:
        raise TimeoutError(f"{name}: the run's work exceeded flow_timeout_s={params.flow_timeout_s:g} s (scale "
                           f"{params.scale}); raise it with overrides={{'flow_timeout_s': ...}}") from None
    except TaskRunTimeoutError as exc:
        raise TimeoutError(f"{name}: a task exceeded task_timeout_s={params.task_timeout_s:g} s (scale "
                           f"{params.scale}; its task run is marked TimedOut); raise it with "
                           f"overrides={{'task_timeout_s': ...}}") from exc


def system_flow(name: str) -> Callable[[Callable[[RunContext], SystemResult]], Any]:
    spec = registry.get(name)
    params_model: type[SystemParams] = spec.params_model()

    def decorate(body: Callable[[RunContext], SystemResult]):
        def run(scale: Literal["smoke", "quick", "full"] = "quick", overrides: dict[str, Any] | None = None,
                storage: str | None = None, cluster: str | None = None, devices: str | None = None,
                run_key: str | None = None) -> dict:
            logger = get_run_logger()
            if isinstance(overrides, BaseModel):  # a Python caller may pass the typed model itself
                overrides = overrides.model_dump(exclude_none=True)
            params = params_model.for_scale(scale, **(overrides or {}))  # fails before any work
            if run_key is not None and not RUN_KEY.fullmatch(str(run_key)):
                raise ParamsError(name, "run_key", f"must be 1-128 letters, digits, '.', '_' or '-' (got {run_key!r})")
            logger.info("resolved parameters: %s", params.model_dump(mode="json"))
            store = resolve_storage(storage).check()
            dask_cluster = resolve_cluster(cluster, shared=not params.own_cluster())
            if not cluster and dask_cluster.mode == "local" and params.embedded_workers():
                dask_cluster = dask_cluster.model_copy(update={"n_workers": params.embedded_workers()})
            try:  # remote workers that cannot report to the API would fail only mid-run
                dask_cluster.check_api_reachable(PREFECT_API_URL.value())
            except ValueError as exc:
                raise ParamsError(name, "cluster", str(exc)) from None
            pool = resolve_devices(devices)
            run_id = str(flow_run.get_id() or uuid.uuid4())
            ctx = RunContext(spec=spec, params=params, storage=store, cluster=dask_cluster, run_id=run_id,
                             device_pool=pool, run_key=run_key)
            if pool is not None:
                pool.ensure_concurrency_limit()  # the slots device tasks claim
            logger.info("%s at scale %s on %s cluster; storage %s; devices %s", name, scale, dask_cluster.mode,
                        store.root_url, f"pool {pool.name!r} ({pool.kind}: {', '.join(pool.devices)})" if pool
                        else "any worker's own")
            environment = capture(name)
            started = time.perf_counter()
            results = store.model_copy(update={"url": f"{store.root_url}/task-results"})
            # a deployment loads flows/<name>.py as a top-level module `<name>`, which a scheduler or worker
            # in another process (the server's warm cluster) cannot import: what refers to it (the flow in
            # the task's context) is pickled by value, and workers are warmed by the installed module name
            _pickle_by_value_if_loaded_from_a_file(body)
            with run_deadline(name, params), shared_api(), tasks_on(dask_cluster, pool, results,
                                                                    warm=f"mlsys_flows.flows.{name}",
                                                                    task_timeout_s=params.task_timeout_s):
                result: SystemResult = body(ctx)
                environment.load_after = load_average()
                environment.distributed = ctx.launches
                report = build_report(spec, params=params.model_dump(mode="json"), result=result, run_id=run_id,
                                      environment=environment, wall_time_s=time.perf_counter() - started)
                # on a worker, after the body: the plot's matplotlib stays out of the flow process (a warm
                # worker has it imported; here it cost every run about a second, issue 42 item 4)
                png = publish_report.submit(report, store).result()
            report_artifacts(report, png, store)  # artifacts of the flow run itself
            h = report.headline
            # the verdict (median of the paired ratios with their interval), not the ratio of medians beside
            # the paired interval: the two can differ and a reader pairs a number with the interval printed by it
            logger.info("%s headline %s: %s vs %s = %s (paper %s); verdict: %s", name, h.metric,
                        h.technique, h.baseline, ratio_label(h), f"{h.paper:.2f}x" if h.paper else "n/a",
                        verdict_text(report.model_dump(mode="json")))
            return report.model_dump(mode="json")

        run.__name__ = name
        description = f"{spec.title} ({spec.paper}): {spec.headline.statement}. Runs the technique and its " \
                      f"baselines on the same workload and reports each claim's ratio."
        # The run form of the UI is the deployment's parameter schema, which Prefect derives from this
        # signature and docstring: the system's typed overrides and a description per parameter.
        run.__annotations__["overrides"] = params_model.overrides_model() | None
        run.__doc__ = description + "\n\nArgs:\n" + "".join(f"    {p.name}: {p.description}\n" for p in PARAMETERS)
        # validated by the system's Params (ParamsError names the field), not by Prefect's signature check
        system = flow(name=name, description=description, log_prints=True, validate_parameters=False)(run)
        # what `prefect deploy` reads the schema from (the flow object's signature; calls go to `run`):
        # every parameter with a concrete type, so the Parameters tab and the run form show it
        system.__signature__ = schema_signature(run, params_model.overrides_model())
        system.parameters = parameter_schema(system)
        return system

    return decorate
