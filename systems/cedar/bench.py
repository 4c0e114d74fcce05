"""Measure one pipeline four ways on the same data (pure): torch DataLoader at each candidate
``num_workers``, the caching DataLoader (the same loader keeping the outputs of the pipeline's
deterministic prefix in memory after the first epoch, tf.data's ``.cache()`` placed by a careful
user), cedar as written, cedar optimized. Each DataLoader baseline's ``num_workers`` is chosen on a
calibration split (the first few source items, timed apart, before the evaluated runs: what a
careful user does); the plain loader's best ``num_workers`` in the evaluated runs themselves is kept
beside it as an oracle (chosen in hindsight). Runs are interleaved; each run is ``epochs`` full
passes. A DataLoader run builds one DataLoader and keeps its (persistent) workers, and the caching
one its cache, across the epochs; the optimized run's time includes profiling, optimizing, its
trials, starting workers and writing its cache (a fresh cache every run, for both caches). After
timing, every variant's outputs are checked against cedar as written: a difference fails the run."""
from __future__ import annotations

import math
import shutil
import tempfile
import time
import uuid
from dataclasses import replace
from typing import Any, Callable

from mlsys_flows.errors import MlsysError
from mlsys_flows.systems.cedar import OPTIMIZED_EPOCHS
from mlsys_flows.systems.cedar.api import Pipeline
from mlsys_flows.systems.cedar.pipeline import Cache, DirStore, Plan, Stage, deterministic_prefix, store_label
from mlsys_flows.systems.cedar.workloads import TorchLoader, count, multiset
from mlsys_flows.systems.common.timing import interleaved, median


class OutputsDiffer(MlsysError, RuntimeError):
    """A variant's outputs are not the same multiset of samples as cedar as written."""


class PrefixedStore:
    """Keys of ``store`` under ``prefix`` (one fresh cache per measured run)."""

    def __init__(self, store: Any, prefix: str):
        self.store, self.prefix = store, prefix.strip("/")

    def write_bytes(self, key: str, data: bytes):
        return self.store.write_bytes(f"{self.prefix}/{key}", data)

    def read_bytes(self, key: str) -> bytes:
        return self.store.read_bytes(f"{self.prefix}/{key}")

    def exists(self, key: str) -> bool:
        return self.store.exists(f"{self.prefix}/{key}")

    def delete(self, key: str = "") -> None:
        """Remove ``key`` (default: everything under the prefix)."""
        full = f"{self.prefix}/{key}".rstrip("/")
        if isinstance(self.store, DirStore):
            shutil.rmtree(f"{self.store.root}/{full}", ignore_errors=True)
        elif callable(getattr(self.store, "delete", None)):
            self.store.delete(full)

    def __repr__(self) -> str:
        return f"{store_label(self.store)}/{self.prefix}"


def _epochs(batches_of_epoch: Callable[[int], Any], epochs: int) -> tuple[float, int]:
    n = 0
    t0 = time.perf_counter()
    for e in range(epochs):
        for b in batches_of_epoch(e):
            n += count(b)
    return time.perf_counter() - t0, n


def _loader_epochs(pipe: Pipeline, workers: int, epochs: int, prefetch_factor: int,
                   cache: bool = False) -> tuple[float, int]:
    """One DataLoader for all epochs (``cache``: the caching one, a fresh cache every run); its
    construction and worker start-up are timed too."""
    n = 0
    t0 = time.perf_counter()
    with TorchLoader(pipe, workers, prefetch_factor, cache=cache) as loader:
        for _ in range(epochs):
            for b in loader.epoch():
                n += count(b)
    return time.perf_counter() - t0, n


def _steady_loader_s(pipe: Pipeline, workers: int, epochs: int, prefetch_factor: int, cache: bool = False) -> float:
    """Seconds of one DataLoader's epochs after the first (the first starts its workers: on a small
    calibration split that start-up would dominate, while the evaluated runs amortize it over the
    whole data); with one epoch, that epoch."""
    with TorchLoader(pipe, workers, prefetch_factor, cache=cache) as loader:
        t0 = time.perf_counter()
        for e in range(epochs):
            if e == 1:
                t0 = time.perf_counter()
            for _ in loader.epoch():
                pass
        return time.perf_counter() - t0


