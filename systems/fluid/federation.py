"""The federated workload and the round loop of every policy (pure: the caller supplies how a round's
client trainings run, e.g. as Dask tasks).

Policies: ``fedavg_wait`` (every client trains the full model, the round waits for the slowest),
``fedavg_drop`` (every client trains the full model, the round waits only for the fastest: the slowest
``Config.drop_fraction`` of the clients' updates are dropped, as FedAvg with a deadline or over-selection
is deployed), ``random_dropout`` (stragglers train a random sub-model of size r), ``ordered_dropout`` (stragglers
keep the first r of each hidden layer) and ``fluid`` (Invariant Dropout: stragglers drop the neurons
whose updates, tracked on the non-stragglers, stay below the threshold theta). ``fluid_static`` is
``fluid`` with its stragglers and sizes fixed once from the initial profile (the re-detection's ablation).
``fedavg_drop``'s drop fraction is tuned on calibration seeds (``tune_drop_fraction``).

Client speeds change between rounds (``speed_trajectory``: devices become busy for a few rounds). All
policies but ``fluid_static`` re-detect the stragglers and re-size their sub-models every
``Config.redetect_every`` rounds from what the server saw of the previous rounds (``observed_s``); the
detection depends only on the speeds and on which updates were valid, so every policy of a seed sees
the same stragglers and sizes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import dropout as dr
from .model import Weights, accuracy, init_mlp, model_bytes, train_flops

POLICIES = ("fedavg_wait", "fedavg_drop", "random_dropout", "ordered_dropout", "fluid", "fluid_static")
INVARIANT = ("fluid", "fluid_static")  # the policies that pick neurons by Invariant Dropout
FAULTS = ("nan", "raise", "shape")  # what the injected faulty clients do, in turn
N_IN, N_OUT = 64, 10

# jobs -> one result per job, in order: the client's result dict, or the exception its task raised
RunClients = Callable[[list[dict]], list]


@dataclass
class Workload:
    """load_digits split into a test set and non-IID client shards, with each client's speed factor."""

    x_test: np.ndarray
    y_test: np.ndarray
    shards: list[tuple[np.ndarray, np.ndarray]]
    speed: np.ndarray            # >= 1: how many times slower than the reference device (the initial profile)
    label_counts: np.ndarray     # clients x 10
    slowed: list[int] = field(default_factory=list)   # clients made straggler_slowdown slower (slow_stragglers)
    trajectory: np.ndarray | None = None  # rounds x clients: each round's speed factors; None: ``speed`` throughout

    @property
    def clients(self) -> int:
        return len(self.shards)

    def speeds(self, rounds: int) -> np.ndarray:
        """rounds x clients speed factors: the trajectory's first ``rounds`` rows, or ``speed`` every round."""
        if self.trajectory is None:
            return np.tile(np.asarray(self.speed, float), (rounds, 1))
        if len(self.trajectory) < rounds:
            raise ValueError(f"the speed trajectory has {len(self.trajectory)} rounds, {rounds} are run")
        return np.asarray(self.trajectory[:rounds], float)


def make_workload(clients: int, alpha: float, test_fraction: float, speed_min: float, speed_max: float,
                  seed: int, min_samples: int = 8) -> Workload:
    """Dirichlet(alpha) label skew over ``clients`` (resampled until every client has ``min_samples``)."""
    from sklearn.datasets import load_digits  # bundled with scikit-learn: nothing is downloaded

    d = load_digits()
    x, y = (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    test = np.zeros(len(y), bool)
    for c in range(N_OUT):  # stratified test split
        idx = rng.permutation(np.flatnonzero(y == c))
        test[idx[:int(round(test_fraction * len(idx)))]] = True
    xtr, ytr = x[~test], y[~test]
    for _ in range(1000):
        parts: list[list[int]] = [[] for _ in range(clients)]
        for c in range(N_OUT):
            idx = rng.permutation(np.flatnonzero(ytr == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(clients, alpha))) * len(idx)).astype(int)[:-1]
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k] += chunk.tolist()
        if min(len(p) for p in parts) >= min_samples:
            break
    else:
        raise ValueError(f"no Dirichlet({alpha}) split gives every one of {clients} clients {min_samples} samples")
    shards = [(xtr[np.sort(p)], ytr[np.sort(p)]) for p in parts]
    counts = np.stack([np.bincount(s[1], minlength=N_OUT) for s in shards])
    return Workload(x[test], y[test], shards, rng.uniform(speed_min, speed_max, clients), counts)


