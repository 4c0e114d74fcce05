"""The vCache experiment on the synthetic sphere stream (pure): a static threshold calibrated on
held-out traffic of the evaluated stream's world (deployable), the best static threshold of the evaluated stream (oracle), vCache, and
the mechanism ablation (one global learned threshold), per seed and per class-confusion level."""
from __future__ import annotations

from . import DELTAS, REGIME_SHRINK, Params, suffix
from .cache import GlobalVerifiedPolicy, VerifiedPolicy
from .evaluate import Outcome, best_static, causal_neighbours, replay, static_sweep
from .workload import Stream

# the held-out calibration traffic of an evaluated stream: the same world (seed: topics, classes, twins,
# popularity), its prompts drawn from this separate random stream (sphere_stream's ``traffic``)
CALIBRATION_TRAFFIC = 1


def calibrate(sweep: list[tuple[float, Outcome]], deltas: dict[str, float]) -> dict[str, float]:
    """Per delta level, the threshold a user would deploy: on a held-out stream, the highest hit rate
    whose error rate meets delta (the strictest threshold of the sweep when none does)."""
    out = {}
    for level, d in deltas.items():
        try:
            out[level] = best_static(sweep, d)[0]
        except ValueError:
            out[level] = max(t for t, _ in sweep)
    return out


def equal_error_static(sweep: list[tuple[float, Outcome]], error_rate: float) -> tuple[float, Outcome]:
    """The static threshold of ``sweep`` with the most hits whose error rate is at most ``error_rate``
    (hindsight: the static frontier at the technique's realized error); the strictest when none is."""
    ok = [(t, o) for t, o in sweep if o.error_rate <= error_rate]
    if not ok:
        return max(sweep, key=lambda to: to[0])
    return max(ok, key=lambda to: (to[1].hit_rate, -to[1].error_rate))


def run_stream(stream: Stream, thresholds: dict[str, float], deltas: dict[str, float], *, levels=("mid",),
               policy: dict | None = None, seed: int = 0, sweep_thresholds=None,
               ablation: bool = True) -> dict[str, dict[str, float]]:
    """Every variant on one evaluated stream. ``thresholds``: the calibrated static threshold per level;
    ``policy``: keyword options of VerifiedPolicy besides delta (Params.policy_options()).
    Variants: vcache[_level], static_threshold[_level] (deployable), vcache_global (ablation, mid) and,
    with ``sweep_thresholds``, static_oracle[_level] and static_equal_error (mid) from the stream's own
    sweep (hindsight). Metric ``delta_met`` is 1 when the realized error rate meets delta, ``error_budget`` is
    the error rate over delta (the share of the bound used); vCache's ``warm_share`` is the share of queries
    whose nearest entry had finished its warm-up (decided by tau*, not forced to explore)."""
    sfx = {"low": "_low", "mid": "", "high": "_high"}
    out: dict[str, dict[str, float]] = {}
    opts = policy or {}

    def put(name: str, o: Outcome, d: float, **extra) -> None:
        out[name] = o.metrics() | {"delta": d, "delta_met": float(o.error_rate <= d),
                                   "error_budget": o.error_rate / d} | extra

    # every static threshold of this stream (the calibrated ones and the hindsight sweep) in one sweep:
    # they share the stream's neighbour lists
    wanted = [float(thresholds[level]) for level in levels] + \
        ([float(t) for t in sweep_thresholds] if sweep_thresholds is not None else [])
    static = dict(static_sweep(stream, sorted(set(wanted))))
    for level in levels:
        d = deltas[level]
        pol = VerifiedPolicy(d, **opts)
        o = replay(stream, pol, seed=seed)
        put("vcache" + sfx[level], o, d, logistic_fits=float(pol.fits), warm_share=o.warm_share)
        t = float(thresholds[level])
        put("static_threshold" + sfx[level], static[t], d, threshold=t)
    if ablation:
        pol = GlobalVerifiedPolicy(deltas["mid"], **opts)
        put("vcache_global", replay(stream, pol, seed=seed), deltas["mid"], logistic_fits=float(pol.fits))
    if sweep_thresholds is not None:
        sweep = [(float(t), static[float(t)]) for t in sweep_thresholds]
        for level in levels:
            t, o = best_static(sweep, deltas[level])
            put("static_oracle" + sfx[level], o, deltas[level], threshold=t)
        t, o = equal_error_static(sweep, out["vcache"]["error_rate"])
        put("static_equal_error", o, deltas["mid"], threshold=t)
        out["_sweep"] = {"threshold": [t for t, _ in sweep], "hit_rate": [o.hit_rate for _, o in sweep],
                         "error_rate": [o.error_rate for _, o in sweep]}
    return out


