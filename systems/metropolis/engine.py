"""The scheduler of AI Metropolis and its baselines (pure), with two executors of the LLM calls.

Policies decide which cluster steps are ready, given every agent's clock and position:

- ``global_sync``: the usual parallel simulation. Every cluster of step t runs in parallel, and no
  agent starts step t+1 before every agent has finished step t (a barrier per step).
- ``out_of_order`` (AI Metropolis): agent i at clock t may step once every agent j that is behind
  (t_j < t) is far enough that it cannot reach i's interaction range by time t:
  ``dist(p_i(t), p_j(t_j)) > radius + max_speed * (t - t_j)``. Agents at the same clock within the
  radius (transitively) form a cluster and step together; a cluster is ready when all its members
  pass the rule.
- ``oracle``: the true dependencies known in hindsight: each step waits only for the previous steps
  of the agents it really shares a cluster with (the clusters of a finished run).

Executors run the ready cluster steps' LLM calls through ``llm_slots`` concurrent slots (the serving
engine's capacity), lagging agents first (priority = simulated time):

- :class:`SimExecutor`: a discrete-event simulation of the same calls (a simulated clock, exact);
- :class:`ThreadExecutor`: real threads that really wait (``time.sleep``) for each call's latency
  while holding a slot; the makespan is wall clock.
- :class:`ModelExecutor`: real threads whose calls generate tokens on a real small model behind a
  continuous-batching server of ``llm_slots`` concurrent requests (``serve.py``); wall clock.
"""
from __future__ import annotations

import heapq
import itertools
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from mlsys_flows.errors import MlsysError

from .world import Agent, Config, StepPlan, chebyshev, initial_world, step_cluster, world_digest

POLICIES = ("global_sync", "out_of_order", "oracle")


class ScheduleError(MlsysError, RuntimeError):
    """A schedule broke an invariant (a deadlock, or a cluster step that disagrees with the truth)."""


# ----------------------------------------------------------------------------------------- policies
def _components(adj: np.ndarray) -> list[list[int]]:
    """Connected components of a small dense boolean graph (union-find over its few edges)."""
    parent = list(range(len(adj)))

    def find(u: int) -> int:
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    for u, v in zip(*np.nonzero(np.triu(adj, 1))):
        ru, rv = find(int(u)), find(int(v))
        if ru != rv:
            parent[max(ru, rv)] = min(ru, rv)
    comps: dict[int, list[int]] = {}
    for u in range(len(adj)):
        comps.setdefault(find(u), []).append(u)
    return list(comps.values())


def ready_clusters(policy: str, cfg: Config, clock: np.ndarray, pos: np.ndarray, busy: np.ndarray,
                   truth: dict[tuple[int, int], tuple[int, ...]] | None = None,
                   safety: int | None = None, dist: np.ndarray | None = None) -> list[tuple[int, tuple[int, ...]]]:
    """The cluster steps ``(t, members)`` that may start now. ``clock``: each agent's time; ``pos``:
    its position at that time; ``busy``: its step is running; ``dist``: the Chebyshev distances of
    ``pos`` (computed when not given). ``safety`` replaces ``max_speed`` in the out-of-order rule
    (only tests use it, to show that a too-small bound breaks equivalence)."""
    idle = ~busy & (clock < cfg.steps)
    if not idle.any():
        return []
    if policy == "oracle":
        if truth is None:
            raise ValueError("the oracle needs the true clusters of a finished run")
        out, seen = [], set()
        for i in np.flatnonzero(idle):
            t = int(clock[i])
            members = truth[(t, int(i))]
            if members in seen:
                continue
            if all(idle[j] and clock[j] == t for j in members):
                seen.add(members)
                out.append((t, members))
        return out
    if policy not in ("global_sync", "out_of_order"):
        raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
    ids = np.flatnonzero(idle)
    ci = clock[ids]
    behind = clock[None, :] < ci[:, None]  # [i, j]: agent j lags idle agent i
    if policy == "global_sync":
        blocked = behind.any(axis=1)
    else:
        d = (chebyshev(pos) if dist is None else dist)[ids]
        v = cfg.max_speed if safety is None else safety
        reach = cfg.radius + v * (ci[:, None] - clock[None, :])
        blocked = (behind & (d <= reach)).any(axis=1)
    free = ~blocked
    if not free.any():
        return []
    # clusters: same clock, within the radius, transitively; a cluster waits if any member is blocked
    dd = (chebyshev(pos) if dist is None else dist)[np.ix_(ids, ids)]
    adj = (dd <= cfg.radius) & (ci[:, None] == ci[None, :])
    out = []
    for comp in _components(adj):
        if free[comp].all():
            members = tuple(sorted(int(ids[k]) for k in comp))
            out.append((int(ci[comp[0]]), members))
    return sorted(out, key=lambda c: (c[0], c[1]))


