"""ReCycle for real: 2 data-parallel pipelines x 2 stages as 4 torch.distributed ranks, one of them killed.

Launch 1 (``recycle_rank``, 4 ranks, rank r = pipeline r // 2, stage r % 2):

1. every rank times its stage (F, B_input, B_weight, Adam) while the others time theirs, pairs of
   ranks time a one-way activation transfer and a 2-rank all-reduce of one stage's gradients; the
   simulator plans every configuration of the run from those times (``plans``);
2. ``cfg.fail_step`` fault-free steps with the ReCycle plan (decoupled backward, staggered optimizer;
   the first one untimed), then every rank saves its stage and Adam state as its shard of a sharded
   checkpoint (the restart's), and the victims (``cfg.victims``, any ranks that leave every stage a
   live peer; the flow draws one from the seed) SIGKILL their own worker processes;
3. the survivors notice at the next step's membership round (``Membership``: a barrier on the
   launch's store that drops a peer whose worker left the cluster), open a process group of their
   own and go on with the rerouted plan: a victim's micro-batches run its stage on the live peer at
   that stage in the other pipeline, with B_input first and B_weight in the bubbles. The store lives
   in the launching process (``platform.ranks``), not in a rank: losing rank 0 is like losing any.

Launch 2 (``restart_rank``, on surviving workers) is Oobleck-style restart, the baseline: a new
process group, the pipelines re-instantiated from Oobleck's templates (a damaged pipeline shrinks to
one worker holding all its layers, or is dropped), every stage restored from the committed
checkpoint, then training with the reconfigured plan (fused backward, one synchronous optimizer
step), then the same workers and layers with the decoupled backward and staggered step (decoupled
Oobleck).

Each rank returns wall-clock (``time.time``) stamps of its steps and, after the failure, the
micro-batches of other workers it ran (read from the order it executed); ``summarize`` turns them
into throughputs before and after the failure, the time to recover of both, where each victim's
work went, and the simulator's predictions beside them. The checkpoint is the step before the failure: the restart redoes no
work, its best case.
"""
from __future__ import annotations

import json
import os
import random
import signal
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from .config import RunConfig
from .policies import Cluster, LayerCosts, _split_layers, best_oobleck, oobleck_pipelines, oobleck_plan, recycle_plan
from .sim import Plan, simulate

PIPELINES, STAGES = 2, 2
RANKS = PIPELINES * STAGES
KILLED_AT = "recycle/killed-at/{}"       # the store key a victim stamps before it dies
VICTIM_STEPS = "recycle/victim-steps/{}"  # and its fault-free steps


def where(rank: int) -> tuple[int, int]:
    """(pipeline, stage) of a rank of launch 1."""
    return rank // STAGES, rank % STAGES


def check_victims(victims) -> tuple[int, ...]:
    """The failed ranks, sorted; refused (ValueError) unless every stage keeps a live rank (the peer
    that takes the victims' micro-batches: the paper's condition for rerouting)."""
    v = tuple(sorted(set(int(r) for r in victims)))
    if not v or len(v) != len(list(victims)) or not all(0 <= r < RANKS for r in v):
        raise ValueError(f"victims must be distinct ranks in 0..{RANKS - 1} (got {list(victims)})")
    for s in range(STAGES):
        if all(p * STAGES + s in v for p in range(PIPELINES)):
            raise ValueError(f"victims {list(v)} leave stage {s} no live rank: nothing can take its micro-batches")
    return v


def draw_failure(seed: int, steps: int, victims=None, fail_step: int | None = None) -> tuple[tuple[int, ...], int]:
    """The failure of the run: ``victims`` and ``fail_step`` where given, else drawn from ``seed`` (one rank
    among all four, rank 0 included; the failure after 2 .. 1 + ``steps`` fault-free steps, so that the
    phase before it times at least one step). The moment is a step count, never a clock."""
    rng = random.Random(f"recycle-failover-{seed}")
    drawn_rank, drawn_step = rng.randrange(RANKS), rng.randint(2, 1 + steps)
    return (check_victims(victims) if victims else (drawn_rank,)), (fail_step if fail_step is not None else drawn_step)