def slow_stragglers(w: Workload, hidden: int, epochs: int, straggler_fraction: float, slowdown: float,
                    ref_gflops: float = 10.0) -> Workload:
    """The workload with its slowest ``straggler_fraction`` clients (by profiled full-model compute, as
    ``plan_stragglers`` ranks them) made ``slowdown`` times slower; the same clients stay the slowest."""
    if slowdown < 1.0:
        raise ValueError(f"slowdown must be >= 1 (got {slowdown})")
    flops = profile_flops(w, hidden, epochs)
    n = _straggler_count(w.clients, straggler_fraction)
    slowed = sorted(int(c) for c in np.argsort(-(flops * w.speed), kind="stable")[:n])
    speed = w.speed.copy()
    speed[slowed] *= slowdown
    return Workload(w.x_test, w.y_test, w.shards, speed, w.label_counts, slowed)


def speed_trajectory(speed, rounds: int, busy_prob: float, busy_slowdown: float, busy_rounds: int,
                     seed: int) -> np.ndarray:
    """rounds x clients speed factors: round 0 is ``speed`` (the profile); from round 1 on, every client
    that is not busy becomes busy with probability ``busy_prob`` per round (a device running something
    else) and then trains ``busy_slowdown`` times slower for ``busy_rounds`` rounds, that round included.
    Seeded by ``seed`` alone, so every policy of a seed sees the same trajectory; the generator draws
    the same numbers whatever the probabilities, so ``busy_prob`` = 0 gives ``speed`` in every round."""
    if not 0.0 <= busy_prob <= 1.0 or busy_slowdown < 1.0 or busy_rounds < 1 or rounds < 1:
        raise ValueError(f"need 0 <= busy_prob <= 1, busy_slowdown >= 1, busy_rounds >= 1, rounds >= 1 (got "
                         f"{busy_prob}, {busy_slowdown}, {busy_rounds}, {rounds})")
    speed = np.asarray(speed, float)
    rng = np.random.default_rng([seed, 0xB05])
    out = np.tile(speed, (rounds, 1))
    left = np.zeros(len(speed), int)  # busy rounds left, this one included
    for t in range(1, rounds):
        draw = rng.random(len(speed))
        left[(left == 0) & (draw < busy_prob)] = busy_rounds
        out[t, left > 0] *= busy_slowdown
        left = np.maximum(left - 1, 0)
    return out


def with_trajectory(w: Workload, trajectory: np.ndarray) -> Workload:
    """The workload whose clients run at ``trajectory`` (rounds x clients) round by round."""
    trajectory = np.asarray(trajectory, float)
    if trajectory.ndim != 2 or trajectory.shape[1] != w.clients:
        raise ValueError(f"a trajectory is rounds x {w.clients} clients (got shape {trajectory.shape})")
    return Workload(w.x_test, w.y_test, w.shards, w.speed, w.label_counts, list(w.slowed), trajectory)


def profile_flops(w: Workload, hidden: int, epochs: int) -> np.ndarray:
    """Every client's full-model training FLOPs per round (counted)."""
    return np.array([train_flops(N_IN, hidden, hidden, N_OUT, len(s[1]), epochs) for s in w.shards])


def _straggler_count(clients: int, straggler_fraction: float) -> int:
    n = int(round(straggler_fraction * clients))
    return min(max(n, 1 if straggler_fraction > 0 else 0), clients - 1)


def rescale_stragglers(speed, stragglers: list[int], factor: float) -> np.ndarray:
    """Speed factors (one per client, or rounds x clients) with the listed clients' multiplied by
    ``factor`` in every round (the regime's re-timing)."""
    out = np.asarray(speed, dtype=float).copy()
    out[..., list(stragglers)] *= factor
    return out


@dataclass
class Plan:
    """Who the stragglers are and the sub-model size each trains (from the clients' profile, or from
    the server's estimates of the previous rounds)."""

    stragglers: list[int]
    r: dict[int, float]
    expected_s: np.ndarray       # estimated full-model training time per client (profile: FLOPs x speed / FLOP/s)


