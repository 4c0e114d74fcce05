"""vCache flow: the verified semantic cache vs static similarity thresholds, on a synthetic sphere
stream and on real MiniLM embeddings of paraphrase sets, at three error bounds."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, SystemResult, system_flow
from mlsys_flows.systems.common.report import Curve
from mlsys_flows.systems.vcache import DELTAS, same_hits_static, suffix
from mlsys_flows.tasks import vcache as t

WORKLOADS = {"sphere": "", "minilm": "_minilm"}


@system_flow("vcache")
def vcache(ctx: RunContext) -> SystemResult:
    p = ctx.params
    keys = {"sphere": t.sphere_stream.submit(p, ctx.storage, ctx.key("sphere.npz")),
            "minilm": t.minilm_stream.submit(p, ctx.storage, ctx.key("minilm.npz"))}
    futures = {(w, which): t.replay.submit(p, ctx.storage, keys[w], which)
               for w in WORKLOADS for which in ("vcache", "static")}
    results = {k: f.result() for k, f in futures.items()}
    variants: dict[str, dict[str, float]] = {}
    curves, sweeps = [], {}
    for w, sfx in WORKLOADS.items():
        sweep = results[(w, "static")].pop("_sweep")
        sweeps[w] = sweep
        for which in ("vcache", "static"):
            for v, m in results[(w, which)].items():
                variants[v + sfx] = m
        variants["static_same_hits" + sfx] = same_hits_static(sweep, variants["vcache" + sfx]["hit_rate"])
        series = {"static_threshold" + sfx: (sweep["error_rate"], sweep["hit_rate"])}
        for lvl in DELTAS:
            m = variants["vcache" + suffix(lvl) + sfx]
            series["vcache" + suffix(lvl) + sfx] = ([m["error_rate"]], [m["hit_rate"]])
        curves.append(Curve(title=f"hit rate vs error rate, {w} workload (static: threshold sweep)",
                            x_label="error rate (wrong cached answers / queries)", y_label="hit rate", series=series))
    kinds = {m: "counted" for ms in variants.values() for m in ms}
    s, sm = variants["vcache"], variants["vcache_minilm"]
    notes = [
        "Every metric is counted: the offline model answers a prompt with its equivalence class and the judge "
        "compares classes, so a hit is an error exactly when the cached prompt belongs to another class. "
        "error_rate = wrong cached answers / all queries (explorations and misses call the model and are right).",
        f"The static baselines are chosen in hindsight: a sweep of {len(sweeps['sphere']['threshold'])} thresholds "
        "from 0.3 to 1.0 on the same stream, keeping the highest hit rate whose error rate meets each delta. A real "
        "deployment cannot do this (it needs the labels); vCache meets delta without tuning.",
        f"Observed vCache error rates: sphere {variants['vcache_low']['error_rate']:.4f} / {s['error_rate']:.4f} / "
        f"{variants['vcache_high']['error_rate']:.4f}, MiniLM {variants['vcache_low_minilm']['error_rate']:.4f} / "
        f"{sm['error_rate']:.4f} / {variants['vcache_high_minilm']['error_rate']:.4f} for delta = {p.delta_low} / "
        f"{p.delta} / {p.delta_high}.",
        f"Workloads: sphere = {p.sphere_queries} queries over {p.sphere_classes} classes in {p.sphere_dim} dims "
        f"(topics of {p.classes_per_topic} classes, topic scales {p.scale_min}-{p.scale_max}, Zipf {p.zipf_s}); "
        f"MiniLM = {sm['queries']:.0f} distinct paraphrases of "
        f"{p.minilm_classes} question classes (no exact repeats), embedded by "
        f"{(p.embed_model + ' at ' + p.embed_base_url) if p.embed_base_url else 'the real all-MiniLM-L6-v2 (packaged, offline)'}.",
        "vCache, as in the authors' implementation, explores an entry until it holds at least "
        f"{p.min_observations} observations with both a correct and a wrong one, and with perfectly separated "
        "observations uses a conservative variance of the threshold; with the streams here it stays well inside "
        "delta and serves fewer hits than the best static threshold picked in hindsight (see docs/vcache.md).",
    ]
    return SystemResult(variants=variants, kinds=kinds, curves=curves, notes=notes)