@dataclass(frozen=True)
class FailoverConfig(RunConfig):
    layers_per_stage: int = 2
    steps: int = 3                       # timed steps of each phase after the failure (after one recovery step)
    victims: tuple[int, ...] = (3,)      # the ranks killed (every stage keeps a live one)
    fail_step: int = 4                   # fault-free steps before the failure (the first untimed)

    def __post_init__(self):
        check_victims(self.victims)
        if self.fail_step < 2:
            raise ValueError(f"fail_step must be >= 2 (one warm-up step, one timed) (got {self.fail_step})")

    def failed(self) -> list[tuple[int, int]]:
        """The victims as (pipeline, stage), the simulator's failed workers."""
        return [where(r) for r in self.victims]

    def cluster(self) -> Cluster:
        return Cluster(PIPELINES, STAGES, self.microbatches, self.layers_per_stage, self.micro_batch)


# ----- the plans, from the times measured in launch 1 ------------------------------------------------------

def costs_from(times: list[dict], p2p_s: float, allreduce_s: float, cfg: FailoverConfig) -> LayerCosts:
    """Per-layer costs: each operation's median over the ranks; the links as measured (one activation
    one way in ``p2p_s``; a 2-rank all-reduce of one stage's gradients in ``allreduce_s``)."""
    L = cfg.layers_per_stage
    med = {k: statistics.median(t[k] for t in times) for k in ("forward", "backward_input", "backward_weight",
                                                                 "backward_fused", "optimizer", "param_bytes")}
    # LayerCosts' 2-rank all-reduce of L layers is L * bytes / bandwidth + 2 * latency
    wire_s = max(allreduce_s - 2 * p2p_s, 1e-6)
    return LayerCosts(forward=med["forward"] / L, backward_input=med["backward_input"] / L,
                      backward_weight=med["backward_weight"] / L, optimizer=med["optimizer"] / L,
                      layer_param_bytes=med["param_bytes"] / L,
                      activation_bytes=cfg.micro_batch * cfg.seq * cfg.d_model * 4,
                      p2p_gb_s=1e9, p2p_latency_s=p2p_s, allreduce_gb_s=med["param_bytes"] / wire_s / 1e9,
                      backward_fused=med["backward_fused"] / L)


@dataclass
class Plans:
    healthy: Plan
    rerouted: Plan
    restart: Plan
    restart_layers: list[tuple[int, int]]  # (first layer, layers) of each restarted worker
    restart_choice: str
    restart_decoupled: Plan                # the same reconfiguration with ReCycle's decoupled backward

    def predicted_step_s(self) -> dict[str, float]:
        """One iteration of each plan from a standing start (the runs separate steps by a barrier)."""
        return {name: simulate(plan, 1).makespan for name, plan in
                (("healthy", self.healthy), ("rerouted", self.rerouted), ("restart", self.restart),
                 ("restart_decoupled", self.restart_decoupled))}


def plans(costs: LayerCosts, cfg: FailoverConfig) -> Plans:
    cl, failed = cfg.cluster(), cfg.failed()
    restart, _, choice = best_oobleck(cl, costs, failed, 3)
    shapes = oobleck_pipelines(cl, failed, drop=choice.startswith("drop"))
    layers = []
    for n in shapes:
        first = 0
        for count in _split_layers(STAGES * cfg.layers_per_stage, n):
            layers.append((first, count))
            first += count
    decoupled = oobleck_plan(cl, costs, failed, drop=choice.startswith("drop"), decoupled=True,
                             label="oobleck_decoupled")
    return Plans(recycle_plan(cl, costs, []), recycle_plan(cl, costs, failed), restart, layers, choice, decoupled)


# ----- what both launches share --------------------------------------------------------------------------

