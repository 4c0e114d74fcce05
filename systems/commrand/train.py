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


def evaluate(model: GraphSAGE, g: Graph, features: torch.Tensor, nodes: np.ndarray, fanouts: tuple[int, ...],
             seed: int, batch_size: int = 2048) -> float:
    """Accuracy on ``nodes`` with the standard (unbiased) sampler and a fixed seed, the same for every
    policy and epoch: an exact count, not timed."""
    rng = np.random.default_rng([seed, 2])
    correct = 0
    model.eval()
    with torch.no_grad():
        for i in range(0, len(nodes), batch_size):
            b = sample_batch(g, nodes[i:i + batch_size], fanouts, rng)
            pred = model(gather(features, b), b).argmax(1).numpy()
            correct += int((pred == g.labels[b.roots]).sum())
    model.train()
    return correct / len(nodes)


def batch_stats(g: Graph, b: Batch) -> dict[str, float]:
    row_bytes = g.features.shape[1] * g.features.itemsize
    return {"unique_nodes": len(b.input_nodes), "pages": pages_touched(b.input_nodes, row_bytes),
            "communities": len(np.unique(g.community_of(b.roots))),
            "sampled": int(sum(blk.nbr.size for blk in b.blocks))}


def train_policy(g: Graph, policy: str, *, fanouts: tuple[int, ...], batch_size: int, hidden: int, lr: float,
                 k: int, bias: float, epochs: int, seed: int, eval_fanouts: tuple[int, ...] | None = None,
                 target: float | None = None, stats: bool = False, test: bool = False) -> dict[str, Any]:
    """Train one policy from the seed's initialisation for up to ``epochs`` epochs (stopping after the
    epoch whose validation accuracy reaches ``target``). Per epoch: the wall time of building the
    batches, sampling, gathering and the optimizer steps (validation is not timed) and the
    validation accuracy. ``bias`` applies to comm_rand only."""
    eval_fanouts = eval_fanouts or fanouts
    features = torch.from_numpy(g.features)
    labels = torch.from_numpy(g.labels)
    torch.manual_seed(seed)
    model = GraphSAGE(g.features.shape[1], hidden, g.classes, len(fanouts))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    p_bias = bias if policy == "comm_rand" else 0.0
    out: dict[str, Any] = {"epoch_s": [], "val_acc": [], "loss": []}
    sums = {"unique_nodes": 0, "pages": 0, "communities": 0, "sampled": 0, "batches": 0}
    for epoch in range(epochs):
        rng = np.random.default_rng([seed, 1, epoch])  # the same stream for every policy
        t0 = time.perf_counter()
        batches = policy_batches(policy, g, batch_size, k, rng)
        spent = time.perf_counter() - t0
        loss_sum = 0.0
        for roots in batches:
            t0 = time.perf_counter()
            b = sample_batch(g, roots, fanouts, rng, p_bias)
            loss = loss_fn(model(gather(features, b), b), labels[torch.from_numpy(b.roots)])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            spent += time.perf_counter() - t0
            loss_sum += float(loss.detach()) * len(roots)
            if stats and epoch == 0:
                for key, v in batch_stats(g, b).items():
                    sums[key] += v
                sums["batches"] += 1
        out["epoch_s"].append(spent)
        out["loss"].append(loss_sum / len(g.train))
        out["val_acc"].append(evaluate(model, g, features, g.val, eval_fanouts, seed))
        if target is not None and out["val_acc"][-1] >= target:
            break
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


def epochs_to(curve: list[float], target: float) -> int | None:
    """1-based epoch at whose end the validation accuracy first reached ``target`` (None: never)."""
    return next((i + 1 for i, a in enumerate(curve) if a >= target), None)


def compare(g: Graph, *, fanouts: tuple[int, ...], batch_size: int, hidden: int, lr: float, k: int, bias: float,
            epochs: int, seed: int, repeats: int, target_fraction: float, threads: int = 1,
            log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """The policies trained on ``g`` with the same initialisation, epochs, lr and seeds, timed one after
    another (never side by side). Each repeat is a training seed (``seed + r``: initialisation, batch
    order, neighbour sampling): random batching trains first, for ``epochs`` epochs, and sets that seed's
    target, ``target_fraction`` of its best validation accuracy; the other policies (their order rotates
    over the seeds) train until they reach it, or for ``epochs`` epochs. The first seed trains every policy
    for all ``epochs`` (the accuracy curves, the final test accuracy, the counted batch statistics).
    Per policy and seed: the mean epoch time, the epoch that reached the target (None: never) and the
    time to it, and the time of the whole epoch cap at the policy's speed (``cap_s``)."""
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        res: dict[str, Any] = {v: {"epoch_s": [], "tta_s": [], "cap_s": [], "epochs_to_target": []} for v in POLICIES}
        res["targets"] = []
        others = [v for v in POLICIES if v != "random"]
        for r in range(repeats):
            s = seed + r
            kw = dict(fanouts=fanouts, batch_size=batch_size, hidden=hidden, lr=lr, k=k, bias=bias, seed=s)
            warm_up(g, fanouts, batch_size, hidden, s)
            rot = others[r % len(others):] + others[:r % len(others)]
            target = None
            for v in ["random", *rot]:
                first = r == 0
                run = train_policy(g, v, epochs=epochs, stats=first, test=first,
                                   target=None if first or v == "random" else target, **kw)
                if v == "random":
                    target = target_fraction * max(run["val_acc"])
                    res["targets"].append(target)
                if first:
                    res[v].update(val_acc=run["val_acc"], loss=run["loss"], test_acc=run["test_acc"],
                                  stats=run["stats"], curve_s=np.cumsum(run["epoch_s"]).tolist())
                reached = epochs_to(run["val_acc"], target)
                times = run["epoch_s"][:reached] if reached else run["epoch_s"]
                res[v]["epoch_s"].append(float(np.mean(times)))
                res[v]["cap_s"].append(float(np.mean(times)) * epochs)
                res[v]["epochs_to_target"].append(reached)
                res[v]["tta_s"].append(float(np.sum(times)) if reached else None)
                log(f"seed {s} {v}: {len(run['epoch_s'])} epochs trained, {np.mean(run['epoch_s']):.3f} s/epoch, "
                    f"last val acc {run['val_acc'][-1]:.4f}" + (f"; target {target:.4f} at epoch {reached} "
                                                                f"({np.sum(times):.2f} s)" if reached else
                                                                f"; target {target:.4f} not reached"))
        res["target"] = res["targets"][0]
        return res
    finally:
        torch.set_num_threads(old_threads)


def sweep_purity(g_kwargs: dict, purities: list[float], nodes: int, train_kwargs: dict,
                 log: Callable[[str], None] = lambda s: None) -> dict[float, dict[str, Any]]:
    """The regime: the comparison on a graph of ``nodes`` nodes at each label purity (one seed, the first),
    policies timed one after another; {purity: compare's result}."""
    from .graph import generate

    out = {}
    for x in sorted(purities):
        g = generate(**(g_kwargs | {"label_purity": x, "nodes": nodes}))
        log(f"regime: label purity {x:g} on {nodes} nodes")
        out[x] = compare(g, **(train_kwargs | {"repeats": 1}), log=log)
    return out
