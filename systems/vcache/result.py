"""The vcache SystemResult from its tasks' outputs: the sphere seeds, the MiniLM replays and the
class-confusion regime, with the frontier curves and the notes (pure: the flow only submits). A regime
point where vCache or the calibrated static threshold broke delta is invalid: hits bought by breaking
the bound are not a win."""
from __future__ import annotations

from mlsys_flows.systems.common.report import Curve, RegimeSample, SystemResult

from . import CALIBRATION_OFFSET, DELTAS, REGIME_SHRINK, Params, same_hits_static, suffix
from .cache import SEPARABLE_VAR_A, SEPARABLE_VAR_B

SAMPLED = ("vcache", "static_threshold", "static_oracle", "vcache_global", "static_equal_error")
SAMPLED_METRICS = ("hit_rate", "error_rate", "error_budget", "delta_met")
REGIME_VARIANTS = ("vcache", "vcache_global", "static_threshold")
# the headline's comparison: vCache against the calibrated static threshold, both held to delta
BOUND_HOLDERS = ("vcache", "static_threshold")


def comparison_stands(run: dict[str, dict], delta: float) -> tuple[bool, str]:
    """Whether vCache's hit rate may be compared with the calibrated static threshold's on one stream
    (contract v4: at equal constraint). It stands where both met delta, or where the side that broke it
    also served no more hits than the side that met it (the latter leads on both: not a win for the
    side that broke delta). Otherwise its hits were bought by breaking the bound: it does not stand.
    Returns (stands, who broke delta and how, '' where nobody did)."""
    broke = [v for v in BOUND_HOLDERS if run[v]["error_rate"] > delta]
    why = "; ".join(f"{v} error {run[v]['error_rate']:.4f} > delta {delta:g}" for v in broke)
    if not broke:
        return True, ""
    if len(broke) == 2:
        return False, why + " (both broke delta)"
    other = next(v for v in BOUND_HOLDERS if v not in broke)
    if run[broke[0]]["hit_rate"] <= run[other]["hit_rate"]:
        return True, why + f", with no more hits than {other} (within delta): {other} leads on both"
    return False, why + f", with more hits than {other} (within delta): hits bought by breaking the bound"


def _regime_sample(p: Params, near_dup: float, point: dict[str, dict]) -> RegimeSample:
    """Hit rates at one class-confusion point; invalid where the comparison does not stand
    (``comparison_stands``: a side broke delta and served more hits than the side that met it)."""
    stands, why = comparison_stands(point, p.delta)
    return RegimeSample(value=float(near_dup), samples={v: [point[v]["hit_rate"]] for v in REGIME_VARIANTS},
                        kind="counted", valid=stands, invalid="" if stands else why)


