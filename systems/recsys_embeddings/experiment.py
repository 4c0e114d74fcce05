"""What the three flows share around the trainer: the dataset from parameters, the variants, the
interleaved timed runs, time to a common logloss, and the accuracy-parity check (pure)."""
from __future__ import annotations

import math
import statistics
from typing import Callable

import numpy as np

from mlsys_flows.systems.recsys_embeddings.params import HarnessParams
from mlsys_flows.systems.recsys_embeddings.hot import budget_rows, profile_hot_rows
from mlsys_flows.systems.recsys_embeddings.workload import Dataset, generate


class ParityError(AssertionError):
    """A variant trained measurably worse than the hybrid baseline: no speed ratio is reported."""


def dataset(p: HarnessParams) -> Dataset:
    return generate(samples=p.samples, test_samples=p.test_samples, num_tables=p.num_tables, rows_max=p.rows_max,
                    dense_features=p.dense_features, coverage=p.coverage, signal=p.signal, seed=p.seed,
                    hot_share=p.hot_share)


def hot_rows(ds: Dataset, p: HarnessParams, budget_mb: float | None = None) -> tuple[np.ndarray, int]:
    """FAE's profile: the hottest rows of a ``profile_fraction`` sample of the training inputs that
    fit the budget; and the number of inputs profiled."""
    _, ids, _ = ds.split("train")
    budget = budget_rows(p.hot_budget_mb if budget_mb is None else budget_mb, p.embedding_dim)
    return profile_hot_rows(ids, ds.total_rows, p.profile_fraction, max(1, budget), np.random.default_rng([p.seed, 5]))


def config(p: HarnessParams):
    from mlsys_flows.systems.recsys_embeddings.trainer import TrainConfig

    return TrainConfig(batch_size=p.batch_size, epochs=p.epochs, lr=p.lr, emb_lr=p.emb_lr, dim=p.embedding_dim,
                       bottom=(32,), top=(64,), evals_per_epoch=p.evals_per_epoch, seed=p.seed, threads=p.train_threads)


def variant(name: str, p: HarnessParams, hot: np.ndarray | None):
    """``hybrid``, ``fae``, ``hotline`` or ``slipstream`` (the hotline pipeline skipping stale inputs;
    its parameters ``snapshot_every`` and ``max_skip`` come from Slipstream's Params)."""
    from mlsys_flows.systems.recsys_embeddings.trainer import Variant

    extra = {"snapshot_every": p.snapshot_every, "max_skip": p.max_skip} if name == "slipstream" else {}
    pipeline = {"slipstream": "hotline"}.get(name, name)
    return Variant(name, pipeline, None if name == "hybrid" else hot, fae_phases=p.fae_phases,
                   skip_stale=name == "slipstream", **extra)


def run_once(ds: Dataset, p: HarnessParams, v) -> dict:
    """One training run of variant ``v`` as a plain dict (pickles across Dask)."""
    from mlsys_flows.systems.recsys_embeddings.trainer import train

    r = train(ds, config(p), v)
    c = r.counters
    gather = c.get("gather_s", 0.0)
    return {"name": r.name, "train_time_s": r.train_time_s, "samples_per_s": r.samples_per_s,
            "test_logloss": r.test_logloss, "test_auc": r.test_auc, "curve": [list(x) for x in r.curve],
            "samples": r.samples, "trained_samples": r.trained_samples,
            "skipped_fraction": c["skipped"] / r.samples, "hot_input_fraction": c["hot_input_fraction"],
            "hot_rows": c["hot_rows"], "rows_gathered": c["rows_gathered"], "rows_sent": c["rows_sent"],
            "syncs": c["syncs"], "sync_rows": c["sync_rows"], "gather_s": gather, "gather_wait_s": c["gather_wait_s"],
            # share of the background gather hidden behind the popular micro-batch (0: the trainer waited
            # for all of it; the wait can exceed the gather's own time by thread wake-up delays)
            "gather_overlap": max(0.0, 1.0 - c["gather_wait_s"] / gather) if gather > 0 else 0.0,
            "stale_threshold": c.get("stale_threshold", 0.0),
            # share of the training time spent blocked on slow-tier gathers (the updates sent before a
            # gather are applied first, so their cost shows here too)
            "slow_tier_share": (c["blocking_gather_s"] + c["gather_wait_s"]) / r.train_time_s}


