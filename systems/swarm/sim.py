"""A discrete-event simulation of a drone swarm serving Poisson task arrivals, under centralized or
distributed control (pure: numpy and scipy).

Workload (identical for every policy at one N and seed): N drones start at uniform random spots of a
square whose side keeps the drone density fixed; tasks arrive as a Poisson process at uniform random
spots, each needs a service time (exponential) on site and is dropped if not started within its
deadline; each drone fails at an exponential time (failure rate per hour) and stays down.

Policies:
- ``centralized``: every decision request (task arrival, drone idle, abort, failure detection) travels
  to a backend (half a round trip plus jitter, lost with ``backhaul_loss`` and retransmitted after
  ``backhaul_retx_s``); the backend is one server: it takes every request queued so far, spends
  ``backend_request_s`` per request and then solves a global assignment of all not-yet-started tasks
  to all drones not serving (re-planning drones en route) with ``linear_sum_assignment`` on the
  travel-time matrix. The solve (cost matrix + assignment) RUNS HERE and its measured time (the thread's CPU
  clock) is the backend's service time on the event clock, plus ``backend_task_s`` per order it issues (the
  task's own compute on the backend, modelled; 0 by default); replies travel back (half a round trip, lossy).
- ``centralized_greedy``: the same backend without re-planning: tasks nobody is heading to go to idle drones
  by greedy matching (cheapest drone-task pair first).
- ``distributed``: each task's beacon broadcasts it within radio range (every ``announce_interval_s``
  until a drone is known to have taken it); an idle drone picks the nearest task it knows (the
  local compute RUNS HERE and its measured time goes on the event clock), broadcasts a claim, waits
  ``claim_window_s`` for competing claims (a lower-cost claim wins), then commits and broadcasts
  TAKEN, or yields and tries its next task. Every radio message reaches each receiver in range with
  probability 1 - radio_loss after a hop delay: lost claims cause duplicate trips, lost
  announcements and TAKEN messages cause late or duplicate service.

Decision latency (one definition for both controls): per task, from its arrival to the moment the drone
that serves it first knows it is to serve it (centralized: the arrival at that drone of the order that
sent it there, its last one to the task; distributed: that drone's commit after its claim window). An
order withdrawn before service (a re-plan sends the drone elsewhere or stops it, or the drone fails on
the way) does not count: the task's decision falls back to a drone still heading there, or to none. It
includes every wait on the way: backhaul, backend queue and solve, radio hops and claim rounds, a
re-announce the task waits for when no idle drone heard it, and the wait for a free drone. A task
dropped at its deadline counts the earliest order of a drone still heading there, or, with none, the
whole deadline. The first service start fixes the decision (a task re-queued after its drone failed
in service keeps it).
Time to service (``p99_time_to_service_s``): per task, from its arrival to the first start of its
service on site (flight included), the delay a task sees; a task never started counts its deadline.
The per-request latency (origin of a request to its answer: the reply at the drone, or a distributed
drone's commit or give-up) is kept as ``*_request_latency_s``.
"""
from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np
from scipy.spatial.distance import cdist

from .assign import greedy_nearest, hungarian

POLICIES = ("centralized", "centralized_greedy", "distributed")

IDLE, DECIDING, ENROUTE, SERVING, FAILED = range(5)


@dataclass(frozen=True)
class SimConfig:
    n_drones: int = 12
    horizon_s: float = 120.0
    warmup_s: float = 20.0
    density_per_km2: float = 60.0
    speed_m_s: float = 15.0
    service_mean_s: float = 10.0
    load: float = 0.4
    deadline_s: float = 60.0
    failure_rate_per_h: float = 1.0
    failure_detect_s: float = 3.0
    rtt_s: float = 0.01
    rtt_jitter_s: float = 0.004
    backhaul_loss: float = 0.001
    backhaul_retx_s: float = 0.2
    backend_request_s: float = 0.0002
    backend_task_s: float = 0.0       # modelled backend compute per order issued (see Params.backend_task_s)
    radio_range_m: float = 200.0
    radio_loss: float = 0.05
    hop_s: float = 0.003
    hop_jitter_s: float = 0.002
    claim_window_s: float = 0.02
    announce_interval_s: float = 2.0
    seed: int = 0

    @property
    def side_m(self) -> float:
        return math.sqrt(self.n_drones / self.density_per_km2) * 1000.0

    @property
    def arrival_rate(self) -> float:
        """Tasks per second: ``load`` is the offered service time per drone per second."""
        return self.load * self.n_drones / self.service_mean_s


