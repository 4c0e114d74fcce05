"""What FAE, Hotline and Slipstream share around the trainer: the dataset from parameters, the
variants, the interleaved timed runs, time to a common logloss, the accuracy-parity check, the slow-
tier regime, the projection and the part of their results the training runs give (pure; each
system's ``result.build_result`` assembles its own result from these)."""
from __future__ import annotations

import math
import statistics
from typing import Callable

import numpy as np

from mlsys_flows.errors import MlsysError
from mlsys_flows.systems.common.repeats import AdaptiveRepeats
from mlsys_flows.systems.recsys_embeddings.params import HarnessParams
from mlsys_flows.systems.recsys_embeddings.hot import budget_rows, profile_hot_rows
from mlsys_flows.systems.recsys_embeddings.workload import Dataset, generate


class ParityError(MlsysError, AssertionError):
    """A variant trained measurably worse than the hybrid baseline: no speed ratio is reported."""


def dataset(p: HarnessParams) -> Dataset:
    return generate(samples=p.samples, test_samples=p.test_samples, num_tables=p.num_tables, rows_max=p.rows_max,
                    dense_features=p.dense_features, coverage=p.coverage, signal=p.signal, seed=p.seed,
                    hot_share=p.hot_share, popularity_correlation=p.popularity_correlation)


def hot_rows(ds: Dataset, p: HarnessParams, budget_mb: float | None = None) -> tuple[np.ndarray, int]:
    """FAE's profile: the hottest rows of a ``profile_fraction`` sample of the training inputs that
    fit the budget; and the number of inputs profiled."""
    _, ids, _ = ds.split("train")
    budget = budget_rows(p.hot_budget_mb if budget_mb is None else budget_mb, p.embedding_dim)
    return profile_hot_rows(ids, ds.total_rows, p.profile_fraction, max(1, budget), np.random.default_rng([p.seed, 5]))


def config(p: HarnessParams, device: str = "cpu"):
    """The trainer's configuration; ``device``: where the model and the fast tier live (auto, cpu,
    cuda, cuda:N; resolved by the trainer, device.resolve_device)."""
    from mlsys_flows.systems.recsys_embeddings.trainer import TrainConfig

    return TrainConfig(batch_size=p.batch_size, epochs=p.epochs, lr=p.lr, emb_lr=p.emb_lr, dim=p.embedding_dim,
                       bottom=(32,), top=(64,), evals_per_epoch=p.evals_per_epoch, seed=p.seed, threads=p.train_threads,
                       device=str(device))


def regime_config(p: HarnessParams, slow_row_us: float, device: str = "cpu"):
    """The trainer's configuration of one regime point: one epoch, one evaluation, the tier slowed."""
    from dataclasses import replace

    return replace(config(p, device), epochs=1, evals_per_epoch=1, slow_row_us=slow_row_us)


def variant(name: str, p: HarnessParams, hot: np.ndarray | None):
    """``hybrid``, ``fae``, ``hotline``, ``slipstream`` (the hotline pipeline skipping stale inputs;
    its parameters ``snapshot_every``, ``max_skip``, ``max_loss_increase`` and ``probe_samples`` come from
    Slipstream's Params), and the
    mechanism ablations ``cache`` (hybrid with FAE's hot set in the fast tier: FAE without its hot/cold
    input classification) and ``hotline_sync`` (Hotline with the cold rows gathered inline)."""
    from mlsys_flows.systems.recsys_embeddings.trainer import Variant

    extra = {"snapshot_every": p.snapshot_every, "max_skip": p.max_skip, "stale_warmup": p.stale_warmup,
             "max_loss_increase": p.max_loss_increase, "probe_samples": p.probe_samples} \
        if name == "slipstream" else {}
    pipeline = {"slipstream": "hotline", "hotline_sync": "hotline"}.get(name, name)
    return Variant(name, pipeline, None if name == "hybrid" else hot, fae_phase_batches=p.fae_phase_batches,
                   overlap_gather=name != "hotline_sync", skip_stale=name == "slipstream", **extra)


