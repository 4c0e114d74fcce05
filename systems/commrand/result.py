"""COMM-RAND's SystemResult from its tasks' outputs (pure): the learning-rate calibration, the policies' training
runs over the seeds, the counted batch statistics and the community-size regime."""
from __future__ import annotations

from typing import Any

from mlsys_flows.systems.commrand import POLICIES, time_to_target
from mlsys_flows.systems.common.report import Curve, RegimeSample, SystemResult

STATS = ("unique_nodes_per_batch", "feature_pages_per_batch", "feature_rows_per_epoch", "communities_per_batch",
         "sampled_per_batch", "batches_per_epoch")
# the policies whose constraint decides a regime point: the technique and the baselines it is compared with
# (comm_fixed, the ablation, is never the strongest baseline)
COMPARED = ("random", "community", "comm_rand")


def regime_sample(p: Any, value: float, res: dict) -> RegimeSample:
    """One community size's point: valid only where the technique and the baselines reached random batching's
    target with every seed and kept their final accuracy within ``accuracy_gap_points`` of random's (the paper's
    claim is time to accuracy at parity)."""
    times, reached = time_to_target(res)
    compared = [v for v in COMPARED if v in res]
    broken = [f"{v} did not reach the target {res['target']:.4f}" for v in compared if not all(reached[v])]
    base = res["random"]["test_acc"]
    broken += [f"{v} ended {100 * (base - res[v]['test_acc']):.2f} points below random's {100 * base:.2f}% (allowed "
               f"{p.accuracy_gap_points:g})" for v in compared
               if v != "random" and 100 * (base - res[v]["test_acc"]) > p.accuracy_gap_points]
    return RegimeSample(value=value, samples=times, kind="measured", valid=not broken, invalid="; ".join(broken))


