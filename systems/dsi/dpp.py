"""The trainer, the on-trainer loaders (baselines), and DPP's master and controller (pure: no dask imports).

DPP runs on any :class:`Executor` (the flow adapts a Dask client; tests use threads):
- the master hands row-group work items to the active workers (``prefetch`` each), treats an
  item as acknowledged once all its batches sit in the trainer's bounded queue, re-issues an
  unacknowledged item when its worker disappears, its attempt fails or its lease expires, and
  drops late duplicates, so every item reaches the trainer exactly once;
- the master is event-driven: it sleeps until an attempt finishes (the handle's done callback), the next
  controller decision or a liveness/lease check is due, instead of polling the handles every few ms on
  the trainer's core (handles without callbacks fall back to a 5 ms poll);
- the controller adds a worker when the trainer's stall fraction over the last interval is
  above ``stall_high`` and removes one when it is below ``stall_low`` with a nearly full queue,
  within ``min_workers`` and ``min(max_workers, live workers)``. It decides every ``control_interval_s``
  and once on an event: when the first item's result arrives (the start-up, during which the trainer
  has had nothing to train on). The stall it reads counts a wait still in progress.
"""
from __future__ import annotations

import math
import queue
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch
from torch import nn

from mlsys_flows.errors import MlsysError
from mlsys_flows.systems.common.dlrm import DLRM, Jagged, KeyedJaggedTensor

from . import Params
from .data import Batch, WorkItem, process_item


class DPPError(MlsysError, RuntimeError):
    """DPP could not deliver the dataset (an item failed ``max_attempts`` times, or no worker)."""


class Handle(Protocol):
    def done(self) -> bool: ...
    def result(self, timeout: float | None = None) -> tuple[list[Batch], dict[str, float]]: ...
    def cancel(self) -> Any: ...


class Executor(Protocol):
    def workers(self) -> list[str]: ...
    def submit(self, item: WorkItem, worker: str) -> Handle: ...


# ----- trainer ------------------------------------------------------------------------------
class Trainer:
    """The trainer: a real DLRM forward/backward/SGD step on each batch.

    - GPU (``device`` cuda): one step on the batch, padded to ``step_ms`` (the accelerator's time;
      the host CPU is free meanwhile).
    - CPU with ``passes`` (what the flow uses): ``passes`` steps on the batch, calibrated so they take
      about ``step_ms`` on the trainer's core (:func:`calibrate_passes`). No padding: the step is
      CPU work and competes with on-host preprocessing for the trainer's core, as in the paper.
    - CPU without ``passes``: one step, padded to ``step_ms`` with a sleep (an emulated accelerator;
      used by tests that need a fixed step time)."""

    def __init__(self, p: Params, used: list[str], device: str = "cpu", passes: int | None = None):
        self.p, self.device, self.passes = p, device, passes
        self.dense = [c for c in used if not c.startswith("sparse")]
        self.sparse = [c for c in used if c.startswith("sparse")]
        self.steps, self.samples, self.loss = 0, 0, math.nan
        self.step_s = 0.0
        torch.manual_seed(p.seed)
        self.model = DLRM(len(self.dense), {c: p.table_rows for c in self.sparse}, 16,
                          bottom=(p.mlp_width,), top=(p.mlp_width,)).to(device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.loss_fn = nn.BCEWithLogitsLoss()

    def loss_metric(self) -> dict[str, float]:
        return {"final_loss": self.loss}

    def step_metric(self) -> dict[str, float]:
        return {"step_ms": 1e3 * self.step_s / max(self.steps, 1)}

    def _pass(self, kjt, dense, labels) -> None:
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(dense, [kjt] if self.sparse else []), labels)
        loss.backward()
        self.opt.step()
        self.loss = float(loss.detach())  # synchronizes with the GPU

    def step(self, b: Batch) -> None:
        t0 = time.perf_counter()
        kjt = KeyedJaggedTensor({c: Jagged.from_numpy(*b.sparse[c]) for c in self.sparse})
        dense, labels = torch.from_numpy(b.dense), torch.from_numpy(b.labels)
        kjt, dense, labels = kjt.to(self.device), dense.to(self.device), labels.to(self.device)
        cpu_bound = self.passes is not None and not self.device.startswith("cuda")
        for _ in range(self.passes if cpu_bound else 1):
            self._pass(kjt, dense, labels)
        self.steps, self.samples = self.steps + 1, self.samples + b.rows
        if not cpu_bound:
            left = self.p.step_ms / 1e3 - (time.perf_counter() - t0)
            if left > 0:
                time.sleep(left)
        self.step_s += time.perf_counter() - t0


