"""The video DAG, its profiles, Llama's planner, the static baselines and the executor.

The DAG is decode -> sample -> motion -> detect -> classify -> aggregate. ``motion`` is the
conditional branch (a frame without motion ends there) and ``detect`` fans out (a frame yields a
content-dependent number of object crops, each classified). Every planned operation has two knobs
per invocation: the batch size (items per invocation) and the hardware tier (``cpu``/``gpu``
workers); the sampling rate is a pipeline parameter held equal for every variant, so every variant
computes the same answer (checked against an in-process reference run).

Execution is event-driven on a virtual clock: an invocation is run for real, at once, in a worker
process of the serverless pool (``runtime.WorkerPool``) and its measured duration (GPU tier: the
compute part divided by a stated speed factor) places its finish event on the clock; a new instance
adds its measured cold start. Instances therefore follow the pipeline's timeline: concurrent
invocations need concurrent instances (up to the tier's limit), an instance idle longer than the
keep-alive is stopped. The same executor runs with a ``PredictedRunner`` (profiled latencies,
outputs from a trace, no processes) to choose the static plans and to predict every variant.
"""
from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from . import ops
from .runtime import TIERS, Instance, WorkerPool

PLANNED = ("decode", "sample", "motion", "detect", "classify")   # aggregate: one invocation per video, tier planned
CHAIN = ops.OPS                     # the DAG is a chain with a branch (motion) and a fan-out (detect)
NEXT = dict(zip(CHAIN, CHAIN[1:]))


@dataclass(frozen=True)
class Config:
    batch: int
    tier: str

    def label(self) -> str:
        return f"{self.tier}/b{self.batch}"


def tier_latency(rtt_s: float, compute_s: float, tier: str, op: str, gpu_speedup: dict[str, float]) -> float:
    """An invocation's latency on its tier: the measured round trip on the CPU tier; on the GPU tier
    the measured call overhead plus the measured compute divided by the op's GPU speed factor."""
    if tier == "cpu":
        return rtt_s
    compute_s = min(compute_s, rtt_s)
    return rtt_s - compute_s + compute_s / gpu_speedup[op]


@dataclass
class Profile:
    """Latency per (op, tier) at each profiled batch size, cold start per tier, price per tier."""

    batches: tuple[int, ...]
    latency: dict[str, list[float]]          # "op/tier" -> seconds per invocation at each batch size
    cold_start_s: dict[str, float]
    price_per_s: dict[str, float]
    items_per_video: dict[str, float] = field(default_factory=dict)  # expected input items per op (profiling video)

    def lat(self, op: str, tier: str, n: int) -> float:
        """Latency of one invocation of ``n`` items: linear between the profiled batch sizes."""
        table = self.__dict__.setdefault("_table", {})
        key = f"{op}/{tier}"
        if key not in table:
            table[key] = np.interp(np.arange(1, max(self.batches) + 1), self.batches, self.latency[key]).tolist()
        row = table[key]
        return row[min(max(1, n), len(row)) - 1]

    def cost(self, op: str, tier: str, n: int) -> float:
        return self.lat(op, tier, n) * self.price_per_s[tier]

    def stage_latency(self, op: str, tier: str, n: int, batch: int, instances: int) -> float:
        """``n`` items in invocations of ``batch`` over ``instances`` parallel workers, in waves."""
        n = max(1, n)
        return math.ceil(math.ceil(n / batch) / instances) * self.lat(op, tier, min(batch, n))

    def cheapest(self, op: str, tier: str = "cpu") -> Config:
        """The batch size with the lowest cost per item on ``tier``."""
        return Config(min(self.batches, key=lambda b: self.lat(op, tier, b) / b), tier)


# --- the planner ---------------------------------------------------------------------------------

@dataclass
class View:
    """What a policy sees when it plans one invocation of ``op``."""

    op: str
    pending: int                 # items waiting at this op for this video
    now: float
    deadline: float              # the video's arrival + SLO
    idle: dict[str, int]         # warm idle instances per tier
    startable: dict[str, int]    # instances that may still start per tier


