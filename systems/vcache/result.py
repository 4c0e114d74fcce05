"""The vcache SystemResult from its tasks' outputs: the sphere seeds, the MiniLM replays and the
class-confusion regime, with the frontier curves and the notes (pure: the flow only submits). vCache and
the calibrated static threshold are compared only where both met delta (issue 47): a regime point where
either broke it is invalid and says who; every seed's samples go to the harness, whose declared constraint
(error_rate <= delta) counts in the headline's verdict only the seeds where both met it."""
from __future__ import annotations

from mlsys_flows.systems.common.report import Curve, RegimeSample, SystemResult
from mlsys_flows.systems.common.verdict import MIN_PAIRS

from . import DELTAS, REGIME_SHRINK, SPEC, Params, same_hits_static, suffix
from .cache import SEPARABLE_VAR_A, SEPARABLE_VAR_B

SAMPLED = ("vcache", "static_threshold", "static_oracle", "vcache_global", "static_equal_error", "static_same_hits")
SAMPLED_METRICS = ("hit_rate", "error_rate", "error_budget", "delta_met")
REGIME_VARIANTS = ("vcache", "vcache_global", "static_threshold")
# the headline's comparison: vCache against the calibrated static threshold, both held to delta
BOUND_HOLDERS = ("vcache", "static_threshold")


def comparison_stands(run: dict[str, dict], delta: float) -> tuple[bool, str]:
    """Whether vCache's hit rate may be compared with the calibrated static threshold's on one stream
    (contract v4, issue 47: at equal constraint): only where both met delta. A side that broke it is
    no comparison at that bound, whether it served more hits or fewer (keeping the latter would keep
    exactly the streams that favour the other side). Returns (stands, who broke delta and how, '' where
    nobody did)."""
    broke = [v for v in BOUND_HOLDERS if run[v]["error_rate"] > delta]
    if not broke:
        return True, ""
    why = "; ".join(f"{v} error {run[v]['error_rate']:.4f} > delta {delta:g} "
                    f"(hit rate {run[v]['hit_rate']:.3f})" for v in broke)
    return False, why + (" (both broke delta)" if len(broke) == 2 else f": {broke[0]} broke delta")


def _ratio(run: dict[str, dict], metric: str) -> str:
    """vCache's value of ``metric`` over the static threshold's, as text ('-' where the latter is 0)."""
    base = run["static_threshold"][metric]
    return f"{run['vcache'][metric] / base:.2f}x" if base else "-"


def _regime_sample(p: Params, near_dup: float, point: dict[str, dict]) -> RegimeSample:
    """Hit rates at one class-confusion point; invalid, saying who broke delta, where vCache or the
    calibrated static threshold did (``comparison_stands``)."""
    stands, why = comparison_stands(point, p.delta)
    return RegimeSample(value=float(near_dup), samples={v: [point[v]["hit_rate"]] for v in REGIME_VARIANTS},
                        kind="counted", valid=stands, invalid="" if stands else why)