def plan_from_estimates(expected_s, hidden: int, straggler_fraction: float, min_r: float) -> Plan:
    """The slowest ``straggler_fraction`` of the clients by estimated full-model training time, each
    with the largest sub-model that brings it to the slowest non-straggler's time."""
    expected = np.asarray(expected_s, float)
    n = _straggler_count(len(expected), straggler_fraction)
    order = np.argsort(-expected, kind="stable")
    stragglers = sorted(int(c) for c in order[:n])
    target = float(max(expected[c] for c in range(len(expected)) if c not in stragglers))
    r = {c: dr.submodel_size(expected[c] / target, N_IN, hidden, N_OUT, min_r) for c in stragglers}
    return Plan(stragglers, r, expected.copy())


def plan_stragglers(w: Workload, hidden: int, epochs: int, straggler_fraction: float, min_r: float,
                    ref_gflops: float) -> Plan:
    """The plan from the clients' initial profile: full-model training FLOPs x ``w.speed``."""
    return plan_from_estimates(profile_flops(w, hidden, epochs) * w.speed / (ref_gflops * 1e9), hidden,
                               straggler_fraction, min_r)


def observed_s(full_flops: float, kept: int, hidden: int, speed: float, ref_gflops: float) -> float:
    """What the server sees of a client's round: how long its training took at the size it trained
    (``kept`` neurons per hidden layer). Modelled from counted FLOPs x that round's speed factor / the
    reference FLOP rate, so the stragglers chosen from it, and every accuracy, repeat with the seed."""
    return full_flops * _work_fraction(kept, hidden) * speed / (ref_gflops * 1e9)


def full_model_estimate(observed: float, kept: int, hidden: int) -> float:
    """The server's estimate of a client's full-model training time from one observed round at ``kept``
    neurons per hidden layer (the time over the sub-model's share of the full model's FLOPs)."""
    return observed / _work_fraction(kept, hidden)


def _work_fraction(kept: int, hidden: int) -> float:
    if kept == hidden:
        return 1.0
    return train_flops(N_IN, kept, kept, N_OUT, 1, 1) / train_flops(N_IN, hidden, hidden, N_OUT, 1, 1)


@dataclass
class Config:
    hidden: int
    rounds: int
    epochs: int
    batch: int
    lr: float
    theta_init: float
    theta_growth: float
    comm_latency_s: float
    bandwidth_mb_s: float
    faulty_clients: int
    seed: int
    # straggler re-detection (every policy but fluid_static): every ``redetect_every`` rounds from round 1
    straggler_fraction: float = 0.2
    min_r: float = 0.5
    ref_gflops: float = 10.0
    redetect_every: int = 1
    # fedavg_drop: the share of the clients whose updates the round does not wait for (the slowest)
    drop_fraction: float = 0.2


def drop_count(clients: int, drop_fraction: float) -> int:
    """How many clients' updates ``fedavg_drop`` does not wait for: round(fraction x clients), at least
    one when the fraction is above 0, and never every client."""
    if not 0.0 <= drop_fraction < 1.0:
        raise ValueError(f"drop_fraction must be in [0, 1) (got {drop_fraction})")
    n = int(round(drop_fraction * clients))
    return min(max(n, 1 if drop_fraction > 0 else 0), clients - 1)


def fastest_valid(finish_s: dict[int, float], keep: int) -> list[int]:
    """The ``keep`` clients (ascending) whose valid updates arrive first this round: ``finish_s`` maps
    each client with a valid update to its finish time (ties: lower client first). FedAvg that drops its
    stragglers aggregates these and does not wait for the rest."""
    order = sorted(finish_s, key=lambda c: (finish_s[c], c))
    return sorted(order[:max(keep, 0)])


def tune_drop_fraction(times: dict[float, list[float]]) -> float:
    """The drop fraction with the lowest median time to the target over the calibration seeds (ties: the
    smaller fraction, which drops less data). ``times``: on the evaluation clock (``round_s``), read by
    ``time_to_target``'s smoothed rule."""
    if not times or any(not v for v in times.values()):
        raise ValueError("every calibrated drop fraction needs at least one calibration time")
    return min(sorted(times), key=lambda f: float(np.median(times[f])))