# ---------------------------------------------------------------------------------------- executors
class PrioritySlots:
    """``k`` slots of a serving engine; a waiting call with a smaller priority goes first."""

    def __init__(self, k: int):
        self._free, self._heap, self._seq = k, [], itertools.count()
        self._cond = threading.Condition()

    def acquire(self, priority: float) -> None:
        with self._cond:
            me = (priority, next(self._seq))
            heapq.heappush(self._heap, me)
            while not (self._free > 0 and self._heap[0] == me):
                self._cond.wait()
            heapq.heappop(self._heap)
            self._free -= 1
            self._cond.notify_all()

    def release(self) -> None:
        with self._cond:
            self._free += 1
            self._cond.notify_all()


@dataclass
class Done:
    plan: StepPlan
    start: float
    end: float


class ThreadExecutor:
    """Runs each cluster step on a thread: its calls really wait (sleep) for their latency while
    holding one of ``k`` priority slots; the phases of a step run one after another."""

    def __init__(self, k: int, max_parallel: int, sleep: Callable[[float], None] = time.sleep):
        self.slots, self._sleep = PrioritySlots(k), sleep
        self._steps = ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="cluster")
        self._calls = ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="llm")
        self._pending: set = set()
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def _call(self, latency: float, priority: float) -> None:
        self.slots.acquire(priority)
        try:
            self._sleep(latency)
        finally:
            self.slots.release()

    def _run(self, members: list[Agent], t: int, cfg: Config) -> Done:
        start = self.now()
        plan = step_cluster(members, t, cfg)  # the agents' decisions; the calls below are their LLM time
        for phase in plan.phases:
            if len(phase) == 1:
                self._call(phase[0], t)
            else:
                for f in [self._calls.submit(self._call, lat, t) for lat in phase]:
                    f.result()
        return Done(plan, start, self.now())

    def submit(self, members: list[Agent], t: int, cfg: Config) -> None:
        self._pending.add(self._steps.submit(self._run, members, t, cfg))

    def wait_any(self) -> list[Done]:
        done, self._pending = wait(self._pending, return_when=FIRST_COMPLETED)
        return [f.result() for f in done]

    def close(self) -> None:
        self._steps.shutdown(wait=True)
        self._calls.shutdown(wait=True)


class ModelExecutor(ThreadExecutor):
    """ThreadExecutor whose calls generate tokens on a real model (serve.ModelServer, ``k`` requests
    batched) instead of sleeping: the makespan is the wall clock of real generation."""

    def __init__(self, k: int, max_parallel: int, latency_median_s: float, serve_cfg, seed: int = 0):
        from dataclasses import replace

        from .serve import ModelServer  # torch and the weights only when a real model is asked for

        super().__init__(k, max_parallel)
        self.server = ModelServer(k, replace(serve_cfg, seed=seed))   # the town's seed seeds the sampling
        self._median = latency_median_s
        self.t0 = time.perf_counter()  # after the model is loaded: loading is not the simulation's time

    def _call(self, latency: float, priority: float) -> None:
        tokens = self.server.cfg.new_tokens(latency, self._median)
        key = int(latency * 1e9)   # the call's drawn latency: unique per call, the same in every policy
        self.server.generate(self.server.prompt_for(key), tokens, priority, key=key)

    def close(self) -> None:
        super().close()
        self.server.close()