@dataclass(frozen=True)
class Decision:
    config: Config
    predicted_s: float
    cost: float
    target_s: float = math.inf
    scale_out: bool = True       # may start new instances (cold starts); False: wait for warm ones


def predict(profile: Profile, op: str, cfg: Config, view: View) -> tuple[float, float, bool]:
    """Predicted latency, cost and scale-out of draining ``view.pending`` items with ``cfg``: ceil(n/b)
    invocations in parallel waves, either over the tier's warm idle instances only or over those plus
    newly started ones (one cold start first), whichever is predicted faster; cost = the profiled busy
    time of every invocation x the tier's price."""
    n, b = view.pending, cfg.batch
    if op == "aggregate":          # a reduction: one invocation over every label
        n = b = max(1, n)
    k = math.ceil(n / b)
    slots = view.idle[cfg.tier] + view.startable[cfg.tier]
    cost = (k - 1) * profile.cost(op, cfg.tier, b) + profile.cost(op, cfg.tier, n - (k - 1) * b)
    one = profile.lat(op, cfg.tier, min(b, n))
    idle = view.idle[cfg.tier]
    warm = math.ceil(k / idle) * one if idle else math.inf
    if slots == idle or k <= idle:
        return warm, cost, False
    out = profile.cold_start_s[cfg.tier] + math.ceil(k / slots) * one
    return (warm, cost, False) if warm <= out else (out, cost, True)


class Policy(Protocol):
    name: str

    def choose(self, view: View) -> Decision: ...


class StaticPolicy:
    """One fixed configuration per operation."""

    def __init__(self, name: str, configs: dict[str, Config], profile: Profile):
        self.name, self.configs, self.profile = name, dict(configs), profile

    def choose(self, view: View) -> Decision:
        cfg = self.configs.get(view.op) or Config(1, self.configs["classify"].tier)  # aggregate: classify's tier
        return Decision(cfg, math.nan, math.nan)  # a static plan predicts nothing


class LlamaPolicy:
    """Llama's per-invocation planning: target = remaining budget x (this op's estimated latency /
    the estimated latency of the remaining critical path); the cheapest configuration predicted to
    meet the target, else the fastest. Called again for every invocation it dispatches, with the
    clock, the queue and the warm instances of that moment (re-planning as invocations finish)."""

    name = "llama"

    def __init__(self, profile: Profile, max_instances: int, tiers: tuple[str, ...] = TIERS):
        self.profile, self.max_instances, self.tiers = profile, max_instances, tiers

    def stage_estimate(self, op: str, n: float) -> float:
        """An op's estimated stage latency for ``n`` items with its cheapest CPU configuration: waves of
        invocations over the tier's concurrency limit."""
        b = self.profile.cheapest(op).batch
        n = max(1, math.ceil(n))
        k = 1 if op == "aggregate" else math.ceil(n / b)
        return math.ceil(k / self.max_instances) * self.profile.lat(op, "cpu", n if op == "aggregate" else min(b, n))

    def shares(self, op: str, pending: int) -> tuple[float, float]:
        """(this op's estimate, the remaining critical path's): the op itself with its pending items,
        every later op with the expected items per video."""
        mine = self.stage_estimate(op, pending)
        later = sum(self.stage_estimate(o, self.profile.items_per_video.get(o, pending)) for o in CHAIN[CHAIN.index(op) + 1:])
        return mine, mine + later

    def target(self, view: View) -> float:
        mine, path = self.shares(view.op, view.pending)
        return max(0.0, view.deadline - view.now) * mine / path

    def candidates(self, view: View) -> list[Decision]:
        target = self.target(view)
        out = []
        batches = (max(1, view.pending),) if view.op == "aggregate" else self.profile.batches
        for tier in self.tiers:
            for b in batches:
                cfg = Config(b, tier)
                lat, cost, scale_out = predict(self.profile, view.op, cfg, view)
                out.append(Decision(cfg, lat, cost, target, scale_out))
        return out

    def choose(self, view: View) -> Decision:
        return pick(self.candidates(view))


