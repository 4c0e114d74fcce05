"""COMM-RAND flow: GraphSAGE mini-batch training on a community-ordered SBM graph with random batching,
pure community order and COMM-RAND batching; time to a target accuracy, epoch time, final accuracy
and the counted reasons (unique nodes, feature rows, pages of the feature array touched)."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, SystemResult, system_flow
from mlsys_flows.systems.commrand import POLICIES
from mlsys_flows.systems.common.report import Curve
from mlsys_flows.tasks import commrand as t

STATS = ("unique_nodes_per_batch", "feature_pages_per_batch", "feature_rows_per_epoch", "communities_per_batch",
         "sampled_per_batch", "batches_per_epoch")


@system_flow("commrand")
def commrand(ctx: RunContext) -> SystemResult:
    p = ctx.params
    graph = t.make_graph.submit(p, ctx.storage, ctx.key("graph.npz")).result()
    # one task trains every policy in turn: timed runs must not share the CPU with each other
    r = t.train.submit(p, ctx.storage, graph).result()
    target, base_acc = r["target"], r["random"]["test_acc"]
    variants: dict[str, dict[str, float]] = {}
    samples: dict[str, dict[str, list[float]]] = {}
    capped = []
    for v in POLICIES:
        x = r[v]
        m = {"final_test_accuracy": x["test_acc"], "best_val_accuracy": max(x["val_acc"]),
             "accuracy_gap_points": 100.0 * (base_acc - x["test_acc"]),
             "reached_target": float(x["epochs_to_target"] is not None), **{s: x["stats"][s] for s in STATS}}
        samples[v] = {"epoch_time_s": x["epoch_s"]}
        if x["epochs_to_target"] is not None:
            m["epochs_to_target"] = float(x["epochs_to_target"])
            samples[v]["time_to_accuracy_s"] = x["tta_s"]
        elif v == "comm_rand":  # the headline needs a value: the cap's time, a lower bound (see the notes)
            samples[v]["time_to_accuracy_s"] = [e * p.epochs for e in x["epoch_s"]]
            capped.append(v)
        variants[v] = m
    kinds = {"epoch_time_s": "measured", "time_to_accuracy_s": "measured"}
    kinds |= {m: "counted" for ms in variants.values() for m in ms}

    epochs_axis = {v: list(range(1, len(r[v]["val_acc"]) + 1)) for v in POLICIES}
    curves = [
        Curve(title="validation accuracy per epoch (same init, lr, seeds)", x_label="epoch",
              y_label="validation accuracy", series={v: (epochs_axis[v], r[v]["val_acc"]) for v in POLICIES}),
        Curve(title="validation accuracy vs training time (first repeat)", x_label="training time (s)",
              y_label="validation accuracy", series={v: (r[v]["curve_s"], r[v]["val_acc"]) for v in POLICIES}),
    ]

    rnd, com, cr = (variants[v] for v in POLICIES)
    reached = {v: r[v]["epochs_to_target"] for v in POLICIES}
    mb = graph["feature_bytes"] / 2**20
    notes = [
        f"Each policy trained a {len(p.fanouts)}-layer GraphSAGE (mean aggregator, hidden {p.hidden}, fanouts "
        f"{list(p.fanouts)} from the roots outward, batches of {p.batch_size} roots, Adam lr {p.lr}) from the same "
        f"initialisation with the same seeds on {p.torch_threads} torch thread(s), in one task, policies interleaved "
        f"over {p.repeats} repeat(s) (the order rotates). The first repeat trains every policy {p.epochs} epochs "
        f"(final accuracy, curves, counted batch statistics); the target is {p.target_fraction:.0%} of random "
        f"batching's best validation accuracy there = {target:.4f}; later repeats train each policy until it "
        "reaches the target and must reproduce the first repeat's validation curve exactly (checked). "
        "time_to_accuracy_s sums the epochs' training time (batch building, sampling, feature gather, forward, "
        "backward, optimizer step) up to the target epoch; validation is not timed.",
        "Epochs to the target: " + ", ".join(f"{v} {reached[v] if reached[v] else f'not within {p.epochs}'}"
                                             for v in POLICIES) + ".",
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
    if capped:
        notes.append("COMM-RAND did not reach the target within the epoch cap: its time_to_accuracy_s is the time "
                     f"of all {p.epochs} epochs, a lower bound, so the headline ratio is an upper bound.")
    notes.append(f"Workload: a stochastic block model graph of {graph['nodes']} nodes in {graph['communities']} "
                 f"communities, {graph['edges']} directed edges, {p.classes} classes (a community's dominant class "
                 f"with probability {p.label_purity}), features = class centroid + community centroid + noise "
                 f"(norm {p.noise}); splits {graph['train']}/{graph['val']}/{graph['test']}. The paper trained on "
                 "real benchmarks on GPUs; docs/commrand.md explains what carries over.")
    return SystemResult(variants=variants, kinds=kinds, samples=samples, curves=curves, notes=notes)
