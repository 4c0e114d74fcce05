"""GraphSAGE (mean aggregator) in plain torch, trained with each mini-batch policy; the interleaved
comparison of the policies (time to a target validation accuracy, epoch time, final accuracy, and
the counted reasons: unique nodes, feature rows gathered, 4 KiB pages of the feature array touched).

Imports torch: loaded by the training task, never by ``systems.commrand``'s package import.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from .graph import Graph
from .sampler import POLICIES, Batch, pages_touched, policy_batches, sample_batch


class SAGEConv(nn.Module):
    """h_dst' = W_self h_dst + W_neigh mean(h_nbr) + b. Like DGL's SAGEConv, the neighbour projection
    runs before the aggregation when it shrinks the rows (in > out), once per unique source node."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.self_lin = nn.Linear(d_in, d_out)
        self.neigh_lin = nn.Linear(d_in, d_out, bias=False)
        self.project_first = d_in > d_out

    def forward(self, h: torch.Tensor, self_idx: torch.Tensor, nbr: torch.Tensor) -> torch.Tensor:
        if self.project_first:
            agg = self.neigh_lin(h)[nbr].mean(1)
        else:
            agg = self.neigh_lin(h[nbr].mean(1))
        return self.self_lin(h[self_idx]) + agg


class GraphSAGE(nn.Module):
    def __init__(self, d_in: int, hidden: int, classes: int, layers: int = 2):
        super().__init__()
        dims = [d_in] + [hidden] * (layers - 1) + [classes]
        self.convs = nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x: torch.Tensor, batch: Batch) -> torch.Tensor:
        h = x
        for i, (conv, blk) in enumerate(zip(self.convs, batch.blocks)):
            h = conv(h, torch.from_numpy(blk.self_idx), torch.from_numpy(blk.nbr))
            if i < len(self.convs) - 1:
                h = torch.relu(h)
        return h


def gather(features: torch.Tensor, batch: Batch) -> torch.Tensor:
    """The batch's input feature rows, read from the one contiguous feature array."""
    return features.index_select(0, torch.from_numpy(batch.input_nodes))


def eval_batches(g: Graph, nodes: np.ndarray, fanouts: tuple[int, ...], seed: int,
                 batch_size: int = 2048) -> list[Batch]:
    """The sampled blocks of ``nodes`` for validation or test: the standard (unbiased) sampler with a fixed
    seed, so every check of every policy and epoch sees the same sample; drawn once per training run."""
    rng = np.random.default_rng([seed, 2])
    return [sample_batch(g, nodes[i:i + batch_size], fanouts, rng) for i in range(0, len(nodes), batch_size)]


def evaluate(model: GraphSAGE, g: Graph, features: torch.Tensor, nodes: np.ndarray, fanouts: tuple[int, ...],
             seed: int, batch_size: int = 2048, batches: list[Batch] | None = None) -> float:
    """Accuracy on ``nodes`` (``batches``: their blocks from ``eval_batches``, drawn here when not given): an
    exact count, never timed."""
    batches = eval_batches(g, nodes, fanouts, seed, batch_size) if batches is None else batches
    correct = 0
    model.eval()
    with torch.no_grad():
        for b in batches:
            pred = model(gather(features, b), b).argmax(1).numpy()
            correct += int((pred == g.labels[b.roots]).sum())
    model.train()
    return correct / len(nodes)


def batch_stats(g: Graph, b: Batch) -> dict[str, float]:
    row_bytes = g.features.shape[1] * g.features.itemsize
    return {"unique_nodes": len(b.input_nodes), "pages": pages_touched(b.input_nodes, row_bytes),
            "communities": len(np.unique(g.community_of(b.roots))),
            "sampled": int(sum(blk.nbr.size for blk in b.blocks))}


def eval_points(batches: int, evals_per_epoch: int, dense: bool = False) -> set[int]:
    """0-based batch indices after which validation runs: ``evals_per_epoch`` evenly spaced, the epoch's last among
    them; ``dense``: after every batch."""
    if dense:
        return set(range(batches))
    n = max(1, min(evals_per_epoch, batches))
    return {int(round((j + 1) * batches / n)) - 1 for j in range(n)}


