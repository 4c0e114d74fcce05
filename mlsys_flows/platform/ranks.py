"""Ranks as Dask tasks: ``run_ranks`` starts N torch.distributed ranks, one per Dask worker process
(pinned there for the launch), and returns their results or fails naming the ranks that failed.

Rendezvous: the caller (the flow's process) opens the launch's ``TCPStore`` on the ranks' host, on a
port the OS picks (``master_store``: bound to that address only, loopback for a local cluster), and
hands ``host:port`` to every rank, which connects as a client: no rank hosts it, so losing any rank,
rank 0 included, leaves the survivors their store (process groups of their own, membership rounds).
Where the caller cannot listen on the ranks' host (their workers span hosts, or run on a machine
other than the caller's, or rank 0's worker cannot read back a nonce the caller set in it: a remote
worker that advertises 127.0.0.1 through a tunnel), rank 0 opens it on its worker's host and publishes ``host:port`` in a
Dask ``Variable`` private to the launch, as before: there, losing rank 0 fails the launch
(``RanksRun.store`` / ``RanksFailed.store`` say which: "caller" or "rank 0"). The
backend is gloo on CPU, nccl when every chosen worker sees a GPU (each rank then takes the next GPU
of its host). A rank runs ``fn(info, *args, **kwargs)`` inside its process group (``RankInfo`` says
rank, world size, backend, device and launch), which is destroyed when ``fn`` returns or raises.

A lost worker is a failed rank: its peers' next collective fails (their sockets to it close) or
times out after ``timeout_s``; the caller learns which ranks were lost (their worker left the
cluster) and which failed, and decides what happens next (reroute, relaunch from a checkpoint).

A launch whose caller is gone (its flow cancelled or its process killed: the scheduler then releases
the ranks' tasks) or that cancels its ranks is torn down too: Dask cannot stop a running task, so each
rank watches its own task and, once the scheduler has released it, raises ``RankCancelled`` in the
rank's thread (at its next Python instruction; a collective in progress ends first, within
``timeout_s``), which leaves the process group and frees the worker for the next launch.
"""
from __future__ import annotations

import ctypes
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable
from urllib.parse import urlparse

from mlsys_flows.errors import MlsysError
from mlsys_flows.systems.common.distributed import (RankInfo, choose_backend, local_devices, master_store,
                                                    peer_store, process_group)

__all__ = ["RankCancelled", "RankInfo", "RanksFailed", "RanksRun", "rank_state", "rank_alive", "run_ranks"]

# one rank per worker process: torch.distributed's default group is process-wide
_RANK_SLOT = threading.Lock()


class RankCancelled(MlsysError, RuntimeError):
    """Raised inside a rank whose Dask task the scheduler released (its launch was cancelled or its
    caller is gone): the rank stops and leaves its process group."""


