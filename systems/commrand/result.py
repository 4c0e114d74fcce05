"""COMM-RAND's SystemResult from its tasks' outputs (pure): the policies' training runs over the seeds,
the counted batch statistics and the label-purity regime."""
from __future__ import annotations

from typing import Any

from mlsys_flows.systems.commrand import POLICIES, time_to_target
from mlsys_flows.systems.common.report import Curve, RegimeSample, SystemResult

STATS = ("unique_nodes_per_batch", "feature_pages_per_batch", "feature_rows_per_epoch", "communities_per_batch",
         "sampled_per_batch", "batches_per_epoch")


def regime_sample(p: Any, purity: float, res: dict) -> RegimeSample:
    """One purity's point: valid only where every policy reached random batching's target and kept its final
    accuracy within ``accuracy_gap_points`` of random's (the paper's claim is time to accuracy at parity)."""
    times, reached = time_to_target(res)
    broken = [f"{v} did not reach the target {res['target']:.4f}" for v in POLICIES if not all(reached[v])]
    base = res["random"]["test_acc"]
    broken += [f"{v} ended {100 * (base - res[v]['test_acc']):.2f} points below random's {100 * base:.2f}% (allowed "
               f"{p.accuracy_gap_points:g})" for v in POLICIES
               if v != "random" and 100 * (base - res[v]["test_acc"]) > p.accuracy_gap_points]
    return RegimeSample(value=purity, samples=times, kind="measured", valid=not broken, invalid="; ".join(broken))


