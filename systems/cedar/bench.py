"""Measure one pipeline three ways on the same data (pure): torch DataLoader at each candidate
``num_workers`` (the best is the baseline), cedar as written, cedar optimized. Runs are
interleaved; each run is ``epochs`` full passes, and the optimized run's time includes profiling,
optimizing, starting workers and writing its cache (a fresh cache every run)."""
from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from typing import Any, Callable

from mlsys_flows.systems.cedar.api import Pipeline
from mlsys_flows.systems.cedar.pipeline import DirStore, store_label
from mlsys_flows.systems.cedar.workloads import count, dataloader, multiset
from mlsys_flows.systems.common.timing import interleaved, median


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


def bench_pipeline(build: Callable[[int | None], Pipeline], *, epochs: int, repeats: int, workers_grid: list[int],
                   profile_samples: int, cache: Any = None, verify_items: int = 48,
                   log: Callable[[str], None] = print) -> dict:
    """Returns medians per variant, the optimized plan, and whether outputs matched."""
    import torch.utils.data  # noqa: F401 - imported before timing, not inside the first measured run

    pipe = build(None)
    own_dir = None
    if cache is None:
        own_dir = tempfile.mkdtemp(prefix="cedar-cache-")
        cache = DirStore(own_dir)
    counts: dict[str, set[int]] = {}
    plans: list[str] = []
    decisions: list[list[dict]] = []

    def note(name: str, t_n: tuple[float, int]) -> float:
        counts.setdefault(name, set()).add(t_n[1])
        return t_n[0]

    def run_dataloader(w: int) -> Callable[[], float]:
        return lambda: note(f"dataloader_w{w}", _epochs(lambda e: dataloader(pipe, w, e), epochs))

    def run_cedar() -> float:
        return note("cedar", _epochs(pipe.iterate, epochs))

    def run_optimized() -> float:
        store = PrefixedStore(cache, f"run-{uuid.uuid4().hex[:8]}")
        t0 = time.perf_counter()
        with build(None).optimize(epochs=epochs, sample=profile_samples, cache=store) as opt:
            t_opt = time.perf_counter() - t0
            t, n = _epochs(opt.iterate, epochs)
            plans.append(opt.explain())
            decisions.append([{"rule": d.rule, "applied": d.applied, "detail": d.detail, "est_gain_s": d.est_gain_s}
                              for d in opt.plan.decisions])
        store.delete()
        log(f"cedar_optimized: optimize {t_opt:.2f} s + {epochs} epochs {t:.2f} s")
        return note("cedar_optimized", (t_opt + t, n))

    variants = {f"dataloader_w{w}": run_dataloader(w) for w in workers_grid}
    variants |= {"cedar": run_cedar, "cedar_optimized": run_optimized}
    times = interleaved(variants, repeats)
    try:
        verified = verify(build, verify_items, epochs, profile_samples, cache)
    finally:
        pipe.close()
        if own_dir:
            shutil.rmtree(own_dir, ignore_errors=True)
    sizes = {n for c in counts.values() for n in c}
    if len(sizes) != 1:
        raise RuntimeError(f"variants delivered different sample counts: {counts}")
    samples = sizes.pop()
    med = {k: median(v) for k, v in times.items()}
    best_w = min(workers_grid, key=lambda w: med[f"dataloader_w{w}"])
    out = {k: {"samples_per_s": samples / s, "seconds": s} for k, s in med.items()}
    out["dataloader"] = dict(out[f"dataloader_w{best_w}"], num_workers=float(best_w))
    return {"variants": out, "samples": samples, "epochs": epochs, "best_num_workers": best_w,
            "plan": plans[-1], "plan_as_written": pipe.explain(), "decisions": decisions[-1],
            "outputs_match": verified, "times": times}