def train_policy(g: Graph, policy: str, *, fanouts: tuple[int, ...], batch_size: int, hidden: int, lr: float,
                 k: int, bias: float, epochs: int, seed: int, evals_per_epoch: int = 1,
                 eval_fanouts: tuple[int, ...] | None = None, target: float | None = None, stats: bool = False,
                 test: bool = False, dense_eval_epochs: int = 0, stop_at_target: bool = True) -> dict[str, Any]:
    """Train one policy from the seed's initialisation for up to ``epochs`` epochs, stopping at the first validation
    check that reaches ``target`` (``stop_at_target=False``: training on to the cap without further validation, for
    the final test accuracy; the clock and the curve up to the target are the same). Validation runs after every
    batch during the first ``dense_eval_epochs`` epochs and ``evals_per_epoch`` times per epoch after them (evenly
    spaced in batches, the last at the epoch's end) for every policy, outside the clock: the clock holds building
    the batches, sampling, gathering and the optimizer steps. Per check: the validation accuracy, the epochs trained
    (a fraction) and the training seconds so far. ``bias`` applies to the COMM-RAND policies (comm_rand, comm_fixed)
    only. ``test``: the test accuracy after the last batch trained (``test_acc``)."""
    eval_fanouts = eval_fanouts or fanouts
    features = torch.from_numpy(g.features)
    val_batches = eval_batches(g, g.val, eval_fanouts, seed)   # sampled once, outside the clock
    labels = torch.from_numpy(g.labels)
    torch.manual_seed(seed)
    model = GraphSAGE(g.features.shape[1], hidden, g.classes, len(fanouts))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    p_bias = bias if policy in ("comm_rand", "comm_fixed") else 0.0
    out: dict[str, Any] = {"val_acc": [], "val_epochs": [], "val_s": [], "val_work": [], "loss": []}
    work = 0   # unique input nodes gathered so far (counted): the feature rows read and first-layer rows projected
    sums = {"unique_nodes": 0, "pages": 0, "communities": 0, "sampled": 0, "batches": 0}
    clock, steps, done, reached = 0.0, 0, False, False
    for epoch in range(epochs):
        rng = np.random.default_rng([seed, 1, epoch])  # the same stream for every policy
        t0 = time.perf_counter()
        batches = policy_batches(policy, g, batch_size, k, rng)
        clock += time.perf_counter() - t0
        checks = eval_points(len(batches), evals_per_epoch, dense=epoch < dense_eval_epochs)
        loss_sum = 0.0
        for i, roots in enumerate(batches):
            t0 = time.perf_counter()
            b = sample_batch(g, roots, fanouts, rng, p_bias)
            loss = loss_fn(model(gather(features, b), b), labels[torch.from_numpy(b.roots)])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            clock += time.perf_counter() - t0
            steps += 1
            work += len(b.input_nodes)
            loss_sum += float(loss.detach()) * len(roots)
            if stats and epoch == 0:
                for key, v in batch_stats(g, b).items():
                    sums[key] += v
                sums["batches"] += 1
            if i in checks and not reached:  # untimed, its own sampling stream: the training stream is the same
                # with or without it
                out["val_acc"].append(evaluate(model, g, features, g.val, eval_fanouts, seed, batches=val_batches))
                out["val_epochs"].append(epoch + (i + 1) / len(batches))
                out["val_s"].append(clock)
                out["val_work"].append(work)
                if target is not None and out["val_acc"][-1] >= target:
                    reached = True
                    if stop_at_target:
                        done = True
                        break
        out["batches_per_epoch"] = len(batches)
        if not done:
            out["loss"].append(loss_sum / len(g.train))
        else:
            break
    out["train_s"], out["steps"] = clock, steps
    out["epoch_s"] = clock / (steps / out["batches_per_epoch"])  # training seconds per epoch's worth of batches
    if stats:
        n = max(1, sums.pop("batches"))
        out["stats"] = {"unique_nodes_per_batch": sums["unique_nodes"] / n,
                        "feature_pages_per_batch": sums["pages"] / n,
                        "feature_rows_per_epoch": float(sums["unique_nodes"]),
                        "communities_per_batch": sums["communities"] / n,
                        "sampled_per_batch": sums["sampled"] / n,
                        "batches_per_epoch": float(n)}
    if test:
        out["test_acc"] = evaluate(model, g, features, g.test, eval_fanouts, seed)
    return out