@dataclass
class History:
    policy: str
    accuracy: list[float] = field(default_factory=list)       # test accuracy after each round
    round_s: list[float] = field(default_factory=list)        # simulated round time (see round_times)
    round_raw_s: list[float] = field(default_factory=list)    # the same from each round's own CPU times
    client_cpu_s: list[float] = field(default_factory=list)   # measured CPU seconds of all local training per round
    excluded: list[list[tuple[int, str]]] = field(default_factory=list)
    theta: list[tuple[float, float]] = field(default_factory=list)
    kept_fraction: list[float] = field(default_factory=list)  # mean kept share of hidden neurons over stragglers
    # per round: (client, kept neurons, CPU s, comm s) of every aggregated client: re-timed by round_times
    trained: list[list[tuple[int, int, float, float]]] = field(default_factory=list)
    stragglers: list[list[int]] = field(default_factory=list)  # per round: the stragglers of the plan in force
    r: list[list[float]] = field(default_factory=list)         # per round: their sub-model sizes, in that order
    speed: list[list[float]] = field(default_factory=list)     # per round: every client's speed factor
    dropped: list[list[int]] = field(default_factory=list)     # per round: valid updates not waited for (fedavg_drop)
    # per round: the modelled round time, max over the aggregated clients of counted FLOPs x that round's speed
    # / ref FLOP rate + communication: repeats with the seed (fedavg_drop's arrival order within a round uses it;
    # its calibration ranks on round_s, the clock it is judged on)
    round_model_s: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("policy", "accuracy", "round_s", "round_raw_s", "client_cpu_s", "excluded", "theta",
                                              "kept_fraction", "trained", "stragglers", "r", "speed", "dropped",
                                              "round_model_s")}


FAULT_ROUND = 1  # the round in which the injected faulty clients misbehave


def fault_of(client: int, round_: int, faulty_clients: int) -> str | None:
    return FAULTS[client % len(FAULTS)] if client < faulty_clients and round_ == FAULT_ROUND else None


def comm_s(sub: Weights, latency_s: float, bandwidth_mb_s: float) -> float:
    """Download of the (sub-)model plus upload of its update."""
    return latency_s + 2 * model_bytes(sub) / (bandwidth_mb_s * 1e6)


def redetects(cfg: Config, policy: str, t: int) -> bool:
    """Whether ``policy`` re-plans its stragglers before round ``t``: from round 1 every
    ``cfg.redetect_every`` rounds (rounds 1, 1 + k, ...), never for ``fluid_static``."""
    return policy != "fluid_static" and t >= 1 and (t - 1) % cfg.redetect_every == 0