def calibrate_passes(p: Params, used: list[str], batch: Batch, repeats: int = 5) -> tuple[int, float]:
    """(passes, ms per pass): how many real DLRM steps on ``batch`` take about ``step_ms`` here.

    Run it on the trainer's core with nothing else there; every variant then does the same work."""
    trainer = Trainer(p, used, "cpu", passes=1)
    trainer.step(batch)  # warm-up (allocations, first-touch of the tables)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        trainer.step(batch)
        times.append(time.perf_counter() - t0)
    per_pass = sorted(times)[len(times) // 2]
    return max(1, round(p.step_ms / 1e3 / per_pass)) if p.step_ms > 0 else 1, 1e3 * per_pass


def num_batches(items: list[WorkItem], batch_size: int) -> int:
    return sum(math.ceil(it.rows / batch_size) for it in items)


# ----- baselines: on-trainer loaders --------------------------------------------------------------
Load = Callable[[WorkItem], tuple[list[Batch], dict[str, float]]]


class PrefetchLoader:
    """An on-trainer loader: ``threads`` loader threads keep up to ``threads * ahead`` work items
    loading ahead of the trainer; items come out in the dataset's order, each once.

    The threads live in the trainer's process, so they share whatever CPU the trainer has."""

    def __init__(self, items: list[WorkItem], load: Load, threads: int = 1, ahead: int = 2):
        if threads < 1 or ahead < 1:
            raise ValueError("a prefetching loader needs at least one thread and one item ahead")
        self.items, self.load, self.threads, self.window = items, load, threads, threads * ahead

    def __iter__(self):
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(self.threads, thread_name_prefix="inline-loader")
        pending: deque = deque()
        nxt = 0
        try:
            while nxt < len(self.items) and len(pending) < self.window:
                pending.append(pool.submit(self.load, self.items[nxt]))
                nxt += 1
            while pending:
                fut = pending.popleft()
                if nxt < len(self.items):  # keep the window full while the trainer consumes this one
                    pending.append(pool.submit(self.load, self.items[nxt]))
                    nxt += 1
                yield fut  # the consumer waits on it (its stall)
        finally:
            for fut in pending:
                fut.cancel()
            pool.shutdown(wait=True, cancel_futures=True)


def run_inline(items: list[WorkItem], open_file: Callable[[str], Any], used: list[str], p: Params,
               device: str = "cpu", projected: bool = True, passes: int | None = None,
               load: Load | None = None, rounds: int = 0) -> dict[str, float]:
    """The trainer loads data on its own host: ``loader_threads`` prefetch threads read (projected
    and coalesced, or full rows) and preprocess work items in order while the trainer steps
    (``rounds``: rounds of derived features per item, see :func:`data.derive_features`).

    Stall = time the trainer waits for the next item's batches."""
    trainer = Trainer(p, used, device, passes=passes)
    load = load or (lambda it: process_item(it, open_file, used, p, projected=projected, rounds=rounds))
    stall_s = bytes_read = calls = 0.0
    t_start = time.perf_counter()
    for fut in PrefetchLoader(items, load, p.loader_threads, p.prefetch):
        t0 = time.perf_counter()
        batches, stats = fut.result()
        stall_s += time.perf_counter() - t0
        bytes_read += stats["bytes_read"]
        calls += stats["read_calls"]
        for b in batches:
            trainer.step(b)
    total = time.perf_counter() - t_start
    return {"trainer_samples_per_s": trainer.samples / total, "stall_fraction": stall_s / total,
            "bytes_read": bytes_read, "read_calls": calls, "samples": trainer.samples, "wall_s": total,
            **trainer.loss_metric(), **trainer.step_metric()}


# ----- DPP ------------------------------------------------------------------------------------
class Controller:
    """Sizes the worker pool from the trainer's stall fraction over each interval."""

    def __init__(self, p: Params):
        self.p = p
        self.target = p.start_workers
        self.history: list[tuple[float, int]] = []
        # every decision: when, what triggered it ("start-up": the first result's event; "regular": a tick),
        # the stall fraction and queue fill it read, and the target before and after
        self.decisions: list[dict[str, Any]] = []

    def decide(self, now: float, stall_fraction: float, queue_fill: float, live: int,
               trigger: str = "regular") -> int:
        before = self.target
        cap = max(1, min(self.p.max_workers, live))
        if stall_fraction > self.p.stall_high and self.target < cap:
            self.target += 1
        elif stall_fraction < self.p.stall_low and queue_fill >= 0.75 and self.target > self.p.min_workers:
            self.target -= 1
        self.target = max(min(self.target, cap), min(self.p.min_workers, cap))
        self.history.append((now, self.target))
        self.decisions.append({"t": now, "trigger": trigger, "stall_fraction": stall_fraction,
                               "queue_fill": queue_fill, "before": before, "target": self.target})
        return self.target


@dataclass
class _Attempt:
    worker: str
    handle: Handle
    issued: float
    renewed: bool = False  # its lease expired and a second copy was queued


@dataclass
class Master:
    """Work-item bookkeeping; ``run`` is the master's loop (a thread beside the trainer)."""

    items: list[WorkItem]
    executor: Executor
    p: Params
    controller: Controller
    out: "queue.Queue[Batch]"
    stall: Callable[[], float]      # the trainer's cumulative stall seconds
    pending: deque = field(init=False)
    queued: set[int] = field(init=False)
    attempts: dict[int, list[_Attempt]] = field(default_factory=dict)
    tries: dict[int, int] = field(default_factory=dict)
    acked: set[int] = field(default_factory=set)
    delivered: list[int] = field(default_factory=list)
    by_worker: dict[str, int] = field(default_factory=dict)  # items delivered, per worker that ran them
    reissued: int = 0
    duplicates: int = 0
    bytes_read: float = 0.0
    read_calls: float = 0.0
    error: BaseException | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self):
        self.pending = deque(self.items)
        self.queued = {it.id for it in self.items}
        self.by_id = {it.id: it for it in self.items}
        self._live: list[str] = []
        self._live_at = -1.0
        self.wake = threading.Event()  # set by an attempt's done callback
        self.polling = False           # a handle without callbacks: poll every 5 ms instead
        self.wakeups = 0
        self._start = self._last = time.perf_counter()  # run() resets them when the loop starts
        self._last_stall = 0.0

    def decide(self, now: float, trigger: str = "regular") -> int:
        """One controller decision on the trainer's stall fraction since the last one (the stall counts
        a wait still in progress) and the queue's fill; returns the target. ``trigger``: "start-up" (the
        first result's event) or "regular" (a tick), recorded with the decision."""
        stall = self.stall()
        fraction = min(1.0, max(0.0, (stall - self._last_stall) / max(now - self._last, 1e-9)))
        self._last, self._last_stall = now, stall
        return self.controller.decide(now - self._start, fraction, self.out.qsize() / self.p.queue_depth,
                                      len(self.live_workers(now)), trigger=trigger)

    def live_workers(self, now: float) -> list[str]:
        if now - self._live_at > 0.2:  # asking the scheduler on every loop would flood it
            self._live, self._live_at = sorted(self.executor.workers()), now
        return self._live

    def _requeue(self, item: WorkItem) -> None:
        if item.id not in self.acked and item.id not in self.queued:
            self.pending.appendleft(item)
            self.queued.add(item.id)
            self.reissued += 1

    def _issue(self, item: WorkItem, worker: str, now: float) -> None:
        self.tries[item.id] = self.tries.get(item.id, 0) + 1
        if self.tries[item.id] > self.p.max_attempts:
            raise DPPError(f"work item {item.id} ({item.key} row group {item.row_group}) failed "
                           f"{self.p.max_attempts} times")
        handle = self.executor.submit(item, worker)
        on_done = getattr(handle, "add_done_callback", None)
        if on_done is None:
            self.polling = True
        else:
            on_done(lambda _: self.wake.set())
        self.attempts.setdefault(item.id, []).append(_Attempt(worker, handle, now))

    def _deliver(self, batches: list[Batch]) -> bool:
        for b in batches:
            while True:
                if self.stop.is_set():
                    return False
                try:
                    self.out.put(b, timeout=0.1)
                    break
                except queue.Full:
                    continue
        return True

    def step(self, now: float) -> None:
        """One pass: retire dead workers' items, collect results, renew leases, assign work."""
        live = self.live_workers(now)
        by_id = self.by_id
        for item_id, atts in list(self.attempts.items()):
            for a in list(atts):
                if a.worker not in live:  # the worker died or left: its unacknowledged item goes back
                    a.handle.cancel()
                    atts.remove(a)
                elif a.handle.done():
                    atts.remove(a)
                    try:  # bounded: a result whose worker just died may never arrive
                        batches, stats = a.handle.result(timeout=min(5.0, self.p.lease_s))
                    except Exception:  # noqa: BLE001 - a failed or lost attempt is re-issued below
                        continue
                    self.bytes_read += stats["bytes_read"]
                    self.read_calls += stats["read_calls"]
                    if item_id in self.acked:
                        self.duplicates += 1  # a late copy of a re-issued item: never delivered twice
                        continue
                    if not self.delivered:
                        # the start-up decision, on an event rather than a tick: until this first result the
                        # trainer has had nothing to train on, so the stall since the start is all of it
                        self.decide(now, trigger="start-up")
                    if not self._deliver(batches):
                        return
                    self.acked.add(item_id)
                    self.delivered.append(item_id)
                    self.by_worker[a.worker] = self.by_worker.get(a.worker, 0) + 1
                    for other in atts:
                        other.handle.cancel()
                    atts.clear()
                elif now - a.issued > self.p.lease_s and not a.renewed:
                    a.renewed = True
                    self._requeue(by_id[item_id])  # lease expired: a second copy races the first
            if not atts:
                del self.attempts[item_id]
                self._requeue(by_id[item_id])
        active = live[:self.controller.target]
        if not active:
            return
        load = {w: 0 for w in active}
        for atts in self.attempts.values():
            for a in atts:
                if a.worker in load:
                    load[a.worker] += 1
        while self.pending:
            worker = min(active, key=lambda w: load[w])
            if load[worker] >= self.p.prefetch:
                break
            item = self.pending.popleft()
            self.queued.discard(item.id)
            if item.id in self.acked:
                continue
            self._issue(item, worker, now)
            load[worker] += 1

    def run(self) -> None:
        self._start = self._last = time.perf_counter()
        self._last_stall = self.stall()
        self.controller.history.append((0.0, self.controller.target))
        no_worker_since = None
        try:
            while len(self.acked) < len(self.items) and not self.stop.is_set():
                self.wake.clear()  # a callback from here on wakes the wait below at once
                now = time.perf_counter()
                self.step(now)
                if not self.live_workers(now):
                    no_worker_since = no_worker_since or now
                    if now - no_worker_since > self.p.lease_s:
                        raise DPPError(f"no DPP worker alive for {self.p.lease_s:.0f} s")
                else:
                    no_worker_since = None
                if now - self._last >= self.p.control_interval_s:
                    self.decide(now)
                due = self._last + self.p.control_interval_s - time.perf_counter()
                if self.polling:
                    time.sleep(0.005)
                elif self.wake.wait(timeout=max(0.001, min(0.2, due))):  # 0.2 s: liveness and leases
                    self.wakeups += 1
        except BaseException as exc:  # noqa: BLE001 - surfaced to the trainer thread
            self.error = exc