class SimExecutor:
    """The same calls on a simulated clock: ``k`` slots, lagging steps' calls first, zero overhead."""

    def __init__(self, k: int):
        self.k, self.clock, self._free = k, 0.0, k
        self._waiting: list = []   # (priority, seq, job, latency)
        self._events: list = []    # (time, seq, job)
        self._jobs: dict[int, list] = {}  # job -> [plan, phase index, calls left in phase, start]
        self._seq = itertools.count()
        self._finished: list[Done] = []

    def now(self) -> float:
        return self.clock

    def submit(self, members: list[Agent], t: int, cfg: Config) -> None:
        plan = step_cluster(members, t, cfg)
        job = next(self._seq)
        self._jobs[job] = [plan, -1, 0, self.clock]
        self._next_phase(job)
        self._dispatch()

    def _next_phase(self, job: int) -> None:
        state = self._jobs[job]
        plan = state[0]
        state[1] += 1
        if state[1] >= len(plan.phases):
            self._finished.append(Done(plan, state[3], self.clock))
            del self._jobs[job]
            return
        phase = plan.phases[state[1]]
        state[2] = len(phase)
        for lat in phase:
            heapq.heappush(self._waiting, (plan.t, next(self._seq), job, lat))

    def _dispatch(self) -> None:
        while self._free and self._waiting:
            _, _, job, lat = heapq.heappop(self._waiting)
            self._free -= 1
            heapq.heappush(self._events, (self.clock + lat, next(self._seq), job))

    def wait_any(self) -> list[Done]:
        while not self._finished:
            if not self._events:
                raise ScheduleError("no call in flight and no step finished")
            self.clock, _, job = heapq.heappop(self._events)
            self._free += 1
            state = self._jobs[job]
            state[2] -= 1
            if state[2] == 0:
                self._next_phase(job)
            self._dispatch()
        out, self._finished = self._finished, []
        return out

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------------------------- runner
@dataclass
class Outcome:
    policy: str
    makespan_s: float
    world: list[Agent]
    steps: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)  # (t, members), in finish order
    llm_calls: int = 0
    conversations: int = 0
    busy_call_s: float = 0.0       # sum of call latencies
    max_clock_spread: int = 0      # largest (max clock - min clock) seen at a dispatch
    mean_ready: float = 0.0        # mean cluster steps in flight after a dispatch round
    progress: list[tuple[float, float]] = field(default_factory=list)  # (time, mean agent clock)

    @property
    def digest(self) -> str:
        return world_digest(self.world)

    def truth(self) -> dict[tuple[int, int], tuple[int, ...]]:
        """(t, agent) -> the members of the agent's cluster at t: the true dependencies."""
        return {(t, i): members for t, members in self.steps for i in members}

    def summary(self) -> dict[str, float]:
        return {"makespan_s": self.makespan_s, "llm_calls": self.llm_calls, "cluster_steps": len(self.steps),
                "conversations": self.conversations, "llm_busy_s": self.busy_call_s,
                "max_clock_spread": self.max_clock_spread, "mean_steps_in_flight": self.mean_ready}