class LlamaOncePolicy(LlamaPolicy):
    """The mechanism ablation: Llama's planner, profile, latency targets and cost-based choice, but each
    operation's configuration (tier, batch size) is chosen once (at its first invocation, with that
    moment's view) and then kept for every later invocation, scaling out like a static plan: no dynamic
    per-invocation configuration, no re-planning."""

    name = "llama_once"

    def __init__(self, profile: Profile, max_instances: int, tiers: tuple[str, ...] = TIERS):
        super().__init__(profile, max_instances, tiers)
        self.fixed: dict[str, Config] = {}

    def choose(self, view: View) -> Decision:
        if view.op not in self.fixed:
            self.fixed[view.op] = super().choose(view).config
        return Decision(self.fixed[view.op], math.nan, math.nan)


def scaled_profile(profile: Profile, factor: float) -> Profile:
    """``profile`` with every operation's invocation latency multiplied by ``factor`` and the cold starts
    and prices unchanged: the operator duration / cold start regime."""
    return Profile(profile.batches, {k: [x * factor for x in v] for k, v in profile.latency.items()},
                   dict(profile.cold_start_s), dict(profile.price_per_s), dict(profile.items_per_video))


def pick(cands: list[Decision]) -> Decision:
    """The cheapest candidate predicted to meet its target; none: the fastest (then cheapest)."""
    feasible = [c for c in cands if c.predicted_s <= c.target_s]
    if feasible:
        return min(feasible, key=lambda c: (c.cost, c.predicted_s))
    return min(cands, key=lambda c: (c.predicted_s, c.cost))


# --- execution -----------------------------------------------------------------------------------

@dataclass
class VideoJob:
    video: int
    arrival: float
    items: list                  # decode inputs: (frame index, compressed bytes or None)
    measured: bool = True        # False: a warm-up video, run but left out of the metrics


class Runner(Protocol):
    def invoke(self, inst: Instance, op: str, items: list, args: dict) -> tuple[list, float]: ...


class RealRunner:
    """Runs the invocation in the instance's worker process; latency per ``tier_latency``."""

    def __init__(self, gpu_speedup: dict[str, float]):
        self.gpu_speedup = gpu_speedup
        self.rtt_s = 0.0

    def invoke(self, inst: Instance, op: str, items: list, args: dict) -> tuple[list, float]:
        outputs, rtt, compute = inst.worker.call(op, items, args)
        self.rtt_s += rtt
        return outputs, tier_latency(rtt, compute, inst.tier, op, self.gpu_speedup)


class PredictedRunner:
    """Profiled latencies and traced outputs: the planner's model of an execution, no processes."""

    def __init__(self, profile: Profile, trace: dict):
        self.profile, self.trace = profile, trace

    def invoke(self, inst: Instance, op: str, items: list, args: dict) -> tuple[list, float]:
        v = args["video"]
        if op == "aggregate":
            outputs = [(v, self.trace[(v, "aggregate", v)])]
        else:
            outputs = [(k2, None) for k, _ in items for k2 in self.trace[(v, op, k)]]
        return outputs, self.profile.lat(op, inst.tier, len(items))


@dataclass
class VideoResult:
    video: int
    latency_s: float
    met: bool
    counts: tuple
    frames_with_motion: int
    objects: int
    cost: float
    invocations: int


@dataclass
class ExecResult:
    policy: str
    videos: list[VideoResult]
    cost: float
    busy_s: dict[str, float]
    invocations: int
    cold_starts: int
    cold_start_s: float
    stopped_idle: int
    warm_cold_starts: int = 0      # cold starts before the first measured video arrived (provisioned)
    warmup: list = field(default_factory=list)
    configs: Counter = field(default_factory=Counter)   # "op:tier/bN" -> invocations
    wall_s: float = 0.0
    rtt_s: float = 0.0

    def summary(self, slo_s: float) -> dict[str, float]:
        lat = np.array([v.latency_s for v in self.videos])
        n = len(self.videos)
        busy = sum(self.busy_s.values())
        return {"cost": sum(v.cost for v in self.videos) / n, "mean_latency_s": float(lat.mean()), "p95_latency_s": float(np.quantile(lat, 0.95)),
                "slo_attainment": float(np.mean([v.met for v in self.videos])), "slo_s": slo_s,
                "gpu_busy_share": self.busy_s["gpu"] / busy if busy else 0.0,
                "invocations": float(sum(v.invocations for v in self.videos)), "cold_starts": float(self.cold_starts),
                "cold_starts_measured_videos": float(self.cold_starts - self.warm_cold_starts),
                "cold_start_s": self.cold_start_s, "execution_wall_s": self.wall_s,
                "objects_classified": float(sum(v.objects for v in self.videos)),
                "frames_with_motion": float(sum(v.frames_with_motion for v in self.videos))}


