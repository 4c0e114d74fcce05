"""Plans for the simulator: ReCycle, Oobleck-style and Bamboo-style training under failures (pure).

The cluster is D data-parallel pipelines x S stages; every stage holds ``layers_per_stage`` equal
transformer layers and the times come from a calibrated stage (``LayerCosts``). A failed worker is
(pipeline, stage).

* ReCycle: the failed worker's micro-batches run at the same stage on its peers in the other pipelines
  (same weights), spread evenly, and return to their own pipeline for the next stage; backward is
  decoupled (Bw deferred into bubbles) and each stage's all-reduce + optimizer step runs as soon as that
  stage is done (staggered, no global barrier).
* Oobleck-style: re-instantiate pipelines from the surviving workers -- a pipeline that lost k workers
  becomes one of S - k stages holding all layers (Oobleck's pipeline templates), or, when better, the
  damaged pipelines are dropped -- and redistribute the global batch over the pipelines by their speed;
  1F1B with a fused backward and a synchronous optimizer step, after a restart cost.
* Bamboo-style: every worker also runs the forward of its successor's stage (redundant computation,
  scheduled into bubbles); on a failure the predecessor runs the failed stage too; fused backward,
  synchronous optimizer step.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .sim import Group, MicroBatch, Plan, simulate


@dataclass(frozen=True)
class LayerCosts:
    """Per-layer, per-micro-batch times (seconds) and sizes from the calibrated stage."""

    forward: float
    backward_input: float
    backward_weight: float
    optimizer: float           # optimizer step of one layer's parameters
    layer_param_bytes: float
    activation_bytes: float
    p2p_gb_s: float            # point-to-point bandwidth between two stages
    p2p_latency_s: float
    allreduce_gb_s: float      # ring all-reduce bus bandwidth
    # the fused backward (one autograd pass) as measured: cheaper than B_input + B_weight, which
    # repeat work; the plans without decoupling (Oobleck, Bamboo, ReCycle's fused ablation) pay it
    backward_fused: float

    @property
    def p2p_s(self) -> float:
        return self.p2p_latency_s + self.activation_bytes / (self.p2p_gb_s * 1e9)

    def allreduce_s(self, layers: int, n: int) -> float:
        """Ring all-reduce of ``layers`` layers' gradients over ``n`` workers."""
        if n <= 1:
            return 0.0
        return 2 * (n - 1) / n * layers * self.layer_param_bytes / (self.allreduce_gb_s * 1e9) + self.p2p_latency_s * 2 * (n - 1)

    def sync_s(self, layers: int, n: int) -> float:
        return self.allreduce_s(layers, n) + layers * self.optimizer


@dataclass(frozen=True)
class Cluster:
    pipelines: int             # D
    stages: int                # S
    microbatches: int          # M per pipeline per iteration
    layers_per_stage: int
    micro_batch: int           # samples per micro-batch

    @property
    def samples_per_iteration(self) -> int:
        return self.pipelines * self.microbatches * self.micro_batch


def place_failures(pipelines: int, stages: int, failures: int, seed: int) -> list[tuple[int, int]]:
    """``failures`` distinct failed workers (pipeline, stage), seeded, such that every stage keeps a live
    worker and no pipeline loses two neighbouring stages (the case Bamboo can recover from)."""
    if failures >= pipelines * stages:
        raise ValueError("failures must leave live workers")
    rng = random.Random(seed)
    for _ in range(10_000):
        chosen = rng.sample([(p, s) for p in range(pipelines) for s in range(stages)], failures)
        per_stage = [sum(1 for _, s in chosen if s == k) for k in range(stages)]
        adjacent = any((p, (s + 1) % stages) in chosen for p, s in chosen) if stages > 1 else False
        if max(per_stage) < pipelines and not adjacent:
            return sorted(chosen)
    raise ValueError(f"cannot place {failures} failures on {pipelines} x {stages} workers under the constraints")


def _stage_durations(c: LayerCosts, layers: int, redundant_layers: int = 0) -> tuple[float, ...]:
    d = (layers * c.forward, layers * c.backward_input, layers * c.backward_weight, layers * c.backward_fused)
    return d + (redundant_layers * c.forward,) if redundant_layers else d