def run_dpp(items: list[WorkItem], executor: Executor, used: list[str], p: Params,
            on_batch: Callable[[Batch], None] | None = None, device: str = "cpu",
            passes: int | None = None) -> tuple[dict[str, float], dict[str, Any]]:
    """Train on batches that DPP workers prepare; returns (metrics, details)."""
    trainer = Trainer(p, used, device, passes=passes)
    out: queue.Queue[Batch] = queue.Queue(maxsize=p.queue_depth)
    stall = [0.0]
    waiting: list[float | None] = [None]  # when the trainer's current wait for a batch began

    def stalled() -> float:  # the controller sees a wait as it happens, not only once its batch arrives
        since = waiting[0]
        return stall[0] + (time.perf_counter() - since if since is not None else 0.0)

    controller = Controller(p)
    master = Master(items, executor, p, controller, out, stall=stalled)
    thread = threading.Thread(target=master.run, name="dpp-master", daemon=True)
    expected = num_batches(items, p.batch_size)
    consumed: list[tuple[int, int]] = []
    t_start = time.perf_counter()
    waiting[0] = t_start  # the trainer waits for its first batch from before the master starts
    thread.start()
    try:
        while len(consumed) < expected:
            t0 = waiting[0] if waiting[0] is not None else time.perf_counter()
            waiting[0] = t0
            while True:
                try:
                    b = out.get(timeout=0.1)
                    break
                except queue.Empty:
                    if master.error is not None:
                        raise master.error
                    if not thread.is_alive():
                        raise DPPError(f"the master stopped after {len(consumed)} of {expected} batches")
                    if time.perf_counter() - t0 > 2 * p.lease_s:
                        raise DPPError(f"no batch for {2 * p.lease_s:.0f} s after {len(consumed)} of {expected}")
            waiting[0] = None  # cleared first: a reader in between under-counts this wait, never twice
            stall[0] += time.perf_counter() - t0
            trainer.step(b)
            consumed.append((b.item, b.index))
            if on_batch is not None:
                on_batch(b)
        total = time.perf_counter() - t_start
    finally:
        master.stop.set()
        thread.join(timeout=10)
    hist = controller.history + [(total, controller.target)]
    area = sum((t1 - t0) * w for (t0, w), (t1, _) in zip(hist[:-1], hist[1:]))
    metrics = {"trainer_samples_per_s": trainer.samples / total, "stall_fraction": stall[0] / total,
               "bytes_read": master.bytes_read, "read_calls": master.read_calls, "samples": trainer.samples,
               "wall_s": total, **trainer.loss_metric(), **trainer.step_metric(), "workers_mean": area / total,
               "workers_max": float(max(w for _, w in hist)), "reissued_items": float(master.reissued),
               "duplicates_dropped": float(master.duplicates)}
    details = {"workers_over_time": hist, "decisions": controller.decisions, "consumed": consumed, "delivered_items": master.delivered,
               "items_by_worker": dict(master.by_worker)}
    return metrics, details


@contextmanager
def torch_threads(n: int):
    """torch's intra-op threads set to ``n`` (the trainer's cores) for the block, then restored."""
    old = torch.get_num_threads()
    torch.set_num_threads(max(1, n))
    try:
        yield
    finally:
        torch.set_num_threads(old)


# ----- the regime: preprocessing cost per sample ------------------------------------------------
REGIME_VARIANTS = ("inline", "dpp", "dpp_colocated")


def sweep_preprocessing(values: list[float], run: Callable[[str, float], float],
                        variants: tuple[str, ...] = REGIME_VARIANTS) -> dict[float, dict[str, float]]:
    """The regime sweep: ``run(variant, extra)`` (trainer samples/s of one run) for every variant at each
    extra preprocessing cost in ``values``, one run each, rotating which variant goes first so none
    always runs on a warmer machine. Returns {extra: {variant: samples/s}}."""
    out: dict[float, dict[str, float]] = {}
    for i, x in enumerate(values):
        k = i % len(variants)
        out[x] = {v: run(v, x) for v in variants[k:] + variants[:k]}
    return out