def execute(jobs: list[VideoJob], policy: Policy, pool: WorkerPool, runner: Runner, args: dict, slo_s: float,
            price_per_s: dict[str, float]) -> ExecResult:
    """Run every video through the DAG under ``policy`` (see the module docstring)."""
    t_wall = time.perf_counter()
    rate = args["sample_rate"]
    seq = itertools.count()
    heap: list = [(j.arrival, next(seq), "arrive", j) for j in jobs]
    heapq.heapify(heap)
    queues = {j.video: {op: [] for op in CHAIN} for j in jobs}
    sampled: dict[int, dict[int, Any]] = {j.video: {} for j in jobs}
    emitted: dict[int, set[int]] = {j.video: set() for j in jobs}
    inflight = {j.video: Counter() for j in jobs}
    arrival = {j.video: j.arrival for j in jobs}
    active: list[int] = []
    agg_started: set[int] = set()
    stats = {"motion": Counter(), "objects": Counter(), "cost": Counter(), "calls": Counter()}
    measured = {j.video: j.measured for j in jobs}
    first_measured = min((j.arrival for j in jobs if j.measured), default=math.inf)
    counted_warm = False
    out_videos: list[VideoResult] = []
    res = ExecResult(policy.name, out_videos, 0.0, dict.fromkeys(TIERS, 0.0), 0, 0, 0.0, 0)

    def launch(v: int, op: str, cfg: Config, items: list, t: float, scale_out: bool = True) -> bool:
        acq = pool.acquire(cfg.tier, t, allow_new=scale_out)
        if acq is None:
            return False
        inst, cold = acq
        outputs, lat = runner.invoke(inst, op, items, {**args, "video": v})
        res.invocations += 1
        res.cost += lat * price_per_s[cfg.tier]
        stats["cost"][v] += lat * price_per_s[cfg.tier]
        stats["calls"][v] += 1
        res.busy_s[cfg.tier] += lat
        res.configs[f"{op}:{cfg.label()}"] += 1
        inflight[v][op] += 1
        heapq.heappush(heap, (t + cold + lat, next(seq), "done", (inst, v, op, outputs)))
        return True

    def route(v: int, op: str, outputs: list, t: float) -> None:
        q = queues[v]
        if op == "decode":
            q["sample"] += outputs
        elif op == "sample":
            seen = sampled[v]
            for k, f in outputs:
                seen[k] = f
            done = emitted[v]
            for k, _ in outputs:
                for m in (k, k + rate):   # a frame pairs with its predecessor once both are here
                    if m in seen and m not in done and (m == 0 or m - rate in seen):
                        done.add(m)
                        q["motion"].append((m, (seen[m], seen[m - rate] if m else None)))
        elif op == "motion":
            stats["motion"][v] += len(outputs)
            q["detect"] += outputs
        elif op == "detect":
            stats["objects"][v] += len(outputs)
            q["classify"] += outputs
        elif op == "classify":
            q["aggregate"] += outputs
        else:
            lat = t - arrival[v]
            r = VideoResult(v, lat, lat <= slo_s, outputs[0][1], stats["motion"][v], stats["objects"][v],
                            stats["cost"][v], stats["calls"][v])
            (out_videos if measured[v] else res.warmup).append(r)
            active.remove(v)

    def dispatch(t: float) -> None:
        for v in list(active):
            q = queues[v]
            for op in PLANNED:
                if not q[op]:
                    continue
                # one decision for the op's pending items, re-planned at the next event for what is left
                view = View(op, len(q[op]), t, arrival[v] + slo_s,
                            {tr: pool.idle(tr, t) for tr in TIERS}, {tr: pool.startable(tr, t) for tr in TIERS})
                dec = policy.choose(view)
                while q[op]:
                    take = q[op][:dec.config.batch]
                    if not launch(v, op, dec.config, take, t, dec.scale_out):
                        break
                    del q[op][:len(take)]
            upstream_done = not any(q[op] or inflight[v][op] for op in PLANNED)
            if upstream_done and v not in agg_started:
                n = len(q["aggregate"])
                view = View("aggregate", n, t, arrival[v] + slo_s,
                            {tr: pool.idle(tr, t) for tr in TIERS}, {tr: pool.startable(tr, t) for tr in TIERS})
                dec = policy.choose(view)
                if launch(v, "aggregate", Config(max(1, n), dec.config.tier), q["aggregate"], t, dec.scale_out):
                    agg_started.add(v)

    try:
        while heap:
            t, _, kind, data = heapq.heappop(heap)
            if kind == "arrive":
                if t >= first_measured and not counted_warm:
                    res.warm_cold_starts, counted_warm = pool.stats.cold_starts, True
                queues[data.video]["decode"] = list(data.items)
                active.append(data.video)
            else:
                inst, v, op, outputs = data
                pool.release(inst, t)
                inflight[v][op] -= 1
                route(v, op, outputs, t)
            if heap and heap[0][0] == t:
                continue  # handle everything at this instant before planning
            dispatch(t)
    finally:
        res.cold_starts = pool.stats.cold_starts
        res.cold_start_s = float(sum(pool.stats.cold_start_s))
        res.stopped_idle = pool.stats.stopped_idle
    if active:
        raise RuntimeError(f"videos {active} never finished (no instance could run their invocations)")
    out_videos.sort(key=lambda r: r.video)
    res.wall_s = time.perf_counter() - t_wall
    res.rtt_s = getattr(runner, "rtt_s", 0.0)
    return res