def _whole_runs(pipe: Pipeline, workers_grid: list[int], epochs: int, prefetch_factor: int, cache: bool,
                trials: int) -> dict[int, float]:
    """Per candidate num_workers, the median of ``trials`` whole timed runs (start-up and, caching, the cache
    fill included), the candidates interleaved trial by trial (one slow moment does not pick the choice)."""
    runs: dict[int, list[float]] = {w: [] for w in workers_grid}
    for _ in range(max(1, trials)):
        for w in workers_grid:
            runs[w].append(_loader_epochs(pipe, w, epochs, prefetch_factor, cache=cache)[0])
    return {w: median(ts) for w, ts in runs.items()}


def calibrate_workers(pipe: Pipeline, workers_grid: list[int], epochs: int,
                      prefetch_factor: int = 4, startup: bool = False, trials: int = 1) -> tuple[int, dict[int, float]]:
    """(num_workers, seconds per candidate): each candidate DataLoader run once over ``epochs`` on
    ``pipe`` (a calibration split) and timed at its steady rate (the epochs after the first), the
    fastest chosen. ``startup``: time each candidate's whole run instead, worker start-up included
    (for a split that is a sizeable share of the evaluated data), the median of ``trials`` runs each."""
    if startup:
        times = _whole_runs(pipe, workers_grid, epochs, prefetch_factor, False, trials)
    else:
        times = {w: _steady_loader_s(pipe, w, epochs, prefetch_factor) for w in workers_grid}
    return min(times, key=times.get), times


def calibrate_cached_workers(pipe: Pipeline, workers_grid: list[int], epochs: int, prefetch_factor: int,
                             plain: dict[int, float], startup: bool = False,
                             trials: int = 1) -> tuple[int, dict[int, float]]:
    """(num_workers, estimated seconds per candidate) of the caching DataLoader on the calibration
    split ``pipe``: its first epoch computes everything, as the plain DataLoader does (``plain``: the
    plain candidates' steady seconds over the epochs after the first, from ``calibrate_workers``),
    and its later epochs are served from its cache, timed here at their steady rate (a fresh cached
    loader per candidate). The estimate is one plain epoch plus the cached epochs; the fastest is
    chosen. With one epoch there is nothing to cache and the plain choice stands."""
    if startup:  # each candidate's whole cached run, start-up and cache fill included (median of ``trials``)
        times = _whole_runs(pipe, workers_grid, epochs, prefetch_factor, True, trials)
        return min(times, key=times.get), times
    if epochs <= 1:
        return min(plain, key=plain.get), dict(plain)
    times = {w: plain[w] / (epochs - 1) + _steady_loader_s(pipe, w, epochs, prefetch_factor, cache=True)
             for w in workers_grid}
    return min(times, key=times.get), times


def optimized_epochs(pipe: Pipeline, epochs: int, profile_samples: int, cache: Any, remote: Any = None,
                     remote_workers: int = 0) -> tuple[float, float, int, Pipeline]:
    """(optimize seconds, epochs seconds, samples, the optimized pipeline, closed) of cedar optimized:
    profile, optimize (trials, workers) and ``epochs`` passes, with a fresh cache under ``cache``;
    ``remote``/``remote_workers``: an executor (Dask workers) the optimizer may offload to."""
    store = PrefixedStore(cache, f"run-{uuid.uuid4().hex[:8]}")
    t0 = time.perf_counter()
    try:
        with pipe.optimize(epochs=epochs, sample=profile_samples, cache=store, remote=remote,
                           remote_workers=remote_workers) as opt:
            t_opt = time.perf_counter() - t0
            t, n = _epochs(opt.iterate, epochs)
    finally:
        store.delete()
        pipe.close()
    return t_opt, t, n, opt


