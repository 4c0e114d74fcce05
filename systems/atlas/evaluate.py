"""One microservice system end to end: synthesize and validate Atlas's graph (and the scripted parser's,
a labelled reference), learn the PC graph from the same short window of normal telemetry with its
significance level chosen on calibration incidents, fit the same localizer on every graph, rank incidents."""
from __future__ import annotations

import time

import numpy as np

from . import ci
from .docs import make_docs
from .model import ERR, FAULTS, LAT, Microservices, expand, make_incident, make_system, simulate, true_graph, var
from .rca import Localizer, component_edges, edge_scores, rank_of, set_scores
from .docs import DocParser
from .learned import CalibrationError, MentionSynthesizer, sentence_scores
from .synth import synthesize

GRAPH_VARIANTS = ("true_graph", "atlas", "atlas_no_validation", "atlas_regex", "atlas_mentions", "atlas_no_docs",
                  "pc_algorithm")
VARIANTS = GRAPH_VARIANTS + ("zscore",)
SUMMED = ("pc_s", "pruned_true_edges", "pruned_false_edges", "validated_edges")


PAST = 10**6   # incident indices of the past incidents in the history (never evaluated)
CALIBRATION = 2 * 10**6   # incident indices of the calibration incidents (PC's alpha is chosen on them; never evaluated)


def build(p, seed: int) -> tuple[Microservices, list[str], np.ndarray, np.ndarray]:
    """The system, its documentation (the held-out phrasings), the longest normal-operation history any
    run size needs, and the telemetry of the most past incidents any setting needs
    (``past[: k * fault_window]`` are the first k incidents)."""
    s = make_system(p.components, seed, p.timeout_quantile, p.request_spread)
    pages = make_docs(s, seed, p.doc_omit, p.doc_hard, p.doc_stale, p.doc_distractor, phrasings="heldout")
    history = simulate(s, max(h for h, _ in p.settings()), np.random.default_rng([seed, 31]))
    past = [make_incident(s, PAST + k, seed, p.fault_window, p.fault_magnitude).data
            for k in range(max(k for _, k in p.settings()))]
    return s, pages, history, (np.concatenate(past) if past else np.zeros((0, s.V)))


def component_candidates(s: Microservices, comp_edges) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """The metric edges each synthesized component edge (callee u, caller v) stands for."""
    return {(u, v): [(var(u, LAT), var(v, LAT)), (var(u, ERR), var(v, ERR)), (var(u, LAT), var(v, ERR))]
            for u, v in sorted(comp_edges)}


def directed_only(G: np.ndarray) -> np.ndarray:
    """The oriented edges of a partially directed graph: an edge PC left unoriented makes neither end a
    parent (neutral: it neither explains an anomaly away nor strips a root candidate)."""
    return G & ~G.T


def calibration_incidents(p, s: Microservices, seed: int) -> list:
    """The calibration incidents of a system: past incidents with a known root cause (post-mortems) that
    no variant learns from and none is evaluated on; PC's significance level is chosen on them."""
    return [make_incident(s, CALIBRATION + k, seed, p.fault_window, p.fault_magnitude)
            for k in range(p.calibration_incidents)]


def validated(s: Microservices, edges: set, data: np.ndarray, alpha: float) -> tuple[np.ndarray, list]:
    """Atlas's data validation of synthesized dependencies: each u -> v is tested through the metric edges
    it stands for and pruned when the data contradicts all of them (none rejects independence)."""
    groups = component_candidates(s, edges)
    candidates = [e for es in groups.values() for e in es]
    _, pvals = ci.validate(expand(s.n, edges), candidates, data, alpha)
    pruned = [ce for ce, es in groups.items() if min(pvals[e] for e in es) > alpha]
    return expand(s.n, set(edges) - set(pruned)), pruned