@dataclass
class Workload:
    drone_xy: np.ndarray      # (N, 2) start positions
    fail_t: np.ndarray        # (N,) failure times (inf: none within the horizon)
    arr_t: np.ndarray         # (T,) arrival times
    task_xy: np.ndarray       # (T, 2)
    service_s: np.ndarray     # (T,)


def make_workload(cfg: SimConfig) -> Workload:
    """The seeded workload of one N: independent of the policy."""
    rng = np.random.default_rng([cfg.seed, cfg.n_drones])
    side, n = cfg.side_m, cfg.n_drones
    drone_xy = rng.uniform(0, side, (n, 2))
    rate_s = cfg.failure_rate_per_h / 3600.0
    fail_t = rng.exponential(1.0 / rate_s, n) if rate_s > 0 else np.full(n, np.inf)
    fail_t[fail_t >= cfg.horizon_s] = np.inf
    gaps = rng.exponential(1.0 / cfg.arrival_rate, int(cfg.arrival_rate * cfg.horizon_s * 1.5) + 20)
    arr_t = np.cumsum(gaps)
    arr_t = arr_t[arr_t < cfg.horizon_s]
    task_xy = rng.uniform(0, side, (len(arr_t), 2))
    service_s = rng.exponential(cfg.service_mean_s, len(arr_t))
    return Workload(drone_xy, fail_t, arr_t, task_xy, service_s)


@dataclass
class Task:
    xy: np.ndarray
    arrival: float
    service: float
    deadline: float
    state: str = "pending"           # pending | started | done | dropped
    gen: int = 0                     # bumped when the task returns to pending after a failure
    server: int = -1
    start: float = math.nan
    done: float = math.nan
    beacon_until: float = -1.0       # distributed: the beacon heard a TAKEN and stays quiet until then
    decided: float = math.nan        # the earliest standing order to it; at service, the server's (module doc)
    first_start: float = math.nan    # the first start of its service (fixes ``decided``)


@dataclass
class Protocol:
    """A distributed drone's local knowledge."""
    known: dict = field(default_factory=dict)    # task -> gen heard announced
    taken: dict = field(default_factory=dict)    # task -> (gen, until) heard taken
    claims: dict = field(default_factory=dict)   # task -> (cost, drone, time heard) best recent claim
    round_origin: float = 0.0
    claim_task: int = -1
    claim_cost: float = 0.0
    tried: set = field(default_factory=set)


@dataclass
class SimResult:
    policy: str
    n_drones: int
    counts: dict
    decision_latency_s: np.ndarray   # per task: arrival to the serving drone's order (see the module doc)
    completion_s: np.ndarray
    solve_s: np.ndarray              # measured time of each backend solve (centralized) or local pick (distributed)
    request_latency_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per decision request
    time_to_service_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per task: arrival to first start

    def metrics(self) -> dict[str, float]:
        lat, comp = self.decision_latency_s, self.completion_s
        m = {k: float(v) for k, v in self.counts.items()}
        m["p99_decision_latency_s"] = float(np.quantile(lat, 0.99)) if len(lat) else 0.0
        m["p50_decision_latency_s"] = float(np.quantile(lat, 0.5)) if len(lat) else 0.0
        tts = self.time_to_service_s
        m["p99_time_to_service_s"] = float(np.quantile(tts, 0.99)) if len(tts) else 0.0
        req = self.request_latency_s
        m["p99_request_latency_s"] = float(np.quantile(req, 0.99)) if len(req) else 0.0
        m["mean_completion_s"] = float(comp.mean()) if len(comp) else 0.0
        m["p95_completion_s"] = float(np.quantile(comp, 0.95)) if len(comp) else 0.0
        m["travel_m_per_task"] = self.counts["travel_m"] / max(1.0, self.counts["tasks_completed"])
        m["compute_s_mean"] = float(self.solve_s.mean()) if len(self.solve_s) else 0.0
        m["compute_s_p99"] = float(np.quantile(self.solve_s, 0.99)) if len(self.solve_s) else 0.0
        return m