def build_result(p: Params, per_seed: list[dict], mini: dict[str, dict], points: dict[float, dict]) -> SystemResult:
    """``per_seed``: sphere_seed's output per evaluated seed; ``mini``: the MiniLM replays (vcache,
    static); ``points``: near_dup_share -> regime's output."""
    variants: dict[str, dict[str, float]] = {}
    curves = []
    per_seed = [dict(r) for r in per_seed]  # the sweeps are popped below: leave the callers' dicts whole
    # sphere: the first seed gives every variant's metrics; the headline's variants keep one sample per seed.
    # static_same_hits per seed: that seed's static threshold with that seed's vCache hit rate (like for like)
    sweeps = [r.pop("_sweep") for r in per_seed]
    for r, sw in zip(per_seed, sweeps):
        same = same_hits_static(sw, r["vcache"]["hit_rate"])
        r["static_same_hits"] = same | {"delta": p.delta, "delta_met": float(same["error_rate"] <= p.delta),
                                        "error_budget": same["error_rate"] / p.delta}
    sweep = sweeps[0]
    variants.update(per_seed[0])
    # every seed's samples reach the harness (issue 47, M4): the spec's constraint (error_rate <= delta) makes
    # the headline's comparisons (its own row and vs_strongest) count only the seeds where both vCache and the
    # calibrated static threshold met delta (a seed where vCache broke it and served fewer hits counts as a
    # loss); every other claim is over every seed. The notes name each seed where a side broke delta.
    judged = [comparison_stands(r, p.delta) for r in per_seed]
    kept = [i for i, (ok, _) in enumerate(judged) if ok]
    everyone = {v: {m: [r[v][m] for r in per_seed] for m in SAMPLED_METRICS} for v in SAMPLED}
    samples = everyone
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
    if not kept:
        standing = (f"On no seed did both vCache and the calibrated static threshold meet delta = {p.delta} "
                    f"({'; '.join(dropped)}): the headline's verdict (the harness, by the spec's constraint) counts "
                    "no pair where both met it and is a tie, no comparison at equal constraint.")
    else:
        standing = (f"The headline compares at equal constraint: the harness (the spec's constraint, error_rate at "
                    f"most delta = {p.delta}) counts the {len(kept)} of {p.seeds} seeds where both vCache and the "
                    "calibrated static threshold met delta, and a seed where vCache broke it and served fewer hits as "
                    "a loss (the report's constraint field gives the pairs counted)" +
                    (f"; a side broke delta on: {'; '.join(dropped)}" if dropped else "; nobody broke it") +
                    "; the other claims (mechanism, oracle, frontier) are over every seed" +
                    (f"; {len(kept)} pair{'s are' if len(kept) > 1 else ' is'} fewer than the {MIN_PAIRS} a verdict "
                     "needs: a tie, whatever the ratio, unless losses where vCache broke delta make up the count."
                     if len(kept) < MIN_PAIRS else "."))
    tails = [f"{r['vcache']['tail_hit_rate']:.3f} ({r['vcache']['tail_error_rate']:.4f}) / "
             f"{r['static_threshold']['tail_hit_rate']:.3f} ({r['static_threshold']['tail_error_rate']:.4f}): "
             f"{_ratio(r, 'tail_hit_rate')} (whole {_ratio(r, 'hit_rate')})"
             for r in per_seed if "tail_hit_rate" in r["vcache"] and "tail_hit_rate" in r["static_threshold"]]
    thresholds = ", ".join(f"{r['static_threshold']['threshold']:g}" for r in per_seed)

    s, sm = variants["vcache"], variants["vcache_minilm"]
    notes = [
        "Every metric is counted: the offline model answers a prompt with its equivalence class and the judge "
        "compares classes, so a hit is an error exactly when the cached prompt belongs to another class. "
        "error_rate = wrong cached answers / all queries (explorations and misses call the model and are right).",
        f"Sphere: {p.seeds} evaluated streams (seeds {p.seed}-{p.seed + p.seeds - 1}); the headline's variants carry "
        "one sample per seed. static_threshold (deployable) is, per seed, the threshold with the most hits meeting "
        "delta on held-out traffic of that seed's world (same topics, classes, twins and popularity; its prompts "
        "from a separate random stream; thresholds every 0.001 from 0.95), then run unchanged on the evaluated "
        f"stream: thresholds at delta = {p.delta}, seeds {p.seed}-{p.seed + p.seeds - 1}: {thresholds}; seed {p.seed} "
        f"at delta = {p.delta_low} / {p.delta_high}: {variants['static_threshold_low']['threshold']:g} / "
        f"{variants['static_threshold_high']['threshold']:g}; "
        "static_oracle is the best threshold meeting delta chosen on the evaluated stream with its labels (an upper "
        "bound a deployment cannot reach); static_equal_error is the evaluated stream's static threshold with the "
        "most hits at vCache's realized error (the frontier, hindsight); static_same_hits is, per seed, the "
        "evaluated stream's strictest static threshold with at least that seed's vCache hit rate.",
        f"Delta compliance at delta = {p.delta}: vCache met it on {met('vcache')}, the calibrated static threshold on "
        f"{met('static_threshold')}, the global-threshold ablation on {met('vcache_global')}.",
        f"Error budget used (observed error rate / delta = {p.delta}, counted, seeds {seeds[0]}-{seeds[-1]}): vcache "
        f"{budget('vcache')}; static_threshold {budget('static_threshold')}; vcache_global {budget('vcache_global')}. "
        f"vCache's lookups decided by its bound (nearest entry past its warm-up of {p.min_observations} observations; "
        "the rest explore): " + ", ".join(f"{r['vcache']['warm_share']:.2f}" for r in per_seed) + " of the queries.",
        standing,
        *([f"Last quarter of each stream (where the caches are warmest; counted, seeds {seeds[0]}-{seeds[-1]}): hit "
           "rate (error rate) vcache / static_threshold, and their ratio, against the whole stream's ratio: " +
           "; ".join(tails) + ". A tail ratio above the whole stream's means vCache was still gaining on the static "
           "threshold when the stream ended (the stream was too short for the ratio to settle)."] if tails else []),
        f"Observed vCache error rates (seed {p.seed} only: the other deltas run on one seed, so their claims are "
        f"one sample each, ties): sphere {variants['vcache_low']['error_rate']:.4f} / "
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
        f"point one stream with 1/{REGIME_SHRINK} of the queries and classes (seed {p.seed} alone: one sample per "
        "point, a tie whatever its ratio), its static threshold calibrated on held-out traffic of the same world; "
        "vCache against that threshold. Hit rate (error rate) "
        "per point, vcache / global / static: " + "; ".join(
            f"{w:g}: " + " / ".join(f"{r[v]['hit_rate']:.3f} ({r[v]['error_rate']:.4f})"
                                    for v in ("vcache", "vcache_global", "static_threshold"))
            for w, r in points.items()) + f". The ratio counts hits only, so a point where vCache or the static threshold "
        f"broke delta = {p.delta} (with more hits or fewer) is invalid: drawn hollow, left out of the crossover, and "
        "it says who broke delta" + (": " + "; ".join(f"{w:g}: {why}" for w, r in points.items()
                                                      for ok, why in [comparison_stands(r, p.delta)] if not ok)
                                     if any(not comparison_stands(r, p.delta)[0] for r in points.values()) else
                                     " (none here)") + ".",
        "vCache, as in the authors' implementation, starts every entry with two pseudo-observations "
        f"({'on' if p.anchor_observations else 'off in this run'}: wrong at similarity 0, right at 1) and explores it "
        f"until it holds {p.min_observations} observations counting them; with perfectly separated observations "
        f"Var(t) is {p.separable_var_scale:g} x our simulated calibration {SEPARABLE_VAR_A:.4f} n^-{SEPARABLE_VAR_B:.3f}; "
        f"tau* is the minimum over {'the authors' + chr(39) + ' 50-point' if p.reference_eps_grid else 'a dense'} eps "
        "grid. The ablation vcache_global pools every entry's observations into one fit, so it leaves the per-entry "
        "warm-up out with the per-entry threshold.",
    ]
    # hit and error rates are counts fixed by the parameters and the seed, but one seed is one draw of the
    # workload: a comparison on one seed (a regime point, the other deltas, MiniLM's one corpus) is one sample,
    # a tie, never an exact verdict. The counts derived from them (model_calls, hit_precision, entries) stay
    # deterministic, so a faulted run is still checked against a fault-free one.
    deterministic = set(SPEC.kinds) - {"hit_rate", "error_rate"}
    return SystemResult(variants=variants, curves=curves, notes=notes, samples=samples, regime=regime,
                        regime_headline_value=float(p.near_dup_share), deterministic=deterministic)