def run(policy: str, cfg: Config, executor, truth: dict | None = None, safety: int | None = None) -> Outcome:
    """Simulate the town under ``policy`` until every agent reaches ``cfg.steps``."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
    world = initial_world(cfg)
    n = cfg.agents
    clock = np.zeros(n, dtype=np.int64)
    pos = np.array([(a.x, a.y) for a in world], dtype=np.int64)
    busy = np.zeros(n, dtype=bool)
    dist = chebyshev(pos)
    out = Outcome(policy, 0.0, world)
    in_flight, rounds, flight_sum = 0, 0, 0
    try:
        while (clock < cfg.steps).any():
            ready = ready_clusters(policy, cfg, clock, pos, busy, truth, safety, dist)
            for t, members in ready:
                busy[list(members)] = True
                executor.submit([world[j] for j in members], t, cfg)
            in_flight += len(ready)
            if ready:
                rounds += 1
                flight_sum += in_flight
                out.max_clock_spread = max(out.max_clock_spread, int(clock.max() - clock.min()))
            if in_flight == 0:
                raise ScheduleError(f"{policy}: deadlock at clocks {clock.tolist()}")
            for done in executor.wait_any():
                plan = done.plan
                in_flight -= 1
                for a in plan.new:
                    world[a.id] = a
                    pos[a.id] = (a.x, a.y)
                    clock[a.id] = plan.t + 1
                    busy[a.id] = False
                moved = list(plan.members)
                row = np.abs(pos[moved][:, None, :] - pos[None, :, :]).max(axis=2)
                dist[moved, :] = row
                dist[:, moved] = row.T
                out.steps.append((plan.t, plan.members))
                out.llm_calls += plan.calls
                out.conversations += int(plan.talked)
                out.busy_call_s += sum(sum(p) for p in plan.phases)
            out.progress.append((executor.now(), float(clock.mean())))
        out.makespan_s = executor.now()
    finally:
        executor.close()
    out.world = world
    out.mean_ready = flight_sum / max(1, rounds)
    return out


def simulate(policy: str, cfg: Config, llm_slots: int, truth: dict | None = None,
             safety: int | None = None) -> Outcome:
    """``run`` on the simulated clock (exact, instantaneous)."""
    return run(policy, cfg, SimExecutor(llm_slots), truth, safety)


def execute(policy: str, cfg: Config, llm_slots: int, truth: dict | None = None) -> Outcome:
    """``run`` with real threads that sleep through each call; the makespan is wall clock."""
    return run(policy, cfg, ThreadExecutor(llm_slots, max_parallel=max(2, cfg.agents)), truth)


def execute_model(policy: str, cfg: Config, llm_slots: int, serve_cfg, truth: dict | None = None) -> tuple[Outcome, dict]:
    """``run`` with every call generated on a real model (ModelExecutor); also the server's counters.
    The outcome's ``busy_call_s`` becomes the server's busy slot-seconds (active requests x step time)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # one server thread does all the compute; more intra-op threads only contend
    try:
        ex = ModelExecutor(llm_slots, max(2, cfg.agents), cfg.latency_median_s, serve_cfg, seed=cfg.seed)
        out = run(policy, cfg, ex, truth)
        check, checked = ex.server.check_logits()   # after the clock: raises past the bound or when none was checked
    finally:
        torch.set_num_threads(threads)
    srv = ex.server
    out.busy_call_s = srv.busy_slot_s
    a, b = srv.step_cost()
    return out, {"decode_steps": srv.steps, "prefills": srv.prefills, "tokens": srv.tokens,
                 "mean_batch": (srv.tokens - srv.prefills) / max(1, srv.steps), "step_fixed_s": a, "step_per_request_s": b,
                 "prefill_s": srv.prefill_s, "decode_s": srv.decode_s, "prefill_calls": srv.prefill_calls,
                 "lane_moves": srv.batch.kv.moves, "logit_check": check,
                 "logit_checked": checked}


def utilization(busy_call_s: float, llm_slots: int, makespan_s: float) -> float:
    """Share of the serving engine's slot-seconds spent on calls."""
    return busy_call_s / (llm_slots * makespan_s) if makespan_s > 0 else 0.0


def same_steps(a: Outcome, b: Outcome) -> bool:
    """Both runs stepped exactly the same clusters at the same times."""
    return sorted(a.steps) == sorted(b.steps)