def bench_pipeline(build: Callable[[int | None], Pipeline], *, epochs: int, repeats: int, workers_grid: list[int],
                   profile_samples: int, cache: Any = None, prefetch_factor: int = 4, verify_items: int = 48,
                   calibrate_items: int = 16, log: Callable[[str], None] = print, remote: Any = None,
                   remote_workers: int = 0) -> dict:
    """Returns per-repeat times and medians per variant, the optimized plan and the verified
    variants. Raises OutputsDiffer when a variant's outputs differ from cedar as written.
    ``calibrate_items``: source items of the split the DataLoader's num_workers is chosen on.
    ``remote``/``remote_workers``: an executor with ``submit(fn, *args)`` (Dask workers) that cedar
    optimized may offload to when its cost model and a measured trial say so."""
    import torch.utils.data  # noqa: F401 - imported before timing, not inside the first measured run

    calib = build(calibrate_items)
    try:
        calibrated_w, calib_times = calibrate_workers(calib, workers_grid, epochs, prefetch_factor)
        cached_w, cached_times = calibrate_cached_workers(calib, workers_grid, epochs, prefetch_factor, calib_times)
    finally:
        calib.close()
    log("DataLoader calibration on " + f"{calibrate_items} source items: "
        + ", ".join(f"num_workers={w} {t:.2f} s" for w, t in calib_times.items()) + f" -> {calibrated_w}")
    log("caching DataLoader calibration (one plain epoch + cached epochs): "
        + ", ".join(f"num_workers={w} {t:.2f} s" for w, t in cached_times.items()) + f" -> {cached_w}")
    pipe = build(None)
    own_dir = None
    if cache is None:
        own_dir = tempfile.mkdtemp(prefix="cedar-cache-")
        cache = DirStore(own_dir)
    counts: dict[str, set[int]] = {}
    plans: list[str] = []
    decisions: list[list[dict]] = []
    timed_plans: list = []
    opt_shares: list[float] = []
    epochs_only: list[float] = []

    def note(name: str, t_n: tuple[float, int]) -> float:
        counts.setdefault(name, set()).add(t_n[1])
        return t_n[0]

    def run_dataloader(w: int) -> Callable[[], float]:
        return lambda: note(f"dataloader_w{w}", _loader_epochs(pipe, w, epochs, prefetch_factor))

    def run_cached() -> float:
        return note("dataloader_cached", _loader_epochs(pipe, cached_w, epochs, prefetch_factor, cache=True))

    def run_cedar() -> float:
        return note("cedar", _epochs(pipe.iterate, epochs))

    def run_optimized() -> float:
        t_opt, t, n, opt = optimized_epochs(build(None), epochs, profile_samples, cache, remote, remote_workers)
        plans.append(opt.explain())
        timed_plans.append(opt.plan)
        decisions.append([{"rule": d.rule, "applied": d.applied, "detail": d.detail, "est_gain_s": d.est_gain_s,
                           "transfer": d.transfer} for d in opt.plan.decisions])
        opt_shares.append(optimize_share(t_opt, t))
        epochs_only.append(t)  # the same run without its fixed cost (diagnostic: not deployable)
        log(f"cedar_optimized: optimize {t_opt:.2f} s + {epochs} epochs {t:.2f} s")
        return note("cedar_optimized", (t_opt + t, n))

    variants = {f"dataloader_w{w}": run_dataloader(w) for w in workers_grid}
    variants |= {"dataloader_cached": run_cached, "cedar": run_cedar, "cedar_optimized": run_optimized}
    try:
        times = rotated(variants, repeats)
        times[OPTIMIZED_EPOCHS] = epochs_only  # paired by repeat with every variant's runs
        sizes = {n for c in counts.values() for n in c}
        if len(sizes) != 1:
            raise OutputsDiffer(f"variants delivered different sample counts per run: {counts}")
        distinct = {_plan_key(pl): pl for pl in timed_plans}  # the plans the repeats chose
        checked = verify(build, verify_items, epochs, profile_samples, cache, workers_grid, prefetch_factor,
                         plans=list(distinct.values()), remote=remote, remote_workers=remote_workers)
    finally:
        pipe.close()
        if own_dir:
            shutil.rmtree(own_dir, ignore_errors=True)
    samples = sizes.pop()
    med = {k: median(v) for k, v in times.items()}
    best_w = min(workers_grid, key=lambda w: med[f"dataloader_w{w}"])
    out = {k: {"samples_per_s": samples / s, "seconds": s} for k, s in med.items()}
    out["dataloader"] = dict(out[f"dataloader_w{calibrated_w}"], num_workers=float(calibrated_w))
    out["dataloader_oracle"] = dict(out[f"dataloader_w{best_w}"], num_workers=float(best_w))
    out["dataloader_cached"]["num_workers"] = float(cached_w)
    return {"variants": out, "samples": samples, "epochs": epochs, "best_num_workers": best_w,
            "calibrated_num_workers": calibrated_w, "calibration_s": {str(w): t for w, t in calib_times.items()},
            "calibrate_items": calibrate_items,
            "cached_num_workers": cached_w, "cached_calibration_s": {str(w): t for w, t in cached_times.items()},
            "optimize_share": median(opt_shares),
            "cached_ops": [op.name for op in pipe.ops[:deterministic_prefix(pipe.ops[:-1])]],
            "plan": plans[-1], "plan_as_written": pipe.explain(), "decisions": decisions[-1],
            "offloads": offload_choices(timed_plans), "verified": checked, "times": times}