def run_once(ds: Dataset, p: HarnessParams, v, cfg=None, device: str = "cpu") -> dict:
    """One training run of variant ``v`` (``cfg``: the trainer's configuration, default from ``p`` on
    ``device``) as a plain dict (pickles across Dask); ``device`` in it: the device it trained on."""
    from mlsys_flows.systems.recsys_embeddings.trainer import train

    r = train(ds, cfg or config(p, device), v)
    c = r.counters
    gather = c.get("gather_s", 0.0)
    return {"name": r.name, "device": r.device, "h2d_rows": c["h2d_rows"], "d2h_rows": c["d2h_rows"],
            "train_time_s": r.train_time_s, "samples_per_s": r.samples_per_s,
            "test_logloss": r.test_logloss, "test_auc": r.test_auc, "curve": [list(x) for x in r.curve],
            "samples": r.samples, "trained_samples": r.trained_samples,
            "skipped_fraction": c["skipped"] / r.samples, "hot_input_fraction": c["hot_input_fraction"],
            "hot_rows": c["hot_rows"], "rows_gathered": c["rows_gathered"], "rows_sent": c["rows_sent"],
            "syncs": c["syncs"], "sync_rows": c["sync_rows"], "gather_s": gather, "gather_wait_s": c["gather_wait_s"],
            # share of the background gather hidden behind the popular micro-batch (0: the trainer waited
            # for all of it; the wait can exceed the gather's own time by thread wake-up delays)
            "gather_overlap": max(0.0, 1.0 - c["gather_wait_s"] / gather) if gather > 0 else 0.0,
            "stale_threshold": c.get("stale_threshold", 0.0),
            "popular_inputs": c["popular_inputs"], "blocking_gather_s": c["blocking_gather_s"],
            # share of the popular inputs (the only skippable ones) that were skipped
            "popular_skipped": c["skipped"] / max(1, c["skipped"] + c["popular_inputs"]),
            "stale_picks": c.get("stale_picks", 0), "stale_quantile_max": c.get("stale_quantile_max", 0.0),
            "stale_quantile_min": c.get("stale_quantile_min", 0.0), "stale_rule_s": c.get("stale_rule_s", 0.0),
            # Slipstream's re-preparation of its kept inputs after a skip: data-loader work, not timed
            "prepare_s": c.get("prepare_s", 0.0),
            # sleep requested of the slow tier (slow_row_us x rows moved): > 0 makes the run's timings emulated
            "injected_sleep_s": c.get("injected_sleep_s", 0.0),
            # which constraint stopped a larger threshold at each pick (counted): the loss rule or the skip cap
            **{f"stale_bound_{b}": c.get(f"stale_bound_{b}", 0) for b in ("loss", "cap", "both", "none")},
            # share of the training time spent blocked on slow-tier gathers (the updates sent before a
            # gather are applied first, so their cost shows here too)
            "slow_tier_share": (c["blocking_gather_s"] + c["gather_wait_s"]) / r.train_time_s}


def run_interleaved(ds: Dataset, p: HarnessParams, variants: list, reps: AdaptiveRepeats | int,
                    log: Callable[[str], None] = lambda s: None, device: str = "cpu",
                    spec=None) -> dict[str, list[dict]]:
    """Every variant on ``device`` once per repeat, variants interleaved (rotating the order each
    repeat): ``reps`` repeats, or, adaptive, until the verdict of ``spec``'s headline decides (its
    metric must be one a run reports, e.g. samples_per_s)."""
    reps = AdaptiveRepeats(reps) if isinstance(reps, int) else reps
    out: dict[str, list[dict]] = {v.name: [] for v in variants}
    for r in reps:
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for v in order:
            res = run_once(ds, p, v, device=device)
            out[v.name].append(res)
            log(f"repeat {r + 1} {v.name} on {res['device']}: {res['train_time_s']:.2f} s training, "
                f"{res['samples_per_s']:.0f} "
                f"samples/s, test logloss {res['test_logloss']:.4f}, AUC {res['test_auc']:.4f}")
        if spec is not None and reps.adaptive:
            reps.record_headline(spec, {n: [x[spec.headline.metric] for x in rs] for n, rs in out.items()})
    return out