def tuned_pc(p, data: np.ndarray, template: np.ndarray, calib: list, n: int) -> tuple[np.ndarray, float, dict, dict]:
    """PC at ``p.pc_alpha``, or at the level of ``p.pc_alpha_grid`` whose graph gives the best top-1 on the
    calibration incidents, a tie broken by the lower mean rank there (then the grid's order). Returns
    (graph, alpha, {alpha: top-1}, {alpha: mean rank}) on the calibration incidents."""
    grid = [p.pc_alpha] if p.pc_alpha is not None else list(p.pc_alpha_grid)
    if len(grid) > 1 and not calib:
        raise CalibrationError("PC's level is chosen on calibration incidents (pc_alpha None): pass them, or set pc_alpha")
    graphs, scores, mean_ranks = {}, {}, {}
    for alpha in grid:
        graphs[alpha] = ci.pc(data, alpha, p.pc_max_depth, required=template)
        if len(grid) > 1:
            loc = Localizer.fit(directed_only(graphs[alpha]), data)
            ranks = [rank_of(loc.rank(inc.data, n, p.anomaly_threshold), inc.root) for inc in calib]
            scores[alpha] = float(np.mean([r == 1 for r in ranks]))
            mean_ranks[alpha] = float(np.mean(ranks))
    best = min(grid, key=lambda a: (-scores.get(a, 0.0), mean_ranks.get(a, 0.0), grid.index(a)))
    return graphs[best], best, scores, mean_ranks


def timeout_edges(s: Microservices) -> list[tuple[int, int]]:
    """The true callee latency -> caller errors edges (timeouts)."""
    return [(var(u, LAT), var(v, ERR)) for u, v in sorted(s.component_edges())]


def detectable(truth: np.ndarray, edges: list[tuple[int, int]], data: np.ndarray, alpha: float = 0.05) -> float:
    """Share of ``edges`` i -> j whose Fisher-z test given j's other true parents rejects independence at
    ``alpha`` on ``data``: whether the link is in the telemetry at all (for the timeouts: in normal operation)."""
    if not edges:
        return 0.0
    _, pvals = ci.validate(truth, edges, data, alpha)
    return float(np.mean([pvals[e] <= alpha for e in edges]))


def learn_graphs(p, s: Microservices, pages: list[str], history: np.ndarray, past: np.ndarray, agent,
                 calib: list | None = None, reference=None) -> dict:
    """Every variant's graph and localizer at every history size, with graph quality and counts.
    Atlas's data validation (``validated``) prunes synthesized dependencies the data contradicts. Every
    learned graph starts from the same background knowledge, the per-component metric template (``expand``
    of no dependency): Atlas adds the documented dependencies to it, PC gets it as required edges, and
    ``atlas_no_docs`` (the mechanism's ablation, and the template-only deployable baseline) is the template
    alone. ``atlas_regex`` is the same pipeline with the scripted parser (``reference``, DocParser by
    default) as its synthesizer, ``atlas_mentions`` with every named component as a dependency (a deployable
    baseline: it reads nothing). ``calib``: the calibration incidents PC's alpha is chosen on."""
    t0 = time.perf_counter()
    syn = synthesize(agent, pages, s.names)
    synth_s = time.perf_counter() - t0
    ref = synthesize(reference if reference is not None else DocParser(), pages, s.names)
    named = synthesize(MentionSynthesizer(), pages, s.names)
    if hasattr(agent, "accept_texts"):   # the learned rule's sentence decisions on the evaluated pages (scored only)
        syn_sentences = sentence_scores(pages, s.names, s.calls, agent.accept_texts)
    else:
        syn_sentences = None
    calib = calib if calib is not None else []
    truth = true_graph(s)
    truth_c = s.component_edges()
    proposed = expand(s.n, syn.edges)
    template = expand(s.n, ())
    tmo = timeout_edges(s)
    out = {"synthesis": {**syn.stats(), "synth_s": synth_s}, "problems": syn.problems, "settings": {}}
    if syn_sentences is not None:
        out["synthesis"]["sentence_scores"] = syn_sentences
    for h, k in p.settings():
        data = np.concatenate([history[:h], past[: k * p.fault_window]])
        atlas, pruned = validated(s, syn.edges, data, p.validation_alpha)
        regex, _ = validated(s, ref.edges, data, p.validation_alpha)
        mentioned, _ = validated(s, named.edges, data, p.validation_alpha)
        t1 = time.perf_counter()
        pcg, alpha, alpha_scores, alpha_ranks = tuned_pc(p, data, template, calib, s.n)
        pc_s = time.perf_counter() - t1
        graphs = {"true_graph": truth, "atlas": atlas, "atlas_no_validation": proposed, "atlas_regex": regex,
                  "atlas_mentions": mentioned, "atlas_no_docs": template, "pc_algorithm": pcg, "zscore": np.zeros_like(truth)}
        stats = {}
        for name, G in graphs.items():
            st = {}
            if name != "zscore":
                m, c = edge_scores(G, truth), set_scores(component_edges(G, s.n), truth_c)
                st = {"metric_edge_precision": m["precision"], "metric_edge_recall": m["recall"],
                      "edge_precision": c["precision"], "edge_recall": c["recall"], "graph_edges": m["edges"],
                      "timeout_edge_recall": float(np.mean([bool(G[i, j]) for i, j in tmo])) if tmo else 0.0}
            stats[name] = st
        stats["atlas"].update(pruned_true_edges=sum(e in truth_c for e in pruned),
                              pruned_false_edges=sum(e not in truth_c for e in pruned),
                              validated_edges=len(syn.edges))
        stats["pc_algorithm"].update(pc_s=pc_s, pc_alpha=alpha)
        stats["true_graph"]["timeout_edges_detectable"] = detectable(truth, tmo, data)
        stats["pc_alpha_scores"] = alpha_scores
        stats["pc_alpha_mean_ranks"] = alpha_ranks
        graphs["pc_algorithm"] = directed_only(pcg)   # the localizer uses PC's oriented edges only
        out["settings"][(h, k)] = {"stats": stats, "localizers": {k: Localizer.fit(G, data) for k, G in graphs.items()}}
    return out


