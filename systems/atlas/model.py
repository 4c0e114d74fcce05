"""The microservice system model: a random service call graph, a structural causal model (SCM) over
per-component metrics, and telemetry with injected faults (pure numpy).

Variables (columns of every telemetry array): 0 is the shared request ``traffic`` (observed at the
frontends); component ``c`` owns columns ``1 + 4c + m`` for the metrics ``cpu``, ``queue``,
``latency``, ``errors``. A call ``v -> u`` (v calls u) makes u a *cause* of v: the callee's latency
and errors feed the caller's.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.special import ndtr, ndtri

METRICS = ("cpu", "queue", "latency", "errors")
CPU, QUEUE, LAT, ERR = range(4)
KINDS = ("frontend", "service", "cache", "db", "queue")
FAULTS = ("cpu_hog", "queue_backlog", "latency_injection", "error_injection")
# errors a caller adds when every one of its requests to a callee times out, in units of its error noise
# (times the edge's timeout_weight, 1-2): a callee whose latency is far past the timeout sets off an error storm
TIMEOUT_ERRORS = 20.0
FAULT_METRIC = {"cpu_hog": CPU, "queue_backlog": QUEUE, "latency_injection": LAT, "error_injection": ERR}

_DOMAINS = ("checkout", "cart", "catalog", "payment", "shipping", "user", "auth", "recommend", "search",
            "inventory", "pricing", "review", "notification", "order", "currency", "ads", "profile", "session",
            "email", "fraud", "invoice", "media", "loyalty", "geo", "tax", "coupon", "ledger", "report",
            "audit", "quote", "warehouse", "rating", "feed", "chat", "billing", "identity")
_SUFFIX = {"frontend": "frontend", "service": "svc", "cache": "cache", "db": "db", "queue": "queue"}


def var(c: int, m: int) -> int:
    """Column of metric ``m`` of component ``c``."""
    return 1 + 4 * c + m


def component_of(v: int) -> int:
    """Component owning column ``v`` (-1 for traffic)."""
    return -1 if v == 0 else (v - 1) // 4


@dataclass
class Microservices:
    """A call graph with the SCM's coefficients. ``calls[v]`` are the callees of component v;
    components are numbered in a topological order (callers before callees)."""

    names: list[str]
    kinds: list[str]
    domains: list[str]
    calls: list[list[int]]
    load: np.ndarray          # cpu per unit traffic
    queue_gain: np.ndarray    # queue length per unit of (convex) cpu
    lat_cpu: np.ndarray
    lat_queue: np.ndarray
    call_weight: dict[tuple[int, int], float]   # (caller, callee) -> latency share
    err_weight: dict[tuple[int, int], float]    # (caller, callee) -> error propagation
    timeout_weight: dict[tuple[int, int], float]  # (caller, callee) -> errors when all its requests time out (x TIMEOUT_ERRORS)
    noise: np.ndarray         # per-variable noise sd (len V)
    timeout_at: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per-request latency where callers time out
    request_sd: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per-request latency spread about a sample's mean
    traffic_ar: float = 0.7
    sd: np.ndarray = field(default_factory=lambda: np.zeros(0))  # normal-operation sd per variable

    @property
    def n(self) -> int:
        return len(self.names)

    @property
    def V(self) -> int:
        return 1 + 4 * self.n

    def callers(self, u: int) -> list[int]:
        return [v for v in range(self.n) if u in self.calls[v]]

    def component_edges(self) -> set[tuple[int, int]]:
        """True causal edges between components: (callee, caller)."""
        return {(u, v) for v in range(self.n) for u in self.calls[v]}

    def var_names(self) -> list[str]:
        return ["traffic"] + [f"{nm}.{m}" for nm in self.names for m in METRICS]


def make_system(n: int, seed: int, timeout_quantile: float = 0.99, request_spread: float = 2.0) -> Microservices:
    """A random microservice deployment with ``n`` components: ~10% frontends, ~50% services,
    the rest caches, databases and queues (leaves); every non-frontend has a caller.

    Timeouts: a telemetry sample's latency is the mean over its requests, which spread about it with sd
    ``request_spread`` x the sample latency's normal sd. Callers time a request out at the
    ``timeout_quantile`` of normal per-request latency (0.99: a p99 timeout, a common setting), so in
    normal operation about 1 - timeout_quantile of requests time out, a share that rises smoothly with the
    callee's latency (the normal cdf): the latency -> errors link is in normal telemetry, weakly, and a
    latency fault past the timeout sets off an error storm. ``timeout_quantile`` 1 disables timeouts."""
    if not 0.5 <= timeout_quantile <= 1.0:
        raise ValueError(f"timeout_quantile must lie in [0.5, 1] (got {timeout_quantile})")
    if request_spread <= 0:
        raise ValueError(f"request_spread must be positive (got {request_spread})")
    rng = np.random.default_rng([seed, 11])
    n_front = max(1, round(0.1 * n))
    n_back = max(2, round(0.4 * n))
    n_svc = n - n_front - n_back
    if n_svc < 1:
        raise ValueError(f"{n} components leave no room for services")
    kinds = ["frontend"] * n_front + ["service"] * n_svc + list(rng.choice(["cache", "db", "db", "queue"], n_back))
    domains = list(rng.choice(_DOMAINS, size=n, replace=n > len(_DOMAINS)))
    names, seen = [], set()
    for i, (k, d) in enumerate(zip(kinds, domains)):
        nm = f"{d}-{_SUFFIX[k]}"
        if k == "frontend":
            nm = ("web", "mobile", "partner", "admin", "api")[i % 5] + "-frontend"
        while nm in seen:
            d = str(rng.choice(_DOMAINS))
            nm = f"{d}-{_SUFFIX[k]}"
            domains[i] = d
        seen.add(nm)
        names.append(nm)
    calls: list[list[int]] = [[] for _ in range(n)]
    svc = list(range(n_front, n_front + n_svc))
    back = list(range(n_front + n_svc, n))
    for v in range(n_front):
        k = int(min(len(svc), rng.integers(2, 4)))
        calls[v] = sorted(rng.choice(svc, size=k, replace=False).tolist())
    for v in svc:
        later = [u for u in svc if u > v] + back
        k = int(min(len(later), rng.integers(1, 4)))
        calls[v] = sorted(rng.choice(later, size=k, replace=False).tolist())
    for u in svc + back:   # every component is called by someone earlier in the order
        if not any(u in calls[v] for v in range(u)):
            earlier = [v for v in range(u) if kinds[v] in ("frontend", "service")]
            calls[int(rng.choice(earlier))].append(u)
    calls = [sorted(set(c)) for c in calls]
    V = 1 + 4 * n
    noise = np.empty(V)
    noise[0] = 1.0
    for c in range(n):
        noise[var(c, CPU)] = rng.uniform(0.5, 1.0)
        noise[var(c, QUEUE)] = rng.uniform(0.3, 0.6)
        noise[var(c, LAT)] = rng.uniform(0.5, 1.2)
        noise[var(c, ERR)] = rng.uniform(0.3, 0.8)
    call_weight = {(v, u): float(rng.uniform(0.5, 1.0)) for v in range(n) for u in calls[v]}
    err_weight = {(v, u): float(rng.uniform(0.4, 0.9)) for v in range(n) for u in calls[v]}
    timeout_weight = {(v, u): float(rng.uniform(1.0, 2.0)) for v in range(n) for u in calls[v]}
    sysm = Microservices(names=names, kinds=kinds, domains=domains, calls=calls,
                         load=rng.uniform(0.5, 1.2, n), queue_gain=rng.uniform(0.3, 0.7, n),
                         lat_cpu=rng.uniform(0.2, 0.6, n), lat_queue=rng.uniform(0.3, 0.8, n),
                         call_weight=call_weight, err_weight=err_weight, timeout_weight=timeout_weight, noise=noise,
                         timeout_at=np.full(n, np.inf))
    # timeouts at the timeout_quantile of normal per-request latency (sample mean + request spread)
    X = simulate(sysm, 4000, np.random.default_rng([seed, 12]))
    sysm.sd = X.std(axis=0)
    lat_sd = np.array([sysm.sd[var(c, LAT)] for c in range(n)])
    sysm.request_sd = request_spread * lat_sd
    if timeout_quantile < 1.0:
        z = float(ndtri(timeout_quantile))
        sysm.timeout_at = np.array([X[:, var(c, LAT)].mean() for c in range(n)]) + z * np.hypot(lat_sd, sysm.request_sd)
    return sysm


def _queue(x: np.ndarray) -> np.ndarray:
    """Queue length vs cpu: linear in normal operation, convex under saturation (softplus-like)."""
    return x + 0.15 * np.maximum(x - 2.0, 0.0) ** 2


def simulate(s: Microservices, T: int, rng: np.random.Generator, fault: tuple[int, str, float] | None = None) -> np.ndarray:
    """[T, V] telemetry from the SCM; ``fault`` = (component, fault type, magnitude in units of the
    faulted metric's normal-operation sd) is active during the whole window."""
    V = s.V
    X = np.zeros((T, V))
    eps = rng.standard_normal((T, V)) * s.noise
    a = s.traffic_ar
    tr = np.empty(T)
    tr[0] = eps[0, 0]
    for t in range(1, T):
        tr[t] = a * tr[t - 1] + np.sqrt(1 - a * a) * eps[t, 0]
    X[:, 0] = tr
    shift = np.zeros(V)
    if fault is not None:
        c, kind, mag = fault
        m = FAULT_METRIC[kind]
        shift[var(c, m)] = mag * (s.sd[var(c, m)] if len(s.sd) else 1.0)
    for c in reversed(range(s.n)):   # callees before callers
        cpu = s.load[c] * tr + eps[:, var(c, CPU)] + shift[var(c, CPU)]
        q = s.queue_gain[c] * _queue(cpu) + eps[:, var(c, QUEUE)] + shift[var(c, QUEUE)]
        lat = s.lat_cpu[c] * cpu + s.lat_queue[c] * q + eps[:, var(c, LAT)] + shift[var(c, LAT)]
        err = eps[:, var(c, ERR)] + shift[var(c, ERR)]
        for u in s.calls[c]:
            lat = lat + s.call_weight[(c, u)] * X[:, var(u, LAT)]
            err = err + s.err_weight[(c, u)] * X[:, var(u, ERR)]
            if np.isfinite(s.timeout_at[u]):
                share = timeout_share(s, u, X[:, var(u, LAT)])
                err = err + s.timeout_weight[(c, u)] * share * s.noise[var(c, ERR)] * TIMEOUT_ERRORS
        X[:, var(c, CPU)], X[:, var(c, QUEUE)], X[:, var(c, LAT)], X[:, var(c, ERR)] = cpu, q, lat, err
    return X


def timeout_share(s: Microservices, u: int, latency: np.ndarray) -> np.ndarray:
    """Share of requests to ``u`` that time out when its samples' mean latency is ``latency``."""
    return ndtr((latency - s.timeout_at[u]) / s.request_sd[u])


def true_graph(s: Microservices) -> np.ndarray:
    """The SCM's graph over variables: A[i, j] = True for i -> j."""
    return expand(s.n, s.component_edges())


def expand(n: int, comp_edges) -> np.ndarray:
    """Metric-level graph from component edges (callee, caller) by the fixed per-component template:
    traffic -> cpu -> queue -> latency, cpu -> latency; callee latency -> caller latency, callee errors
    -> caller errors, callee latency -> caller errors (timeouts)."""
    A = np.zeros((1 + 4 * n, 1 + 4 * n), bool)
    for c in range(n):
        A[0, var(c, CPU)] = A[var(c, CPU), var(c, QUEUE)] = A[var(c, CPU), var(c, LAT)] = True
        A[var(c, QUEUE), var(c, LAT)] = True
    for u, v in comp_edges:
        A[var(u, LAT), var(v, LAT)] = A[var(u, ERR), var(v, ERR)] = A[var(u, LAT), var(v, ERR)] = True
    return A


@dataclass(frozen=True)
class Incident:
    root: int
    fault: str
    magnitude: float
    data: np.ndarray   # [window, V] telemetry while the fault is active


def make_incident(s: Microservices, index: int, seed: int, window: int, magnitude: float) -> Incident:
    """Incident ``index`` of a system: a uniformly drawn root cause component and fault type, the
    magnitude drawn in [1, 2] x ``magnitude`` normal sds of the faulted metric."""
    rng = np.random.default_rng([seed, 13, index])
    root = int(rng.integers(s.n))
    kind = str(rng.choice(FAULTS))
    mag = float(magnitude * rng.uniform(1.0, 2.0))
    return Incident(root, kind, mag, simulate(s, window, rng, (root, kind, mag)))