def regime_sweep(ds: Dataset, p: HarnessParams, variants: list,
                 log: Callable[[str], None] = lambda s: None, device: str = "cpu") -> dict[float, dict[str, dict]]:
    """The regime: every variant once at each added slow-tier cost per row of ``p.regime_slow_row_us``,
    on the first ``p.regime_samples`` training inputs for one epoch (the variants' hot rows as given,
    the variants rotated at each point). Returns {cost: {variant: run dict}}."""
    from dataclasses import replace

    sub = ds.head(p.regime_samples, min(p.test_samples, 2_048))
    # a skipping variant's warm-up and snapshot interval shrink with the run (the same share of it)
    frac = sub.train / (p.epochs * ds.train)
    variants = [replace(v, stale_warmup=max(1, round(v.stale_warmup * frac)),
                        snapshot_every=max(1, round(v.snapshot_every * frac))) if v.skip_stale else v
                for v in variants]
    out: dict[float, dict[str, dict]] = {}
    for k, us in enumerate(p.regime_slow_row_us):
        cfg = regime_config(p, us, device)
        out[us] = {}
        for v in variants[k % len(variants):] + variants[:k % len(variants)]:
            r = run_once(sub, p, v, cfg)
            out[us][v.name] = r
            log(f"regime {us:g} us/row {v.name}: {r['train_time_s']:.2f} s, slow-tier share {r['slow_tier_share']:.0%}")
    return out


# What the regime's added cost stands for: the tier process sleeps, it does no slower work (tier.py)
EMULATED_SLOW_TIER = ("the slow tier's added cost per row (slow_row_us > 0): the tier process sleeps n x slow_row_us "
                      "per request of n rows, standing in for a slower slow tier (host-DRAM tables behind PCIe and "
                      "CPU embedding kernels in the papers)")


def parity_break(runs: dict[str, dict], gap: float, compared: tuple[str, ...], baseline: str = "hybrid") -> str:
    """Who broke the headline's accuracy parity at one regime point (a final test logloss more than
    ``gap`` above ``baseline``'s) among the ``compared`` variants present; "" when none did."""
    if baseline not in runs:
        return ""
    base = runs[baseline]["test_logloss"]
    broke = [f"{n} {runs[n]['test_logloss']:.4f}" for n in compared
             if n in runs and runs[n]["test_logloss"] - base > gap]
    return (f"test logloss above {baseline}'s {base:.4f} by more than the parity gap {gap}: " + ", ".join(broke)
            if broke else "")


def injected(us: float, runs: dict[str, dict]) -> bool:
    """Whether a regime point's timings rest on an injected cost: an added cost per row was asked, or
    a run there says its slow tier slept (``injected_sleep_s``). Such a point is emulated."""
    return us > 0 or any(r.get("injected_sleep_s", 0.0) > 0 for r in runs.values())


