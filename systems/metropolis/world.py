"""The simulated town of AI Metropolis (pure): agents on a 2D grid, clusters, one cluster step.

Every agent has a position, a goal, a memory digest and a conversation cooldown. Distances are
Chebyshev (king moves) on an integer grid, so an agent moving at most ``max_speed`` cells per step on
each axis moves at most ``max_speed`` in that distance: the dependency bound is exact integer math.

A cluster is a connected component of the agents at the same simulated time that lie within
``radius`` of each other. A cluster step depends only on its members' states at that time, the time
and the seed (every random draw is keyed by agent or cluster and time, never by execution order),
so any schedule that steps the same clusters yields the same world, bit for bit.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

MASK = (1 << 64) - 1


def mix(*values: int) -> int:
    """splitmix64 over a sequence of integers: a deterministic 64-bit digest."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (int(v) & MASK)) & MASK
        h = (h + 0x9E3779B97F4A7C15) & MASK
        z = h
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        h = z ^ (z >> 31)
    return h


# salts of the independent random streams
_INIT, _AGENT, _CLUSTER, _CALL = 1, 2, 3, 4


@dataclass(frozen=True)
class Config:
    """The rules of the town and of its LLM calls (a plain, picklable mirror of the parameters)."""

    agents: int
    steps: int
    map_size: int
    radius: int
    max_speed: int
    hotspots: int
    hotspot_prob: float
    act_prob: float
    talk_prob: float
    max_turns: int
    cooldown: int
    latency_median_s: float
    latency_sigma: float
    seed: int = 0

    def hotspot_cells(self) -> list[tuple[int, int]]:
        return _hotspots(self.seed, self.map_size, self.hotspots)

    def latency(self, *key: int) -> float:
        """Seconds of one LLM call, lognormal(ln median, sigma), a function of the call's key only."""
        rng = random.Random(mix(self.seed, _CALL, *key))
        return rng.lognormvariate(math.log(self.latency_median_s), self.latency_sigma)


@lru_cache(maxsize=64)
def _hotspots(seed: int, size: int, count: int) -> list[tuple[int, int]]:
    rng = random.Random(mix(seed, _INIT, -1))
    return [(rng.randrange(size), rng.randrange(size)) for _ in range(count)]


@dataclass(frozen=True)
class Agent:
    id: int
    x: int
    y: int
    gx: int
    gy: int
    memory: int
    cooldown: int = 0
    talks: int = 0


def _new_goal(cfg: Config, rng: random.Random, hotspots: list[tuple[int, int]]) -> tuple[int, int]:
    n = cfg.map_size
    if hotspots and rng.random() < cfg.hotspot_prob:
        hx, hy = hotspots[rng.randrange(len(hotspots))]
        return (min(n - 1, max(0, hx + rng.randint(-1, 1))), min(n - 1, max(0, hy + rng.randint(-1, 1))))
    return rng.randrange(n), rng.randrange(n)


def initial_world(cfg: Config) -> list[Agent]:
    hot = cfg.hotspot_cells()
    out = []
    for i in range(cfg.agents):
        rng = random.Random(mix(cfg.seed, _INIT, i))
        x, y = rng.randrange(cfg.map_size), rng.randrange(cfg.map_size)
        gx, gy = _new_goal(cfg, rng, hot)
        out.append(Agent(i, x, y, gx, gy, memory=mix(cfg.seed, i)))
    return out


def chebyshev(pos: np.ndarray) -> np.ndarray:
    """All-pairs Chebyshev distance of integer positions (N, 2)."""
    x, y = pos[:, 0], pos[:, 1]
    return np.maximum(np.abs(x[:, None] - x[None, :]), np.abs(y[:, None] - y[None, :]))


def clusters_of(agents: list[Agent], radius: int) -> list[tuple[int, ...]]:
    """Connected components of ``agents`` (all at one time) under distance <= radius, as sorted id
    tuples, ordered by their smallest id."""
    if not agents:
        return []
    pos = np.array([(a.x, a.y) for a in agents], dtype=np.int64)
    adj = chebyshev(pos) <= radius
    ids = [a.id for a in agents]
    seen, out = [False] * len(agents), []
    for s in range(len(agents)):
        if seen[s]:
            continue
        stack, comp = [s], []
        seen[s] = True
        while stack:
            u = stack.pop()
            comp.append(ids[u])
            for v in np.flatnonzero(adj[u]):
                if not seen[v]:
                    seen[v] = True
                    stack.append(int(v))
        out.append(tuple(sorted(comp)))
    return sorted(out)


@dataclass(frozen=True)
class StepPlan:
    """One cluster step: the members' new states and the LLM calls it makes, as phases (the calls of
    a phase run in parallel; phases run one after another: the members' own calls, then the chained
    turns of a conversation)."""

    t: int
    members: tuple[int, ...]
    new: tuple[Agent, ...]
    phases: tuple[tuple[float, ...], ...]
    talked: bool

    @property
    def calls(self) -> int:
        return sum(len(p) for p in self.phases)

    def critical_path_s(self) -> float:
        return sum(max(p) for p in self.phases)


def step_cluster(members: list[Agent], t: int, cfg: Config) -> StepPlan:
    """Advance one cluster (all members at time ``t``) to ``t + 1``."""
    members = sorted(members, key=lambda a: a.id)
    ids = tuple(a.id for a in members)
    crng = random.Random(mix(cfg.seed, _CLUSTER, ids[0], t, len(ids)))
    act = []
    for a in members:
        if random.Random(mix(cfg.seed, _AGENT, a.id, t)).random() < cfg.act_prob:
            act.append(cfg.latency(a.id, t, 0))
    talk = len(members) >= 2 and all(a.cooldown == 0 for a in members) and crng.random() < cfg.talk_prob
    phases: list[tuple[float, ...]] = [tuple(act)] if act else []
    new: list[Agent] = []
    if talk:
        turns = crng.randint(2, max(2, cfg.max_turns))
        for k in range(turns):
            speaker = ids[k % len(ids)]
            phases.append((cfg.latency(speaker, t, 1 + k),))
        topic = mix(t, turns, *sorted(a.memory for a in members))
        for a in members:
            new.append(replace(a, memory=mix(a.memory, topic), cooldown=cfg.cooldown, talks=a.talks + 1))
    else:
        hot = cfg.hotspot_cells() if cfg.hotspots else []
        for a in members:
            gx, gy = a.gx, a.gy
            if (a.x, a.y) == (gx, gy):
                gx, gy = _new_goal(cfg, random.Random(mix(cfg.seed, _AGENT, a.id, t, 1)), hot)
            v = cfg.max_speed
            x = a.x + max(-v, min(v, gx - a.x))
            y = a.y + max(-v, min(v, gy - a.y))
            new.append(replace(a, x=x, y=y, gx=gx, gy=gy, memory=mix(a.memory, x, y, len(ids)),
                               cooldown=max(0, a.cooldown - 1)))
    return StepPlan(t, ids, tuple(new), tuple(phases), talk)


def world_digest(agents: list[Agent]) -> str:
    """A hex digest of the whole world state (every field of every agent)."""
    h = 0
    for a in sorted(agents, key=lambda a: a.id):
        h = mix(h, a.id, a.x, a.y, a.gx, a.gy, a.memory, a.cooldown, a.talks)
    return f"{h:016x}"