def run_interleaved(ds: Dataset, p: HarnessParams, variants: list, repeats: int,
                    log: Callable[[str], None] = lambda s: None) -> dict[str, list[dict]]:
    """Every variant ``repeats`` times, variants interleaved (rotating the order each repeat)."""
    out: dict[str, list[dict]] = {v.name: [] for v in variants}
    for r in range(repeats):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for v in order:
            res = run_once(ds, p, v)
            out[v.name].append(res)
            log(f"repeat {r + 1}/{repeats} {v.name}: {res['train_time_s']:.2f} s training, {res['samples_per_s']:.0f} "
                f"samples/s, test logloss {res['test_logloss']:.4f}, AUC {res['test_auc']:.4f}")
    return out


def time_to_target(curve: list, target: float) -> float:
    """Training seconds until the test logloss first reaches ``target`` (linear between evaluations);
    inf when it never does."""
    for (t0, _, l0, _), (t1, _, l1, _) in zip(curve, curve[1:]):
        if l1 <= target:
            if l0 <= target:
                return t0
            return t0 + (t1 - t0) * (l0 - target) / (l0 - l1)
    return math.inf


def check_parity(runs: dict[str, list[dict]], gap: float, baseline: str = "hybrid") -> dict[str, float]:
    """Each variant's final test logloss minus the baseline's (first repeat; the math is the same in
    every repeat); raises ParityError when any exceeds ``gap``."""
    base = runs[baseline][0]["test_logloss"]
    gaps = {n: rs[0]["test_logloss"] - base for n, rs in runs.items()}
    worse = {n: g for n, g in gaps.items() if g > gap}
    if worse:
        raise ParityError(f"accuracy parity failed: test logloss above {baseline}'s {base:.4f} by more than {gap}: "
                          + ", ".join(f"{n} +{g:.4f}" for n, g in worse.items()))
    return gaps


def summarize(runs: dict[str, list[dict]], gap: float) -> tuple[dict, dict, dict, float]:
    """(variants, samples, gaps, target): counted metrics from the first repeat, timed metrics per
    repeat; the target logloss is the worst final logloss of the variants (every one reaches it)."""
    gaps = check_parity(runs, gap)
    target = max(rs[0]["test_logloss"] for rs in runs.values())
    variants, samples = {}, {}
    for n, rs in runs.items():
        r = rs[0]
        variants[n] = {"test_logloss": r["test_logloss"], "test_auc": r["test_auc"], "logloss_gap": gaps[n],
                       "hot_input_fraction": r["hot_input_fraction"], "hot_rows": r["hot_rows"],
                       "rows_gathered": r["rows_gathered"], "rows_sent": r["rows_sent"], "syncs": r["syncs"],
                       "sync_rows": r["sync_rows"], "skipped_fraction": r["skipped_fraction"]}
        samples[n] = {"time_to_logloss_s": [time_to_target(x["curve"], target) for x in rs],
                      "train_time_s": [x["train_time_s"] for x in rs],
                      "samples_per_s": [x["samples_per_s"] for x in rs]}
        samples[n]["slow_tier_share"] = [x["slow_tier_share"] for x in rs]
        if r["gather_s"] > 0:
            samples[n]["gather_overlap"] = [x["gather_overlap"] for x in rs]
    return variants, samples, gaps, target


KINDS = {"time_to_logloss_s": "measured", "train_time_s": "measured", "samples_per_s": "measured",
         "gather_overlap": "measured", "slow_tier_share": "measured", "test_logloss": "counted", "test_auc": "counted", "logloss_gap": "counted",
         "hot_input_fraction": "counted", "hot_rows": "counted", "rows_gathered": "counted", "rows_sent": "counted",
         "syncs": "counted", "sync_rows": "counted", "skipped_fraction": "counted"}