def build_result(p: Params, per_seed: list[dict], mini: dict[str, dict], points: dict[float, dict]) -> SystemResult:
    """``per_seed``: sphere_seed's output per evaluated seed; ``mini``: the MiniLM replays (vcache,
    static); ``points``: near_dup_share -> regime's output."""
    variants: dict[str, dict[str, float]] = {}
    curves = []
    per_seed = [dict(r) for r in per_seed]  # the sweeps are popped below: leave the callers' dicts whole
    # sphere: the first seed gives every variant's metrics; the headline's variants keep one sample per seed
    sweep = per_seed[0].pop("_sweep")
    for r in per_seed[1:]:
        r.pop("_sweep")
    variants.update(per_seed[0])
    variants["static_same_hits"] = same_hits_static(sweep, variants["vcache"]["hit_rate"])
    # the headline compares at equal constraint: the seeds where the comparison does not stand are left
    # out of every paired comparison (the pairs stay aligned); the notes name them and who broke delta
    judged = [comparison_stands(r, p.delta) for r in per_seed]
    kept = [i for i, (ok, _) in enumerate(judged) if ok]
    everyone = {v: {m: [r[v][m] for r in per_seed] for m in SAMPLED_METRICS} for v in SAMPLED}
    samples = {v: {m: [xs[i] for i in kept] for m, xs in ms.items()} for v, ms in everyone.items()} if kept else {}
    series = {"static_threshold (sweep, seed 0)": (sweep["error_rate"], sweep["hit_rate"])}
    for v in ("vcache", "vcache_global", "static_threshold"):
        series[v] = (everyone[v]["error_rate"], everyone[v]["hit_rate"])
    curves.append(Curve(title="hit rate vs error rate, sphere workload (every seed)",
                        x_label="error rate (wrong cached answers / queries)", y_label="hit rate", series=series))
    # MiniLM paraphrases: hindsight static thresholds only (one corpus)
    mres = {which: dict(r) for which, r in mini.items()}
    msweep = mres["static"].pop("_sweep")
    for which in ("vcache", "static"):
        for v, m in mres[which].items():
            variants[v + "_minilm"] = m
    series = {"static_threshold_minilm": (msweep["error_rate"], msweep["hit_rate"])}
    for lvl in DELTAS:
        m = variants["vcache" + suffix(lvl) + "_minilm"]
        series["vcache" + suffix(lvl) + "_minilm"] = ([m["error_rate"]], [m["hit_rate"]])
    curves.append(Curve(title="hit rate vs error rate, MiniLM workload (static: threshold sweep)",
                        x_label="error rate (wrong cached answers / queries)", y_label="hit rate", series=series))
    # the regime: class confusion
    regime = [_regime_sample(p, w, r) for w, r in points.items()]

    def met(v: str) -> str:
        errs = everyone[v]["error_rate"]
        return (f"{int(sum(everyone[v]['delta_met']))}/{p.seeds} seeds (error {min(errs):.4f}-{max(errs):.4f})")

    def budget(v: str) -> str:
        return ", ".join(f"{b:.2f}" for b in everyone[v]["error_budget"])

    seeds = [p.seed + i for i in range(p.seeds)]
    dropped = [f"seed {seeds[i]}: {why}" for i, (ok, why) in enumerate(judged) if not ok]
    led = [f"seed {seeds[i]}: {why}" for i, (ok, why) in enumerate(judged) if ok and why]
    if not kept:
        standing = (f"On no seed does the comparison stand ({'; '.join(dropped)}): the headline shows seed {p.seed}'s "
                    "values alone (one sample, a tie) and is no comparison at equal constraint.")
    else:
        standing = (f"The headline compares at equal constraint: {len(kept)} of {p.seeds} seeds are paired (every "
                    "seed where both met delta, or where the side that broke it served no more hits than the side "
                    "that met it)" + (f"; left out of every paired comparison: {'; '.join(dropped)}" if dropped else
                                      "; none left out") + (f"; kept: {'; '.join(led)}" if led else "") + ".")

    s, sm = variants["vcache"], variants["vcache_minilm"]
    notes = [
        "Every metric is counted: the offline model answers a prompt with its equivalence class and the judge "
        "compares classes, so a hit is an error exactly when the cached prompt belongs to another class. "
        "error_rate = wrong cached answers / all queries (explorations and misses call the model and are right).",
        f"Sphere: {p.seeds} evaluated streams (seeds {p.seed}-{p.seed + p.seeds - 1}); the headline's variants carry "
        "one sample per seed. static_threshold (deployable) is the threshold with the most hits meeting each delta on "
        f"a held-out calibration stream (seed {p.seed + CALIBRATION_OFFSET}, thresholds "
        f"{variants['static_threshold_low']['threshold']:g} / {variants['static_threshold']['threshold']:g} / "
        f"{variants['static_threshold_high']['threshold']:g}), then run unchanged on each evaluated stream; "
        "static_oracle is the best threshold meeting delta chosen on the evaluated stream with its labels (an upper "
        "bound a deployment cannot reach); static_equal_error is the evaluated stream's static threshold with the "
        "most hits at vCache's realized error (the frontier, hindsight).",
        f"Delta compliance at delta = {p.delta}: vCache met it on {met('vcache')}, the calibrated static threshold on "
        f"{met('static_threshold')}, the global-threshold ablation on {met('vcache_global')}.",
        f"Error budget used (observed error rate / delta = {p.delta}, counted, seeds {seeds[0]}-{seeds[-1]}): vcache "
        f"{budget('vcache')}; static_threshold {budget('static_threshold')}; vcache_global {budget('vcache_global')}. "
        f"vCache's lookups decided by its bound (nearest entry past its warm-up of {p.min_observations} observations; "
        "the rest explore): " + ", ".join(f"{r['vcache']['warm_share']:.2f}" for r in per_seed) + " of the queries.",
        standing,
        f"Observed vCache error rates (seed {p.seed}): sphere {variants['vcache_low']['error_rate']:.4f} / "
        f"{s['error_rate']:.4f} / {variants['vcache_high']['error_rate']:.4f}, MiniLM "
        f"{variants['vcache_low_minilm']['error_rate']:.4f} / {sm['error_rate']:.4f} / "
        f"{variants['vcache_high_minilm']['error_rate']:.4f} for delta = {p.delta_low} / {p.delta} / {p.delta_high}.",
        f"Workloads: sphere = {p.sphere_queries} queries over {p.sphere_classes} classes in {p.sphere_dim} dims "
        f"(topics of {p.classes_per_topic} classes, topic scales {p.scale_min}-{p.scale_max}, class spread "
        f"within={p.within}, Zipf {p.zipf_s}; a share {p.near_dup_share:g} of the classes are near-duplicates of "
        f"another class with a different answer, centres {p.near_dup_offset:g} x the topic scale apart); MiniLM = {sm['queries']:.0f} distinct paraphrases of "
        f"{p.minilm_classes} question classes (no exact repeats), embedded by "
        f"{(p.embed_model + ' at ' + p.embed_base_url) if p.embed_base_url else 'the real all-MiniLM-L6-v2 (packaged, offline)'}; "
        "its static baselines are chosen in hindsight on that one corpus (static_oracle*_minilm).",
        f"Regime: class confusion near_dup_share = {', '.join(f'{w:g}' for w in p.regime_near_dup)} at delta {p.delta}, each "
        f"point a stream with 1/{REGIME_SHRINK} of the queries and classes (seed {p.seed}), its static threshold "
        "calibrated on the held-out seed at the same confusion; vCache against that threshold. Hit rate (error rate) "
        "per point, vcache / global / static: " + "; ".join(
            f"{w:g}: " + " / ".join(f"{r[v]['hit_rate']:.3f} ({r[v]['error_rate']:.4f})"
                                    for v in ("vcache", "vcache_global", "static_threshold"))
            for w, r in points.items()) + f". The ratio counts hits only, so a point where vCache or the static threshold broke delta = {p.delta} "
        "and served more hits than the side that met it (or both broke it) is drawn hollow and left out of the "
        "crossover (invalid); where the side that broke delta served fewer hits, the other leads on both and the "
        "point counts.",
        "vCache, as in the authors' implementation, starts every entry with two pseudo-observations "
        f"({'on' if p.anchor_observations else 'off in this run'}: wrong at similarity 0, right at 1) and explores it "
        f"until it holds {p.min_observations} observations counting them; with perfectly separated observations "
        f"Var(t) is {p.separable_var_scale:g} x our simulated calibration {SEPARABLE_VAR_A:.4f} n^-{SEPARABLE_VAR_B:.3f}; "
        f"tau* is the minimum over {'the authors' + chr(39) + ' 50-point' if p.reference_eps_grid else 'a dense'} eps "
        "grid. The ablation vcache_global pools every entry's observations into one fit, so it leaves the per-entry "
        "warm-up out with the per-entry threshold.",
    ]
    return SystemResult(variants=variants, curves=curves, notes=notes, samples=samples, regime=regime,
                        regime_headline_value=float(p.near_dup_share))