def warm_up(g: Graph, fanouts: tuple[int, ...], batch_size: int, hidden: int, seed: int) -> None:
    """A few untimed steps on a throwaway model, so no policy pays torch's first-call costs."""
    rng = np.random.default_rng([seed, 3])
    model = GraphSAGE(g.features.shape[1], hidden, g.classes, len(fanouts))
    features = torch.from_numpy(g.features)
    for _ in range(2):
        b = sample_batch(g, rng.choice(g.train, min(batch_size, len(g.train)), replace=False), fanouts, rng)
        model(gather(features, b), b).sum().backward()


def first_reach(curve: list[float], target: float) -> int | None:
    """Index of the first validation check that reached ``target`` (None: never)."""
    return next((i for i, a in enumerate(curve) if a >= target), None)


def epochs_to(run: dict, target: float) -> float | None:
    """Epochs trained (a fraction, at validation-check granularity) when validation first reached ``target``."""
    i = first_reach(run["val_acc"], target)
    return None if i is None else run["val_epochs"][i]


TUNED = ("random", "community", "comm_rand")   # comm_fixed, the ablation, trains with comm_rand's rate


def lrs_for(lrs: dict[str, float] | float) -> dict[str, float]:
    """Every policy's learning rate: one rate for all, or the tuned policies' rates (comm_fixed takes comm_rand's)."""
    if isinstance(lrs, (int, float)):
        return {v: float(lrs) for v in POLICIES}
    out = dict(lrs)
    if "comm_rand" in out:
        out.setdefault("comm_fixed", out["comm_rand"])
    missing = [v for v in POLICIES if v not in out]
    if missing:
        raise ValueError(f"no learning rate for {', '.join(missing)}")
    return out


def work_score(work: list[int], acc: list[float], budget: float) -> float:
    """Mean validation accuracy over the first ``budget`` units of work (counted unique input nodes): each check's
    accuracy holds from its work to the next check's, 0 before the first; deterministic, and "fast and high" in
    work rather than epochs, so a k that converges in fewer epochs but gathers more rows per batch pays for it."""
    area, edges = 0.0, list(work[1:]) + [budget]
    for w0, w1, a in zip(work, edges, acc):
        lo, hi = min(w0, budget), min(w1, budget)
        area += a * max(0.0, hi - lo)
    return area / budget


