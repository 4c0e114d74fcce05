"""Discrete-event simulator of pipeline-parallel training (pure Python).

A plan lists workers (devices), micro-batches with their route (the worker that runs each stage) and
per-stage durations, and the synchronisation groups (gradient all-reduce + optimizer step of one
layer shard). The simulator builds the operation graph of ``iterations`` training iterations --
forward F, backward-input Bi and backward-weight Bw per (micro-batch, stage) (or a fused backward B),
optional redundant forward RF (Bamboo), one sync op per group -- and list-schedules it: each worker,
when idle, starts the most urgent ready operation:

1. a backward (Bi or fused B), oldest first (1F1B drains backward first);
2. a deferred op (Bw, RF) when ``max_deferred`` of them are already waiting (activation memory);
3. a forward, while fewer than the worker's in-flight limit micro-batches wait for their backward
   (1F1B: stage s of S keeps at most S - s);
4. otherwise a deferred op: Bw and RF fill the pipeline bubbles.

A sync op occupies all of its group's workers at once and starts when all of them have finished the
iteration's work; a worker starts the next iteration's forwards after its own sync ops (staggered
optimizer) or, with ``barrier``, after one global sync of every worker.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from mlsys_flows.errors import MlsysError


class SimulationError(MlsysError, RuntimeError):
    """The plan cannot be scheduled (a dependency cycle or an inconsistent route)."""


@dataclass(frozen=True)
class MicroBatch:
    route: tuple[int, ...]                    # worker of each stage
    durations: tuple[tuple[float, ...], ...]  # per stage: (forward, backward_input, backward_weight,
                                              #             fused backward[, redundant forward])
    order: int = 0                            # position in its own pipeline's sequence (ties go to the lower)


@dataclass(frozen=True)
class Group:
    members: tuple[int, ...]
    duration: float                           # all-reduce + optimizer step


@dataclass
class Plan:
    workers: list[str]
    microbatches: list[MicroBatch]
    groups: list[Group]
    limits: list[int]                         # in-flight forwards per worker (per stage it runs)
    stage_limits: dict[tuple[int, int], int] = field(default_factory=dict)  # (worker, stage) overrides
    decoupled: bool = True                    # Bi and Bw separate (else one fused B)
    barrier: bool = False                     # one global sync instead of per-group syncs
    p2p_s: float = 0.0                        # transfer time between two different workers
    max_deferred: int = 1 << 30
    samples_per_iteration: float = 1.0
    label: str = ""


@dataclass
class Record:
    worker: int
    kind: str
    iteration: int
    mb: int
    start: float
    end: float
    stage: int = -1                           # the stage of its micro-batch's route (-1: sync)


@dataclass
class Result:
    iteration_end: list[float]
    records: list[Record] = field(default_factory=list)

    @property
    def makespan(self) -> float:
        return self.iteration_end[-1]

    def steady_iteration_s(self) -> float:
        """Time per iteration once the pipeline is in steady state (first iteration excluded)."""
        e = self.iteration_end
        return (e[-1] - e[0]) / (len(e) - 1) if len(e) > 1 else e[0]

    def busy(self, worker: int) -> float:
        return sum(r.end - r.start for r in self.records if r.worker == worker)

    def order(self, worker: int, iteration: int | None = None) -> list[tuple[str, int]]:
        """The (kind, micro-batch) sequence a worker ran, in start order."""
        rs = sorted((r for r in self.records if r.worker == worker and (iteration is None or r.iteration == iteration)),
                    key=lambda r: r.start)
        return [(r.kind, r.mb) for r in rs]


_BACKWARD, _FORWARD, _DEFERRED = ("Bi", "B"), ("F",), ("Bw", "RF")


def simulate(plan: Plan, iterations: int = 3) -> Result:
    if iterations < 1:
        raise ValueError("iterations must be >= 1")
    W = len(plan.workers)
    if len(plan.limits) != W or min(plan.limits, default=1) < 1:
        raise SimulationError("every worker needs an in-flight limit >= 1")
    for mb in plan.microbatches:
        if len(mb.route) != len(mb.durations) or not all(0 <= w < W for w in mb.route):
            raise SimulationError("a micro-batch route names an unknown worker or lacks durations")
        if any(len(d) < 4 for d in mb.durations):
            raise SimulationError("a stage's durations need forward, backward_input, backward_weight and the fused "
                                  "backward")
    groups = [Group(tuple(range(W)), max((g.duration for g in plan.groups), default=0.0))] if plan.barrier \
        else list(plan.groups)
    # --- the operation graph ---
    kind, worker, it_of, mb_of, dur, stage_of = [], [], [], [], [], []
    succ: list[list[tuple[int, float]]] = []
    members: dict[int, tuple[int, ...]] = {}

    def add(k, w, it, m, d, s=-1):
        kind.append(k), worker.append(w), it_of.append(it), mb_of.append(m), dur.append(d), succ.append([])
        stage_of.append(s)
        return len(kind) - 1

    ndeps: list[int] = []
    edges = []
    sync_prev: dict[int, list[int]] = {}      # worker -> sync ops of the previous iteration
    it_ops: list[list[int]] = [[] for _ in range(W)]
    sync_ops_by_it: list[list[int]] = []
    for it in range(iterations):
        it_ops = [[] for _ in range(W)]
        for j, mb in enumerate(plan.microbatches):
            S = len(mb.route)
            fwd, bwd = [], []
            for s, w in enumerate(mb.route):
                d = mb.durations[s]
                f = add("F", w, it, j, d[0], s)
                fwd.append(f)
                it_ops[w].append(f)
                for prev in sync_prev.get(w, []):
                    edges.append((prev, f, 0.0))
                if s > 0:
                    edges.append((fwd[s - 1], f, plan.p2p_s if mb.route[s - 1] != w else 0.0))
                if len(d) > 4 and d[4] > 0:
                    rf = add("RF", w, it, j, d[4], s)
                    it_ops[w].append(rf)
                    edges.append((f, rf, 0.0))
            bwd = [0] * S
            for s in range(S - 1, -1, -1):
                w, d = mb.route[s], mb.durations[s]
                b = add("Bi" if plan.decoupled else "B", w, it, j, d[1] if plan.decoupled else d[3], s)
                bwd[s] = b
                it_ops[w].append(b)
                edges.append((fwd[s], b, 0.0))
                if s < S - 1:
                    edges.append((bwd[s + 1], b, plan.p2p_s if mb.route[s + 1] != w else 0.0))
                if plan.decoupled:
                    bw = add("Bw", w, it, j, d[2], s)
                    it_ops[w].append(bw)
                    edges.append((b, bw, 0.0))
        syncs = []
        new_prev: dict[int, list[int]] = {}
        for g in groups:
            op = add("sync", g.members[0], it, -1, g.duration)
            members[op] = g.members
            syncs.append(op)
            for w in g.members:
                for o in it_ops[w]:
                    edges.append((o, op, 0.0))
                new_prev.setdefault(w, []).append(op)
        sync_ops_by_it.append(syncs)
        sync_prev = new_prev
    n = len(kind)
    ndeps = [0] * n
    for a, b, delay in edges:
        succ[a].append((b, delay))
        ndeps[b] += 1
    # --- list scheduling ---
    order = [mb.order for mb in plan.microbatches]
    ready_at = [0.0] * n
    end = [math.inf] * n
    free_at = [0.0] * W
    inflight: dict[tuple[int, int], int] = {}  # (worker, stage) -> forwards waiting for their backward
    deferred_waiting = [0] * W
    ready: list[list[int]] = [[] for _ in range(W)]   # deps met, per worker (ops of workers)
    ready_syncs: list[int] = []
    events: list[float] = [0.0]
    running: list[tuple[float, int]] = []
    records: list[Record] = []
    done = 0

    def release(op):
        if kind[op] == "sync":
            ready_syncs.append(op)
        else:
            ready[worker[op]].append(op)
            if kind[op] in _DEFERRED:
                deferred_waiting[worker[op]] += 1
        heapq.heappush(events, ready_at[op])

    for op in range(n):
        if ndeps[op] == 0:
            release(op)

    def start(op, w_list, t):
        end[op] = t + dur[op]
        for w in w_list:
            free_at[w] = end[op]
        heapq.heappush(running, (end[op], op))
        heapq.heappush(events, end[op])
        records.append(Record(worker[op] if kind[op] != "sync" else -1, kind[op], it_of[op], mb_of[op], t, end[op],
                              stage_of[op]))
        if kind[op] == "sync":
            for w in w_list:
                records.append(Record(w, "sync", it_of[op], -1, t, end[op]))

    while done < n:
        if not events:
            raise SimulationError(f"deadlock: {n - done} operations can never start ({plan.label})")
        t = heapq.heappop(events)
        while events and events[0] <= t:
            heapq.heappop(events)
        while running and running[0][0] <= t:
            _, op = heapq.heappop(running)
            done += 1
            for b, delay in succ[op]:
                ready_at[b] = max(ready_at[b], end[op] + delay)
                ndeps[b] -= 1
                if ndeps[b] == 0:
                    release(b)
        # group syncs first: their members wait for them
        for op in sorted(ready_syncs, key=lambda o: (ready_at[o], o)):
            ws = members[op]
            if ready_at[op] <= t and all(free_at[w] <= t for w in ws):
                ready_syncs.remove(op)
                start(op, ws, t)
        for w in range(W):
            if free_at[w] > t or not ready[w]:
                continue
            cand = [o for o in ready[w] if ready_at[o] <= t]
            if not cand:
                continue
            key = lambda o: (it_of[o], ready_at[o], order[mb_of[o]], mb_of[o], o)  # noqa: E731
            back = [o for o in cand if kind[o] in _BACKWARD]
            defer = [o for o in cand if kind[o] in _DEFERRED]
            fwd = [o for o in cand if kind[o] in _FORWARD
                   and inflight.get((w, stage_of[o]), 0) < plan.stage_limits.get((w, stage_of[o]), plan.limits[w])]
            if back:
                op = min(back, key=key)
            elif defer and deferred_waiting[w] >= plan.max_deferred:
                op = min(defer, key=key)
            elif fwd:
                op = min(fwd, key=key)
            elif defer:
                op = min(defer, key=key)
            else:
                continue
            ready[w].remove(op)
            if kind[op] == "F":
                inflight[(w, stage_of[op])] = inflight.get((w, stage_of[op]), 0) + 1
            elif kind[op] in _BACKWARD:
                inflight[(w, stage_of[op])] -= 1
            else:
                deferred_waiting[w] -= 1
            start(op, (w,), t)
    it_end = [max(end[o] for o in syncs) if syncs else 0.0 for syncs in sync_ops_by_it]
    if any(not syncs for syncs in sync_ops_by_it):
        it_end = [max(end[o] for o in range(n) if it_of[o] == it) for it in range(iterations)]
    return Result(iteration_end=it_end, records=records)