def evaluate_policies(stream: Stream, p: Params, which: str) -> dict[str, dict[str, float]]:
    """The MiniLM workload. ``which`` = 'static': the sweep, the best static threshold per delta chosen
    in hindsight on the same stream (static_oracle*); 'vcache': the verified policy per delta. Returns
    {variant (without workload suffix): metrics}; static results also carry the sweep under '_sweep'."""
    out: dict[str, dict] = {}
    if which == "static":
        sweep = static_sweep(stream, p.thresholds())
        for level, d in p.deltas().items():
            t, o = best_static(sweep, d)
            out["static_oracle" + suffix(level)] = o.metrics() | {"threshold": t, "delta": d}
        out["_sweep"] = {"threshold": [t for t, _ in sweep], "hit_rate": [o.hit_rate for _, o in sweep],
                         "error_rate": [o.error_rate for _, o in sweep]}
    elif which == "vcache":
        for level, d in p.deltas().items():
            pol = VerifiedPolicy(d, **p.policy_options())
            o = replay(stream, pol, seed=p.seed)
            out["vcache" + suffix(level)] = o.metrics() | {"delta": d, "logistic_fits": float(pol.fits),
                                                           "warm_share": o.warm_share}
    else:
        raise ValueError(f"unknown policy family {which!r}")
    return out


def seed_levels(i: int) -> tuple[str, ...]:
    """The delta levels run on evaluated seed ``p.seed + i``: all three on the first, the headline's on the others."""
    return DELTAS if i == 0 else ("mid",)


def calibration(p: Params, i: int = 0, near_dup: float | None = None, shrink: int = 1,
                levels: tuple[str, ...] | None = None) -> dict[str, float]:
    """The deployable static thresholds per delta level (``levels``, default ``seed_levels(i)``) for the
    evaluated stream of seed ``p.seed + i``:
    chosen on held-out traffic of the same world (same seed, prompts from CALIBRATION_TRAFFIC; never
    evaluated) over ``p.calibration_thresholds()`` (0.001 apart from 0.95; the neighbour lists need only
    reach 0.95, which halves the sweep's cost). Where a level's choice is the grid's lowest threshold, the
    sweep is extended with the run's thresholds below it."""
    deltas = {level: p.deltas()[level] for level in (levels or seed_levels(i))}
    stream = p.sphere(p.seed + i, near_dup, shrink, traffic=CALIBRATION_TRAFFIC)
    grid = p.calibration_thresholds()
    sweep = static_sweep(stream, grid, causal_neighbours(stream.vectors, floor=float(grid.min())))
    out = calibrate(sweep, deltas)
    lowest = min(t for t, _ in sweep)
    if any(t <= lowest for t in out.values()):
        below = [t for t in p.thresholds() if t < lowest]
        out = calibrate(static_sweep(stream, below) + sweep, deltas)
    return out


def evaluate_seed(p: Params, i: int, thresholds: dict[str, float] | None = None) -> dict[str, dict]:
    """Every sphere variant on the evaluated stream of seed ``p.seed + i`` (all three deltas on the
    first, the headline's delta on the others); ``thresholds``: the calibrated static ones (default:
    ``calibration(p, i)``); the stream's own sweep gives the hindsight baselines."""
    levels = seed_levels(i)
    if thresholds is None:
        thresholds = calibration(p, i)
    return run_stream(p.sphere(p.seed + i), thresholds, p.deltas(), levels=levels, policy=p.policy_options(),
                      seed=p.seed + i, sweep_thresholds=p.thresholds())


def regime_point(p: Params, near_dup: float) -> dict[str, dict]:
    """vCache, its ablation and the calibrated static threshold (delta mid) at class confusion
    ``near_dup`` (the share of near-duplicate classes), on a quarter-size stream of the run's seed; the
    static threshold calibrated on held-out traffic of that world."""
    thresholds = calibration(p, 0, near_dup, REGIME_SHRINK, levels=("mid",))
    return run_stream(p.sphere(p.seed, near_dup, REGIME_SHRINK), thresholds, p.deltas(), policy=p.policy_options(),
                      seed=p.seed)
