"""The bagel SystemResult from its tasks' outputs: the trials' recall at every budget, the curves, the
per-cluster regime and the notes on the scorer and workload (pure: the flow only submits)."""
from __future__ import annotations

import numpy as np

from mlsys_flows.systems.common.report import Curve, RegimeSample, SystemResult

from . import Params
from .evaluate import merge, summarize
from .plan import explore_factor

SAMPLED = ("recall_at_k", "far_recall_at_k")
CLAIM = ("dense", "rerank", "gar", "bagel")   # the second workload's methods (digits_*)


def _tuning(tuned: dict, what: str, p: Params) -> str:
    betas = ", ".join(f"{b:g}: {r:.3f}" for b, r in tuned["beta_recall"].items())
    gars = ", ".join(f"({b}, {k}): {r:.3f}" for (b, k), r in tuned["gar_recall"].items())
    beta = (f"BAGEL's UCB factor fixed by the beta_scale parameter at {tuned['beta_scale']:g}" if tuned.get("fixed") else
            f"BAGEL's UCB factor beta_scale = {tuned['beta_scale']:g}, the best of the grid by mean recall@k at "
            f"B = {p.budget} (per value: {betas})")
    same = "the same city and unordered aspect pair" if tuned.get("workload") else "the same embedding"
    return (f"Calibration on {what}: {tuned['queries']} calibration queries (their own seed, none with the relevant "
            f"set of an evaluated query ({same}); offline oracle as the scorer; the evaluated queries are never "
            f"seen). {beta}; GAR's "
            f"(batch, graph neighbours) = ({tuned['gar'][0]}, {tuned['gar'][1]}) (per pair: {gars}); ties go to "
            "the first value of the grid.")


def _budget_note(budgets: list[int], mean: dict[str, list[float]], n: int) -> str:
    """Where BAGEL's mean recall@k lies below rerank's on the budget curve, and the crossover."""
    bg, rr = mean["bagel"], mean["rerank"]
    below = [b for b, x, y in zip(budgets, bg, rr) if x < y]
    above_from = next((i for i in range(len(budgets)) if all(bg[j] >= rr[j] for j in range(i, len(budgets)))), None)
    per = "; ".join(f"B = {b}: {x:.3f} / {y:.3f}" for b, x, y in zip(budgets, bg, rr))
    if not below:
        where = "BAGEL is at or above rerank at every budget of the curve"
    elif above_from is None:
        where = f"BAGEL is below rerank at B = {', '.join(map(str, below))}, up to the curve's largest budget"
    elif above_from == 0:
        where = f"BAGEL is below rerank at B = {', '.join(map(str, below))}"
    else:
        where = (f"BAGEL is below rerank at B = {', '.join(map(str, below))} and at or above it from B = "
                 f"{budgets[above_from]} on (the crossover lies between B = {budgets[above_from - 1]} and "
                 f"{budgets[above_from]})")
    ex = [b for b, x, y in zip(budgets, bg, mean.get("bagel_exploit", bg)) if x < y]
    same = [b for b, x, y in zip(budgets, rr, mean["dense"]) if x == y]
    return (f"Budget curve (mean recall@k over all {n} queries, bagel / rerank): {per}. {where}"
            + (f"; below bagel_exploit (no exploration) at B = {', '.join(map(str, ex))}" if ex else "")
            + (f"; rerank equals the dense retriever at B = {', '.join(map(str, same))} (reordering a top-B no "
               "larger than k cannot change which passages fill the top k)" if same else "") + ".")


def _graph_note(tuned: dict) -> str | None:
    w = tuned.get("workload") or {}
    if not w.get("edges"):
        return None
    e = w["edges"]
    share = lambda key: ", ".join(f"{v[key]:.3f} at k = {k}" for k, v in e.items())   # noqa: E731
    return (f"GAR's corpus graph on the headline corpus (each passage's k nearest MiniLM neighbours; GAR used "
            f"k = {tuned['gar'][1]}): share of edges from a passage to the same city under another aspect (the only "
            f"link that leads from a query's near aspect toward its far one) {share('same_city')}; to the same "
            f"(city, aspect) pair {share('same_pair')}; to another city under the same aspect "
            f"{share('same_aspect')}; to neither {share('other')}. The evaluated queries: {w['queries']}, of them "
            f"{w['distinct_texts']} distinct texts and {w['distinct_sets']} distinct relevant sets (city and "
            "unordered aspect pair): the trials share one corpus and some queries.")