def build_result(p: Any, graph: dict, r: dict, sweep: dict) -> SystemResult:
    """``graph``: the graph task's summary; ``r``: the training task's result per policy (seeds, curves,
    statistics); ``sweep``: label purity -> the same comparison on a smaller graph, one seed."""
    target, base_acc = r["target"], r["random"]["test_acc"]
    tta, reached_by_seed = time_to_target(r)
    variants: dict[str, dict[str, float]] = {}
    samples: dict[str, dict[str, list[float]]] = {}
    capped = [v for v in POLICIES if not all(reached_by_seed[v])]
    for v in POLICIES:
        x = r[v]
        m = {"final_test_accuracy": x["test_acc"], "best_val_accuracy": max(x["val_acc"]),
             "accuracy_gap_points": 100.0 * (base_acc - x["test_acc"]),
             "reached_target": sum(reached_by_seed[v]) / len(reached_by_seed[v]), **{s: x["stats"][s] for s in STATS}}
        samples[v] = {"epoch_time_s": x["epoch_s"], "time_to_accuracy_s": tta[v]}
        if all(reached_by_seed[v]):
            samples[v]["epochs_to_target"] = [float(e) for e in x["epochs_to_target"]]
        variants[v] = m
    regime = [regime_sample(p, float(purity), res) for purity, res in sweep.items()]

    epochs_axis = {v: list(range(1, len(r[v]["val_acc"]) + 1)) for v in POLICIES}
    curves = [
        Curve(title="validation accuracy per epoch (same init, lr, seeds)", x_label="epoch",
              y_label="validation accuracy", series={v: (epochs_axis[v], r[v]["val_acc"]) for v in POLICIES}),
        Curve(title="validation accuracy vs training time (first repeat)", x_label="training time (s)",
              y_label="validation accuracy", series={v: (r[v]["curve_s"], r[v]["val_acc"]) for v in POLICIES}),
    ]

    rnd, com, cr = (variants[v] for v in POLICIES)
    reached = {v: r[v]["epochs_to_target"] for v in POLICIES}
    seeds = ", ".join(str(p.seed + i) for i in range(p.repeats))
    mb = graph["feature_bytes"] / 2**20
    notes = [
        f"Each policy trained a {len(p.fanouts)}-layer GraphSAGE (mean aggregator, hidden {p.hidden}, fanouts "
        f"{list(p.fanouts)} from the roots outward, batches of {p.batch_size} roots, Adam lr {p.lr}) from the same "
        f"initialisation with the same seeds on {p.torch_threads} torch thread(s), in one task, one policy at a "
        f"time. Each repeat is a training seed ({seeds}: initialisation, batch order, neighbour sampling; the graph "
        f"is the same): random batching trains {p.epochs} epochs first and sets that seed's target, "
        f"{p.target_fraction:.0%} of its best validation accuracy (first seed: {target:.4f}); the other policies "
        "(order rotating over the seeds) train until they reach it or for the epoch cap. The first seed trains every "
        f"policy all {p.epochs} epochs (final accuracy, curves, counted batch statistics). time_to_accuracy_s sums "
        "the epochs' training time (batch building, sampling, feature gather, forward, backward, optimizer step) up "
        "to the epoch that reached the target (accuracy is checked once per epoch); validation is not timed.",
        "Epochs to the target per seed: " + "; ".join(
            f"{v} " + ", ".join(str(e) if e else f"not within {p.epochs}" for e in reached[v]) for v in POLICIES) + ".",
        f"Why community batches are faster here (counted, first epoch): a random batch's {len(p.fanouts)}-hop "
        f"sample holds {rnd['unique_nodes_per_batch']:.0f} unique nodes on average, a COMM-RAND batch "
        f"{cr['unique_nodes_per_batch']:.0f} and a pure-community batch {com['unique_nodes_per_batch']:.0f}, "
        f"because roots of a few communities share their (mostly in-community, homophily "
        f"{graph['homophily']:.2f}) neighbours. The feature rows gathered per epoch fall from "
        f"{rnd['feature_rows_per_epoch']:.0f} to {cr['feature_rows_per_epoch']:.0f}, and with node ids ordered "
        f"by community those rows are close together: {rnd['feature_pages_per_batch']:.0f} vs "
        f"{cr['feature_pages_per_batch']:.0f} distinct 4 KiB pages of the {mb:.0f} MiB feature array per batch "
        f"({graph['row_bytes']} B rows). On this CPU the first layer's projection runs once per unique node, so "
        "compute falls with the unique nodes as well as the gathered bytes; on the paper's GPUs the same "
        "reduction shows up as fewer DRAM reads and better cache hit rates.",
        f"Roots per batch come from {rnd['communities_per_batch']:.1f} communities (random), "
        f"{cr['communities_per_batch']:.1f} (COMM-RAND, k={p.communities_per_batch} per group, a batch may "
        f"straddle two groups) and {com['communities_per_batch']:.1f} (pure community order). COMM-RAND's "
        f"neighbour sampler draws from the node's own community with probability p={p.same_community_bias}; "
        "validation and test use the unbiased sampler for every policy.",
    ]
    gaps = {v: variants[v]["accuracy_gap_points"] for v in POLICIES if v != "random"}
    over = [v for v, gap in gaps.items() if gap > p.accuracy_gap_points]
    notes.append("Accuracy parity (final test accuracy after equal epochs, points below random batching's "
                 f"{100 * base_acc:.2f}%): " + ", ".join(f"{v} {gap:+.2f}" for v, gap in gaps.items())
                 + f"; allowed gap {p.accuracy_gap_points:g} points: "
                 + (f"EXCEEDED by {', '.join(over)}." if over else "met by every policy."))
    if "comm_rand" in capped:
        notes.append("COMM-RAND did not reach the target within the epoch cap with some seed: there its "
                     "time_to_accuracy_s is no less than its whole cap and no less than any baseline's time with that "
                     "seed, so that seed reports no win.")
    if "community" in capped:
        notes.append("Pure community order did not reach the target within the epoch cap with some seed: there its "
                     "time_to_accuracy_s is its whole cap's time, a lower bound (the ratio against it is a lower bound).")
    rows = []
    for purity, res in sweep.items():
        times, ok = time_to_target(res)
        rows.append(f"{purity:g}: " + ", ".join(
            f"{v} {times[v][0]:.2f} s" + ("" if ok[v][0] else " (target not reached)") for v in POLICIES)
            + f", test accuracy after the cap " + "/".join(f"{res[v]['test_acc']:.3f}" for v in POLICIES))
    notes.append(f"Regime (label purity; measured, one seed and one timed run per policy on graphs of {p.regime_nodes} "
                 f"nodes, the other graph parameters as above, so its points are noisier and smaller than the "
                 "headline's): time to the target, " + "; ".join(rows) + ".")
    notes.append(f"Workload: a stochastic block model graph of {graph['nodes']} nodes in {graph['communities']} "
                 f"communities, {graph['edges']} directed edges, {p.classes} classes (a community's dominant class "
                 f"with probability {p.label_purity}), features = class centroid + community centroid + noise "
                 f"(norm {p.noise}); splits {graph['train']}/{graph['val']}/{graph['test']}. The paper trained on "
                 "real benchmarks on GPUs; docs/commrand.md explains what carries over.")
    return SystemResult(variants=variants, samples=samples, curves=curves, notes=notes, regime=regime,
                        regime_headline_value=float(p.label_purity))