def regime_result(sweep: dict[float, dict[str, dict]], metric: str, p: HarnessParams, technique: str,
                  baselines: tuple[str, ...]):
    """(RegimeSamples of ``metric`` per point, a note on what the sweep measured, the assumptions of
    its emulated points). ``metric``: ``train_time_s`` (the same inputs, so a lower time is a faster
    time to the same loss) or ``samples_per_s``. A point with an added cost is ``emulated`` (the tier
    sleeps); it is valid when ``technique`` and ``baselines`` kept the headline's accuracy parity there."""
    from mlsys_flows.systems.common.report import Assumption, RegimeSample

    samples = []
    for us, runs in sorted(sweep.items()):
        broke = parity_break(runs, p.parity_gap, (technique, *baselines))
        slept = injected(us, runs)
        samples.append(RegimeSample(value=float(us), samples={n: [r[metric]] for n, r in runs.items()},
                                    kind="emulated" if slept else "measured", valid=not broke, invalid=broke,
                                    emulated=EMULATED_SLOW_TIER if slept else ""))
    shares = ", ".join(f"{us:g} us: {runs['hybrid']['slow_tier_share']:.0%}" for us, runs in sorted(sweep.items())
                       if "hybrid" in runs)
    broken = [f"{s.value:g} us ({s.invalid})" for s in samples if not s.valid]
    what = "training time" if metric == "train_time_s" else "training throughput (samples/s)"
    note = (f"Regime (one run per variant and point; measured at 0 us added, emulated above): the slow tier slowed by "
            f"{', '.join(f'{us:g}' for us in sorted(sweep))} us per row moved (the tier process sleeps that long per "
            f"row gathered, updated or written), each variant trained once on {devices_of(sweep)} on the first "
            f"{p.regime_samples} training inputs for one epoch; the curve compares {what} of the same inputs. "
            f"Accuracy parity (the headline's: final test logloss within {p.parity_gap} of hybrid's) is checked at "
            "every point for the technique and its baselines; "
            + (f"a point where it broke is drawn hollow and left out of the crossover: {'; '.join(broken)}. "
               if broken else "it held at every point. ")
            + f"Hybrid's share of training time blocked on the slow tier: {shares}.")
    assumptions = {"slow_row_us": Assumption(
        value=", ".join(f"{us:g}" for us in sorted(sweep) if us > 0), unit="us per slow-tier row",
        source="parameter regime_slow_row_us, injected: " + EMULATED_SLOW_TIER + "; not measured on such a tier")}
    return samples, note, assumptions


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


# The projection's hardware: the fast tier in GPU HBM next to the compute, the slow tier in host DRAM
# behind PCIe (the papers' setting). Constants, each with its source; the compute is this run's.
PCIE_GB_S = 12.0        # PCIe 3.0 x16: 15.75 GB/s per direction raw, ~12 GB/s achieved by large copies
HOST_ROW_US = 0.1       # one row's host-side gather or row-wise Adagrad update: a random DRAM access (~100 ns)


def projection_assumptions(p: HarnessParams, device: str = "cpu") -> dict:
    """The projection's constants; ``device``: where this run's compute was measured."""
    from mlsys_flows.systems.common.report import Assumption

    where = (f"on this run's GPU ({device}), with the slow tier still a host process behind a socket"
             if device.startswith("cuda") else
             "on this machine's CPU: a GPU computes faster, which raises the slow tier's share, so the projection is "
             "conservative for the techniques")
    return {
        "pcie_gb_s": Assumption(value=PCIE_GB_S, unit="GB/s", source="PCIe 3.0 x16 (15.75 GB/s per direction, the "
                                "papers' V100-class hosts), ~12 GB/s achieved by bulk host-to-device copies"),
        "host_row_us": Assumption(value=HOST_ROW_US, unit="us per row", source="one random host-DRAM access per "
                                  "row gathered or updated (~100 ns DRAM latency of a server CPU)"),
        "row_bytes": Assumption(value=4 * p.embedding_dim, unit="bytes", source="parameter embedding_dim x float32 "
                                "(syncs: one more float, the Adagrad accumulator)"),
        "compute_s": Assumption(value="measured in this run", unit="s", source="each variant's training time minus "
                                "its time blocked on the slow tier (median of the repeats), " + where),
        "rows": Assumption(value="counted in this run", source="rows gathered, rows sent and the syncs' rows of each "
                           "variant's first repeat"),
        "overlap": Assumption(value="hotline: the cold-row gather hides behind the popular micro-batch's compute "
                              "(its share of the trained inputs); others: none", source="the Hotline paper's "
                              "pipeline, as this trainer runs it"),
    }