def _bridge_note(p: Params, first: dict, bridge: dict) -> str:
    """The same_city = 0 run against the headline's own values on the same queries (trial 0's first n)."""
    methods = ("rerank", "gar", "bagel", "bagel_exploit")
    n = len(bridge["recall"]["bagel"])

    def row(res, key, ms):
        return " / ".join(f"{np.mean(res[key][m][:n]):.3f}" for m in ms)
    head = {k: {m: first[k][m][p.budget] for m in methods} for k in ("recall", "far_recall")}
    return (f"Bridge re-graded (offline oracle, nothing re-embedded; the values tuned with same_city = "
            f"{p.same_city:g}): on the first {n} queries of trial 0 at B = {p.budget}, mean recall@k rerank / gar / "
            f"bagel / bagel_exploit with same_city = {p.same_city:g} (the run's) {row(head, 'recall', methods)}, "
            f"with same_city = 0 (the city's other aspects graded 0, no bridge) {row(bridge, 'recall', methods)}; "
            f"far-cluster recall bagel / bagel_exploit {row(head, 'far_recall', methods[2:])} and "
            f"{row(bridge, 'far_recall', methods[2:])}.")


def build_result(p: Params, chunks: list[list[dict]], points: dict[int, dict[str, float]], tuned: dict,
                 digits: tuple[list[list[dict]], dict] | None = None, bridge: dict | None = None) -> SystemResult:
    """``chunks``: per trial, the evaluate task's output for each chunk of queries; ``points``: passages
    per cluster -> the regime task's recall per method (and ``_outside_top_b``); ``tuned``: the headline
    workload's calibration; ``digits``: (per trial chunks, calibration) of the second workload (None: the
    headline runs on digits, which is then that claim too); ``bridge``: the same_city task's per-query
    recall and far recall per method with same_city = 0 (None: not run)."""
    per_trial = [merge(cs) for cs in chunks]
    res = merge(per_trial)
    variants = summarize(res, p.budget)
    trial_vars = [summarize(r, p.budget) for r in per_trial]
    if digits is not None:
        d_trials = [merge(cs) for cs in digits[0]]
        d_tuned = digits[1]
    else:
        d_trials, d_tuned = per_trial, tuned
    d_vars = [summarize(r, p.budget) for r in d_trials]
    d_all = summarize(merge(d_trials), p.budget)
    for m in CLAIM:
        variants[f"digits_{m}"] = d_all[m]
    samples = {m: {x: [tv[m][x] for tv in trial_vars] for x in SAMPLED} for m in trial_vars[0]}
    samples.update({f"digits_{m}": {x: [tv[m][x] for tv in d_vars] for x in SAMPLED} for m in CLAIM})
    regime = [RegimeSample(value=float(c), samples={m: [v] for m, v in pt.items() if not m.startswith("_")},
                           kind="counted") for c, pt in points.items()]
    methods = list(res["recall"])
    budgets = p.budgets()
    curves = [
        Curve(title="mean recall@k vs scorer budget", x_label="scorer calls per query (B)", y_label="mean recall@k",
              series={m: (budgets, [float(np.mean(res["recall"][m][b])) for b in budgets]) for m in methods}),
        Curve(title="far-cluster recall vs scorer budget", x_label="scorer calls per query (B)",
              y_label="share of the far cluster's relevant passages in the top k",
              series={m: (budgets, [float(np.mean(res["far_recall"][m][b])) for b in budgets]) for m in methods}),
        Curve(title=f"per-query recall@k at B={p.budget} (sorted)", x_label="query (sorted by recall)",
              y_label="recall@k",
              series={m: (list(range(len(res["recall"][m][p.budget]))), sorted(res["recall"][m][p.budget]))
                      for m in methods}),
    ]
    r, bg = np.asarray(res["recall"]["rerank"][p.budget]), np.asarray(res["recall"]["bagel"][p.budget])
    g = np.asarray(res["recall"]["gar"][p.budget])
    ls = np.asarray(res["lengthscale"])
    k = p.top_k or "the number of relevant passages"
    llm = res.get("llm")
    if llm:
        scorer = (f"the scorer is the LLM {p.llm_model} at {p.llm_base_url} (OpenAI-compatible chat, asked for a 0-10 grade per "
                  f"(query, passage), temperature 0, each pair requested once and shared by the methods): "
                  f"{llm['requests']} requests, {llm['failed']} failed scores (unreadable reply or HTTP error; "
                  "scored 0, counted per method in failed_scores)")
    elif p.embedding == "minilm":
        scorer = (f"the offline scorer is a noisy label oracle (graded relevance by construction + N(0, {p.score_noise}^2), one "
                  "fixed draw per passage so every method sees the same score)")
    else:
        scorer = (f"the offline scorer is a noisy label oracle (true graded relevance + N(0, {p.score_noise}^2), one fixed draw per passage "
                  "so every method sees the same score)")
    if p.embedding == "minilm":
        workload = (f"Workload: a generated text corpus, {p.cities} cities x 8 aspects (history, food, climate, ...) x "
                    f"{p.per_cluster} template passages per pair (one corpus, seed {p.seed}; the trials draw their "
                    "queries), embedded with the packaged MiniLM (all-MiniLM-L6-v2, offline); each query asks about one city under an aspect in a long question and under a second, "
                    f"distant aspect (aspect centroids at least the {p.far_quantile:.0%} quantile of pair distances "
                    "apart) in a short tail, so its embedding sits near the first cluster. Relevant: the city's "
                    f"passages on both aspects (graded 1); oracle grades {p.same_city} for the city's other aspects and "
                    f"{p.same_aspect} for other cities on the two aspects.")
    else:
        workload = (f"Workload: sklearn digits (1797 images) projected to {p.dim} PCA dims; per query two digit classes "
                    f"with centroids at least the {p.far_quantile:.0%} quantile of pair distances apart, the "
                    f"{p.per_cluster} passages nearest each centroid relevant, graded relevance halving at "
                    f"{p.relevance_width} class radii, the query near a relevant passage of one class, so the dense "
                    "neighbourhood holds only one cluster.")
    notes = [
        f"Every metric is counted: recall@k (k = {k}) of the final ranking against the known relevant set, averaged "
        f"over {p.queries} queries in each of {p.trials} trials (seeds {p.seed}-{p.seed + p.trials - 1}; the "
        "headline's recall carries one sample per trial); recall_p10/p90 give the spread over all queries. Both scorers' calls are capped at "
        f"B = {p.budget} per query (checked); {scorer}.",
        f"Per query at B = {p.budget}: BAGEL beats rerank on {int((bg > r).sum())}, ties on {int((bg == r).sum())}, "
        f"loses on {int((bg < r).sum())} of {len(r)}; mean difference {float((bg - r).mean()):+.3f} "
        f"(standard error {float((bg - r).std(ddof=1) / np.sqrt(len(r))) if len(r) > 1 else 0.0:.3f}); against GAR "
        f"{int((bg > g).sum())} / {int((bg == g).sum())} / {int((bg < g).sum())}, mean difference "
        f"{float((bg - g).mean()):+.3f}.",
        workload,
        f"BAGEL as built: {p.seeds} retriever seeds, RBF GP with prior mean 0 and variance {p.signal_var}, length "
        f"scale and noise by type-II maximum likelihood over a grid set from the corpus' nearest-neighbour and "
        f"median pairwise distances (refit every {p.refit_every} scores; final length scales median "
        f"{float(np.median(ls)):.3f}, range {float(ls.min()):.3f}-{float(ls.max()):.3f}), GP-UCB with "
        f"sqrt(beta_t) = {tuned['beta_scale']:g} x sqrt(2 log(N t^2 pi^2 / (6 x {p.beta_delta}))); final ranking: "
        "scored passages by score, then the rest by the GP posterior mean.",
        _tuning(tuned, "the headline workload", p),
        "GAR (graph-based adaptive re-ranking, MacAvaney et al. CIKM 2022; deployable): a corpus graph of each "
        "passage's nearest neighbours in the embedding space, built before any query; batches of scorer calls "
        "alternate between the dense ranking's next unscored passages and the frontier (unscored neighbours of "
        "scored passages, by the best score that reached them); final ranking: scored passages by score, then the "
        "dense order. Same budget B, calls counted.",
        (f"bagel_explore (UCB factor {explore_factor(p, tuned):g}), means over all {len(r)} queries: recall@k "
         f"{variants['bagel_explore']['recall_at_k']:.3f}, far-cluster recall "
         f"{variants['bagel_explore']['far_recall_at_k']:.3f} vs bagel's {variants['bagel']['far_recall_at_k']:.3f} at "
         f"B = {p.budget}: more exploration is how the GP could reach the second cluster"
         + ("; on this corpus the highest-variance passages are outliers of their classes, whose graded relevance is "
            "near 0, so exploration rarely lands in the far cluster's basin within the budget (see docs/bagel.md)."
            if p.embedding == "digits" else " (see docs/bagel.md).")
         if "bagel_explore" in variants else "bagel_explore skipped."),
        ("The paper scores with an LLM on four text retrieval datasets; here the scorer is a noisy label oracle on a "
         "synthetic two-cluster workload, which isolates the mechanism (global exploration of the embedding space) "
         "but not an LLM's score distribution." if not llm else
         "The paper scores with an LLM on four text retrieval datasets; here an LLM scores a generated text corpus "
         "whose relevance is known by construction, so recall is counted against the construction, not the LLM's "
         "own judgement."),
    ]
    out_b = float(np.mean(res["outside_top_b"][p.budget]))
    notes += [
        f"Mechanism (means over all {len(r)} queries; the variants table gives medians of the per-trial means): "
        f"bagel_exploit (UCB weight 0, exploitation only) recall@k "
        f"{variants['bagel_exploit']['recall_at_k']:.3f} and far-cluster recall "
        f"{variants['bagel_exploit']['far_recall_at_k']:.3f} vs bagel's {variants['bagel']['recall_at_k']:.3f} and "
        f"{variants['bagel']['far_recall_at_k']:.3f}. Share of the relevant passages outside the retriever's top-B "
        f"at the headline: {out_b:.2f}.",
        f"Regime: relevant passages per cluster {', '.join(map(str, p.regime_per_cluster))} at B = {p.budget}, "
        f"{p.regime_queries} queries each (the first trial's seed; UCB factor and GAR as calibrated; one query "
        "sample per point, so the point's verdict leaves the query sampling out); per point the "
        "share of relevant passages outside the top-B and mean recall@k rerank / gar / bagel / bagel_exploit: "
        + "; ".join(f"{c}: {pt['_outside_top_b']:.2f}, {pt['rerank']:.3f} / {pt['gar']:.3f} / {pt['bagel']:.3f} / "
                    f"{pt['bagel_exploit']:.3f}" for c, pt in points.items()) + ".",
        "Second claim (digits_* variants): "
        + ("the digits workload run beside the headline, " if digits is not None else "the headline's own digits run, ")
        + f"{p.trials} trials of {p.queries} queries (seeds as the headline's), sklearn digits in {p.dim} PCA dims, "
        f"two digit classes per query, the {p.per_cluster} passages nearest each class centre relevant; mean "
        f"recall@k dense / rerank / gar / bagel {d_all['dense']['recall_at_k']:.3f} / "
        f"{d_all['rerank']['recall_at_k']:.3f} / {d_all['gar']['recall_at_k']:.3f} / "
        f"{d_all['bagel']['recall_at_k']:.3f}, far-cluster recall of bagel {d_all['bagel']['far_recall_at_k']:.3f}.",
    ]
    mean = {m: [float(np.mean(res["recall"][m][b])) for b in budgets] for m in methods}
    notes.append(_budget_note(budgets, mean, len(r)))
    graph = _graph_note(tuned)
    if graph:
        notes.append(graph)
    if bridge is not None:
        notes.append(_bridge_note(p, per_trial[0], bridge))
    if digits is not None:
        notes.append(_tuning(d_tuned, "the digits workload", p))
    return SystemResult(variants=variants, curves=curves, notes=notes, samples=samples, regime=regime,
                        regime_headline_value=float(p.per_cluster))