def verify(build: Callable[[int | None], Pipeline], items: int, epochs: int, profile_samples: int, cache: Any) -> bool:
    """Same multiset of samples from DataLoader, cedar as written and cedar optimized (first
    ``items`` source items, two epochs so the optimized run also reads its cache)."""
    pipe = build(items)
    store = PrefixedStore(cache, f"verify-{uuid.uuid4().hex[:8]}")
    try:
        with pipe.optimize(epochs=max(2, epochs), sample=min(profile_samples, items), cache=store, mode="always") as opt:
            for e in range(2):
                ref = multiset(pipe.iterate(e))
                if multiset(opt.iterate(e)) != ref or multiset(dataloader(pipe, 1, e)) != ref:
                    return False
        return True
    finally:
        store.delete()
        pipe.close()


def summarize(results: dict[str, dict]):
    """Variants, samples, curves and notes of a run over several pipelines. The aggregate variants
    ('dataloader', 'cedar', 'cedar_optimized') are total samples / total seconds over the
    pipelines, per repeat; the geometric mean of per-pipeline ratios is given in the notes."""
    import math

    from mlsys_flows.systems.common.report import Curve

    kinds = ("dataloader", "cedar", "cedar_optimized")
    timed = {name: {kind: r["times"][f"dataloader_w{r['best_num_workers']}" if kind == "dataloader" else kind]
                    for kind in kinds} for name, r in results.items()}
    total = sum(r["samples"] for r in results.values())
    samples: dict[str, dict[str, list[float]]] = {}
    for kind in kinds:  # repeat i of every pipeline makes aggregate sample i
        seconds = [sum(ts) for ts in zip(*(timed[name][kind] for name in results))]
        samples[kind] = {"seconds": seconds, "samples_per_s": [total / s for s in seconds]}
        for name, r in results.items():
            samples[f"{name}/{kind}"] = {"seconds": list(timed[name][kind]),
                                         "samples_per_s": [r["samples"] / s for s in timed[name][kind]]}
    variants: dict[str, dict[str, float]] = {"dataloader": {}, "cedar": {}, "cedar_optimized": {}}
    for name, r in results.items():
        variants[f"{name}/dataloader"] = {"num_workers": float(r["best_num_workers"])}
        variants[f"{name}/cedar"], variants[f"{name}/cedar_optimized"] = {}, {}
    geo = math.exp(sum(math.log(r["variants"]["cedar_optimized"]["samples_per_s"] /
                                r["variants"]["dataloader"]["samples_per_s"]) for r in results.values()) / len(results))
    curves = [Curve(title="DataLoader num_workers sweep (the fastest is the baseline)", x_label="num_workers",
                    y_label="samples/s",
                    series={name: ([float(k.rsplit("w", 1)[1]) for k in r["variants"] if k.startswith("dataloader_w")],
                                   [v["samples_per_s"] for k, v in r["variants"].items() if k.startswith("dataloader_w")])
                            for name, r in results.items()}),
              Curve(title="throughput per pipeline", y_label="samples/s",
                    x_label="pipeline (" + ", ".join(f"{i}: {n}" for i, n in enumerate(results)) + ")",
                    series={kind: (list(range(len(results))), [r["variants"][kind]["samples_per_s"]
                                                                for r in results.values()]) for kind in kinds})]
    notes = [
        "Aggregate variants (dataloader, cedar, cedar_optimized) are total samples / total seconds over the "
        "pipelines, one sample per repeat (repeat i of every pipeline); geometric mean of the per-pipeline cedar_optimized/dataloader ratios: {geo:.2f}x.",
    ]
    for name, r in results.items():
        v = r["variants"]
        sweep = ", ".join(f"{k[len('dataloader_w'):]}: {x['samples_per_s']:.0f}/s" for k, x in v.items()
                          if k.startswith("dataloader_w"))
        notes.append(
            f"{name}: {r['samples']} samples per run ({r['epochs']} epochs); DataLoader best num_workers="
            f"{r['best_num_workers']} ({sweep}); "
            f"cedar as written {v['cedar']['samples_per_s']:.0f}/s; cedar optimized {v['cedar_optimized']['samples_per_s']:.0f}/s "
            f"(its time includes profiling, optimizing, starting workers and writing the cache). Outputs of the three "
            f"match as multisets: {r['outputs_match']}.")
        notes.append(f"{name} plan chosen by the optimizer:\n```\n{r['plan']}\n```")
    return variants, samples, curves, notes