def projected_time(runs: list[dict], p: HarnessParams, overlapped: bool) -> float:
    """A variant's training seconds with the fast tier in HBM and the slow tier in host memory behind
    PCIe: this run's compute (training time minus the time blocked on the slow tier, median of the
    repeats) plus the counted rows moved at the stated per-row costs; ``overlapped``: the gathers hide
    behind the popular micro-batch's compute (Hotline)."""
    r = runs[0]
    compute = statistics.median(x["train_time_s"] * (1.0 - min(1.0, x["slow_tier_share"])) for x in runs)
    row_s = 4 * p.embedding_dim / (PCIE_GB_S * 1e9) + HOST_ROW_US * 1e-6
    sync_s = r["sync_rows"] * ((4 * p.embedding_dim + 4) / (PCIE_GB_S * 1e9) + HOST_ROW_US * 1e-6)
    gather_s = r["rows_gathered"] * row_s
    if overlapped:
        window = compute * r["popular_inputs"] / max(1, r["trained_samples"])
        gather_s = max(0.0, gather_s - window)
    return compute + gather_s + r["rows_sent"] * row_s + sync_s


def devices_of(runs: dict) -> str:
    """The device the runs trained on, as the trainer resolved it (several joined if they differed):
    ``runs`` is {variant: [run dict]} (run_interleaved) or {cost: {variant: run dict}} (regime_sweep)."""
    flat = [r for rs in runs.values() for r in (rs.values() if isinstance(rs, dict) else rs)]
    return ", ".join(sorted({r.get("device", "cpu") for r in flat})) or "cpu"


def device_note(device: str) -> str:
    """Where the trainer's parts sat and what crossed between them, on ``device`` (a report note)."""
    on_gpu = device.startswith("cuda")
    return (f"Device (recorded per run, as the trainer resolved it): every variant trained on {device}. The dense "
            "model, the fast tier (hot rows and their Adagrad state) and the prepared inputs sat on that device; the "
            "slow tier's tables stayed in host memory behind its own process. Rows gathered from the slow tier were "
            "copied host-to-device and the gradients of slow rows (and FAE's synced hot rows) device-to-host before "
            "they went back, "
            + ("through pinned host buffers with non-blocking copies; the training clock waits for the device's "
               "queued work before each evaluation." if on_gpu else
               "as no-op copies: on the CPU the device and the host are the same memory."))


def loss_curves(runs: dict[str, list[dict]]) -> dict[str, tuple[list[float], list[float]]]:
    """Test logloss against training seconds, first repeat of each variant."""
    return {n: ([c[0] for c in rs[0]["curve"]], [c[2] for c in rs[0]["curve"]]) for n, rs in runs.items()}