# --- the workload, its reference answer and trace --------------------------------------------------

def make_jobs(videos: list[list], mean_gap_s: float, seed: int, warmup: int = 0) -> list[VideoJob]:
    """Videos arrive as a Poisson process (exponential gaps, mean ``mean_gap_s``), the first at 0; the
    first ``warmup`` of them are warm-up videos (run, not measured)."""
    gaps = np.random.default_rng([seed, 7]).exponential(mean_gap_s, len(videos))
    gaps[0] = 0.0
    return [VideoJob(v, float(t), items, measured=v >= warmup)
            for v, (t, items) in enumerate(zip(np.cumsum(gaps), videos))]


def items_per_video(trace: dict, videos: int) -> dict[str, float]:
    """Mean input items per op and video in a trace (the planner's expectation for later ops)."""
    outs = Counter()
    for (_, op, _), keys in trace.items():
        if op != "aggregate":
            outs[op] += len(keys)
    n = {"decode": outs["decode"], "sample": outs["decode"], "motion": outs["sample"], "detect": outs["motion"],
         "classify": outs["detect"], "aggregate": outs["detect"]}
    return {op: c / videos for op, c in n.items()}


def reference(videos: list[list], args: dict, labels: bool = True) -> tuple[dict, dict[int, tuple | None]]:
    """The pipeline run in-process, item by item: the trace (video, op, key) -> output keys and each
    video's answer (objects per class). ``labels=False``: the classifier is not run (its outputs, one per
    crop, do not depend on the labels), so the trace's item counts, all the executor's predictions need,
    come at a fraction of the cost and every answer is None (for videos no answer is checked on)."""
    rate = args["sample_rate"]
    trace: dict = {}
    answers = {}
    for v, items in enumerate(videos):
        a = {**args, "video": v}
        frames = ops.decode(items, a)
        for (k, _), (k2, _) in zip(items, frames):
            trace[(v, "decode", k)] = [k2]
        kept = {}
        for k, f in frames:
            s = ops.sample([(k, f)], a)
            trace[(v, "sample", k)] = [k2 for k2, _ in s]
            kept.update(s)
        found = []
        for k in sorted(kept):
            m = ops.motion([(k, (kept[k], kept.get(k - rate) if k else None))], a)
            trace[(v, "motion", k)] = [k2 for k2, _ in m]
            for k2, f in m:
                crops = ops.detect([(k2, f)], a)
                trace[(v, "detect", k2)] = [c for c, _ in crops]
                for c, lab in (ops.classify(crops, a) if labels else [(c, None) for c, _ in crops]):
                    trace[(v, "classify", c)] = [c]
                    found.append((c, lab))
        answers[v] = ops.aggregate(found, a)[0][1] if labels else None
        trace[(v, "aggregate", v)] = answers[v]
    return trace, answers