def loss_curves(runs: dict[str, list[dict]]) -> dict[str, tuple[list[float], list[float]]]:
    """Test logloss against training seconds, first repeat of each variant."""
    return {n: ([c[0] for c in rs[0]["curve"]], [c[2] for c in rs[0]["curve"]]) for n, rs in runs.items()}


def build_result(runs: dict[str, list[dict]], p: HarnessParams, data: dict, profiled: int):
    """The SystemResult the three flows share: metrics, samples, the test-logloss curves and the notes
    on what was measured. Raises ParityError when a variant misses the accuracy parity."""
    from mlsys_flows.systems.common.report import Curve, SystemResult

    variants, samples, gaps, target = summarize(runs, p.parity_gap)
    kinds = {m: KINDS[m] for m in {m for v in variants.values() for m in v} | {m for v in samples.values() for m in v}}
    first = {n: rs[0] for n, rs in runs.items()}
    curves = [Curve(title="test logloss during training (first repeat; evaluation not timed)",
                    x_label="training seconds", y_label="test logloss", series=loss_curves(runs))]
    hot = next((r for n, r in first.items() if n != "hybrid"), None)
    notes = [
        f"Workload: {p.samples} training and {p.test_samples} test samples (a fixed split), {p.num_tables} tables "
        f"(Criteo Kaggle's sizes compressed to at most {p.rows_max} rows; {data['total_rows']} rows in all), one id "
        f"per table, Zipf rows with the hottest 7% of each table's reachable rows taking {p.hot_share:.0%} of its "
        f"accesses (the hottest 7% of all rows take {data['hot_share']:.1%}); labels from a hidden logistic model "
        f"(positive rate {data['positive_rate']:.3f}, its own test logloss {data['bayes_logloss']:.4f}).",
        f"Every variant trained {p.epochs} epoch(s) of batches of {p.batch_size} from the same init (dense SGD lr "
        f"{p.lr}, row-wise Adagrad lr {p.emb_lr} on the embedding rows wherever they live) with {p.train_threads} "
        "torch thread(s). The slow tier is a separate process holding every row and its Adagrad state; rows and "
        "gradients cross a Unix socket, so a row gathered from or updated in the slow tier costs real serialization, "
        "copies and a process switch, the same per row in every variant. Input dedup and the hot/cold split are "
        "data-loader work done before the clock starts, for every variant; skipping decisions and syncs are timed.",
        f"Accuracy parity (enforced): every variant's final test logloss is within {p.parity_gap} of hybrid's ("
        + ", ".join(f"{n} {g:+.4f}" for n, g in gaps.items()) + "). time_to_logloss_s is the training time until the "
        f"test logloss first reaches {target:.4f}, the worst final logloss of the variants (so every one reaches it), "
        f"linear between the {p.evals_per_epoch} evaluations per epoch; timed metrics are medians of {p.repeats} "
        "repeat(s) with the variants interleaved.",
    ]
    if hot is not None:
        notes.append(f"Hot rows: the {hot['hot_rows']} most accessed rows of a {p.profile_fraction:.0%} profile "
                     f"({profiled} inputs) that fit {p.hot_budget_mb} MB; {hot['hot_input_fraction']:.1%} of the "
                     "training inputs touch only hot rows (counted). The fast tier is a torch tensor in the trainer "
                     "process (no GPU here): the gap between the tiers is a process boundary, not PCIe and CPU "
                     "embedding kernels as in the papers, and the dense compute runs on the same CPU cores.")
    share = statistics.median(x["slow_tier_share"] for x in runs["hybrid"])
    notes.append(f"Hybrid spent {share:.0%} of its training time blocked on slow-tier gathers (slow_tier_share, "
                 "measured; sparse updates are applied before the next gather, so their cost is included): a technique "
                 "that removes slow-tier traffic can save at most about that share here, far less than in the papers, "
                 "where the CPU-memory embedding path dominates a GPU training step.")
    return SystemResult(variants=variants, kinds=kinds, samples=samples, curves=curves, notes=notes), first