def rank_incidents(p, s: Microservices, seed: int, learned: dict, start: int, stop: int) -> dict:
    """Simulate incidents [start, stop) and rank root causes with every variant at every history size."""
    roots, faults = [], []
    ranks = {st: {v: [] for v in VARIANTS} for st in learned["settings"]}
    for k in range(start, stop):
        inc = make_incident(s, k, seed, p.fault_window, p.fault_magnitude)
        roots.append(inc.root)
        faults.append(inc.fault)
        for st, lv in learned["settings"].items():
            for v, loc in lv["localizers"].items():
                ranks[st][v].append(rank_of(loc.rank(inc.data, s.n, p.anomaly_threshold), inc.root))
    return {"roots": roots, "faults": faults, "ranks": ranks}


def accuracy(ranks: list[int], k: int) -> float:
    return float(np.mean(np.asarray(ranks) <= k)) if ranks else 0.0


def summarize(systems: list[dict], size: tuple[int, int]) -> dict[str, dict[str, float]]:
    """Pooled metrics per variant at one setting (normal history samples, past incidents) over every
    system's incidents and graphs.
    ``systems``: per system {"learned": stats-only learn output, "incidents": [rank_incidents, ...]}."""
    variants: dict[str, dict[str, float]] = {}
    for v in VARIANTS:
        ranks = [r for sysm in systems for chunk in sysm["incidents"] for r in chunk["ranks"][size][v]]
        m = {"top1_accuracy": accuracy(ranks, 1), "top3_accuracy": accuracy(ranks, 3),
             "mean_rank": float(np.mean(ranks)), "incidents": float(len(ranks))}
        for f in FAULTS:
            fr = [r for sysm in systems for chunk in sysm["incidents"]
                  for r, ff in zip(chunk["ranks"][size][v], chunk["faults"]) if ff == f]
            m[f"top1_{f}"] = accuracy(fr, 1)
        stats = [sysm["learned"]["settings"][size]["stats"][v] for sysm in systems]
        for key in stats[0]:
            agg = np.sum if key in SUMMED else np.mean
            m[key] = float(agg([st[key] for st in stats]))
        variants[v] = m
    syn = [sysm["learned"]["synthesis"] for sysm in systems]
    for key in syn[0]:
        if key not in ("synth_s", "agent", "calibration", "sentence_scores"):
            variants["atlas"][key] = float(np.sum([s_[key] for s_ in syn]))
    return variants