def training_result(runs: dict[str, list[dict]], p: HarnessParams, data: dict, profiled: int):
    """(SystemResult, first repeat of each variant): the part of FAE's, Hotline's and Slipstream's
    results their training runs give (metrics, samples, the test-logloss curves and the notes on what
    was measured; the specs declare the kinds). Raises ParityError when a variant misses the parity."""
    from mlsys_flows.systems.common.report import Curve, SystemResult

    variants, samples, gaps, target = summarize(runs, p.parity_gap)
    first = {n: rs[0] for n, rs in runs.items()}
    curves = [Curve(title="test logloss during training (first repeat; evaluation not timed)",
                    x_label="training seconds", y_label="test logloss", series=loss_curves(runs))]
    hot = next((r for n, r in first.items() if n != "hybrid"), None)
    device = devices_of(runs)
    on_gpu = device.startswith("cuda")
    notes = [
        f"Workload: {p.samples} training and {p.test_samples} test samples (a fixed split), {p.num_tables} tables "
        f"(Criteo Kaggle's sizes compressed to at most {p.rows_max} rows; {data['total_rows']} rows in all), one id "
        f"per table, Zipf rows with the hottest 7% of each table's reachable rows taking {p.hot_share:.0%} of its "
        f"accesses (the hottest 7% of all rows take {data['hot_share']:.1%}); labels from a hidden logistic model "
        f"(positive rate {data['positive_rate']:.3f}, its own test logloss {data['bayes_logloss']:.4f}).",
        f"Every variant trained {p.epochs} epoch(s) of batches of {p.batch_size} from the same init (dense SGD lr "
        f"{p.lr}, row-wise Adagrad lr {p.emb_lr} on the embedding rows wherever they live) on {device} with "
        f"{p.train_threads} torch CPU thread(s). The slow tier is a separate process holding every row and its Adagrad state; rows and "
        "gradients cross a Unix socket, so a row gathered from or updated in the slow tier costs real serialization, "
        "copies and a process switch, the same per row in every variant. Input dedup and the hot/cold split are "
        "data-loader work done outside the clock for every variant (before it starts; Slipstream's popular "
        "micro-batch shrunk by a skip is prepared again with the clock paused); skipping decisions and syncs are "
        "timed.",
        f"Accuracy parity (enforced): every variant's final test logloss is within {p.parity_gap} of hybrid's ("
        + ", ".join(f"{n} {g:+.4f}" for n, g in gaps.items()) + "). time_to_logloss_s is the training time until the "
        f"test logloss first reaches {target:.4f}, the worst final logloss of the variants (so every one reaches it), "
        f"linear between the {p.evals_per_epoch} evaluations per epoch; timed metrics are medians of {len(next(iter(runs.values())))} "
        "repeat(s) with the variants interleaved.",
    ]
    if hot is not None:
        notes.append(f"Hot rows: the {hot['hot_rows']} most accessed rows of a {p.profile_fraction:.0%} profile "
                     f"({profiled} inputs) that fit {p.hot_budget_mb} MB; {hot['hot_input_fraction']:.1%} of the "
                     "training inputs touch only hot rows (counted). "
                     + ("The fast tier is a tensor in GPU memory next to the dense compute; the gap between the tiers "
                        "is the slow tier's process boundary plus PCIe copies, not CPU embedding kernels as in the "
                        "papers." if on_gpu else
                        "The fast tier is a torch tensor in the trainer process (no GPU in this run): the gap between "
                        "the tiers is a process boundary, not PCIe and CPU embedding kernels as in the papers, and "
                        "the dense compute runs on the same CPU cores."))
    notes.append(device_note(device))
    share = statistics.median(x["slow_tier_share"] for x in runs["hybrid"])
    notes.append(f"Hybrid spent {share:.0%} of its training time blocked on slow-tier gathers (slow_tier_share, "
                 "measured; sparse updates are applied before the next gather, so their cost is included): a technique "
                 "that removes slow-tier traffic can save at most about that share here, far less than in the papers, "
                 "where the CPU-memory embedding path dominates a GPU training step.")
    return SystemResult(variants=variants, samples=samples, curves=curves, notes=notes), first


def add_regime(result, sweep: dict[float, dict[str, dict]], metric: str, p: HarnessParams, spec,
               extra_note: str = "") -> None:
    """The slow-tier regime into ``result``: its points (the technique and baselines of ``spec``), the
    note (``extra_note`` appended), what its emulated points stand for, and the headline's point (0 us
    added: the training runs leave the tier as it is)."""
    head = spec.headline
    result.regime, note, assumptions = regime_result(sweep, metric, p, head.technique, spec.baselines)
    result.regime_headline_value = 0.0
    result.notes.append(note + extra_note)
    result.assumptions["regime"] = assumptions


def projection(trained: dict, p: HarnessParams, baseline: str, technique: str, overlapped: bool, statement: str,
               per_second: bool = False):
    """The projection at HBM/host-memory constants of ``technique`` (its gather hidden behind compute
    when ``overlapped``) against ``baseline``: projected training seconds, or training samples per
    second when ``per_second``."""
    from mlsys_flows.systems.common.report import Projection

    runs = trained["runs"]
    base, tech = projected_time(runs[baseline], p, False), projected_time(runs[technique], p, overlapped)
    if per_second:
        samples = runs[baseline][0]["samples"]
        base, tech = samples / base, samples / tech
    return Projection(baseline_value=base, technique_value=tech,
                      assumptions=projection_assumptions(p, trained["device"]), statement=statement)
