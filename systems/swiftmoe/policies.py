"""The three expert-placement policies, really executed on W simulated workers (pure torch).

Each policy is an :class:`~mlsys_flows.systems.moe.model.ExpertBackend`: it owns the expert
weights and optimizer state, computes every routed row on the replica (worker) it places it
on, and records the work of the iteration (rows computed per worker, rows moved between
workers, bytes of every communication phase measured from the real tensors) for the
iteration-time model in ``cost.py``.

- ``deepspeed``: expert e fixed on worker e*W/E; per source worker and expert at most
  ``capacity = ceil(cf * k * tokens_per_worker / E)`` rows; overflow rows are really dropped
  (zero expert output, so no gradient reaches any expert or the router from them); buffers are
  padded to capacity as DeepSpeed's all-to-all does.
- ``flexmoe``: replicas of popular experts, each with its own full copy of weights and Adam
  state; replica gradients all-reduced; every ``replace_every`` iterations the placement is
  re-planned from the load seen since the last plan and new replicas get weights AND optimizer
  state copied from an existing one (the migration is charged).
- ``flexmoe_every`` (the decoupling's ablation): FlexMoE with ``replace_every=1``.
- ``swiftmoe``: every expert's fp32 master weights and Adam state are sharded statically over
  all W workers. Each iteration the replica count of each expert follows its token load; a
  replica's gradient is reduce-scattered to the shard owners, each owner steps Adam on its
  shard, and the all-gather of the updated shards writes each expert straight into the replicas
  of the next iteration's placement, so a new placement costs no extra transfer.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import torch
from torch import Tensor

from mlsys_flows.systems.moe.model import ExpertLayout, MoEConfig, expert_ffn

from . import ABLATION, FROZEN, POLICIES, PRECISION_BYTES
from .placement import assign_workers, replica_counts, split_rows


def nbytes(*tensors: Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class AdamState:
    """Adam moments of one tensor (or shard); ``update`` is torch.optim.Adam's single-tensor math."""

    m: Tensor
    v: Tensor
    step: Tensor = field(default_factory=lambda: torch.zeros((), dtype=torch.float32))

    @classmethod
    def zeros_like(cls, t: Tensor) -> "AdamState":
        return cls(torch.zeros_like(t), torch.zeros_like(t))

    def clone(self) -> "AdamState":
        return AdamState(self.m.clone(), self.v.clone(), self.step.clone())

    def tensors(self) -> tuple[Tensor, Tensor, Tensor]:
        return self.m, self.v, self.step

    @torch.no_grad()
    def update(self, p: Tensor, g: Tensor, lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> None:
        self.step += 1
        t = float(self.step)
        self.m.lerp_(g, 1 - b1)
        self.v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (self.v.sqrt() / math.sqrt(1 - b2 ** t)).add_(eps)
        p.addcdiv_(self.m, denom, value=-lr / (1 - b1 ** t))


@dataclass
class IterationWork:
    """What one iteration did, for the time model."""

    layers: int
    workers: int
    compute: list[list[tuple[int, int]]] = field(default_factory=list)  # per layer: (worker, rows) per expert call
    a2a_rows: list[np.ndarray] = field(default_factory=list)            # per layer: rows src -> dst [W, W]
    comm: dict[str, np.ndarray] = field(default_factory=dict)           # phase -> bytes src -> dst [W, W]
    routed: int = 0
    dropped: int = 0

    def __post_init__(self) -> None:
        self.compute = [[] for _ in range(self.layers)]
        self.a2a_rows = [np.zeros((self.workers, self.workers)) for _ in range(self.layers)]

    def to_trace(self) -> dict:
        """Plain-data copy (lists and arrays) for shipping between tasks and re-pricing later."""
        return {"layers": self.layers, "workers": self.workers, "compute": [[tuple(c) for c in cs] for cs in self.compute],
                "a2a_rows": [a.copy() for a in self.a2a_rows], "comm": {k: v.copy() for k, v in self.comm.items()},
                "routed": self.routed, "dropped": self.dropped}

    @classmethod
    def from_trace(cls, d: dict) -> "IterationWork":
        work = cls(int(d["layers"]), int(d["workers"]), routed=int(d["routed"]), dropped=int(d["dropped"]))
        w = work.workers
        if len(d["compute"]) != work.layers or len(d["a2a_rows"]) != work.layers:
            raise ValueError(f"trace has {len(d['compute'])} compute and {len(d['a2a_rows'])} all-to-all layers, "
                             f"expected {work.layers}")
        for m in [*d["a2a_rows"], *d["comm"].values()]:
            if np.shape(m) != (w, w):
                raise ValueError(f"trace matrix of shape {np.shape(m)}, expected ({w}, {w})")
        if any(not 0 <= wk < w or n < 0 for cs in d["compute"] for wk, n in cs):
            raise ValueError("trace expert call on a worker out of range or with negative rows")
        work.compute = [[(int(wk), int(n)) for wk, n in cs] for cs in d["compute"]]
        work.a2a_rows = [np.array(a, dtype=float) for a in d["a2a_rows"]]
        work.comm = {k: np.array(v, dtype=float) for k, v in d["comm"].items()}
        return work

    def add_bytes(self, phase: str, src, dst, n: float) -> None:
        """``n`` bytes from each ``src`` to each ``dst`` (broadcast index arrays); local copies are free."""
        src, dst = np.broadcast_arrays(np.asarray(src), np.asarray(dst))
        off = src != dst
        np.add.at(self.comm.setdefault(phase, np.zeros((self.workers, self.workers))), (src[off], dst[off]), n)


class Policy:
    name = "policy"

    def __init__(self, cfg: MoEConfig, weights: list[list[Tensor]], workers: int, slots_per_worker: int, lr: float,
                 precision: str = "fp32"):
        self.cfg, self.workers, self.slots, self.lr = cfg, workers, slots_per_worker, lr
        self.layout = ExpertLayout(cfg.d_model, cfg.d_ff)
        # bytes per expert parameter by role (the tensors are fp32; transfers and state are charged at these)
        self.bytes = PRECISION_BYTES[precision]
        self.load = np.zeros((cfg.n_layers, cfg.n_experts))  # rows routed this iteration
        self.work = IterationWork(cfg.n_layers, workers)

    # -- forward ---------------------------------------------------------------------------
    def __call__(self, layer: int, x: Tensor, expert: Tensor, n_tokens: int) -> Tensor:
        ex = expert.cpu().numpy()
        src = (np.arange(len(ex)) % n_tokens) * self.workers // n_tokens  # data-parallel micro-batches
        rows_all, outs = [], []
        for e in range(self.cfg.n_experts):
            idx = np.flatnonzero(ex == e)
            self.load[layer, e] += len(idx)
            self.work.routed += len(idx)
            for worker, weight, rows in self._calls(layer, e, idx, src):
                if len(rows):
                    r = torch.as_tensor(rows, device=x.device)
                    rows_all.append(r)
                    outs.append(expert_ffn(x[r], weight, self.layout))
        if not outs:
            return torch.zeros_like(x)
        return torch.zeros_like(x).index_copy(0, torch.cat(rows_all), torch.cat(outs))

    def _record(self, layer: int, worker: int, rows: int, src: np.ndarray) -> None:
        self.work.compute[layer].append((worker, rows))
        np.add.at(self.work.a2a_rows[layer], (src, worker), 1)

    def _calls(self, layer: int, e: int, idx: np.ndarray, src: np.ndarray) -> list[tuple[int, Tensor, np.ndarray]]:
        raise NotImplementedError

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        """Forward passes inside are not training work: nothing recorded, no load counted."""
        work, load = self.work, self.load.copy()
        self.work = IterationWork(self.cfg.n_layers, self.workers)
        try:
            yield
        finally:
            self.work, self.load = work, load

    # -- update ----------------------------------------------------------------------------
    def step(self) -> IterationWork:
        """Apply the optimizer (and any re-placement); return the finished iteration's work."""
        self._update()
        work, self.work = self.work, IterationWork(self.cfg.n_layers, self.workers)
        self.load[:] = 0
        return work

    def _update(self) -> None:
        raise NotImplementedError

    def expert_weights(self) -> list[list[Tensor]]:
        raise NotImplementedError

    def expert_state_bytes(self) -> int:
        """Most bytes of expert weights + optimizer state any worker holds."""
        raise NotImplementedError

    def _replica_state_bytes(self) -> int:
        """Bytes per parameter of a replica that owns its optimizer state (DeepSpeed, FlexMoE): weights,
        gradient buffer, master copy (mixed precision) and Adam's moments (16 B in either precision)."""
        b = self.bytes
        return b["weight"] + b["grad"] + b["master"] + b["adam"]

    def _migration_bytes(self) -> int:
        """Bytes per parameter a new replica with its own optimizer state receives: weights, master copy
        and Adam's moments (the gradient buffer is recomputed, not shipped)."""
        b = self.bytes
        return b["weight"] + b["master"] + b["adam"]

    @staticmethod
    def _grad(w: Tensor) -> Tensor:
        return w.grad if w.grad is not None else torch.zeros_like(w)


class DeepSpeed(Policy):
    """Fixed placement, capacity factor, overflow really dropped. With W <= E each worker hosts
    E/W experts; with W > E the workers form W/E expert-parallel groups of E ranks (expert e at
    rank g*E + e of group g, DeepSpeed's layout), a worker's tokens go to its own group's copy and
    the copies' gradients are all-reduced."""

    name = "deepspeed"

    def __init__(self, cfg, weights, workers, slots_per_worker, lr, capacity_factor: float, precision: str = "fp32"):
        super().__init__(cfg, weights, workers, slots_per_worker, lr, precision)
        self.cf, e_n = capacity_factor, cfg.n_experts
        self.groups = max(1, workers // e_n)
        self.host = [[g * e_n + e if workers > e_n else e * workers // e_n for g in range(self.groups)] for e in range(e_n)]
        self.weights = [[w.clone().requires_grad_(True) for w in layer] for layer in weights]
        self.state = [[AdamState.zeros_like(w) for w in layer] for layer in weights]

    def _calls(self, layer, e, idx, src):
        n_src = len(src) // (self.cfg.top_k * self.workers)  # tokens per worker
        cap = max(1, math.ceil(self.cf * self.cfg.top_k * n_src / self.cfg.n_experts))
        kept = np.concatenate([idx[src[idx] == s][:cap] for s in range(self.workers)]) if len(idx) else idx
        self.work.dropped += len(idx) - len(kept)
        per_group = self.workers // self.groups
        for g, host in enumerate(self.host[e]):
            # DeepSpeed's all-to-all and expert GEMM run on buffers padded to capacity.
            self.work.compute[layer].append((host, cap * per_group))
            self.work.a2a_rows[layer][g * per_group:(g + 1) * per_group, host] += cap
        # the copies are identical, so one tensor computes every group's rows
        return [(self.host[e][0], self.weights[layer][e], np.sort(kept))]

    def _update(self):
        for ws, ss in zip(self.weights, self.state):
            for e, (w, s) in enumerate(zip(ws, ss)):
                g = self._grad(w)
                ring = self.host[e]
                for i, h in enumerate(ring):  # ring all-reduce over the expert-data-parallel copies
                    self.work.add_bytes("grad_allreduce", h, ring[(i + 1) % len(ring)],
                                        2 * (len(ring) - 1) / len(ring) * g.numel() * self.bytes["grad"])
                s.update(w.data, g, self.lr)
                w.grad = None

    def expert_weights(self):
        return [[w.detach() for w in layer] for layer in self.weights]

    def expert_state_bytes(self):
        per_worker = np.zeros(self.workers)
        for ws in self.weights:
            for e, w in enumerate(ws):
                for h in self.host[e]:
                    per_worker[h] += w.numel() * self._replica_state_bytes()
        return int(per_worker.max())


class _Replicated(Policy):
    """Shared by FlexMoE and SwiftMoE: per layer, expert -> {worker: replica weight}."""

    def _place(self, load: np.ndarray, previous: dict[int, dict[int, Tensor]] | None = None) -> list[list[int]]:
        """Holders (workers) of each expert for a load vector."""
        counts = replica_counts(load, self.workers * self.slots, self.workers)
        prev = None if previous is None else [{e for e, reps in previous.items() if w in reps} for w in range(self.workers)]
        held = assign_workers(load, counts, self.workers, self.slots, prev)
        return [[w for w in range(self.workers) if e in held[w]] for e in range(len(load))]

    def _calls(self, layer, e, idx, src):
        reps = self.replicas[layer][e]
        calls = []
        for worker, rows in split_rows(idx, list(reps)):
            self._record(layer, worker, len(rows), src[rows])
            calls.append((worker, reps[worker], rows))
        return calls

    def expert_weights(self):
        return [[next(iter(reps.values())).detach() for reps in layer] for layer in self.replicas]


class FlexMoE(_Replicated):
    """Replicas with their own optimizer state; periodic re-placement migrates weights + state."""

    name = "flexmoe"

    def __init__(self, cfg, weights, workers, slots_per_worker, lr, replace_every: int, precision: str = "fp32"):
        super().__init__(cfg, weights, workers, slots_per_worker, lr, precision)
        self.replace_every, self.iteration = replace_every, 0
        self.window = np.zeros((cfg.n_layers, cfg.n_experts))
        self.replicas: list[list[dict[int, Tensor]]] = []
        self.state: list[list[dict[int, AdamState]]] = []
        for layer in weights:
            holders = self._place(np.ones(cfg.n_experts))
            self.replicas.append([{w: wt.clone().requires_grad_(True) for w in hs} for wt, hs in zip(layer, holders)])
            self.state.append([{w: AdamState.zeros_like(wt) for w in hs} for wt, hs in zip(layer, holders)])

    def _update(self):
        self.window += self.load
        for layer, (reps_l, state_l) in enumerate(zip(self.replicas, self.state)):
            for reps, states in zip(reps_l, state_l):
                g = sum(self._grad(w) for w in reps.values())  # all-reduce over the replicas
                ring = sorted(reps)
                for i, w in enumerate(ring):  # ring all-reduce: 2(r-1)/r of the gradient per link
                    self.work.add_bytes("grad_allreduce", w, ring[(i + 1) % len(ring)],
                                        2 * (len(ring) - 1) / len(ring) * g.numel() * self.bytes["grad"])
                for w, wt in reps.items():
                    states[w].update(wt.data, g, self.lr)
                    wt.grad = None
        self.iteration += 1
        if self.iteration % self.replace_every == 0:
            for layer in range(self.cfg.n_layers):
                self._migrate(layer, self._place(self.window[layer], dict(enumerate(self.replicas[layer]))))
            self.window[:] = 0

    def _migrate(self, layer: int, holders: list[list[int]]) -> None:
        for e, hs in enumerate(holders):
            reps, states = self.replicas[layer][e], self.state[layer][e]
            old = sorted(reps)
            new_reps, new_states = {}, {}
            for i, w in enumerate(hs):
                if w in reps:
                    new_reps[w], new_states[w] = reps[w], states[w]
                    continue
                src = old[i % len(old)]  # copy weights AND Adam state from an existing replica
                new_reps[w] = reps[src].detach().clone().requires_grad_(True)
                new_states[w] = states[src].clone()
                self.work.add_bytes("migration", src, w, new_reps[w].numel() * self._migration_bytes())
            self.replicas[layer][e], self.state[layer][e] = new_reps, new_states

    def expert_state_bytes(self):
        per_worker = np.zeros(self.workers)
        for reps_l in self.replicas:
            for reps in reps_l:
                for w in reps:
                    per_worker[w] += reps[w].numel() * self._replica_state_bytes()
        return int(per_worker.max())


class SwiftMoE(_Replicated):
    """Statically sharded fp32 master + Adam state; per-iteration replica placement.

    Expert e's flat vector is zero-padded to W equal shards and kept as ``master[l][e]`` of
    shape [W, shard]: row w (and the same row of its Adam moments) is owned by worker w."""

    name = "swiftmoe"

    def __init__(self, cfg, weights, workers, slots_per_worker, lr, frozen: bool = False, precision: str = "fp32"):
        super().__init__(cfg, weights, workers, slots_per_worker, lr, precision)
        self.frozen = frozen  # the ablation: the start's placement kept, never re-planned from the load
        numel = self.layout.numel
        self.shard_len = -(-numel // workers)
        pad = self.shard_len * workers - numel
        self.master = [[torch.nn.functional.pad(wt, (0, pad)).view(workers, -1).clone() for wt in layer] for layer in weights]
        self.state = [[AdamState.zeros_like(m) for m in layer] for layer in self.master]
        self.replicas = []
        for layer in weights:
            holders = self._place(np.ones(cfg.n_experts))
            self.replicas.append([{w: wt.clone().requires_grad_(True) for w in hs} for wt, hs in zip(layer, holders)])

    def _update(self):
        numel, pad = self.layout.numel, self.shard_len * self.workers - self.layout.numel
        grad_shard, weight_shard = self.shard_len * self.bytes["grad"], self.shard_len * self.bytes["weight"]
        for layer in range(self.cfg.n_layers):
            # the next iteration's placement follows this load (frozen: the same holders as now)
            nxt = [sorted(reps) for reps in self.replicas[layer]] if self.frozen else self._place(self.load[layer])
            for e, reps in enumerate(self.replicas[layer]):
                # reduce-scatter: row w of every replica's gradient goes to owner w, summed there
                g = sum(torch.nn.functional.pad(self._grad(wt), (0, pad)).view(self.workers, -1) for wt in reps.values())
                owners = np.arange(self.workers)
                self.work.add_bytes("grad_reduce_scatter", np.array(list(reps))[:, None], owners, grad_shard)
                self.state[layer][e].update(self.master[layer][e], g, self.lr)  # each owner steps its row
                # the all-gather of updated shards lands directly in the next placement's replicas
                full = self.master[layer][e].reshape(-1)[:numel]
                self.replicas[layer][e] = {w: full.clone().requires_grad_(True) for w in nxt[e]}
                self.work.add_bytes("weight_all_gather", owners[:, None], np.array(nxt[e]), weight_shard)

    def expert_state_bytes(self):
        """Replicas hold weights and gradient buffers; every worker owns one shard of each expert's fp32
        master and Adam moments (SwiftMoE keeps an fp32 master in either precision)."""
        b = self.bytes
        per_worker = np.zeros(self.workers)
        for reps_l in self.replicas:
            for reps in reps_l:
                for w in reps:
                    per_worker[w] += reps[w].numel() * (b["weight"] + b["grad"])
                per_worker += self.shard_len * (4 + b["adam"])
        return int(per_worker.max())


def make_policy(name: str, cfg: MoEConfig, weights: list[list[Tensor]], workers: int, slots_per_worker: int,
                lr: float, capacity_factor: float, replace_every: int, precision: str = "fp32") -> Policy:
    if name == "deepspeed":
        return DeepSpeed(cfg, weights, workers, slots_per_worker, lr, capacity_factor, precision)
    if name == "flexmoe":
        return FlexMoE(cfg, weights, workers, slots_per_worker, lr, replace_every, precision)
    if name == ABLATION:  # the decoupling's ablation: FlexMoE re-placed every iteration, as SwiftMoE is
        return FlexMoE(cfg, weights, workers, slots_per_worker, lr, 1, precision)
    if name == "swiftmoe":
        return SwiftMoE(cfg, weights, workers, slots_per_worker, lr, precision=precision)
    if name == FROZEN:
        return SwiftMoE(cfg, weights, workers, slots_per_worker, lr, frozen=True, precision=precision)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}, {ABLATION}, {FROZEN}")