class Swarm:
    """One run of one policy. ``clock`` measures the real compute: the thread's CPU clock by default, so
    other processes sharing the machine (the other simulations of the flow) do not inflate a solve as they
    would not on a dedicated backend; injectable for tests."""

    def __init__(self, cfg: SimConfig, policy: str, workload: Workload | None = None, clock=time.thread_time):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; one of {POLICIES}")
        self.cfg, self.policy, self.clock = cfg, policy, clock
        self.w = workload or make_workload(cfg)
        n = cfg.n_drones
        self.rng = np.random.default_rng([cfg.seed, n, POLICIES.index(policy), 7])
        # drone state, as arrays: a moving drone is at xy + unit(dest - xy) * speed * (now - t)
        self.xy = self.w.drone_xy.astype(float).copy()
        self.t0 = np.zeros(n)
        self.dest = self.xy.copy()
        self.vel = np.zeros((n, 2))       # m/s while en route
        self.dur = np.zeros(n)            # seconds of flight from (xy, t0) to dest
        self.state = np.full(n, IDLE)
        self.target = np.full(n, -1)
        self.eta = np.zeros(n)
        self.travel = np.zeros(n)
        self.plan_seq = np.full(n, -1)
        self.order_t = np.full(n, math.nan)   # when each drone got its current order (went en route)
        self.proto = [Protocol() for _ in range(n)] if policy == "distributed" else []
        self.tasks: list[Task] = []
        self.events: list = []
        self._seq = itertools.count()
        self.now = 0.0
        self.lat: list[tuple[float, float]] = []          # (origin, latency)
        self.compute: list[float] = []
        self.c = dict(tasks_arrived=0, tasks_completed=0, tasks_dropped=0, drones_failed=0, wasted_trips=0,
                      decisions=0, messages_lost=0, messages_sent=0, requeued_tasks=0, solves=0)
        # centralized backend
        self.queue: list[float] = []                      # origins of queued requests
        self.busy = False
        self.detected = np.zeros(n, dtype=bool)
        self.dispatched: dict[int, int] = {}              # centralized_greedy: drone -> task last sent
        self.inflight: dict[int, int] = {}                # centralized_greedy: orders not yet received
        self.seq_plans = 0
        if policy == "centralized":
            hungarian(np.ones((2, 2)))   # import scipy's solver now, not inside the first timed solve

    # ----- event plumbing -----
    def at(self, t: float, kind: str, *args) -> None:
        heapq.heappush(self.events, (t, next(self._seq), kind, args))

    def run(self, drain: bool = True) -> SimResult:
        """Simulates the arrivals up to the horizon, then (``drain``) until every task is completed or dropped."""
        for i, t in enumerate(self.w.arr_t):
            self.at(float(t), "arrive", i)
        for d, t in enumerate(self.w.fail_t):
            if math.isfinite(t):
                self.at(float(t), "fail", d)
        end = self.cfg.horizon_s + (self.cfg.deadline_s + 5 * self.cfg.service_mean_s if drain else 0.0)
        while self.events:
            t, _, kind, args = heapq.heappop(self.events)
            if t > end:
                break
            self.now = t
            getattr(self, "on_" + kind)(*args)
            if t > self.cfg.horizon_s and self.c["tasks_completed"] + self.c["tasks_dropped"] == len(self.tasks):
                break     # every task resolved after the arrivals stopped
        return self.result()

    def positions(self, idx=None) -> np.ndarray:
        """Where drones ``idx`` (default all) are now."""
        if idx is None:
            return self.xy + self.vel * np.minimum(self.now - self.t0, self.dur)[:, None]
        idx = np.asarray(idx)
        return self.xy[idx] + self.vel[idx] * np.minimum(self.now - self.t0[idx], self.dur[idx])[:, None]

    def pos(self, d: int) -> np.ndarray:
        return self.positions([d])[0]

    def _stop(self, d: int) -> None:
        """Freeze a drone where it is now, counting its travel."""
        p = self.pos(d)
        self.travel[d] += float(np.hypot(*(p - self.xy[d])))
        self.xy[d], self.dest[d], self.t0[d], self.vel[d], self.dur[d] = p, p, self.now, 0.0, 0.0

    def _go(self, d: int, k: int) -> None:
        left = int(self.target[d]) if self.state[d] == ENROUTE and self.target[d] != k else -1
        if math.isnan(self.tasks[k].decided):
            self.tasks[k].decided = self.now
        self._stop(d)
        self.state[d], self.target[d], self.dest[d] = ENROUTE, k, self.tasks[k].xy
        self.order_t[d] = self.now
        if left >= 0:        # re-planned away from another task
            self._withdrawn(left)
        vec = self.dest[d] - self.xy[d]
        dist = float(np.hypot(*vec))
        self.dur[d] = dist / self.cfg.speed_m_s
        self.vel[d] = vec / dist * self.cfg.speed_m_s if dist > 0 else 0.0
        self.eta[d] = self.now + self.dur[d]
        self.at(self.eta[d], "reach", d, k, float(self.eta[d]))

    def _withdrawn(self, k: int) -> None:
        """A drone's order to task ``k`` no longer stands (re-planned elsewhere, stopped, failed on the way):
        until its service starts, the task's decision is the earliest order of a drone still heading there,
        or none (NaN: the next order sets it)."""
        task = self.tasks[k]
        if task.state != "pending" or not math.isnan(task.first_start):
            return
        on = np.flatnonzero((self.state == ENROUTE) & (self.target == k))
        task.decided = float(self.order_t[on].min()) if len(on) else math.nan

    def _lost(self, p: float, n: int = 1) -> np.ndarray:
        """Which of ``n`` messages are lost."""
        self.c["messages_sent"] += n
        lost = self.rng.random(n) < p if p > 0 else np.zeros(n, dtype=bool)
        self.c["messages_lost"] += int(lost.sum())
        return lost

    def _backhaul_delay(self) -> float:
        """One-way drone<->backend delay, retransmissions included."""
        cfg, delay = self.cfg, 0.0
        while self._lost(cfg.backhaul_loss)[0]:
            delay += cfg.backhaul_retx_s
        jitter = self.rng.exponential(cfg.rtt_jitter_s / 2) if cfg.rtt_jitter_s > 0 else 0.0
        return delay + cfg.rtt_s / 2 + jitter

    def _hops(self, n: int) -> np.ndarray:
        j = self.rng.exponential(self.cfg.hop_jitter_s, n) if self.cfg.hop_jitter_s > 0 else np.zeros(n)
        return self.cfg.hop_s + j

    def _record(self, origin: float) -> None:
        self.c["decisions"] += 1
        self.lat.append((origin, self.now - origin))

    # ----- workload events -----
    def on_arrive(self, i: int) -> None:
        w = self.w
        self.tasks.append(Task(w.task_xy[i], float(w.arr_t[i]), float(w.service_s[i]),
                               float(w.arr_t[i]) + self.cfg.deadline_s))
        k = len(self.tasks) - 1
        self.c["tasks_arrived"] += 1
        self.at(self.tasks[k].deadline, "deadline", k)
        if self.policy == "distributed":
            self.announce(k)
        else:
            self.request(self.now)

    def on_deadline(self, k: int) -> None:
        task = self.tasks[k]
        if task.state != "pending":
            return
        task.state = "dropped"
        self.c["tasks_dropped"] += 1
        for d in np.flatnonzero((self.state == ENROUTE) & (self.target == k)):
            self._stop(d)   # drones know the deadline: those heading there stop
            self.c["wasted_trips"] += 1
            self.became_idle(int(d))

    def on_reach(self, d: int, k: int, eta: float) -> None:
        if self.state[d] != ENROUTE or self.target[d] != k or self.eta[d] != eta:
            return  # superseded by a later plan
        self._stop(d)
        task = self.tasks[k]
        if task.state != "pending":
            self.c["wasted_trips"] += 1  # someone else served it first
            self.became_idle(d)
            return
        task.state, task.server, task.start = "started", d, self.now
        if math.isnan(task.first_start):  # the order that led to its service is its decision
            task.first_start, task.decided = self.now, float(self.order_t[d])
        self.state[d] = SERVING
        if self.policy == "distributed":   # the beacon tells its range the task is being served
            self._beacon_says_taken(k, math.inf, 1)
        self.at(self.now + task.service, "served", d, k)

    def on_served(self, d: int, k: int) -> None:
        if self.state[d] != SERVING or self.target[d] != k:
            return
        task = self.tasks[k]
        task.state, task.done = "done", self.now
        self.c["tasks_completed"] += 1
        self.became_idle(d)

    def on_fail(self, d: int) -> None:
        self._stop(d)
        k, was = int(self.target[d]), int(self.state[d])
        self.state[d], self.target[d] = FAILED, -1
        self.c["drones_failed"] += 1
        if was == ENROUTE:
            self._withdrawn(k)
        if was == SERVING:
            task = self.tasks[k]
            task.state, task.server, task.start = "pending", -1, math.nan
            self.c["requeued_tasks"] += 1
        # the controller notices after failure_detect_s (missed heartbeats; the task's beacon sees no service)
        self.at(self.now + self.cfg.failure_detect_s, "detect", d, k if was in (SERVING, ENROUTE) else -1)

    def on_detect(self, d: int, k: int) -> None:
        if self.policy == "distributed":
            if k >= 0 and self.tasks[k].state == "pending":
                self.tasks[k].gen += 1   # the beacon announces it again, as a new generation
                self.tasks[k].beacon_until = -1.0
                self.announce(k)
        else:
            self.detected[d] = True
            self.request(self.now)

    def became_idle(self, d: int) -> None:
        self.state[d], self.target[d] = IDLE, -1
        if self.policy == "distributed":
            self.decide(d, self.now)
        else:
            self.request(self.now)

    # ----- centralized control -----
    def request(self, origin: float) -> None:
        self.at(self.now + self._backhaul_delay(), "backend_recv", origin)

    def on_backend_recv(self, origin: float) -> None:
        self.queue.append(origin)
        if not self.busy:
            self.solve()

    def solve(self) -> None:
        """One backend batch: every queued request, then one global assignment of every not-started task
        to every drone not serving (its view: drones that failed are alive until detected)."""
        batch, self.queue = self.queue, []
        self.busy = True
        replan = self.policy == "centralized"
        free = (self.state == IDLE) | ((self.state == FAILED) & ~self.detected)
        if not replan and self.inflight:
            free[list(self.inflight)] = False        # dispatched, the order still on its way
        drones = np.flatnonzero(free | (self.state == ENROUTE) if replan else free)
        if replan:
            tasks = [k for k, t in enumerate(self.tasks) if t.state == "pending"]  # arrival order
        else:   # dispatch only the tasks nobody is heading to (as far as the backend knows)
            heading = set(self.target[self.state == ENROUTE].tolist())
            heading |= {k for d, k in self.dispatched.items() if self.state[d] == FAILED and not self.detected[d]}
            heading |= set(self.inflight.values())
            tasks = [k for k, t in enumerate(self.tasks) if t.state == "pending" and k not in heading]
        t0 = self.clock()
        pairs = []
        if len(drones) and tasks:
            dxy = self.positions(drones)
            txy = np.array([self.tasks[k].xy for k in tasks])
            cost = cdist(dxy, txy) / self.cfg.speed_m_s   # scipy's C loop, as a backend would compute it
            pairs = hungarian(cost) if self.policy == "centralized" else greedy_nearest(cost)
        solve_s = self.clock() - t0
        self.compute.append(solve_s)
        self.c["solves"] += 1
        self.seq_plans += 1
        # re-planning: a drone en route that the new plan leaves out stops
        plan = {int(d): -1 for d in drones if self.state[d] == ENROUTE} if replan else {}
        plan.update({int(drones[r]): tasks[c] for r, c in pairs})
        # only changed orders are sent (a drone en route keeping its task gets no message)
        plan = {d: k for d, k in plan.items() if not (self.state[d] == ENROUTE and self.target[d] == k)}
        if not replan:
            self.dispatched.update(plan)
            self.inflight.update(plan)
        # the backend's busy time: per-request handling, the measured solve, and the modelled compute of every
        # order it issues (a drone sent to a task; a stop order carries no task)
        task_s = self.cfg.backend_task_s * sum(k >= 0 for k in plan.values())
        self.at(self.now + self.cfg.backend_request_s * len(batch) + solve_s + task_s, "backend_done", batch, plan,
                self.seq_plans)

    def on_backend_done(self, batch: list[float], plan: dict, seq: int) -> None:
        for origin in batch:     # each request's answer and each drone's new plan travel back separately
            self.at(self.now + self._backhaul_delay(), "reply", origin)
        for d, k in plan.items():
            self.at(self.now + self._backhaul_delay(), "assign", d, k, seq)
        self.busy = False
        if self.queue:
            self.solve()

    def on_reply(self, origin: float) -> None:
        self._record(origin)

    def on_assign(self, d: int, k: int, seq: int) -> None:
        if self.inflight.get(d) == k:
            del self.inflight[d]
        if self.state[d] not in (IDLE, ENROUTE) or seq < self.plan_seq[d]:
            return  # failed, serving (a stale plan) or an older plan arriving late
        self.plan_seq[d] = seq
        if k < 0:
            if self.state[d] == ENROUTE:
                left = int(self.target[d])
                self._stop(d)
                self.state[d], self.target[d] = IDLE, -1
                self._withdrawn(left)
            return
        if self.tasks[k].state != "pending" or (self.state[d] == ENROUTE and self.target[d] == k):
            return
        self._go(d, k)

    # ----- distributed control -----
    def _in_range(self, here: np.ndarray, exclude: int = -1) -> np.ndarray:
        """Alive drones within radio range of ``here`` that receive a broadcast (losses drawn)."""
        p = self.positions() - here
        ok = (p[:, 0] ** 2 + p[:, 1] ** 2 <= self.cfg.radio_range_m ** 2) & (self.state != FAILED)
        if exclude >= 0:
            ok[exclude] = False
        near = np.flatnonzero(ok)
        return near[~self._lost(self.cfg.radio_loss, len(near))]

    def announce(self, k: int) -> None:
        """The task's beacon broadcasts it, and again every announce_interval_s while it is pending."""
        task = self.tasks[k]
        if task.state != "pending":
            return
        rx = self._in_range(task.xy)
        for d, h in zip(rx.tolist(), self._hops(len(rx)).tolist()):
            self.at(self.now + h, "heard", d, k, task.gen, self.now)
        self.at(self.now + self.cfg.announce_interval_s, "reannounce", k, task.gen)

    def on_reannounce(self, k: int, gen: int) -> None:
        task = self.tasks[k]
        if task.state != "pending" or task.gen != gen:
            return
        if self.now < task.beacon_until:  # the beacon heard a TAKEN: quiet until that drone is overdue
            self.at(task.beacon_until, "reannounce", k, gen)
            return
        self.announce(k)

    def on_heard(self, d: int, k: int, gen: int, sent: float) -> None:
        if self.state[d] == FAILED:
            return
        pr = self.proto[d]
        if pr.known.get(k, -1) < gen:
            pr.known[k] = gen
        if self.state[d] == IDLE:
            self.decide(d, sent)

    def _candidates(self, d: int) -> tuple[list[int], np.ndarray]:
        pr = self.proto[d]
        ks = []
        for k, gen in list(pr.known.items()):
            task = self.tasks[k]
            if self.now >= task.deadline or task.state == "done":
                del pr.known[k]   # past its deadline; or served (modelled as known: the beacon stops)
                continue
            tk = pr.taken.get(k)
            if (tk is not None and tk[0] >= gen and self.now < tk[1]) or k in pr.tried:
                continue
            ks.append(k)
        if not ks:
            return ks, np.zeros(0)
        txy = np.array([self.tasks[k].xy for k in ks])
        return ks, np.sqrt(((txy - self.xy[d]) ** 2).sum(-1))

    def decide(self, d: int, origin: float) -> None:
        """An idle drone picks the nearest task it knows and claims it."""
        pr = self.proto[d]
        self.state[d] = DECIDING
        pr.round_origin, pr.tried = origin, set()
        self._round(d)

    def _round(self, d: int) -> None:
        pr = self.proto[d]
        t0 = self.clock()
        ks, dist = self._candidates(d)
        pick = int(np.argmin(dist)) if ks else -1
        compute_s = self.clock() - t0
        self.compute.append(compute_s)
        if pick < 0:
            self.at(self.now + compute_s, "giveup", d)
            return
        k = ks[pick]
        pr.claim_task, pr.claim_cost = k, float(dist[pick]) / self.cfg.speed_m_s
        t_send = self.now + compute_s
        rx = self._in_range(self.xy[d], exclude=d)
        for e, h in zip(rx.tolist(), self._hops(len(rx)).tolist()):
            self.at(t_send + h, "claim", e, d, k, pr.claim_cost)
        if not self._lost(self.cfg.radio_loss)[0]:   # the task's beacon relays the claim to its own range
            relay = self._in_range(self.tasks[k].xy, exclude=d)
            for e, h in zip(relay.tolist(), (self._hops(len(relay)) + self._hops(len(relay))).tolist()):
                self.at(t_send + h, "claim", e, d, k, pr.claim_cost)
        self.at(t_send + self.cfg.claim_window_s, "resolve", d, k)

    def on_claim(self, e: int, d: int, k: int, cost: float) -> None:
        if self.state[e] == FAILED:
            return
        pr = self.proto[e]
        best = pr.claims.get(k)
        stale = best is None or self.now - best[2] > 2 * self.cfg.claim_window_s
        if stale or (cost, d) < best[:2]:
            pr.claims[k] = (cost, d, self.now)

    def on_taken(self, e: int, d: int, k: int, gen: int, until: float) -> None:
        if self.state[e] != FAILED:
            self.proto[e].taken[k] = (gen, until)

    def on_resolve(self, d: int, k: int) -> None:
        pr = self.proto[d]
        if self.state[d] != DECIDING or pr.claim_task != k:
            return
        best = pr.claims.pop(k, None)
        beaten = best is not None and self.now - best[2] <= 2 * self.cfg.claim_window_s and \
            best[:2] < (pr.claim_cost, d)
        if beaten or self.tasks[k].state != "pending":
            pr.tried.add(k)            # a better claim was heard (or it was served meanwhile): next task
            self._round(d)
            return
        self._record(pr.round_origin)
        self._go(d, k)
        task = self.tasks[k]
        until = float(self.eta[d]) + self.cfg.failure_detect_s
        rx = self._in_range(self.xy[d], exclude=d)   # TAKEN to the neighbours ...
        for e, h in zip(rx.tolist(), self._hops(len(rx)).tolist()):
            self.at(self.now + h, "taken", e, d, k, task.gen, until)
        if not self._lost(self.cfg.radio_loss)[0]:   # ... and to the task's beacon, which relays it
            task.beacon_until = until
            self._beacon_says_taken(k, until, 2)

    def _beacon_says_taken(self, k: int, until: float, hops: int) -> None:
        task = self.tasks[k]
        rx = self._in_range(task.xy)
        delay = sum(self._hops(len(rx)) for _ in range(hops))
        for e, h in zip(rx.tolist(), np.atleast_1d(delay).tolist()):
            self.at(self.now + h, "taken", e, -1, k, task.gen, until)

    def on_giveup(self, d: int) -> None:
        if self.state[d] != DECIDING:
            return
        self._record(self.proto[d].round_origin)
        self.state[d] = IDLE

    # ----- results -----
    def result(self) -> SimResult:
        cfg = self.cfg
        for d in np.flatnonzero(self.state == ENROUTE):
            self._stop(int(d))
        c = dict(self.c)
        c["tasks_pending"] = sum(t.state == "pending" for t in self.tasks)
        c["tasks_in_service"] = sum(t.state == "started" for t in self.tasks)
        c["travel_m"] = float(self.travel.sum())
        req = np.array([x for o, x in self.lat if cfg.warmup_s <= o <= cfg.horizon_s])
        lat = np.array([task_decision_latency(t) for t in self.tasks if cfg.warmup_s <= t.arrival <= cfg.horizon_s])
        comp = np.array([t.done - t.arrival for t in self.tasks if t.state == "done" and t.arrival >= cfg.warmup_s])
        tts = np.array([task_time_to_service(t) for t in self.tasks if cfg.warmup_s <= t.arrival <= cfg.horizon_s])
        return SimResult(self.policy, cfg.n_drones, c, lat, comp, np.array(self.compute), req, tts)


def task_decision_latency(t: Task) -> float:
    """Arrival to the standing decision (the serving drone's order once served; see the module doc); a task
    no standing order reached waited its whole deadline."""
    return t.decided - t.arrival if not math.isnan(t.decided) else t.deadline - t.arrival


def task_time_to_service(t: Task) -> float:
    """Arrival to the first start of its service (flight included); a task never started counts its deadline."""
    return t.first_start - t.arrival if not math.isnan(t.first_start) else t.deadline - t.arrival


def simulate(cfg: SimConfig, policy: str, clock=time.thread_time) -> SimResult:
    return Swarm(cfg, policy, clock=clock).run()
