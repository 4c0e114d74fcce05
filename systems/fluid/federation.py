"""The federated workload and the round loop of every policy (pure: the caller supplies how a round's
client trainings run, e.g. as Dask tasks).

Policies: ``fedavg_wait`` (every client trains the full model, the round waits for the slowest),
``random_dropout`` (stragglers train a random sub-model of size r), ``ordered_dropout`` (stragglers
keep the first r of each hidden layer) and ``fluid`` (Invariant Dropout: stragglers drop the neurons
whose updates, tracked on the non-stragglers, stay below the threshold theta).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import dropout as dr
from .model import Weights, accuracy, init_mlp, model_bytes, train_flops

POLICIES = ("fedavg_wait", "random_dropout", "ordered_dropout", "fluid")
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
    speed: np.ndarray            # >= 1: how many times slower than the reference device
    label_counts: np.ndarray     # clients x 10

    @property
    def clients(self) -> int:
        return len(self.shards)


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
    flops = np.array([train_flops(N_IN, hidden, hidden, N_OUT, len(s[1]), epochs) for s in w.shards])
    n = _straggler_count(w.clients, straggler_fraction)
    speed = w.speed.copy()
    speed[np.argsort(-(flops * w.speed), kind="stable")[:n]] *= slowdown
    return Workload(w.x_test, w.y_test, w.shards, speed, w.label_counts)


def _straggler_count(clients: int, straggler_fraction: float) -> int:
    n = int(round(straggler_fraction * clients))
    return min(max(n, 1 if straggler_fraction > 0 else 0), clients - 1)


def rescale_stragglers(speed, stragglers: list[int], factor: float) -> np.ndarray:
    """Speed factors with the stragglers' multiplied by ``factor`` (the regime's re-timing)."""
    out = np.asarray(speed, dtype=float).copy()
    out[list(stragglers)] *= factor
    return out


@dataclass
class Plan:
    """Who the stragglers are and the sub-model size each trains (from the clients' profile)."""

    stragglers: list[int]
    r: dict[int, float]
    expected_s: np.ndarray       # profile: full-model training FLOPs x speed / reference FLOP/s


def plan_stragglers(w: Workload, hidden: int, epochs: int, straggler_fraction: float, min_r: float,
                    ref_gflops: float) -> Plan:
    """The slowest ``straggler_fraction`` of the clients by profiled full-model round compute, each
    with the largest sub-model that brings it to the slowest non-straggler's time."""
    flops = np.array([train_flops(N_IN, hidden, hidden, N_OUT, len(s[1]), epochs) for s in w.shards])
    expected = flops * w.speed / (ref_gflops * 1e9)
    n = _straggler_count(w.clients, straggler_fraction)
    order = np.argsort(-expected, kind="stable")
    stragglers = sorted(int(c) for c in order[:n])
    target = float(max(expected[c] for c in range(w.clients) if c not in stragglers))
    r = {c: dr.submodel_size(expected[c] / target, N_IN, hidden, N_OUT, min_r) for c in stragglers}
    return Plan(stragglers, r, expected)


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
    # per round: (client, kept neurons, CPU s, comm s) of every valid client: re-timed by round_times
    trained: list[list[tuple[int, int, float, float]]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("policy", "accuracy", "round_s", "round_raw_s", "client_cpu_s", "excluded", "theta",
                                              "kept_fraction", "trained")}


FAULT_ROUND = 1  # the round in which the injected faulty clients misbehave


def fault_of(client: int, round_: int, faulty_clients: int) -> str | None:
    return FAULTS[client % len(FAULTS)] if client < faulty_clients and round_ == FAULT_ROUND else None


def comm_s(sub: Weights, latency_s: float, bandwidth_mb_s: float) -> float:
    """Download of the (sub-)model plus upload of its update."""
    return latency_s + 2 * model_bytes(sub) / (bandwidth_mb_s * 1e6)


def run_federation(w: Workload, plan: Plan, cfg: Config, policy: str, run_clients: RunClients,
                   log: Callable[[str], None] = lambda s: None,
                   progress: Callable[[int, "History"], None] = lambda t, h: None) -> History:
    """``cfg.rounds`` rounds of ``policy``. Round 0 trains the full model everywhere (the profiling
    round that gives Invariant Dropout its first non-straggler updates); from round 1 the dropout
    policies send each straggler its sub-model. A client whose task raised or whose update is
    malformed is excluded from the round (logged); the round completes with the others.
    ``progress(round, history)`` is called after every round."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; one of {POLICIES}")
    glob = init_mlp(N_IN, cfg.hidden, N_OUT, cfg.seed)
    full_shapes = [a.shape for a in glob]
    hidden = (cfg.hidden, cfg.hidden)
    h = History(policy)
    last_ns: list[Weights] = []   # last round's valid non-straggler models (trained from last_glob)
    last_glob = glob
    trained: list[list[tuple[int, int, float, float]]] = []  # per round: (client, kept neurons, CPU s, comm s)
    for t in range(cfg.rounds):
        keeps: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        thetas = (float("nan"), float("nan"))
        dropping = policy != "fedavg_wait" and t > 0
        scores = dr.neuron_scores(last_glob, last_ns) if policy == "fluid" and dropping and last_ns else None
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
            full, mask = dr.expand(res["weights"], keeps[c], glob)
            entries.append((full, mask, float(res["samples"])))
            cpu += res["cpu_s"]
            done.append((c, len(keeps[c][0]), res["cpu_s"], comm_s(res["weights"], cfg.comm_latency_s,
                                                                   cfg.bandwidth_mb_s)))
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
        progress(t, h)
    h.round_s, h.round_raw_s = round_times(trained, w.speed)
    h.trained = trained
    return h


def round_times(trained: list[list[tuple[int, int, float, float]]], speed: np.ndarray) -> tuple[list[float], list[float]]:
    """Simulated round times: the slowest valid client's compute x its speed factor + its communication.
    A client's compute is the median of its measured CPU times over the run's rounds in which it trained
    the same model size (robust to scheduling spikes of a shared machine); the raw variant uses each
    round's own measurement."""
    by: dict[tuple[int, int], list[float]] = {}
    for done in trained:
        for c, kept, cpu, _ in done:
            by.setdefault((c, kept), []).append(cpu)
    med = {k: float(np.median(v)) for k, v in by.items()}
    robust = [max((med[c, kept] * speed[c] + comm for c, kept, _, comm in done), default=0.0) for done in trained]
    raw = [max((cpu * speed[c] + comm for c, _, cpu, comm in done), default=0.0) for done in trained]
    return robust, raw


def final_accuracy(acc: list[float], last: int = 3) -> float:
    """Mean test accuracy of the last ``last`` rounds (one round's accuracy is noisy under label skew)."""
    return float(np.mean(acc[-last:]))


def time_to_target(acc: list[float], round_s: list[float], target: float) -> tuple[float, int | None]:
    """Simulated time until the first round whose test accuracy reaches ``target``, and that round's
    number (1-based); when never reached: the whole run's time and None."""
    clock = np.cumsum(round_s)
    for i, a in enumerate(acc):
        if a >= target:
            return float(clock[i]), i + 1
    return float(clock[-1]) if len(clock) else 0.0, None