def profile_inputs(videos: list[list], args: dict, need: int) -> dict[str, list]:
    """``need`` real input items of every op (cycled where the video has fewer), for profiling."""
    rate = args["sample_rate"]
    pools: dict[str, list] = {op: [] for op in CHAIN}
    for v, items in enumerate(videos):
        a = {**args, "video": v}
        pools["decode"] += items
        frames = ops.decode(items, a)
        pools["sample"] += frames
        kept = dict(ops.sample(frames, a))
        pairs = [(k, (kept[k], kept.get(k - rate) if k else None)) for k in sorted(kept)]
        pools["motion"] += pairs
        # detect is profiled on frames of every kind, crops on what it finds
        pools["detect"] += [(k, f) for k, f in kept.items()]
        pools["classify"] += ops.detect(list(kept.items()), a)
    pools["aggregate"] = [(k, lab) for k, lab in ops.classify(pools["classify"][:need], args)]
    for op, xs in pools.items():
        if not xs:
            raise ValueError(f"the profiling video has no {op} inputs")
        pools[op] = [xs[i % len(xs)] for i in range(need)]
    return pools


def measure_profile(pool: WorkerPool, inputs: dict[str, list], batches: tuple[int, ...], args: dict, reps: int,
                    gpu_speedup: dict[str, float], price_per_s: dict[str, float], cold_probes: int) -> tuple[Profile, dict]:
    """Time every (op, tier, batch) on warm workers of each tier (median of ``reps`` after one
    warm-up call) and ``cold_probes`` cold starts per tier (fresh processes)."""
    latency: dict[str, list[float]] = {}
    compute: dict[str, list[float]] = {}
    raw: dict[str, list[float]] = {}
    for tier in TIERS:
        inst, _ = pool.acquire(tier)
        try:
            for op in CHAIN:
                lats, comps = [], []
                for b in batches:
                    items = inputs[op][:b]
                    a = {**args, "video": 0}
                    inst.worker.call(op, items, a)
                    samples = [inst.worker.call(op, items, a) for _ in range(reps)]
                    rtt = float(np.median([s[1] for s in samples]))
                    comp = float(np.median([s[2] for s in samples]))
                    lats.append(tier_latency(rtt, comp, tier, op, gpu_speedup))
                    comps.append(comp)
                latency[f"{op}/{tier}"] = linear_fit(batches, lats)
                compute[f"{op}/{tier}"] = comps
                raw[f"{op}/{tier}"] = lats
        finally:
            pool.release(inst)
    colds: dict[str, list[float]] = {t: [] for t in TIERS}
    for tier in TIERS:
        held = []
        for _ in range(cold_probes):
            before = len(pool.stats.cold_start_s)
            acq = pool.acquire(tier)
            if acq is None:
                break
            held.append(acq[0])
            if len(pool.stats.cold_start_s) > before:
                colds[tier].append(acq[1])
        for inst in held:
            pool.release(inst)
    cold = {t: float(np.median(c)) if c else float(np.median(pool.stats.cold_start_s)) for t, c in colds.items()}
    return Profile(tuple(batches), latency, cold, dict(price_per_s)), {"compute": compute, "raw_latency": raw,
                                                                       "cold_samples": colds}