def recycle_plan(cl: Cluster, c: LayerCosts, failed: list[tuple[int, int]], *, decoupled: bool = True,
                 staggered: bool = True, label: str = "recycle") -> Plan:
    D, S, M, L = cl.pipelines, cl.stages, cl.microbatches, cl.layers_per_stage
    dead = set(failed)
    alive = [(p, s) for p in range(D) for s in range(S) if (p, s) not in dead]
    index = {w: i for i, w in enumerate(alive)}
    load = {w: M for w in alive}  # own micro-batches first; rerouted ones go to the least loaded peer
    mbs = []
    dur = _stage_durations(c, L)
    for p in range(D):
        for k in range(M):
            route = []
            for s in range(S):
                if (p, s) in dead:  # reroute to the least loaded live peer at the same stage
                    peer = min((w for w in alive if w[1] == s), key=lambda w: (load[w], (w[0] - p) % D))
                    load[peer] += 1
                else:
                    peer = (p, s)
                route.append(index[peer])
            mbs.append(MicroBatch(tuple(route), (dur,) * S, k))
    groups = []
    for s in range(S):
        ws = [index[w] for w in alive if w[1] == s]
        groups.append(Group(tuple(ws), c.sync_s(L, len(ws))))
    limits = [max(1, math.ceil((S - s) * load[(p, s)] / M)) for p, s in alive]
    return Plan(workers=[f"p{p}s{s}" for p, s in alive], microbatches=mbs, groups=groups, limits=limits,
                decoupled=decoupled, barrier=not staggered, p2p_s=c.p2p_s, max_deferred=S,
                samples_per_iteration=cl.samples_per_iteration, label=label)


def bamboo_plan(cl: Cluster, c: LayerCosts, failed: list[tuple[int, int]], *, label: str = "bamboo") -> Plan:
    D, S, M, L = cl.pipelines, cl.stages, cl.microbatches, cl.layers_per_stage
    dead = set(failed)
    alive = [(p, s) for p in range(D) for s in range(S) if (p, s) not in dead]
    index = {w: i for i, w in enumerate(alive)}
    mbs = []
    holds: dict[tuple[int, int], list[int]] = {w: [] for w in alive}   # stages (layer shards) a worker runs
    for p in range(D):
        route = []
        for s in range(S):
            w = (p, s) if (p, s) not in dead else (p, (s - 1) % S)  # the predecessor holds the replica
            holds[w].append(s)
            route.append(index[w])
        durs = []
        for s in range(S):
            w = route[s]
            # redundant forward of the successor's stage, unless the worker already runs it for real
            succ = (s + 1) % S
            redundant = L if S > 1 and route[succ] != w and (p, s) not in dead else 0
            durs.append(_stage_durations(c, L, redundant))
        mbs += [MicroBatch(tuple(route), tuple(durs), k) for k in range(M)]
    limits = [S - min(holds[w]) for w in alive]
    stage_limits = {(index[w], s): S - s for w in alive for s in holds[w]}
    # synchronous data parallelism: one global step; a worker running two stages syncs both shards
    step = max(c.sync_s(L * len(holds[w]), D) for w in alive)
    return Plan(workers=[f"p{p}s{s}" for p, s in alive], microbatches=mbs,
                groups=[Group(tuple(range(len(alive))), step)], limits=limits,
                stage_limits=stage_limits, decoupled=False, barrier=True,
                p2p_s=c.p2p_s, samples_per_iteration=cl.samples_per_iteration, label=label)