class Membership:
    """A per-step barrier of the live ranks on the launch's store that survives a dead peer: a rank
    stamps ``step`` and waits for its live peers' stamps; a peer whose worker left the cluster
    (``alive(rank)`` False) is dropped instead of waited for (no timeout to tune: the cluster's own
    failure detection decides). ``timeout_s`` only guards against a peer that hangs."""

    def __init__(self, store, rank: int, ranks: list[int], alive: Callable[[int], bool], prefix: str,
                 timeout_s: float = 120.0):
        self.store, self.rank, self.live = store, rank, set(ranks)
        self.alive, self.prefix, self.timeout_s = alive, prefix, timeout_s

    def round(self, step: int) -> set[int]:
        """The ranks alive at ``step`` (every one of them has reached it)."""
        key = f"{self.prefix}/{step}/{{}}"
        self.store.set(key.format(self.rank), "1")
        waiting = self.live - {self.rank}
        deadline, next_check = time.monotonic() + self.timeout_s, time.monotonic() + 0.02
        while waiting:
            waiting = {r for r in waiting if not self.store.check([key.format(r)])}
            if waiting and time.monotonic() >= next_check:  # ask the cluster only once in a while
                dead = {r for r in waiting if not self.alive(r)}
                waiting -= dead
                self.live -= dead
                next_check = time.monotonic() + 0.02
            if waiting:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {self.rank}: ranks {sorted(waiting)} neither reached step {step} "
                                       f"nor left the cluster within {self.timeout_s:g} s")
                time.sleep(0.001)
        return set(self.live)


def _inputs(cfg: FailoverConfig) -> Callable[[int], Any]:
    """The input of micro-batch j (the same in every launch and plan: j numbers the global batch)."""
    import torch

    cache: dict[int, Any] = {}

    def get(j: int):
        if j not in cache:
            gen = torch.Generator().manual_seed(cfg.seed * 100_003 + j)
            cache[j] = torch.randn(cfg.micro_batch, cfg.seq, cfg.d_model, generator=gen)
        return cache[j]
    return get


def _new_stage(cfg: FailoverConfig, stage: int, layers: int):
    import torch

    from .stage import Stage

    torch.manual_seed(cfg.seed + stage)  # data-parallel replicas of a stage start identical
    return Stage(cfg.d_model, cfg.heads, layers)


def _timed_steps(plan: Plan, order, worker, membership: Membership, first_step: int, count: int) -> list[dict]:
    from .execute import run_step

    out = []
    for step in range(first_step, first_step + count):
        membership.round(step)
        t0 = time.time()
        run_step(plan, order, worker)
        out.append({"step": step, "start": t0, "end": time.time()})
    return out


def _shared_blocks(stage, mine: tuple[int, int], owners: list[tuple[int, int]], me: int, groups: dict) -> list:
    """The blocks of this worker's layers that other workers hold too, one per set of sharers, in layer
    order (the same order on every rank). ``groups`` maps a sorted tuple of ranks to its process group."""
    from .execute import Shared, layer_params

    first, count = mine
    sets: dict[tuple[int, ...], list[int]] = {}
    for layer in range(first, first + count):
        sharers = tuple(w for w, (a, n) in enumerate(owners) if a <= layer < a + n)
        sets.setdefault(sharers, []).append(layer)
    blocks = []
    for sharers, layers in sets.items():
        if len(sharers) > 1:
            params = [q for layer in layers for q in layer_params(stage, layer - first, 1)]
            blocks.append(Shared(groups[sharers], params, len(sharers)))
    return blocks


# ----- launch 1: ReCycle --------------------------------------------------------------------------------