def linear_fit(batches, lats) -> list[float]:
    """The profile's model of an invocation: latency = overhead + per-item time x batch (least squares,
    both terms clamped at >= 0), evaluated at each batch size; smooths timing noise so a larger
    batch is never cheaper per call nor dearer per item than a smaller one."""
    b, y = np.asarray(batches, float), np.asarray(lats, float)
    slope = max(0.0, float(np.polyfit(b, y, 1)[0])) if len(b) > 1 else float(y[0] / b[0])
    icept = max(0.0, float(np.mean(y - slope * b)))
    return (icept + slope * b).tolist()


# --- the static baselines --------------------------------------------------------

LIGHT = ("decode", "sample", "motion")


def static_space(batches: tuple[int, ...]):
    """Every static plan: one tier for the light ops (decode, sample, motion), one each for detect and
    classify, and one batch size for all of them."""
    for light, det, cls in itertools.product(TIERS, repeat=3):
        for b in batches:
            yield {**{op: Config(b, light) for op in LIGHT}, "detect": Config(b, det), "classify": Config(b, cls)}


def predict_run(jobs: list[VideoJob], policy: Policy, profile: Profile, trace: dict, args: dict, slo_s: float,
                keep_alive_s: float, max_instances: int, prewarm: int = 0) -> ExecResult:
    """The executor on the profile and the trace (no processes): the planner's view of a run."""
    pool = WorkerPool(keep_alive_s, max_instances, spawn=lambda tier: (None, profile.cold_start_s[tier]), clock=lambda: 0.0)
    for tier in TIERS:
        pool.prewarm(tier, prewarm, 0.0)
    keyed = [VideoJob(j.video, j.arrival, [(k, None) for k, _ in j.items]) for j in jobs]
    return execute(keyed, policy, pool, PredictedRunner(profile, trace), args, slo_s, profile.price_per_s)


def choose_statics(jobs: list[VideoJob], profile: Profile, trace: dict, args: dict, slo_s: float, keep_alive_s: float,
                   max_instances: int, target: float, prewarm: int = 0) -> tuple[dict[str, dict[str, Config]], list[dict]]:
    """all_cpu: the cheapest all-CPU plan; all_gpu: the fastest all-GPU plan; best_static: the cheapest
    static plan, all-CPU ones included, predicted to meet the SLO for at least ``target`` of the videos
    (ties in cost: the higher attainment first; none: the one with the highest predicted attainment, then
    cheapest). Either way no scored plan, all_cpu and all_gpu included, is at most as dear and at least as
    good (and better in one) on these videos: a cheaper plan with at least best_static's attainment would
    reach the target too and be taken. Every candidate is scored on ``jobs`` with the profiled model: on
    calibration videos this is what a user can do before deploying; on the evaluated videos it is hindsight."""
    scored = []
    for plan in static_space(profile.batches):
        r = predict_run(jobs, StaticPolicy("static", plan, profile), profile, trace, args, slo_s, keep_alive_s,
                        max_instances, prewarm)
        s = r.summary(slo_s)
        scored.append({"plan": plan, "cost": s["cost"], "mean_latency_s": s["mean_latency_s"],
                       "slo_attainment": s["slo_attainment"]})
    uniform = {t: [c for c in scored if all(cfg.tier == t for cfg in c["plan"].values())] for t in TIERS}
    all_cpu = min(uniform["cpu"], key=lambda c: (c["cost"], c["mean_latency_s"]))
    all_gpu = min(uniform["gpu"], key=lambda c: (c["mean_latency_s"], c["cost"]))
    ok = [c for c in scored if c["slo_attainment"] >= target - 1e-9]
    best = min(ok, key=lambda c: (c["cost"], -c["slo_attainment"], c["mean_latency_s"])) if ok else \
        min(scored, key=lambda c: (-c["slo_attainment"], c["cost"]))
    return {"all_cpu": all_cpu["plan"], "all_gpu": all_gpu["plan"], "best_static": best["plan"]}, scored


def plan_label(plan: dict[str, Config]) -> str:
    return ", ".join(f"{op} {cfg.label()}" for op, cfg in plan.items())