def calibrate(g_kwargs: dict, lr_grid: list[float], *, fanouts: tuple[int, ...], batch_size: int, hidden: int,
              k: int, bias: float, epochs: int, seed: int, threads: int = 1, evals_per_epoch: int = 1,
              k_grid: list[int] | None = None, log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Each tuned policy's Adam rate, and COMM-RAND's k (communities per group), picked as a careful user would without
    the evaluated data: on a graph of another seed (``g_kwargs``) with another training seed, every rate of
    ``lr_grid`` trains ``epochs`` epochs (COMM-RAND with ``k``); the rate whose validation curve (checked
    ``evals_per_epoch`` times per epoch) has the highest mean wins (fast and high; counted, deterministic). Then
    COMM-RAND trains with each k of ``k_grid`` (those the graph's communities allow) at its chosen rate, validated
    after every batch, and the k with the highest mean validation accuracy over a common budget of work
    (``work_score``: unique input nodes gathered, the per-batch cost that k trades against convergence; counted,
    deterministic) wins; comm_fixed, the ablation, inherits rate and k. One rate and at most one k: no training."""
    ks = sorted(set(k_grid or []))
    if len(lr_grid) == 1 and len(ks) <= 1:
        return {"lrs": lrs_for(lr_grid[0]), "scores": {}, "k": ks[0] if ks else k, "k_scores": {}}
    from .graph import generate

    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = generate(**g_kwargs)
        warm_up(g, fanouts, batch_size, hidden, seed)
        kw = dict(fanouts=fanouts, batch_size=batch_size, hidden=hidden, bias=bias, epochs=epochs, seed=seed,
                  evals_per_epoch=evals_per_epoch)
        scores: dict[str, dict[float, float]] = {}
        for v in TUNED if len(lr_grid) > 1 else ():
            scores[v] = {}
            for lr in lr_grid:
                run = train_policy(g, v, lr=lr, k=k, **kw)
                scores[v][lr] = float(np.mean(run["val_acc"]))
            log(f"calibration {v}: " + ", ".join(f"lr {lr:g} -> mean val acc {a:.4f}" for lr, a in scores[v].items()))
        best = {v: max(sc, key=lambda lr: (sc[lr], -lr)) for v, sc in scores.items()} or \
            {v: float(lr_grid[0]) for v in TUNED}
        chosen_k, k_scores = k, {}
        fit = [x for x in ks if x <= g.communities]
        if len(fit) > 1:
            lr = best["comm_rand"]
            # validated after every batch, so that the score resolves the work to one batch
            runs = {x: train_policy(g, "comm_rand", lr=lr, k=x, dense_eval_epochs=epochs, **kw) for x in fit}
            budget = float(min(r["val_work"][-1] for r in runs.values()))
            k_scores = {x: work_score(r["val_work"], r["val_acc"], budget) for x, r in runs.items()}
            chosen_k = max(k_scores, key=lambda x: (k_scores[x], -x))
            log(f"calibration comm_rand k (lr {lr:g}, over {budget:.0f} unique input nodes): "
                + ", ".join(f"k {x} -> {a:.4f}" for x, a in k_scores.items()))
        elif len(fit) == 1:
            chosen_k = fit[0]
        return {"lrs": lrs_for(best),
                "scores": {v: {str(lr): a for lr, a in sc.items()} for v, sc in scores.items()},
                "k": int(chosen_k), "k_scores": {str(x): a for x, a in k_scores.items()}}
    finally:
        torch.set_num_threads(old_threads)


def compare(g: Graph, *, fanouts: tuple[int, ...], batch_size: int, hidden: int, lrs: dict[str, float] | float,
            k: int, bias: float, epochs: int, seed: int, repeats: int, target_fraction: float, threads: int = 1,
            evals_per_epoch: int = 1, dense_eval_epochs: int = 0, full_cap: bool = False,
            log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """The policies trained on ``g`` with the same initialisation, epochs and seeds (each with its calibrated learning
    rate), timed one after another (never side by side). Each repeat is a training seed (``seed + r``:
    initialisation, batch order, neighbour sampling): random batching trains first, for ``epochs`` epochs, and sets
    that seed's target, ``target_fraction`` of its best validation accuracy; the other policies (their order rotates
    over the seeds) train until a validation check reaches it, or for ``epochs`` epochs. The first seed trains every
    policy for all ``epochs`` (the accuracy curves, the counted batch statistics); with ``full_cap`` every seed
    trains every policy the whole cap (past the first seed unvalidated after the target) and every seed's final test
    accuracy after the cap is kept (``test_accs``, so that accuracy claims pair over the seeds; without it only the
    first seed's). The time to the target is read off the curve either way (validation is outside the clock, so
    training on past the target changes nothing before it). Per policy and seed: the training seconds per epoch, the
    epochs (a fraction) and training seconds to the target (None: never), and the time of the whole epoch cap at the
    policy's speed (``cap_s``)."""
    lr_of = lrs_for(lrs)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        res: dict[str, Any] = {v: {"epoch_s": [], "tta_s": [], "cap_s": [], "epochs_to_target": [], "test_accs": [],
                                   "lr": lr_of[v]} for v in POLICIES}
        res["k"] = int(k)
        res["targets"] = []
        others = [v for v in POLICIES if v != "random"]
        for r in range(repeats):
            s = seed + r
            kw = dict(fanouts=fanouts, batch_size=batch_size, hidden=hidden, k=k, bias=bias, seed=s,
                      evals_per_epoch=evals_per_epoch, dense_eval_epochs=dense_eval_epochs)
            warm_up(g, fanouts, batch_size, hidden, s)
            rot = others[r % len(others):] + others[:r % len(others)]
            target = None
            for v in ["random", *rot]:
                first = r == 0
                whole = first or full_cap
                # full cap past the first seed: on to the cap for the final accuracy, unvalidated after the target
                run = train_policy(g, v, epochs=epochs, stats=first, test=whole, lr=lr_of[v],
                                   target=None if first or v == "random" else target, stop_at_target=not full_cap, **kw)
                if v == "random":
                    target = target_fraction * max(run["val_acc"])
                    res["targets"].append(target)
                if first:
                    res[v].update(val_acc=run["val_acc"], val_epochs=run["val_epochs"], val_s=run["val_s"],
                                  loss=run["loss"], test_acc=run["test_acc"], stats=run["stats"])
                i = first_reach(run["val_acc"], target)
                if i is None:
                    per_epoch = run["epoch_s"]
                else:
                    per_epoch = run["val_s"][i] / run["val_epochs"][i]
                res[v]["epoch_s"].append(float(per_epoch))
                res[v]["cap_s"].append(float(per_epoch) * epochs)
                res[v]["epochs_to_target"].append(None if i is None else float(run["val_epochs"][i]))
                res[v]["tta_s"].append(None if i is None else float(run["val_s"][i]))
                if whole:
                    res[v]["test_accs"].append(float(run["test_acc"]))
                log(f"seed {s} {v} (lr {lr_of[v]:g}): {run['steps']} steps, {run['epoch_s']:.3f} s/epoch, last val acc "
                    f"{run['val_acc'][-1]:.4f}" + (f"; target {target:.4f} after {run['val_epochs'][i]:.2f} epochs "
                                                   f"({run['val_s'][i]:.2f} s)" if i is not None else
                                                   f"; target {target:.4f} not reached"))
        res["target"] = res["targets"][0]
        return res
    finally:
        torch.set_num_threads(old_threads)


def sweep_community_batches(g_kwargs: dict, ratios: list[float], nodes: int, communities: dict[float, int],
                            train_kwargs: dict, calibration: dict, log: Callable[[str], None] = lambda s: None
                            ) -> dict[float, dict[str, Any]]:
    """The regime: the comparison on a graph of ``nodes`` nodes at each community size (``communities[x]``
    communities for x batches of training nodes per community), each point with its own learning rates,
    calibrated as the headline's are (``calibration``: lr_grid, epochs, seed, k_grid) on a calibration graph of that
    point's size and another seed; policies timed one after another;
    {x: compare's result, with the graph's communities and the point's calibration}."""
    from .graph import generate

    cal_kw = {k: v for k, v in train_kwargs.items() if k in ("fanouts", "batch_size", "hidden", "k", "bias", "threads",
                                                             "evals_per_epoch")}
    out = {}
    for x in sorted(ratios):
        point = g_kwargs | {"nodes": nodes, "communities": communities[x]}
        cal = calibrate(g_kwargs=point | {"seed": calibration["seed"]}, lr_grid=list(calibration["lr_grid"]),
                        epochs=calibration["epochs"], seed=calibration["seed"], k_grid=calibration.get("k_grid"),
                        log=log, **cal_kw)
        g = generate(**point)
        k = int(cal.get("k", train_kwargs["k"]))
        log(f"regime: {x:g} batches of training nodes per community ({communities[x]} communities on {nodes} nodes), "
            "rates " + ", ".join(f"{v} {lr:g}" for v, lr in cal["lrs"].items()) + f", k {k}")
        out[x] = compare(g, **(train_kwargs | {"lrs": cal["lrs"], "k": k}), log=log) | {"communities": communities[x],
                                                                                "calibration": cal}
    return out