def run_federation(w: Workload, plan: Plan, cfg: Config, policy: str, run_clients: RunClients,
                   log: Callable[[str], None] = lambda s: None,
                   progress: Callable[[int, "History"], None] = lambda t, h: None,
                   stop_at: float | None = None) -> History:
    """``cfg.rounds`` rounds of ``policy``. Round 0 trains the full model everywhere (the profiling
    round that gives Invariant Dropout its first non-straggler updates); from round 1 the dropout
    policies send each straggler its sub-model. ``plan`` is the initial profile's: ``fluid_static``
    keeps it; every other policy re-plans before round 1 and then every ``cfg.redetect_every`` rounds
    from the server's estimates, which each round's valid clients update with what the server saw of
    them (``observed_s`` at that round's speed, ``full_model_estimate``; an excluded client keeps its
    last estimate). A client whose task raised or whose update is malformed is excluded from the round
    (logged); the round completes with the others. ``fedavg_drop`` trains the full model everywhere and
    aggregates only the valid updates that arrive first (all but ``drop_count`` clients, by that round's
    finish times: ``observed_s`` at that round's speed + communication); the round lasts until the last of
    them. ``progress(round, history)`` is called after every round. ``stop_at``: stop after the first
    round at which the running mean of the test accuracy over the last ``SMOOTH`` rounds reaches it
    (``crossed``; the rule ``time_to_target`` reads: a time-to-target run needs no later round)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; one of {POLICIES}")
    if cfg.redetect_every < 1:
        raise ValueError(f"redetect_every must be >= 1 (got {cfg.redetect_every})")
    speeds = w.speeds(cfg.rounds)
    flops = profile_flops(w, cfg.hidden, cfg.epochs)
    estimate = np.asarray(plan.expected_s, float).copy()  # the server's full-model time estimates
    glob = init_mlp(N_IN, cfg.hidden, N_OUT, cfg.seed)
    full_shapes = [a.shape for a in glob]
    hidden = (cfg.hidden, cfg.hidden)
    h = History(policy)
    last_ns: list[Weights] = []   # last round's valid non-straggler models (trained from last_glob)
    last_glob = glob
    trained: list[list[tuple[int, int, float, float]]] = []  # per round: (client, kept neurons, CPU s, comm s)
    n_keep = w.clients - (drop_count(w.clients, cfg.drop_fraction) if policy == "fedavg_drop" else 0)
    for t in range(cfg.rounds):
        if redetects(cfg, policy, t):
            plan = plan_from_estimates(estimate, cfg.hidden, cfg.straggler_fraction, cfg.min_r)
        keeps: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        thetas = (float("nan"), float("nan"))
        dropping = policy not in ("fedavg_wait", "fedavg_drop") and t > 0
        scores = dr.neuron_scores(last_glob, last_ns) if policy in INVARIANT and dropping and last_ns else None
        for c in range(w.clients):
            if not dropping or c not in plan.stragglers or plan.r[c] >= 1.0:
                keeps[c] = dr.full_keep(hidden)
            elif policy == "random_dropout":
                keeps[c] = dr.random_keep(hidden, plan.r[c], np.random.default_rng([cfg.seed, t, c, 7]))
            elif policy == "ordered_dropout":
                keeps[c] = dr.ordered_keep(hidden, plan.r[c])
            elif scores is None:  # no valid non-straggler update last round: nothing to rank by
                keeps[c] = dr.ordered_keep(hidden, plan.r[c])
                log(f"{policy} round {t}: no non-straggler updates to rank neurons; client {c} keeps the first neurons")
            else:
                keeps[c], thetas = dr.invariant_keep(scores, plan.r[c], cfg.theta_init, cfg.theta_growth)
        jobs = [{"weights": dr.extract(glob, keeps[c]), "x": w.shards[c][0], "y": w.shards[c][1],
                 "epochs": cfg.epochs, "batch": cfg.batch, "lr": cfg.lr, "seed": cfg.seed, "client": c, "round": t,
                 "fault": fault_of(c, t, cfg.faulty_clients)} for c in range(w.clients)]
        results = run_clients(jobs)
        entries, excluded, done, cpu, ns = [], [], [], 0.0, []
        valid: dict[int, tuple] = {}
        for c, res in enumerate(results):
            shapes = dr.submodel_shapes(full_shapes, keeps[c])
            try:
                if isinstance(res, BaseException):
                    raise dr.UpdateError(f"task failed: {type(res).__name__}: {res}")
                if not isinstance(res, dict) or "weights" not in res:
                    raise dr.UpdateError(f"result is a {type(res).__name__}, not an update")
                dr.check_update(res["weights"], shapes)
            except dr.UpdateError as exc:
                excluded.append((c, str(exc)))
                log(f"{policy} round {t}: client {c} excluded: {exc}")
                continue
            cpu += res["cpu_s"]  # a dropped client's training ran too: its CPU is spent, its update unused
            kept = len(keeps[c][0])
            seen = observed_s(flops[c], kept, cfg.hidden, speeds[t, c], cfg.ref_gflops)
            link = comm_s(res["weights"], cfg.comm_latency_s, cfg.bandwidth_mb_s)
            valid[c] = (res, kept, seen + link)
            # what the server saw of this client this round: the input to the next re-detection
            estimate[c] = full_model_estimate(seen, kept, cfg.hidden)
        waited = fastest_valid({c: v[2] for c, v in valid.items()}, n_keep) if policy == "fedavg_drop" else sorted(valid)
        for c in waited:
            res, kept, _ = valid[c]
            full, mask = dr.expand(res["weights"], keeps[c], glob)
            entries.append((full, mask, float(res["samples"])))
            done.append((c, kept, res["cpu_s"], comm_s(res["weights"], cfg.comm_latency_s, cfg.bandwidth_mb_s)))
            if c not in plan.stragglers:
                ns.append(full)
        new = dr.aggregate(glob, entries) if entries else glob
        if not entries:
            log(f"{policy} round {t}: every client excluded; the global model is unchanged")
        last_glob, last_ns, glob = glob, ns, new
        strag_keep = [len(keeps[c][0]) / cfg.hidden for c in plan.stragglers]
        h.accuracy.append(accuracy(glob, w.x_test, w.y_test))
        trained.append(done)
        h.client_cpu_s.append(cpu)
        h.excluded.append(excluded)
        h.theta.append(thetas)
        h.kept_fraction.append(float(np.mean(strag_keep)) if strag_keep else 1.0)
        h.stragglers.append(list(plan.stragglers))
        h.r.append([float(plan.r[c]) for c in plan.stragglers])
        h.dropped.append(sorted(set(valid) - set(waited)))
        h.round_model_s.append(max((valid[c][2] for c in waited), default=0.0))
        progress(t, h)
        if stop_at is not None and crossed(h.accuracy, stop_at):
            break
    h.round_s, h.round_raw_s = round_times(trained, speeds)
    h.trained = trained
    h.speed = speeds.tolist()
    return h


def round_times(trained: list[list[tuple[int, int, float, float]]], speed) -> tuple[list[float], list[float]]:
    """Simulated round times: the slowest valid client's compute x its speed factor in that round +
    its communication. ``speed``: one factor per client for every round, or rounds x clients. A
    client's compute is the median of its measured CPU times over the run's rounds in which it trained
    the same model size (robust to scheduling spikes of a shared machine); the raw variant uses each
    round's own measurement."""
    speed = np.asarray(speed, float)
    per_round = speed if speed.ndim == 2 else np.tile(speed, (len(trained), 1))
    if len(per_round) < len(trained):
        raise ValueError(f"speeds for {len(per_round)} rounds, {len(trained)} rounds trained")
    by: dict[tuple[int, int], list[float]] = {}
    for done in trained:
        for c, kept, cpu, _ in done:
            by.setdefault((c, kept), []).append(cpu)
    med = {k: float(np.median(v)) for k, v in by.items()}
    robust = [max((med[c, kept] * sp[c] + comm for c, kept, _, comm in done), default=0.0)
              for done, sp in zip(trained, per_round)]
    raw = [max((cpu * sp[c] + comm for c, _, cpu, comm in done), default=0.0) for done, sp in zip(trained, per_round)]
    return robust, raw