def recycle_rank(rank: int, world_size: int, store, cfg: FailoverConfig, alive: Callable[[int], bool],
                 save_shard: Callable[[int, dict], None]) -> dict:
    """One rank of launch 1 (see the module's doc). A rank of ``cfg.victims`` never returns."""
    import torch
    import torch.distributed as dist

    from .execute import Worker
    from .stage import calibrate

    if world_size != PIPELINES * STAGES:
        raise ValueError(f"world_size: the ReCycle failover run has {PIPELINES * STAGES} ranks (got {world_size})")
    torch.set_num_threads(1)
    me_stage, L = rank % STAGES, cfg.layers_per_stage
    stage_ranks = [tuple(p * STAGES + s for p in range(PIPELINES)) for s in range(STAGES)]
    groups = {ranks: dist.new_group(list(ranks)) for ranks in stage_ranks}  # every rank creates every group
    # 1. the costs, measured under the run's own contention
    st = calibrate(cfg.d_model, cfg.heads, L, cfg.micro_batch, cfg.seq, reps=cfg.calibration_reps,
                   seed=cfg.seed + me_stage, threads=1)
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, asdict(st))
    p2p_s = _one_way_s(rank, cfg)
    stage_model = _new_stage(cfg, me_stage, L)
    allreduce_s = _allreduce_s(stage_model, groups[stage_ranks[me_stage]])
    links = torch.tensor([p2p_s, allreduce_s], dtype=torch.float64)
    dist.broadcast(links, 0)  # every rank plans with rank 0's link times
    costs = costs_from(gathered, float(links[0]), float(links[1]), cfg)
    pl = plans(costs, cfg)
    healthy_order = simulate(pl.healthy, 1).order(rank, 0)
    worker = Worker(me=rank, ranks=list(range(world_size)), stage=stage_model,
                    optimizer=torch.optim.Adam(stage_model.parameters(), lr=1e-4),
                    shape=(cfg.micro_batch, cfg.seq, cfg.d_model), inputs=_inputs(cfg))
    owners = [(s * L, L) for _ in range(PIPELINES) for s in range(STAGES)]
    worker.shared = _shared_blocks(stage_model, owners[rank], owners, rank, groups)
    membership = Membership(store, rank, list(range(world_size)), alive, prefix="recycle/step")
    # 2. fault-free training, then the checkpoint the restart resumes from, then the failure
    before = _timed_steps(pl.healthy, healthy_order, worker, membership, 0, cfg.fail_step)
    step = len(before)
    t0 = time.perf_counter()
    save_shard(step - 1, {"model": stage_model.state_dict(), "opt": worker.optimizer.state_dict()})
    checkpoint_s = time.perf_counter() - t0
    membership.round(step)  # every shard is durable (committed) before anyone fails
    if rank in cfg.victims:  # its steps for the record, then the failure
        store.set(VICTIM_STEPS.format(rank), json.dumps(before))
        store.set(KILLED_AT.format(rank), repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    # 3. the survivors notice at the next round, regroup and reroute
    live = membership.round(step + 1)
    detected = time.time()
    if live != set(range(world_size)) - set(cfg.victims):
        raise RuntimeError(f"rank {rank}: expected ranks {sorted(set(range(world_size)) - set(cfg.victims))} to "
                           f"survive, found {sorted(live)}")
    survivors = sorted(live)
    worker.group = dist.new_group(survivors, use_local_synchronization=True)
    live_stage = {ranks: tuple(r for r in ranks if r in live) for ranks in stage_ranks}
    regrouped = {kept: groups[ranks] if kept == ranks else
                 (dist.new_group(list(kept), use_local_synchronization=True) if rank in kept and len(kept) > 1 else None)
                 for ranks, kept in live_stage.items()}
    survivor_owners = [owners[r] for r in survivors]
    worker.me, worker.ranks = survivors.index(rank), survivors
    worker.shared = _shared_blocks(stage_model, owners[rank], survivor_owners, worker.me,
                                   _by_worker_index(regrouped, survivors))
    rerouted_order = simulate(pl.rerouted, 1).order(worker.me, 0)
    # read before the steps: where the launch's store is rank 0's (a launcher that cannot host it), a
    # survivor that read after them could find rank 0 done and its store gone
    killed_at = {v: float(store.get(KILLED_AT.format(v)).decode()) for v in cfg.victims}
    victim_before = {v: json.loads(store.get(VICTIM_STEPS.format(v)).decode()) for v in cfg.victims}
    after = _timed_steps(pl.rerouted, rerouted_order, worker, membership, step + 2, 1 + cfg.steps)
    return {"rank": rank, "before": before, "after": after, "detected": detected,
            "killed_at": killed_at, "checkpoint_s": checkpoint_s,
            "victim_before": victim_before, "took_over": took_over(pl.rerouted, rerouted_order, worker.me, rank, cfg),
            "checkpoint_step": step - 1,
            "times": gathered, "p2p_s": float(links[0]), "allreduce_s": float(links[1]),
            "predicted_step_s": pl.predicted_step_s(), "restart_choice": pl.restart_choice,
            "restart_workers": len(pl.restart.workers)}


def took_over(plan: Plan, order, me: int, rank: int, cfg: FailoverConfig) -> dict[int, int]:
    """{victim rank: micro-batches of it this rank ran per step}, from the forwards in the order this rank
    executed: micro-batch j is pipeline j // microbatches's (``recycle_plan`` numbers them pipeline by
    pipeline), and a forward of stage s of pipeline p run here is rank p * STAGES + s's work."""
    out: dict[int, int] = {}
    for kind, mb in order:
        if kind != "F":
            continue
        route = plan.microbatches[mb].route
        for s, w in enumerate(route):
            owner = (mb // cfg.microbatches) * STAGES + s
            if w == me and owner != rank:
                out[owner] = out.get(owner, 0) + 1
                break
    return out


def _by_worker_index(regrouped: dict, survivors: list[int]) -> dict:
    """``_shared_blocks`` looks groups up by the plan's worker indices: survivors' ranks -> indices."""
    return {tuple(survivors.index(r) for r in kept): g for kept, g in regrouped.items() if g is not None}


def _one_way_s(rank: int, cfg: FailoverConfig, rounds: int = 15) -> float:
    """Half the median ping-pong of one activation between the two stages of each pipeline (all pairs at
    once, as in the run)."""
    import torch
    import torch.distributed as dist

    act = torch.zeros(cfg.micro_batch, cfg.seq, cfg.d_model)
    peer = rank + 1 if rank % STAGES == 0 else rank - 1
    rtts = []
    for _ in range(rounds):
        dist.barrier()
        t0 = time.perf_counter()
        if rank % STAGES == 0:
            dist.send(act, peer)
            dist.recv(act, peer)
        else:
            dist.recv(act, peer)
            dist.send(act, peer)
        rtts.append(time.perf_counter() - t0)
    return statistics.median(rtts[3:]) / 2


def _allreduce_s(stage, group, rounds: int = 7) -> float:
    """Median time of an all-reduce of one stage's gradients over its data-parallel group (all stages at once)."""
    import torch
    import torch.distributed as dist

    flat = torch.zeros(sum(q.numel() for q in stage.parameters()))
    ts = []
    for _ in range(rounds):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(flat, group=group)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts[2:])


# ----- launch 2: the restart baseline -------------------------------------------------------------------

def merge_shards(states: list[dict]) -> dict:
    """One worker's model and Adam state from consecutive stages' shards: the blocks renumbered in order,
    Adam's per-parameter state shifted by the parameters before it (a stage's parameters are its blocks'
    parameters in order)."""
    model, opt_state, params, offset, block = {}, {}, [], 0, 0
    group = None
    for st in states:
        blocks = sorted({int(k.split(".")[1]) for k in st["model"]})
        for b in blocks:
            for k, v in st["model"].items():
                if k.startswith(f"blocks.{b}."):
                    model[f"blocks.{block}." + k.split(".", 2)[2]] = v
            block += 1
        n = len(st["opt"]["param_groups"][0]["params"])
        for i, v in st["opt"]["state"].items():
            opt_state[int(i) + offset] = v
        params += list(range(offset, offset + n))
        group = group or {k: v for k, v in st["opt"]["param_groups"][0].items() if k != "params"}
        offset += n
    return {"model": model, "opt": {"state": opt_state, "param_groups": [{**group, "params": params}]}}


def restart_rank(rank: int, world_size: int, store, cfg: FailoverConfig, launched_at: float,
                 costs_times: dict, load_shard: Callable[[int], dict]) -> dict:
    """One rank of launch 2: rebuild this worker's layers of Oobleck's reconfigured pipelines, restore them
    from the checkpoint (``load_shard(old rank)``), then train with the reconfigured plan. ``costs_times``
    is launch 1's measurement, so both launches plan from the same numbers."""
    import torch
    import torch.distributed as dist

    from .execute import Worker
    from .stage import Stage

    torch.set_num_threads(1)
    entered = time.time()
    t0 = time.perf_counter()
    L = cfg.layers_per_stage
    costs = costs_from(costs_times["times"], costs_times["p2p_s"], costs_times["allreduce_s"], cfg)
    pl = plans(costs, cfg)
    if world_size != len(pl.restart.workers):
        raise ValueError(f"world_size: Oobleck's reconfiguration has {len(pl.restart.workers)} workers "
                         f"(got {world_size})")
    first, count = pl.restart_layers[rank]
    if first % L or count % L:
        raise ValueError("the reconfigured pipelines split layers inside a stage: no shard holds them")
    # the old rank whose shard holds each stage: this worker's own pipeline where it survives
    pipeline = _origin_pipeline(pl, rank, cfg.failed())
    stages = range(first // L, (first + count) // L)
    state = merge_shards([load_shard(pipeline * STAGES + s) for s in stages])
    torch.manual_seed(cfg.seed)
    stage_model = Stage(cfg.d_model, cfg.heads, count)
    stage_model.load_state_dict(state["model"])
    opt = torch.optim.Adam(stage_model.parameters(), lr=1e-4)
    opt.load_state_dict(state["opt"])
    restored_s = time.perf_counter() - t0
    owners = pl.restart_layers
    sets = sorted({tuple(w for w, (a, n) in enumerate(owners) if a <= layer < a + n)
                   for layer in range(STAGES * L)})
    groups = {s: dist.new_group(list(s)) for s in sets if len(s) > 1}  # every rank creates every group
    worker = Worker(me=rank, ranks=list(range(world_size)), stage=stage_model, optimizer=opt,
                    shape=(cfg.micro_batch, cfg.seq, cfg.d_model), inputs=_inputs(cfg))
    worker.shared = _shared_blocks(stage_model, owners[rank], owners, rank, groups)
    order = simulate(pl.restart, 1).order(rank, 0)
    membership = Membership(store, rank, list(range(world_size)), lambda r: True, prefix="restart/step")
    steps = _timed_steps(pl.restart, order, worker, membership, 0, 1 + cfg.steps)
    # then the same workers and layers with ReCycle's decoupled backward and staggered step (decoupled Oobleck)
    order = simulate(pl.restart_decoupled, 1).order(rank, 0)
    decoupled = _timed_steps(pl.restart_decoupled, order, worker, membership, 1 + cfg.steps, 1 + cfg.steps)
    return {"rank": rank, "steps": steps, "decoupled_steps": decoupled, "launched_at": launched_at, "entered": entered, "restore_s": restored_s,
            "layers": [first, count]}


def _origin_pipeline(pl: Plans, worker: int, failed: list[tuple[int, int]]) -> int:
    """The original pipeline a reconfigured worker's pipeline came from (Oobleck keeps their order)."""
    lost = [sum(1 for p, _ in failed if p == q) for q in range(PIPELINES)]
    drop = pl.restart_choice.startswith("drop")
    kept = [q for q in range(PIPELINES) if (lost[q] == 0 if drop else lost[q] < STAGES)]
    return kept[int(pl.restart.workers[worker].split("s")[0][1:])]


# ----- the measurements -----------------------------------------------------------------------------------

def summarize(recycle: list[dict], restart: list[dict], cfg: FailoverConfig, lost: list[int] | None = None) -> dict:
    """Throughput (samples/s) before the failure, after it with ReCycle and after the restart; the time to
    recover of each (from the first kill to the end of the first step after it); where each victim's
    micro-batches went (``rerouted_to``: {victim: {survivor: micro-batches per step}}, as the survivors ran
    them); the simulator's predictions and its error on each phase and on the ratio between ReCycle and
    the restart. ``lost``: the ranks the launcher saw lost (their workers left the cluster); the victims
    are what the survivors read from the store. A step lasts from the first rank's start to the last
    rank's end; each phase's first step (warm-up, or the step that recovers) is not in its throughput."""
    samples = PIPELINES * cfg.microbatches * cfg.micro_batch

    def step_s(per_rank: list[list[dict]]) -> list[float]:
        n = min(len(s) for s in per_rank)
        return [max(s[i]["end"] for s in per_rank) - min(s[i]["start"] for s in per_rank) for i in range(n)]

    victims = sorted(int(v) for v in recycle[0]["killed_at"])
    before = step_s([r["before"] for r in recycle] + [recycle[0]["victim_before"][v] for v in
                                                      recycle[0]["victim_before"]])[1:]
    rerouted_all = step_s([r["after"] for r in recycle])
    restarted_all = step_s([r["steps"] for r in restart])
    decoupled_all = step_s([r["decoupled_steps"] for r in restart])
    killed = min(recycle[0]["killed_at"].values())
    detected = max(r["detected"] for r in recycle)
    detection_s = detected - killed
    recycle_recover = max(r["after"][0]["end"] for r in recycle) - killed
    launched = restart[0]["launched_at"]
    # the restart starts when the survivors know: detection, then the relaunch up to its first step's end
    restart_recover = detection_s + max(r["steps"][0]["end"] for r in restart) - launched
    predicted = recycle[0]["predicted_step_s"]
    med = {"healthy": statistics.median(before), "rerouted": statistics.median(rerouted_all[1:]),
           "restart": statistics.median(restarted_all[1:]), "restart_decoupled": statistics.median(decoupled_all[1:])}
    rerouted_to = {v: {r["rank"]: r["took_over"][v] for r in recycle if r["took_over"].get(v)} for v in victims}
    return {
        "samples_per_step": samples, "victims": victims, "lost_ranks": sorted(lost) if lost is not None else victims,
        "fail_step": recycle[0]["checkpoint_step"] + 1, "checkpoint_step": recycle[0]["checkpoint_step"],
        "rerouted_to": rerouted_to, "survivors": sorted(r["rank"] for r in recycle),
        "before_steps_s": before, "rerouted_steps_s": rerouted_all[1:], "restart_steps_s": restarted_all[1:],
        "before_samples_s": samples / med["healthy"],
        "rerouted_samples_s": samples / med["rerouted"],
        "restart_samples_s": samples / med["restart"], "restart_decoupled_steps_s": decoupled_all[1:],
        "restart_decoupled_samples_s": samples / med["restart_decoupled"],
        "detection_s": detection_s, "recycle_recover_s": recycle_recover, "restart_recover_s": restart_recover,
        "restart_relaunch_s": max(r["entered"] for r in restart) - launched,
        "restart_restore_s": max(r["restore_s"] for r in restart),
        "restart_layers": {r["rank"]: r["layers"] for r in restart if "layers" in r},
        "checkpoint_s": max(r["checkpoint_s"] for r in recycle),
        "predicted_step_s": predicted, "restart_choice": recycle[0]["restart_choice"],
        "p2p_s": recycle[0]["p2p_s"], "allreduce_s": recycle[0]["allreduce_s"],
        "stage_ms": {op: statistics.median(t[op] for t in recycle[0]["times"]) * 1e3
                     for op in ("forward", "backward_input", "backward_weight", "backward_fused", "optimizer")},
        "prediction_error": {k: med[k] / predicted[k] - 1 for k in med},
        # the comparison the simulator makes: ReCycle's steady throughput over each reconfigured plan's (step
        # times inverted), measured against predicted; positive: the simulator understates ReCycle's edge
        "ratio_measured": {k: med[k] / med["rerouted"] for k in ("restart", "restart_decoupled")},
        "ratio_predicted": {k: predicted[k] / predicted["rerouted"] for k in ("restart", "restart_decoupled")},
        "ratio_prediction_error": {k: (med[k] / med["rerouted"]) / (predicted[k] / predicted["rerouted"]) - 1
                                   for k in ("restart", "restart_decoupled")},
    }