def build_result(p: Any, graph: dict, r: dict, sweep: dict, cal: dict | None = None) -> SystemResult:
    """``graph``: the graph task's summary; ``r``: the training task's result per policy (seeds, curves,
    statistics); ``sweep``: community size in batches -> the same comparison on a regime graph; ``cal``: the
    calibration (each policy's learning rate and the scores behind it)."""
    cal = cal or {"lrs": {v: r[v]["lr"] for v in POLICIES}, "scores": {}}
    target, base_acc = r["target"], r["random"]["test_acc"]
    tta, reached_by_seed = time_to_target(r)
    variants: dict[str, dict[str, float]] = {}
    samples: dict[str, dict[str, list[float]]] = {}
    capped = [v for v in POLICIES if not all(reached_by_seed[v])]
    for v in POLICIES:
        x = r[v]
        m = {"final_test_accuracy": x["test_acc"], "best_val_accuracy": max(x["val_acc"]),
             "accuracy_gap_points": 100.0 * (base_acc - x["test_acc"]), "learning_rate": float(x["lr"]),
             "reached_target": sum(reached_by_seed[v]) / len(reached_by_seed[v]), **{s: x["stats"][s] for s in STATS}}
        samples[v] = {"epoch_time_s": x["epoch_s"], "time_to_accuracy_s": tta[v],
                      "reached_target": [float(ok) for ok in reached_by_seed[v]]}
        if all(reached_by_seed[v]):
            samples[v]["epochs_to_target"] = [float(e) for e in x["epochs_to_target"]]
        variants[v] = m
    regime = [regime_sample(p, float(x), res) for x, res in sweep.items()]

    curves = [
        Curve(title="validation accuracy vs epochs trained (first seed, checked "
                    f"{p.evals_per_epoch}x per epoch)", x_label="epochs", y_label="validation accuracy",
              series={v: (r[v]["val_epochs"], r[v]["val_acc"]) for v in POLICIES}),
        Curve(title="validation accuracy vs training time (first seed)", x_label="training time (s)",
              y_label="validation accuracy", series={v: (r[v]["val_s"], r[v]["val_acc"]) for v in POLICIES}),
    ]

    rnd, com, cr, fx = (variants[v] for v in POLICIES)
    reached = {v: r[v]["epochs_to_target"] for v in POLICIES}
    seeds = ", ".join(str(p.seed + i) for i in range(p.repeats))
    mb = graph["feature_bytes"] / 2**20
    per_comm = graph["train"] / graph["communities"]
    lrs = cal["lrs"]
    notes = [
        f"Each policy trained a {len(p.fanouts)}-layer GraphSAGE (mean aggregator, hidden {p.hidden}, fanouts "
        f"{list(p.fanouts)} from the roots outward, batches of {p.batch_size} roots, Adam) from the same "
        f"initialisation with the same seeds on {p.torch_threads} torch thread(s), in one task, one policy at a "
        f"time. Each repeat is a training seed ({seeds}: initialisation, batch order, neighbour sampling; the graph "
        f"is the same): random batching trains {p.epochs} epochs first and sets that seed's target, "
        f"{p.target_fraction:.0%} of its best validation accuracy (first seed: {target:.4f}); the other policies "
        "(order rotating over the seeds) train until a validation check reaches it, or for the epoch cap. The first "
        f"seed trains every policy all {p.epochs} epochs (final accuracy, curves, counted batch statistics). "
        f"Validation runs {p.evals_per_epoch} times per epoch, evenly spaced in batches, for every policy, and is "
        "outside the clock for every policy: time_to_accuracy_s is the training time (batch building, sampling, "
        "feature gather, forward, backward, optimizer step) up to the first check that reached the target.",
        "Learning rates (Adam), each tuned policy's own, chosen on a calibration graph (graph seed "
        f"{p.calibration_seed()}, the same parameters) and training seed the evaluation never uses, from "
        f"{list(p.lr_grid)} by the mean validation accuracy of a {p.calibration_epochs}-epoch run: "
        + ", ".join(f"{v} {lrs[v]:g}" for v in POLICIES if v != "comm_fixed")
        + "; comm_fixed (the ablation) trains with comm_rand's rate"
        + ("." if cal.get("scores") else " (one rate in the grid: no calibration ran)."),
        "Epochs to the target per seed (at validation-check granularity): " + "; ".join(
            f"{v} " + ", ".join(f"{e:.2f}" if e else f"not within {p.epochs}" for e in reached[v]) for v in POLICIES)
        + ".",
        f"Community size: {graph['communities']} communities of {per_comm:.0f} training nodes on average, "
        f"{per_comm / p.batch_size:.2f} batches each (community_batches {p.community_batches:g}). Roots per batch come "
        f"from {rnd['communities_per_batch']:.1f} communities (random), {com['communities_per_batch']:.1f} (pure "
        f"community order), {cr['communities_per_batch']:.1f} (COMM-RAND, k={p.communities_per_batch} per group) and "
        f"{fx['communities_per_batch']:.1f} (comm_fixed: the same groups' size, fixed groups). COMM-RAND and "
        f"comm_fixed draw a neighbour from the node's own community with probability p={p.same_community_bias}; "
        "validation and test use the unbiased sampler for every policy.",
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
    ]
    gaps = {v: variants[v]["accuracy_gap_points"] for v in POLICIES if v != "random"}
    over = [v for v, gap in gaps.items() if gap > p.accuracy_gap_points]
    notes.append("Accuracy parity (final test accuracy after equal epochs, points below random batching's "
                 f"{100 * base_acc:.2f}%): " + ", ".join(f"{v} {gap:+.2f}" for v, gap in gaps.items())
                 + f"; allowed gap {p.accuracy_gap_points:g} points: "
                 + (f"EXCEEDED by {', '.join(over)}." if over else "met by every policy."))
    if "comm_rand" in capped:
        notes.append("COMM-RAND did not reach the target within the epoch cap with some seed: there its "
                     "time_to_accuracy_s is no less than its whole cap and no less than any other policy's time with "
                     "that seed, so that seed reports no win.")
    for v in ("community", "comm_fixed"):
        if v in capped:
            notes.append(f"{v} did not reach the target within the epoch cap with some seed: there its "
                         "time_to_accuracy_s is its whole cap's time, a lower bound (the ratio against it is a lower "
                         "bound).")
    rows = []
    for x, res in sweep.items():
        times, ok = time_to_target(res)
        rows.append(f"{x:g} ({res.get('communities', '?')} communities): " + ", ".join(
            f"{v} {sorted(times[v])[len(times[v]) // 2]:.2f} s" + ("" if all(ok[v]) else " (target missed)")
            for v in POLICIES) + ", test accuracy after the cap (first seed) "
            + "/".join(f"{res[v]['test_acc']:.3f}" for v in POLICIES))
    notes.append(f"Regime (training nodes per community over batch size; measured, {p.regime_repeats} seed(s) per "
                 f"point on graphs of {p.regime_nodes} nodes, each policy with its calibrated rate, the other graph "
                 "parameters as above): the upper median time to the target over the seeds, " + "; ".join(rows) + ".")
    notes.append(f"Workload: a stochastic block model graph of {graph['nodes']} nodes in {graph['communities']} "
                 f"communities, {graph['edges']} directed edges, {p.classes} classes (a community's dominant class "
                 f"with probability {p.label_purity}), features = class centroid + community centroid + noise "
                 f"(norm {p.noise}); splits {graph['train']}/{graph['val']}/{graph['test']}. The paper trained on "
                 "real benchmarks on GPUs; docs/commrand.md explains what carries over.")
    return SystemResult(variants=variants, samples=samples, curves=curves, notes=notes, regime=regime,
                        regime_headline_value=float(p.community_batches))