SMOOTH = 3  # rounds in the accuracy window: final_accuracy's, time_to_target's and the runs' stop rule


def final_accuracy(acc: list[float], last: int = SMOOTH) -> float:
    """Mean test accuracy of the last ``last`` rounds (one round's accuracy is noisy under label skew)."""
    return float(np.mean(acc[-last:]))


def smoothed(acc: list[float], window: int = SMOOTH) -> list[float]:
    """The running mean of the test accuracy over the last ``window`` rounds (fewer in the first rounds):
    the curve a time to target is read from, so one round's noise (one test image of a few hundred)
    does not decide it."""
    a = np.asarray(acc, float)
    return [float(a[max(0, i - window + 1):i + 1].mean()) for i in range(len(a))]


def crossed(acc: list[float], target: float) -> bool:
    """Whether the smoothed accuracy has reached ``target`` by the last round run (the stop rule)."""
    return bool(acc) and float(np.mean(acc[-SMOOTH:])) >= target


def time_to_target(acc: list[float], round_s: list[float], target: float) -> tuple[float, int | None]:
    """Simulated time until the running mean of the test accuracy over ``SMOOTH`` rounds (``smoothed``)
    reaches ``target``, interpolated linearly in time within the round in which it crosses (from the
    end of the round before, at the smoothed value there, to the end of that round), and that round's
    number (1-based); when never reached: the whole run's time (a lower bound, not a time to target)
    and None. One noisy round moves the time by a fraction of a round, not by whole rounds."""
    clock = np.cumsum(round_s)
    sm = smoothed(acc)
    for i, a in enumerate(sm):
        if a >= target:
            if i == 0 or a <= sm[i - 1]:
                return float(clock[i]), i + 1
            frac = (target - sm[i - 1]) / (a - sm[i - 1])
            return float(clock[i - 1] + frac * (clock[i] - clock[i - 1])), i + 1
    return float(clock[-1]) if len(clock) else 0.0, None
