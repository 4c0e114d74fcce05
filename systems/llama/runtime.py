"""A small serverless runtime: worker processes started on demand, kept warm, stopped when idle.

``Worker`` is one real process (``worker.py``); its cold start is measured from ``Popen`` to the
worker's ``ready`` message (interpreter start-up, imports, classifier weights). ``WorkerPool`` keeps
instances per hardware tier: ``acquire`` returns an idle warm instance or starts a new one (a cold
start) while the tier is under its concurrency limit; ``release`` marks it idle; an instance idle
longer than ``keep_alive_s`` is stopped (its process ends) on the next ``reap`` (every acquire and
release reaps). The pool works on any clock: the real one by default, or the executor's virtual
clock (``now=``), on which instance lifetimes then follow the pipeline's modelled timeline.
``spawn`` makes instances; the default starts real processes, the planner's predictor passes a
stand-in that starts nothing.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from mlsys_flows.errors import MlsysError

TIERS = ("cpu", "gpu")
WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")


class WorkerError(MlsysError, RuntimeError):
    """A worker process failed to start, died, or an invocation raised inside it."""


class Worker:
    """One serverless worker process of a tier; ``call`` runs one invocation in it."""

    def __init__(self, tier: str, start_timeout_s: float = 60.0):
        if tier not in TIERS:
            raise ValueError(f"tier must be one of {TIERS} (got {tier!r})")
        self.tier = tier
        t0 = time.perf_counter()
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   LLAMA_TIER=tier)
        self.proc = subprocess.Popen([sys.executable, WORKER_SCRIPT, tier], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, close_fds=True)
        try:
            msg = pickle.load(self.proc.stdout)
        except Exception as exc:
            self.stop()
            raise WorkerError(f"{tier} worker did not start: {exc}") from None
        self.cold_start_s = time.perf_counter() - t0
        if msg[0] != "ready":
            self.stop()
            raise WorkerError(f"{tier} worker sent {msg[0]!r} instead of ready")
        self.import_s = msg[2]
        self.calls = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def call(self, op: str, items: list, args: dict) -> tuple[list, float, float]:
        """Run ``op`` on ``items`` in the process: (outputs, round-trip seconds, compute seconds)."""
        t0 = time.perf_counter()
        try:
            pickle.dump((op, items, args), self.proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self.proc.stdin.flush()
            status, payload, compute_s = pickle.load(self.proc.stdout)
        except (EOFError, OSError, pickle.UnpicklingError) as exc:
            raise WorkerError(f"{self.tier} worker {self.pid} died during {op}: {exc!r}") from None
        rtt = time.perf_counter() - t0
        if status != "ok":
            raise WorkerError(f"{op} failed in {self.tier} worker {self.pid}: {payload}")
        self.calls += 1
        return payload, rtt, compute_s

    def stop(self, timeout_s: float = 5.0) -> None:
        """End this worker's own process (EOF on stdin, then terminate, then kill) and reap it."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f and not f.closed:
                    f.close()
            except OSError:
                pass


@dataclass
class Instance:
    tier: str
    worker: Any                  # a Worker, or None for the predictor's stand-in
    cold_start_s: float
    busy: bool = True
    idle_since: float = 0.0
    started_at: float = 0.0


@dataclass
class PoolStats:
    cold_starts: int = 0
    cold_start_s: list[float] = field(default_factory=list)
    stopped_idle: int = 0
    peak_instances: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    pids: list[int] = field(default_factory=list)


def real_spawn(tier: str) -> tuple[Any, float]:
    w = Worker(tier)
    return w, w.cold_start_s


class WorkerPool:
    """Serverless instances per tier with keep-alive and a per-tier concurrency limit."""

    def __init__(self, keep_alive_s: float, max_instances: int | dict[str, int],
                 spawn: Callable[[str], tuple[Any, float]] = real_spawn, clock: Callable[[], float] = time.monotonic):
        if keep_alive_s < 0:
            raise ValueError("keep_alive_s must be >= 0")
        self.keep_alive_s = keep_alive_s
        self.max_instances = max_instances if isinstance(max_instances, dict) else dict.fromkeys(TIERS, max_instances)
        self.spawn, self.clock = spawn, clock
        self.instances: dict[str, list[Instance]] = {t: [] for t in TIERS}
        self.stats = PoolStats()
        self.closed = False

    def _now(self, now: float | None) -> float:
        return self.clock() if now is None else now

    def reap(self, now: float | None = None) -> int:
        """Stop every instance idle for longer than the keep-alive; returns how many stopped."""
        now = self._now(now)
        stopped = 0
        for tier, insts in self.instances.items():
            keep = []
            for inst in insts:
                if not inst.busy and now - inst.idle_since > self.keep_alive_s:
                    if inst.worker is not None:
                        inst.worker.stop()
                    stopped += 1
                else:
                    keep.append(inst)
            self.instances[tier] = keep
        self.stats.stopped_idle += stopped
        return stopped

    def idle(self, tier: str, now: float | None = None) -> int:
        """Warm idle instances of ``tier`` (still inside their keep-alive at ``now``)."""
        now = self._now(now)
        return sum(1 for i in self.instances[tier] if not i.busy and now - i.idle_since <= self.keep_alive_s)

    def startable(self, tier: str, now: float | None = None) -> int:
        """Instances that could still be started without passing the concurrency limit."""
        now = self._now(now)
        live = sum(1 for i in self.instances[tier] if i.busy or now - i.idle_since <= self.keep_alive_s)
        return max(0, self.max_instances[tier] - live)

    def acquire(self, tier: str, now: float | None = None, allow_new: bool = True) -> tuple[Instance, float] | None:
        """A warm idle instance (cold seconds 0) or, with ``allow_new``, a newly started one (its
        measured cold start); None when none is idle and none may start (the concurrency limit)."""
        if self.closed:
            raise WorkerError("the pool is closed")
        now = self._now(now)
        self.reap(now)
        for inst in self.instances[tier]:
            if not inst.busy:
                inst.busy = True
                return inst, 0.0
        if not allow_new or len(self.instances[tier]) >= self.max_instances[tier]:
            return None
        worker, cold = self.spawn(tier)
        inst = Instance(tier, worker, cold, busy=True, started_at=now)
        self.instances[tier].append(inst)
        self.stats.cold_starts += 1
        self.stats.cold_start_s.append(cold)
        if worker is not None:
            self.stats.pids.append(worker.pid)
        self.stats.peak_instances[tier] = max(self.stats.peak_instances[tier], len(self.instances[tier]))
        return inst, cold

    def prewarm(self, tier: str, n: int, now: float | None = None) -> list[float]:
        """Start instances of ``tier`` until ``n`` are live (provisioned concurrency), idle from
        ``now``; returns their measured cold starts (counted in the stats like any other)."""
        now = self._now(now)
        started, held = [], []
        while len(self.instances[tier]) < min(n, self.max_instances[tier]):
            inst, cold = self.acquire(tier, now)
            held.append(inst)
            started.append(cold)
        for inst in held:
            self.release(inst, now)
        return started

    def release(self, inst: Instance, now: float | None = None) -> None:
        inst.busy = False
        inst.idle_since = self._now(now)
        self.reap(inst.idle_since)

    def live_pids(self) -> list[int]:
        return [i.worker.pid for insts in self.instances.values() for i in insts if i.worker is not None]

    def close(self) -> None:
        """Stop every instance (idle or not)."""
        for insts in self.instances.values():
            for inst in insts:
                if inst.worker is not None:
                    inst.worker.stop()
        self.instances = {t: [] for t in TIERS}
        self.closed = True

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