def _split_of(pipe: Pipeline) -> dict[str, int] | None:
    """The calibration split's first sample id, its size and seed (a list source of {"id": ...} items), else None."""
    refs = getattr(pipe.source, "refs", None)
    if not refs or not isinstance(refs[0], dict) or "id" not in refs[0]:
        return None
    return {"first": int(refs[0]["id"]), "items": len(refs), "seed": int(pipe.seed)}


def optimize_share(t_opt: float, t_epochs: float) -> float:
    """optimize()'s share of one cedar optimized run: its seconds (profiling, trials, worker start-up) over the
    whole run's, optimize() plus the epochs."""
    if t_opt < 0 or t_epochs < 0 or t_opt + t_epochs <= 0:
        raise ValueError(f"optimize share needs non-negative times, not both 0 (got {t_opt}, {t_epochs})")
    return t_opt / (t_opt + t_epochs)


def rotated(variants: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """``interleaved``, with the first variant rotating from one repeat to the next (no variant
    always follows the same one)."""
    names = list(variants)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        k = r % len(names)
        for n, ts in interleaved({n: variants[n] for n in names[k:] + names[:k]}, 1).items():
            out[n] += ts
    return out


def offload_choices(plans: list[Plan]) -> list[str]:
    """Per timed run, where its stages ran and how results came back, e.g. 'cold: process
    (shared_memory), warm: inline'; one entry per distinct choice, in order of first use."""
    out: list[str] = []
    for plan in plans:
        parts = []
        for s in plan.steps:
            if not isinstance(s, Stage) or not s.fused:
                continue
            phases = {"cold": s.cold} | ({"warm": s.warm} if s.cache_ops else {})
            parts.append(", ".join(f"{ph}: {ex}" + (f" ({plan.transfer})" if ex == "process" else
                                                     " (Dask)" if ex == "remote" else "")
                                   for ph, ex in phases.items()))
        text = "; ".join(parts) or "no stage"
        if text not in out:
            out.append(text)
    return out


def _plan_key(plan: Plan) -> tuple:
    return (plan.chunk, plan.cache is not None, plan.prefetch,
            tuple((s.label(), s.cold, s.warm, s.cache_ops) if isinstance(s, Stage) else s.label() for s in plan.steps))


def verify(build: Callable[[int | None], Pipeline], items: int, epochs: int, profile_samples: int, cache: Any,
           workers_grid: list[int] = (1,), prefetch_factor: int = 4, plans: list[Plan] = (), remote: Any = None,
           remote_workers: int = 0) -> list[str]:
    """Check that every variant yields the same multiset of samples as cedar as written, on the
    first ``items`` source items, in epochs 0 and 1 (so cached plans also serve from their cache
    and random operators are redrawn): the DataLoader and the caching DataLoader at each
    ``num_workers`` (one loader across both epochs, as timed; the caching one serves epoch 1 from its
    cache), cedar optimized with every legal rewrite (``mode="always"``) and each optimized plan in
    ``plans`` (those the timed runs used). With a ``remote`` executor, also cedar optimized with every
    rewrite offloading to it. Returns the variants checked; raises
    OutputsDiffer naming each variant and epoch that differs."""
    pipe = build(items)
    stores = [PrefixedStore(cache, f"verify-{uuid.uuid4().hex[:8]}") for _ in range(2 + len(plans))]
    checked, bad = [], []
    try:
        refs = [multiset(pipe.iterate(e)) for e in range(2)]

        def check(name: str, epochs_out: list[dict[str, int]]) -> None:
            checked.append(name)
            for e, (got, ref) in enumerate(zip(epochs_out, refs)):
                if got != ref:
                    missing = sum((ref[k] - got.get(k, 0)) for k in ref if ref[k] > got.get(k, 0))
                    extra = sum((got[k] - ref.get(k, 0)) for k in got if got[k] > ref.get(k, 0))
                    bad.append(f"{name} epoch {e}: {missing} of {sum(ref.values())} samples of cedar as written "
                               f"missing, {extra} other samples")

        for w in workers_grid:
            with TorchLoader(pipe, w, prefetch_factor) as loader:
                check(f"dataloader_w{w}", [multiset(loader.epoch()) for _ in range(2)])
        for w in workers_grid:  # the caching DataLoader: epoch 1 comes from its cache
            with TorchLoader(pipe, w, prefetch_factor, cache=True) as loader:
                check(f"dataloader_cached_w{w}", [multiset(loader.epoch()) for _ in range(2)])
        with pipe.optimize(epochs=max(2, epochs), sample=min(profile_samples, items), cache=stores[0],
                           mode="always") as opt:
            check("cedar_optimized (every rewrite)", [multiset(opt.iterate(e)) for e in range(2)])
        if remote is not None and remote_workers > 0:
            with pipe.optimize(epochs=max(2, epochs), sample=min(profile_samples, items), cache=stores[-1],
                               mode="always", workers=1, remote=remote, remote_workers=remote_workers) as opt:
                check("cedar_optimized (every rewrite, on Dask workers)", [multiset(opt.iterate(e)) for e in range(2)])
        for k, plan in enumerate(plans, start=1):  # a timed run's plan on this source, with a cache of its own
            cache_obj = Cache(stores[k], "cedar-cache/timed") if plan.cache is not None else None
            with Pipeline(pipe.source, pipe.ops, pipe.seed, plan=replace(plan, cache=cache_obj), remote=remote) as timed:
                check("cedar_optimized (timed plan)" if len(plans) == 1 else f"cedar_optimized (timed plan {k})",
                      [multiset(timed.iterate(e)) for e in range(2)])
    finally:
        for st in stores:
            st.delete()
        pipe.close()
    if bad:
        raise OutputsDiffer("outputs differ from cedar as written (same source items, same epochs): "
                            + "; ".join(bad) + ". A rewrite or an operator's marks (deterministic, random, "
                            "reads/writes, order_sensitive) are wrong; the run's timings are not comparable.")
    return checked


def geomean(xs: list[float]) -> float:
    """Geometric mean of positive numbers."""
    if not xs or any(x <= 0 for x in xs):
        raise ValueError(f"geometric mean needs positive values (got {xs})")
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


KINDS = ("dataloader", "dataloader_cached", "dataloader_oracle", "cedar", "cedar_optimized", OPTIMIZED_EPOCHS)


def aggregate(results: dict[str, dict]) -> dict[str, dict[str, list[float]]]:
    """Aggregate variants over the pipelines, one value per repeat (repeat i of every pipeline,
    which ran interleaved): ``geomean_samples_per_s``, the geometric mean over the pipelines of
    each one's samples/s (the ratio of two such means is exactly the geometric mean of the
    per-pipeline ratios, the paper's average), and ``seconds``, the summed run time."""
    out: dict[str, dict[str, list[float]]] = {}
    for kind in KINDS:
        per_pipeline = [[r["samples"] / s for s in _times(r, kind)] for r in results.values()]
        seconds = [sum(ts) for ts in zip(*(_times(r, kind) for r in results.values()))]
        out[kind] = {"geomean_samples_per_s": [geomean(list(rates)) for rates in zip(*per_pipeline)],
                     "seconds": seconds}
    return out


def _times(r: dict, kind: str) -> list[float]:
    """The run times of ``kind``: the DataLoader at its calibrated num_workers (``dataloader``) or at
    the best one in the evaluated runs (``dataloader_oracle``)."""
    if kind == "dataloader":
        return r["times"][f"dataloader_w{r['calibrated_num_workers']}"]
    if kind == "dataloader_oracle":
        return r["times"][f"dataloader_w{r['best_num_workers']}"]
    return r["times"][kind]


def summarize(results: dict[str, dict]):
    """Variants, samples, curves and notes of a run over several pipelines: the aggregate
    variants (see ``aggregate``) and, per pipeline, ``<name>/<variant>`` with samples/s and
    seconds per repeat (and the DataLoader's chosen num_workers)."""
    from mlsys_flows.systems.common.report import Curve

    samples = aggregate(results)
    kinds = KINDS
    variants: dict[str, dict[str, float]] = {kind: {} for kind in kinds}
    for name, r in results.items():
        for kind in kinds:
            ts = _times(r, kind)
            samples[f"{name}/{kind}"] = {"seconds": list(ts), "samples_per_s": [r["samples"] / s for s in ts]}
            variants[f"{name}/{kind}"] = {}
        variants[f"{name}/dataloader"] = {"num_workers": float(r["calibrated_num_workers"])}
        variants[f"{name}/dataloader_oracle"] = {"num_workers": float(r["best_num_workers"])}
        variants[f"{name}/dataloader_cached"] = {"num_workers": float(r["cached_num_workers"])}
        if "optimize_share" in r:  # median over the repeats of optimize()'s seconds / cedar optimized's run
            variants["cedar_optimized"][f"optimize_share_{name}"] = float(r["optimize_share"])
    curves = [Curve(title="DataLoader num_workers sweep (evaluated runs; the fastest is the oracle)", x_label="num_workers",
                    y_label="samples/s",
                    series={name: ([float(k.rsplit("w", 1)[1]) for k in r["variants"] if k.startswith("dataloader_w")],
                                   [v["samples_per_s"] for k, v in r["variants"].items() if k.startswith("dataloader_w")])
                            for name, r in results.items()}),
              Curve(title="throughput per pipeline", y_label="samples/s",
                    x_label="pipeline (" + ", ".join(f"{i}: {n}" for i, n in enumerate(results)) + ")",
                    series={kind: (list(range(len(results))), [r["variants"][kind]["samples_per_s"]
                                                                for r in results.values()]) for kind in kinds})]
    notes = [
        f"Aggregate variants ({', '.join(kinds)}): geomean_samples_per_s is, per repeat, the "
        f"geometric mean over the {len(results)} pipelines ({', '.join(results)}) of each pipeline's samples/s, so "
        f"the headline ratio is the geometric mean of the per-pipeline ratios (the paper averages its pipelines' "
        f"speedups); seconds is the summed run time.",
    ]
    for name, r in results.items():
        v = r["variants"]
        sweep = ", ".join(f"{k[len('dataloader_w'):]}: {x['samples_per_s']:.0f}/s" for k, x in v.items()
                          if k.startswith("dataloader_w"))
        notes.append(
            f"{name}: {r['samples']} samples per run ({r['epochs']} epochs); DataLoader (one loader across the epochs, "
            f"persistent workers): num_workers={r['calibrated_num_workers']} chosen on a calibration split of "
            f"{r['calibrate_items']} source items (" + ", ".join(f"{w}: {t:.2f} s" for w, t in r['calibration_s'].items())
            + f"), the deployable baseline; best in the evaluated runs num_workers={r['best_num_workers']} ({sweep}), "
            "the oracle; "
            f"caching DataLoader (the same loader with the outputs of its deterministic prefix, "
            f"{' -> '.join(r['cached_ops']) or 'no operator'}, kept in memory after the first epoch, as tf.data's "
            f".cache() there) {v['dataloader_cached']['samples_per_s']:.0f}/s at num_workers="
            f"{r['cached_num_workers']}, chosen on the same split (one plain epoch plus its cached epochs: "
            + ", ".join(f"{w}: {t:.2f} s" for w, t in r['cached_calibration_s'].items()) + "), deployable; "
            f"cedar as written {v['cedar']['samples_per_s']:.0f}/s; cedar optimized {v['cedar_optimized']['samples_per_s']:.0f}/s "
            f"(its time includes profiling, optimizing, its offload trials, starting workers and writing the cache"
            + (f"; optimize() is {r['optimize_share']:.0%} of its run, median over the repeats" if "optimize_share" in r
               else "")
            + (f"; its epochs alone, without optimize(), {v[OPTIMIZED_EPOCHS]['samples_per_s']:.0f}/s (diagnostic, not "
               "deployable)" if OPTIMIZED_EPOCHS in v else "") + "). "
            + (f"Where its stages ran and how results came back, per distinct timed plan: {' | '.join(r['offloads'])} "
               f"(process: local worker processes, shared_memory: large arrays through shared memory, pickle: through "
               f"the pool's pipes; Dask: the cluster's other workers, {r.get('remote_workers', 0)} worker thread(s) "
               f"offered to the optimizer). " if r.get("offloads") else "")
            + f"Outputs checked equal to cedar as written (multisets, epochs 0 and 1): {', '.join(r['verified'])}.")
        notes.append(f"{name} plan chosen by the optimizer:\n```\n{r['plan']}\n```")
    return variants, samples, curves, notes


# ----- the regime: per-sample CPU cost ------------------------------------------------------------
REGIME_VARIANTS = ("dataloader", "dataloader_cached", "cedar", "cedar_optimized")


def sweep_cost(values_us: list[float], build: Callable[[float, int | None], Pipeline], *, epochs: int,
               workers_grid: list[int], profile_samples: int, calibrate_items: int, prefetch_factor: int = 4,
               repeats: int = 1, cache: Any = None, remote: Any = None, remote_workers: int = 0,
               calibrate_build: Callable[[float], Pipeline] | None = None,
               calibrate_trials: int = 1) -> dict[float, dict[str, Any]]:
    """The regime sweep over the per-sample CPU cost: at each cost ``us`` (``build(us, limit)`` makes the
    pipeline, ``limit`` source items or all), the DataLoader and the caching DataLoader, each at the
    num_workers chosen on a calibration split of ``calibrate_items`` items, cedar as written and cedar
    optimized, ``repeats`` runs of ``epochs`` each, interleaved, rotating which goes first.
    ``calibrate_build(us)``: the calibration split instead (data the evaluated runs never see, e.g. another
    seed), each candidate timed over its whole run, worker start-up and cache fill included, the median of
    ``calibrate_trials`` runs each. Returns {us: {variant: [samples/s per repeat], "num_workers": the
    DataLoader's, "cached_num_workers": the caching DataLoader's, "optimize_share": [optimize()'s share of
    each cedar optimized run], "applied": the optimizer's applied rewrites (its last run)}}."""
    own_dir = None
    if cache is None:
        own_dir = tempfile.mkdtemp(prefix="cedar-regime-")
        cache = DirStore(own_dir)
    out: dict[float, dict[str, Any]] = {}
    try:
        for i, us in enumerate(values_us):
            calib = calibrate_build(us) if calibrate_build else build(us, calibrate_items)
            startup = calibrate_build is not None
            split = _split_of(calib) if startup else None
            try:
                w, plain = calibrate_workers(calib, workers_grid, epochs, prefetch_factor, startup=startup,
                                             trials=calibrate_trials)
                cw, _ = calibrate_cached_workers(calib, workers_grid, epochs, prefetch_factor, plain, startup=startup,
                                                 trials=calibrate_trials)
            finally:
                calib.close()
            pipe = build(us, None)
            point: dict[str, Any] = {"num_workers": float(w), "cached_num_workers": float(cw),
                                     **{v: [] for v in REGIME_VARIANTS}, "optimize_share": []}
            if split:
                point["calibration_split"] = split
            runs = {"dataloader": lambda: _loader_epochs(pipe, w, epochs, prefetch_factor),
                    "dataloader_cached": lambda: _loader_epochs(pipe, cw, epochs, prefetch_factor, cache=True),
                    "cedar": lambda: _epochs(pipe.iterate, epochs)}

            def optimized():
                t_opt, t, n, opt = optimized_epochs(build(us, None), epochs, profile_samples, cache, remote,
                                                    remote_workers)
                point["applied"] = [d.rule for d in opt.plan.decisions if d.applied]
                point["optimize_share"].append(optimize_share(t_opt, t))
                return t_opt + t, n

            runs["cedar_optimized"] = optimized
            counts = set()
            try:
                for r in range(repeats):
                    k = (i + r) % len(REGIME_VARIANTS)
                    for v in REGIME_VARIANTS[k:] + REGIME_VARIANTS[:k]:
                        t, n = runs[v]()
                        counts.add(n)
                        point[v].append(n / t)
            finally:
                pipe.close()
            if len(counts) != 1:
                raise OutputsDiffer(f"regime point {us:g} us: variants delivered different sample counts {counts}")
            out[us] = point
    finally:
        if own_dir:
            shutil.rmtree(own_dir, ignore_errors=True)
    return out
