"""ReCycle for real: 2 data-parallel pipelines x 2 stages as 4 torch.distributed ranks, one of them killed.

Launch 1 (``recycle_rank``, 4 ranks, rank r = pipeline r // 2, stage r % 2):

1. every rank times its stage (F, B_input, B_weight, Adam) while the others time theirs, pairs of
   ranks time a one-way activation transfer and a 2-rank all-reduce of one stage's gradients; the
   simulator plans every configuration of the run from those times (``plans``);
2. fault-free training with the ReCycle plan (decoupled backward, staggered optimizer), then every
   rank saves its stage and Adam state as its shard of a sharded checkpoint (the restart's), and
   the last stage of pipeline 1 (rank 3) SIGKILLs its own worker process;
3. the survivors notice at the next step's membership round (``Membership``: a barrier on the
   launch's store that drops a peer whose worker left the cluster), open a process group of their
   own and go on with the rerouted plan: pipeline 1's micro-batches run their second stage on
   rank 1, with B_input first and B_weight in the bubbles.

Launch 2 (``restart_rank``, the 3 surviving workers) is Oobleck-style restart, the baseline: a new
process group, the pipelines re-instantiated from Oobleck's templates (pipeline 1 shrinks to one
worker holding all layers), every stage restored from the committed checkpoint, then training with
the reconfigured plan (fused backward, one synchronous optimizer step).

Each rank returns wall-clock (``time.time``) stamps of its steps; ``summarize`` turns them into
throughputs before and after the failure, the time to recover of both, and the simulator's
predictions beside them. The checkpoint is the step before the failure: the restart redoes no
work, its best case.
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from .config import RunConfig
from .policies import Cluster, LayerCosts, _split_layers, best_oobleck, oobleck_pipelines, recycle_plan
from .sim import Plan, simulate

PIPELINES, STAGES = 2, 2
VICTIM = PIPELINES * STAGES - 1          # the last stage of the last pipeline
FAILED = [(VICTIM // STAGES, VICTIM % STAGES)]
KILLED_AT = "recycle/killed-at"          # the store key the victim stamps before it dies
VICTIM_STEPS = "recycle/victim-steps"    # and its fault-free steps


@dataclass(frozen=True)
class FailoverConfig(RunConfig):
    layers_per_stage: int = 2
    steps: int = 3                       # timed steps of each phase (after one warm-up or recovery step)

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

    def predicted_step_s(self) -> dict[str, float]:
        """One iteration of each plan from a standing start (the runs separate steps by a barrier)."""
        return {name: simulate(plan, 1).makespan for name, plan in
                (("healthy", self.healthy), ("rerouted", self.rerouted), ("restart", self.restart))}


def plans(costs: LayerCosts, cfg: FailoverConfig) -> Plans:
    cl = cfg.cluster()
    restart, _, choice = best_oobleck(cl, costs, FAILED, 3)
    shapes = oobleck_pipelines(cl, FAILED, drop=choice.startswith("drop"))
    layers = []
    for n in shapes:
        first = 0
        for count in _split_layers(STAGES * cfg.layers_per_stage, n):
            layers.append((first, count))
            first += count
    return Plans(recycle_plan(cl, costs, []), recycle_plan(cl, costs, FAILED), restart, layers, choice)


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
    """One rank of launch 1 (see the module's doc). Rank ``VICTIM`` never returns."""
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
    before = _timed_steps(pl.healthy, healthy_order, worker, membership, 0, 1 + cfg.steps)
    step = len(before)
    t0 = time.perf_counter()
    save_shard(step - 1, {"model": stage_model.state_dict(), "opt": worker.optimizer.state_dict()})
    checkpoint_s = time.perf_counter() - t0
    membership.round(step)  # every shard is durable (committed) before anyone fails
    if rank == VICTIM:  # its steps for the record, then the failure
        store.set(VICTIM_STEPS, json.dumps(before))
        store.set(KILLED_AT, repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    # 3. the survivors notice at the next round, regroup and reroute
    live = membership.round(step + 1)
    detected = time.time()
    if live != set(range(world_size)) - {VICTIM}:
        raise RuntimeError(f"rank {rank}: expected ranks {sorted(set(range(world_size)) - {VICTIM})} to survive, "
                           f"found {sorted(live)}")
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
    # the store is rank 0's: read it while every survivor still needs rank 0 for the steps' collectives
    # (read after them, a survivor could find rank 0 done and its store gone)
    killed_at, victim_before = float(store.get(KILLED_AT).decode()), json.loads(store.get(VICTIM_STEPS).decode())
    after = _timed_steps(pl.rerouted, rerouted_order, worker, membership, step + 2, 1 + cfg.steps)
    return {"rank": rank, "before": before, "after": after, "detected": detected,
            "killed_at": killed_at, "checkpoint_s": checkpoint_s,
            "victim_before": victim_before,
            "checkpoint_step": step - 1,
            "times": gathered, "p2p_s": float(links[0]), "allreduce_s": float(links[1]),
            "predicted_step_s": pl.predicted_step_s(), "restart_choice": pl.restart_choice,
            "restart_workers": len(pl.restart.workers)}


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
    pipeline = _origin_pipeline(pl, rank)
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
    return {"rank": rank, "steps": steps, "launched_at": launched_at, "entered": entered, "restore_s": restored_s,
            "layers": [first, count]}


def _origin_pipeline(pl: Plans, worker: int) -> int:
    """The original pipeline a reconfigured worker's pipeline came from (Oobleck keeps their order)."""
    lost = [sum(1 for p, _ in FAILED if p == q) for q in range(PIPELINES)]
    drop = pl.restart_choice.startswith("drop")
    kept = [q for q in range(PIPELINES) if (lost[q] == 0 if drop else lost[q] < STAGES)]
    return kept[int(pl.restart.workers[worker].split("s")[0][1:])]


# ----- the measurements -----------------------------------------------------------------------------------

def summarize(recycle: list[dict], restart: list[dict], cfg: FailoverConfig) -> dict:
    """Throughput (samples/s) before the failure, after it with ReCycle and after the restart; the time to
    recover of each (from the kill to the end of the first step after it); the simulator's predictions.
    A step lasts from the first rank's start to the last rank's end; each phase's first step (warm-up,
    or the step that recovers) is not in its throughput."""
    samples = PIPELINES * cfg.microbatches * cfg.micro_batch

    def step_s(per_rank: list[list[dict]]) -> list[float]:
        n = min(len(s) for s in per_rank)
        return [max(s[i]["end"] for s in per_rank) - min(s[i]["start"] for s in per_rank) for i in range(n)]

    before = step_s([r["before"] for r in recycle] + [recycle[0]["victim_before"]])[1:]
    rerouted_all = step_s([r["after"] for r in recycle])
    restarted_all = step_s([r["steps"] for r in restart])
    killed = recycle[0]["killed_at"]
    detected = max(r["detected"] for r in recycle)
    detection_s = detected - killed
    recycle_recover = max(r["after"][0]["end"] for r in recycle) - killed
    launched = restart[0]["launched_at"]
    # the restart starts when the survivors know: detection, then the relaunch up to its first step's end
    restart_recover = detection_s + max(r["steps"][0]["end"] for r in restart) - launched
    predicted = recycle[0]["predicted_step_s"]
    return {
        "samples_per_step": samples,
        "before_steps_s": before, "rerouted_steps_s": rerouted_all[1:], "restart_steps_s": restarted_all[1:],
        "before_samples_s": samples / statistics.median(before),
        "rerouted_samples_s": samples / statistics.median(rerouted_all[1:]),
        "restart_samples_s": samples / statistics.median(restarted_all[1:]),
        "detection_s": detection_s, "recycle_recover_s": recycle_recover, "restart_recover_s": restart_recover,
        "restart_relaunch_s": max(r["entered"] for r in restart) - launched,
        "restart_restore_s": max(r["restore_s"] for r in restart),
        "checkpoint_s": max(r["checkpoint_s"] for r in recycle),
        "predicted_step_s": predicted, "restart_choice": recycle[0]["restart_choice"],
        "p2p_s": recycle[0]["p2p_s"], "allreduce_s": recycle[0]["allreduce_s"],
        "stage_ms": {op: statistics.median(t[op] for t in recycle[0]["times"]) * 1e3
                     for op in ("forward", "backward_input", "backward_weight", "optimizer")},
        "prediction_error": {"healthy": statistics.median(before) / predicted["healthy"] - 1,
                             "rerouted": statistics.median(rerouted_all[1:]) / predicted["rerouted"] - 1,
                             "restart": statistics.median(restarted_all[1:]) / predicted["restart"] - 1},
    }