class RanksFailed(MlsysError, RuntimeError):
    """Ranks of a launch failed: ``lost`` {rank: worker} whose worker left the cluster, ``failed``
    {rank: the exception it raised}; ``results`` {rank: result} of the ranks that finished anyway
    (survivors that carried on, as ReCycle's do), ``workers`` the launch's workers in rank order and
    ``backend`` its process groups' backend."""

    def __init__(self, launch_id: str, lost: dict[int, str], failed: dict[int, BaseException],
                 results: dict[int, Any] | None = None, workers: list[str] | None = None, backend: str = "",
                 store: str = ""):
        self.launch_id, self.lost, self.failed = launch_id, lost, failed
        self.results, self.workers, self.backend, self.store = results or {}, workers or [], backend, store
        parts = [f"rank {r} lost (its worker {w} left the cluster)" for r, w in sorted(lost.items())]
        parts += [f"rank {r} failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                  for r, e in sorted(failed.items())]
        super().__init__(f"launch {launch_id}: " + "; ".join(parts))


@dataclass
class RanksRun:
    """A launch that completed: each rank's result, and where and how it ran."""

    results: list[Any]
    world_size: int
    backend: str
    workers: list[str]
    launch_id: str
    seconds: float
    devices: list[str] = field(default_factory=list)
    store: str = "caller"  # where the rendezvous store lived: "caller" (no rank's loss ends it) or "rank 0"

    def describe(self) -> dict[str, Any]:
        """What the report's notes record of the launch."""
        return {"world_size": self.world_size, "backend": self.backend, "workers": self.workers,
                "devices": self.devices, "launch_id": self.launch_id, "seconds": round(self.seconds, 3),
                "store": self.store}


def rank_state() -> dict[str, bool]:
    """Whether this process runs a rank now and belongs to a process group (``client.run(rank_state)``
    asks every worker: after a launch, on success or failure, both are False on every survivor)."""
    import torch.distributed as dist

    return {"rank_running": _RANK_SLOT.locked(), "process_group": dist.is_available() and dist.is_initialized()}


def rank_alive(info: RankInfo) -> Callable[[int], bool]:
    """Inside a rank: ``alive(r)`` says whether rank r's worker is still in the cluster (the scheduler
    drops a worker whose process died as soon as its connection closes): failure detection without
    a timeout to tune."""
    from distributed import get_client

    client = get_client()

    def alive(rank: int) -> bool:
        return info.workers[rank] in client.scheduler_info(n_workers=-1)["workers"]
    return alive


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _rank_main(launch_id: str, rank: int, world_size: int, backend: str, device: str, timeout_s: float,
               payload: bytes, workers: tuple[str, ...] = (), store_address: str | None = None) -> Any:
    """What one rank runs on its worker. ``payload`` is ``(fn, args, kwargs)`` pickled by the caller:
    the scheduler unpickles a task's arguments, and importing ``fn``'s module (torch, a system) there
    would block its event loop long enough to drop workers; the worker unpickles it here.
    ``store_address``: the caller's rendezvous store (``host:port``), else rank 0 opens one."""
    import cloudpickle
    from distributed import Variable, get_client, get_worker

    if not _RANK_SLOT.acquire(blocking=False):
        raise RuntimeError(f"worker {get_worker().address} already runs a rank of another launch")
    try:
        host = urlparse(get_worker().address).hostname or "127.0.0.1"
        address = Variable(f"mlsys-ranks-{launch_id}", client=get_client())
        if store_address is not None:  # the caller's: every rank is a client
            master_host, port = store_address.rsplit(":", 1)
            store = peer_store(master_host, int(port), world_size, timeout_s)
        elif rank == 0:
            store = master_store(host, world_size, timeout_s)
            address.set(f"{host}:{store.port}")
        else:
            try:
                master = address.get(timeout=timeout_s)
            except TimeoutError:
                raise TimeoutError(f"rank {rank}: rank 0 published no rendezvous address within {timeout_s:g} s") \
                    from None
            master_host, port = master.rsplit(":", 1)
            store = peer_store(master_host, int(port), world_size, timeout_s)
        info = RankInfo(rank=rank, world_size=world_size, backend=backend, device=device, launch_id=launch_id,
                        host=host, workers=workers, store=store)
        fn, args, kwargs = cloudpickle.loads(payload)
        with process_group(store, info, timeout_s), _cancelled_when_released(get_worker()):
            return fn(info, *args, **kwargs)
    finally:
        _RANK_SLOT.release()


@contextmanager
def _cancelled_when_released(worker, poll_s: float = 0.5):
    """While the block runs, a watcher raises ``RankCancelled`` in this thread once the scheduler has
    released this task (the worker's record of it is cancelled or gone)."""
    key, thread = worker.get_current_task(), threading.get_ident()
    done, guard = threading.Event(), threading.Lock()

    def watch() -> None:
        while not done.wait(poll_s):
            ts = worker.state.tasks.get(key)
            if ts is None or ts.state in ("cancelled", "released", "forgotten"):
                with guard:  # never once the block has ended: the exception would hit its cleanup
                    if not done.is_set():
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread),
                                                                   ctypes.py_object(RankCancelled))
                return

    watcher = threading.Thread(target=watch, name=f"rank-watch-{key}", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        with guard:
            done.set()
        watcher.join()


def run_ranks(client, fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "auto",
              timeout_s: float = 60.0, workers: list[str] | None = None, poll_s: float = 0.5,
              **kwargs: Any) -> RanksRun:
    """Run ``fn(info, *args, **kwargs)`` as ``world_size`` ranks on as many workers of ``client``'s
    cluster (``workers``, else the first ``world_size`` by address); returns their results in rank
    order. Raises ``ValueError`` naming ``world_size`` when the cluster has too few workers, and
    ``RanksFailed`` when a rank raised or its worker left; the other ranks are then waited for (each
    fails at its next collective, within ``timeout_s``, or, carrying on without the lost one, finishes
    within ``timeout_s`` of the loss) so that none is left running."""
    import cloudpickle
    from distributed import Variable, wait

    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1 (got {world_size!r})")
    if workers is None:  # a worker that is (re)starting gets up to timeout_s to join
        try:
            client.wait_for_workers(world_size, timeout=timeout_s)
        except TimeoutError:
            pass  # refused below, naming world_size
    present = sorted(client.scheduler_info(n_workers=-1)["workers"])
    # the workers named may not be registered yet (just started, or reconnecting to a scheduler that
    # missed their heartbeats on a loaded machine): they get up to timeout_s to (re)join
    deadline = time.monotonic() + timeout_s
    while workers and not set(workers) <= set(present) and time.monotonic() < deadline:
        time.sleep(poll_s)
        present = sorted(client.scheduler_info(n_workers=-1)["workers"])
    chosen = list(workers or present[:world_size])
    if len(chosen) < world_size or len(set(chosen)) != len(chosen) or not set(chosen) <= set(present):
        raise ValueError(f"world_size: {world_size} ranks need {world_size} distinct Dask workers (one rank per "
                         f"worker process); the cluster has {len(present)}" +
                         (f", and {sorted(set(chosen) - set(present))} are not among them" if workers else ""))
    chosen = chosen[:world_size]
    if backend == "auto":
        gpus = client.run(_gpu_count, workers=chosen)
        backend = choose_backend([gpus[w] for w in chosen])
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'auto', 'gloo' or 'nccl' (got {backend!r})")
    devices = local_devices([urlparse(w).hostname or w for w in chosen], backend)
    launch_id = uuid.uuid4().hex[:12]
    started = time.perf_counter()
    payload = cloudpickle.dumps((fn, args, kwargs))
    store = _caller_store([urlparse(w).hostname or w for w in chosen], world_size, timeout_s)
    address = f"{urlparse(chosen[0]).hostname or chosen[0]}:{store.port}" if store is not None else None
    if store is not None and not _store_reachable(client, chosen[0], store, address, launch_id):
        store = address = None  # e.g. a remote worker that advertises 127.0.0.1 (a tunnel): rank 0 opens it
    where = "caller" if store is not None else "rank 0"
    futures = [client.submit(_rank_main, launch_id, r, world_size, backend, devices[r], timeout_s, payload,
                             tuple(chosen), address, workers=[chosen[r]], allow_other_workers=False, pure=False,
                             key=f"rank-{r}-of-{world_size}-{launch_id}")
               for r in range(world_size)]
    try:
        failing_since = None
        while True:
            try:
                with client.as_current():  # wait() finds the client of the futures there
                    wait(futures, timeout=poll_s)
            except TimeoutError:
                pass
            alive = set(client.scheduler_info(n_workers=-1)["workers"])
            lost = {r: chosen[r] for r, f in enumerate(futures) if f.status == "pending" and chosen[r] not in alive}
            failed = {r: f.exception() for r, f in enumerate(futures) if f.status == "error"}
            failed |= {r: RuntimeError("its Dask task was cancelled") for r, f in enumerate(futures)
                       if f.status == "cancelled"}
            if not lost and not failed and all(f.status == "finished" for f in futures):
                return RanksRun(results=[f.result() for f in futures], world_size=world_size, backend=backend,
                                workers=chosen, launch_id=launch_id, seconds=time.perf_counter() - started,
                                devices=devices, store=where)
            if lost or failed:
                # the others fail at their next collective: wait for them (bounded), then report all
                failing_since = failing_since or time.monotonic()
                settled = all(f.status != "pending" or r in lost for r, f in enumerate(futures))
                if settled or time.monotonic() - failing_since > timeout_s + poll_s:
                    done = {r: f.result() for r, f in enumerate(futures) if f.status == "finished"}
                    raise RanksFailed(launch_id, lost, failed, done, chosen, backend, where)
    finally:
        for f in futures:
            if f.status == "pending":
                f.cancel()
        try:
            Variable(f"mlsys-ranks-{launch_id}", client=client).delete()
        except Exception:  # noqa: BLE001 - the scheduler may be gone; the variable goes with it
            pass
        del store  # the caller's store closes with its last reference (every rank is settled or cancelled)


def _store_reachable(client, worker: str, store, address: str, launch_id: str, timeout_s: float = 5.0) -> bool:
    """Whether ``worker`` reaches the caller's store at ``address``: a nonce set here is read back there. A
    worker that advertises the caller's host without being on it (a tunnel to 127.0.0.1) reaches no
    store, or another one, and fails this (within ``timeout_s``)."""
    nonce = uuid.uuid4().hex
    key = f"mlsys-ranks/{launch_id}/nonce"
    store.set(key, nonce)
    try:
        got = client.run(_read_store_key, address, key, timeout_s, workers=[worker])
    except Exception:  # noqa: BLE001 - unreachable, refused, timed out: not the caller's store
        return False
    return got.get(worker) == nonce


def _read_store_key(address: str, key: str, timeout_s: float) -> str | None:
    """On a worker: the value of ``key`` in the store at ``address``, or None where it cannot be read."""
    try:
        host, port = address.rsplit(":", 1)
        import torch.distributed as dist

        # a client that counts for no rank (no world size: it joins no rendezvous count)
        return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s),
                             wait_for_workers=False).get(key).decode()
    except Exception:  # noqa: BLE001 - no store there, or not ours
        return None


def _caller_store(hosts: list[str], world_size: int, timeout_s: float):
    """The launch's rendezvous store in the caller's process, on the ranks' host (``master_store``: that
    address only), or None where the caller cannot listen there (ranks on several hosts, or on a host
    that is not the caller's): rank 0 then opens it."""
    if len(set(hosts)) != 1:
        return None
    try:
        return master_store(hosts[0], world_size, timeout_s)
    except (OSError, RuntimeError):  # not an address of this machine (torch wraps some socket errors)
        return None