def _split_layers(total: int, stages: int) -> list[int]:
    return [total // stages + (1 if i < total % stages else 0) for i in range(stages)]


def oobleck_pipelines(cl: Cluster, failed: list[tuple[int, int]], drop: bool) -> list[int]:
    """Stage counts of the re-instantiated pipelines."""
    lost = [sum(1 for p, _ in failed if p == q) for q in range(cl.pipelines)]
    if drop:
        return [cl.stages for k in lost if k == 0]
    return [cl.stages - k for k in lost if cl.stages - k > 0]


def _layer_groups(splits: list[list[int]]) -> list[tuple[tuple[int, ...], int]]:
    """The sync groups of pipelines with different layer splits: workers that hold a common layer must
    all-reduce together, so the groups are the connected components of "shares a layer" (one per stage
    position when every pipeline has the same split). Returns (members, layers of the largest shard)."""
    owners: dict[int, list[int]] = {}   # layer -> workers holding it
    shard: list[int] = []
    w = 0
    for sp in splits:
        first = 0
        for n_layers in sp:
            for layer in range(first, first + n_layers):
                owners.setdefault(layer, []).append(w)
            shard.append(n_layers)
            first += n_layers
            w += 1
    parent = list(range(w))

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for ws in owners.values():
        for x in ws[1:]:
            parent[find(x)] = find(ws[0])
    comps: dict[int, list[int]] = {}
    for x in range(w):
        comps.setdefault(find(x), []).append(x)
    return [(tuple(ms), max(shard[x] for x in ms)) for ms in comps.values()]


def oobleck_plan(cl: Cluster, c: LayerCosts, failed: list[tuple[int, int]], *, drop: bool = False,
                 decoupled: bool = False, label: str = "oobleck") -> Plan:
    """Oobleck-style reconfiguration. ``decoupled=True`` gives it ReCycle's decoupled backward and staggered
    optimizer step too (the mechanism ablation: everything of ReCycle but the rerouting): B_weight deferred
    into bubbles and each group of workers sharing layers steps as soon as it is done, no global barrier."""
    S, M, L = cl.stages, cl.microbatches, cl.layers_per_stage
    total_layers = S * L
    shapes = oobleck_pipelines(cl, failed, drop)
    if not shapes:
        raise ValueError("no pipeline survives")
    splits = [_split_layers(total_layers, n) for n in shapes]
    # the global batch over the pipelines by their speed: greedy on the 1F1B estimate (m + n - 1) * slowest stage,
    # each plan with its own backward (the fused one as measured; decoupled: B_input + B_weight)
    backward = c.backward_input + c.backward_weight if decoupled else c.backward_fused
    per_mb = [max(sp) * (c.forward + backward) for sp in splits]
    counts = [0] * len(shapes)
    for _ in range(cl.pipelines * M):
        q = min(range(len(shapes)), key=lambda i: ((counts[i] + shapes[i]) * per_mb[i], i))
        counts[q] += 1
    workers, mbs, limits, sync = [], [], [], []
    for q, (n, sp) in enumerate(zip(shapes, splits)):
        base = len(workers)
        for s in range(n):
            workers.append(f"q{q}s{s}")
            limits.append(n - s)
            sync.append(c.sync_s(sp[s], len(shapes)))
        if counts[q]:
            mb = MicroBatch(tuple(range(base, base + n)), tuple(_stage_durations(c, k) for k in sp))
            mbs += [MicroBatch(mb.route, mb.durations, k) for k in range(counts[q])]
    if decoupled:
        groups = [Group(ms, c.sync_s(layers, len(shapes))) for ms, layers in _layer_groups(splits)]
        return Plan(workers=workers, microbatches=mbs, groups=groups, limits=limits, decoupled=True, barrier=False,
                    p2p_s=c.p2p_s, max_deferred=S, samples_per_iteration=cl.samples_per_iteration, label=label)
    return Plan(workers=workers, microbatches=mbs, groups=[Group(tuple(range(len(workers))), max(sync))],
                limits=limits, decoupled=False, barrier=True, p2p_s=c.p2p_s,
                samples_per_iteration=cl.samples_per_iteration, label=label)


def best_oobleck(cl: Cluster, c: LayerCosts, failed: list[tuple[int, int]], iterations: int, *,
                 decoupled: bool = False):
    """Oobleck's choice between pipeline templates over all survivors and dropping damaged pipelines:
    whichever simulates faster. Returns (plan, result, choice)."""
    options = []
    for drop in (False, True):
        if drop and not failed:
            continue
        try:
            plan = oobleck_plan(cl, c, failed, drop=drop, decoupled=decoupled, label="oobleck")
        except ValueError:
            continue
        res = simulate(plan, iterations)
        options.append((res.steady_iteration_s(), drop, plan, res))
    _, drop, plan, res = min(options, key=lambda o: (o[0], o[1]))
    return plan, res, "drop damaged pipelines" if drop else "shrunk pipelines (templates)"


def window_throughput(samples_per_iteration: float, iteration_s: float, window_iterations: int,
                      stall_s: float) -> float:
    """Samples per second over a window of ``window_iterations`` iterations that also pays ``stall_s``
    (lost work and restarts)."""
    return window_iterations * samples_per_iteration / (window_iterations * iteration_s + stall_s)
