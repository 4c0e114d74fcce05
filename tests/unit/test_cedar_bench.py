"""cedar's benchmark harness: the headline is the geometric mean of per-pipeline ratios (checked
against an independent computation), every pipeline has its claims, and a variant whose outputs
differ from cedar as written fails the run."""
from __future__ import annotations

import os
import statistics
import time

import pytest

from mlsys_flows.systems.cedar import GEOMEAN, PIPELINES, SPEC, Pipeline
from mlsys_flows.systems.cedar.bench import OutputsDiffer, aggregate, bench_pipeline, geomean, summarize
from mlsys_flows.systems.common.report import Ratio, SystemResult

KINDS = {"geomean_samples_per_s": "measured", "samples_per_s": "measured", "seconds": "measured",
         "num_workers": "measured"}


def fake_result(samples: int, times: dict[str, list[float]], best_w: int, calibrated_w: int | None = None,
                cached_w: int = 0) -> dict:
    """What bench_pipeline returns, for given run times per repeat (the calibration chose
    ``calibrated_w``, by default the evaluated runs' best, and ``cached_w`` for the caching loader;
    without times of its own, the caching DataLoader takes 0.9 of the plain one's at ``calibrated_w``)."""
    calibrated_w = best_w if calibrated_w is None else calibrated_w
    times = {"dataloader_cached": [0.9 * t for t in times[f"dataloader_w{calibrated_w}"]],
             "cedar_optimized_epochs": [0.8 * t for t in times["cedar_optimized"]], **times}
    med = {k: statistics.median(v) for k, v in times.items()}
    variants = {k: {"samples_per_s": samples / s, "seconds": s} for k, s in med.items()}
    variants["dataloader"] = dict(variants[f"dataloader_w{calibrated_w}"], num_workers=float(calibrated_w))
    variants["dataloader_oracle"] = dict(variants[f"dataloader_w{best_w}"], num_workers=float(best_w))
    variants["dataloader_cached"]["num_workers"] = float(cached_w)
    return {"variants": variants, "samples": samples, "epochs": 3, "best_num_workers": best_w, "plan": "plan",
            "calibrated_num_workers": calibrated_w, "calibration_s": {"0": 1.0, "2": 1.0}, "calibrate_items": 16,
            "cached_num_workers": cached_w, "cached_calibration_s": {"0": 0.5, "2": 0.7}, "cached_ops": ["read", "decode"],
            "verified": ["dataloader_w0"], "times": times}


RESULTS = {  # three pipelines of very different sizes and speedups, three repeats each
    "image": fake_result(700, {"dataloader_w0": [3.0, 3.2, 2.9], "dataloader_w2": [2.0, 2.4, 1.8],
                               "cedar": [3.1, 3.0, 3.3], "cedar_optimized": [1.0, 1.3, 1.1]}, best_w=2),
    "text": fake_result(20000, {"dataloader_w0": [4.0, 4.4, 3.9], "dataloader_w2": [5.0, 5.1, 4.8],
                                "cedar": [3.5, 3.4, 3.9], "cedar_optimized": [2.5, 2.0, 2.2]}, best_w=0,
                        calibrated_w=2),  # the calibration split chose another num_workers than hindsight
    "audio": fake_result(300, {"dataloader_w0": [6.0, 6.5, 6.1], "dataloader_w2": [3.3, 3.1, 3.6],
                               "cedar": [6.2, 6.0, 6.4], "cedar_optimized": [1.5, 1.7, 1.4]}, best_w=2),
}


def per_pipeline_ratio_geomeans(results: dict) -> list[float]:
    """Independently: per repeat, the geometric mean over pipelines of optimized/DataLoader samples/s."""
    reps = len(next(iter(results.values()))["times"]["cedar"])
    out = []
    for i in range(reps):
        ratios = [(r["samples"] / r["times"]["cedar_optimized"][i])
                  / (r["samples"] / r["times"][f"dataloader_w{r['calibrated_num_workers']}"][i]) for r in results.values()]
        out.append(statistics.geometric_mean(ratios))
    return out


def check_headline_is_geomean_of_ratios(samples: dict, results: dict) -> Ratio:
    """The aggregate variants' headline, computed by the harness, equals the geometric mean of
    the per-pipeline ratios in every repeat (its range) and at the median."""
    variants = SystemResult(variants={}, kinds=KINDS, samples=samples).medians()
    ratio = Ratio.of(variants, SPEC.headline, KINDS, samples)
    expected = per_pipeline_ratio_geomeans(results)
    per_repeat = [t / b for t, b in zip(samples["cedar_optimized"][GEOMEAN], samples["dataloader"][GEOMEAN])]
    assert per_repeat == pytest.approx(expected, rel=1e-12)
    assert ratio.range == pytest.approx((min(expected), max(expected)), rel=1e-12)
    assert ratio.ratio == pytest.approx(statistics.median(samples["cedar_optimized"][GEOMEAN])
                                        / statistics.median(samples["dataloader"][GEOMEAN]), rel=1e-12)
    assert min(expected) * (1 - 1e-9) <= ratio.ratio <= max(expected) * (1 + 1e-9)
    return ratio


def test_geomean_aggregate_against_an_independent_computation():
    samples = aggregate(RESULTS)
    which = {"dataloader": "calibrated_num_workers", "dataloader_oracle": "best_num_workers"}
    for kind in ("dataloader", "dataloader_cached", "dataloader_oracle", "cedar", "cedar_optimized"):
        for i in range(3):
            rates = [r["samples"] / r["times"][f"dataloader_w{r[which[kind]]}" if kind in which
                                               else kind][i] for r in RESULTS.values()]
            assert samples[kind][GEOMEAN][i] == pytest.approx(statistics.geometric_mean(rates), rel=1e-12)
    check_headline_is_geomean_of_ratios(samples, RESULTS)
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        geomean([1.0, 0.0])


def test_the_geomean_check_fails_on_the_old_total_over_total_aggregate():
    """Companion: total samples / total seconds (weighted by the largest pipeline) is not the
    paper's average, and the same check says so."""
    samples = aggregate(RESULTS)
    total = sum(r["samples"] for r in RESULTS.values())
    for kind in ("dataloader", "cedar_optimized"):
        samples[kind][GEOMEAN] = [total / s for s in samples[kind]["seconds"]]
    with pytest.raises(AssertionError):
        check_headline_is_geomean_of_ratios(samples, RESULTS)


def test_summarize_reports_every_pipeline_and_the_spec_claims_them():
    variants, samples, curves, notes = summarize(RESULTS)
    for name in RESULTS:
        assert samples[f"{name}/cedar_optimized"]["samples_per_s"] == \
            [RESULTS[name]["samples"] / t for t in RESULTS[name]["times"]["cedar_optimized"]]
        assert variants[f"{name}/dataloader"] == {"num_workers": float(RESULTS[name]["calibrated_num_workers"])}
        assert variants[f"{name}/dataloader_oracle"] == {"num_workers": float(RESULTS[name]["best_num_workers"])}
    assert "geometric mean" in notes[0] and len(curves) == 2
    assert set(PIPELINES) == {"image", "text", "audio"}
    head = SPEC.headline
    assert (head.metric, head.baseline, head.technique) == (GEOMEAN, "dataloader", "cedar_optimized")
    for name in PIPELINES:
        assert any(c.metric == "samples_per_s" and c.baseline == f"{name}/dataloader"
                   and c.technique == f"{name}/cedar_optimized" for c in SPEC.claims)
    # every claim of the spec can be computed from what summarize returns
    med = SystemResult(variants=variants, kinds=KINDS, samples=samples).medians()
    for claim in SPEC.claims:
        Ratio.of(med, claim, KINDS, samples)


# ----- the equivalence check fails the run --------------------------------------------------------

def slow_triple(s):
    time.sleep(0.002)
    return s | {"a": s["a"] * 3 + 1}


def builder(make):
    def build(limit):
        n = limit or 40
        return make(Pipeline.from_list([{"a": i, "b": i % 5} for i in range(n)], seed=0))
    return build


def run(build):
    return bench_pipeline(build, epochs=2, repeats=1, workers_grid=[0, 1], profile_samples=8, log=lambda m: None)


def test_correct_pipeline_passes_and_lists_what_was_checked():
    build = builder(lambda p: p.map(slow_triple, name="triple", reads=("a",), writes=("a",))
                    .filter(lambda s: s["b"] < 3, name="small_b", reads=("b",)).batch(4))
    result = run(build)
    assert result["verified"] == ["dataloader_w0", "dataloader_w1", "dataloader_cached_w0", "dataloader_cached_w1",
                                  "cedar_optimized (every rewrite)", "cedar_optimized (timed plan)"]
    # the caching DataLoader ran at its calibrated num_workers and cached the deterministic prefix
    assert result["cached_ops"] == ["triple", "small_b"] and result["cached_num_workers"] in (0, 1)
    assert result["variants"]["dataloader_cached"]["num_workers"] == result["cached_num_workers"]
    assert len(result["times"]["dataloader_cached"]) == 1
    assert result["samples"] == 2 * 24
    # optimize()'s share, computed in the run from its two timings: the diagnostic epochs-only time is the
    # same run less optimize(), so the share is 1 - epochs / whole run
    (whole,), (epochs_only,) = result["times"]["cedar_optimized"], result["times"]["cedar_optimized_epochs"]
    assert 0 < epochs_only < whole and result["optimize_share"] == pytest.approx(1 - epochs_only / whole)
    assert result["variants"]["cedar_optimized_epochs"]["samples_per_s"] == pytest.approx(2 * 24 / epochs_only)


def test_misdeclared_operator_makes_the_run_fail():
    """'triple' changes field a but declares it writes c: the optimizer may then hoist the cheap
    filter on a ahead of it, which changes the samples. The run must fail, naming the variant."""
    build = builder(lambda p: p.map(slow_triple, name="triple", reads=("a",), writes=("c",))
                    .filter(lambda s: s["a"] % 2 == 0, name="even_a", reads=("a",)).batch(4))
    with pytest.raises(OutputsDiffer, match=r"cedar_optimized \(every rewrite\) epoch 0: \d+ of \d+ samples"):
        run(build)


def test_process_dependent_operator_makes_the_run_fail():
    """An operator marked deterministic whose output depends on the process running it: the
    DataLoader's worker (and cedar's worker processes) give other samples."""
    build = builder(lambda p: p.map(lambda s: s | {"pid": os.getpid()}, name="pid").batch(4))
    with pytest.raises(OutputsDiffer, match=r"dataloader_w1 epoch 0"):
        run(build)


def test_the_deployable_dataloader_is_the_calibrated_choice_and_the_oracle_is_never_worse():
    text = RESULTS["text"]
    assert text["calibrated_num_workers"] != text["best_num_workers"]
    variants, samples, _, notes = summarize(RESULTS)
    assert samples["text/dataloader"]["seconds"] == text["times"]["dataloader_w2"]
    assert samples["text/dataloader_oracle"]["seconds"] == text["times"]["dataloader_w0"]
    for name in RESULTS:
        assert statistics.median(samples[f"{name}/dataloader_oracle"]["samples_per_s"]) >= \
            statistics.median(samples[f"{name}/dataloader"]["samples_per_s"])
    assert any("calibration split" in n for n in notes)
    assert SPEC.role("dataloader") == ("paper", "deployable") and SPEC.role("dataloader_oracle") == ("oracle",)
    assert SPEC.role("dataloader_cached") == ("deployable",)
    assert SPEC.mechanism.ablation == "cedar" and SPEC.contract_v3


def test_calibrate_workers_picks_the_fastest_candidate(monkeypatch):
    from mlsys_flows.systems.cedar import bench

    seconds = {0: 2.0, 1: 0.5, 2: 1.0}
    monkeypatch.setattr(bench, "_steady_loader_s", lambda pipe, w, epochs, pf: seconds[w])
    assert bench.calibrate_workers(None, [0, 1, 2], 2) == (1, seconds)
    pipe = Pipeline.from_list([{"a": i} for i in range(16)], seed=0).map(slow_triple, name="triple", reads=("a",),
                                                                          writes=("a",)).batch(4)
    w, real = bench.calibrate_workers(pipe, [0, 1], 2)
    assert w in (0, 1) and set(real) == {0, 1} and all(t > 0 for t in real.values())


def test_the_cost_sweep_runs_every_variant_on_the_same_samples():
    from mlsys_flows.systems.cedar.bench import REGIME_VARIANTS, sweep_cost
    from mlsys_flows.systems.cedar.workloads import cost_pipeline

    built = []

    def build(us, limit):
        built.append((us, limit))
        return cost_pipeline(limit or 24, int(us), 8, 0)

    pts = sweep_cost([4.0, 1.0], build, epochs=2, workers_grid=[0], profile_samples=8, calibrate_items=8, repeats=2)
    assert list(pts) == [4.0, 1.0]
    for us, pt in pts.items():
        assert all(len(pt[v]) == 2 and min(pt[v]) > 0 for v in REGIME_VARIANTS) and pt["num_workers"] == 0.0
        assert pt["cached_num_workers"] == 0.0 and "dataloader_cached" in REGIME_VARIANTS
        assert isinstance(pt["applied"], list)
        # optimize()'s share of each cedar optimized run, computed from its timings (the fixed-cost rule reads it)
        assert len(pt["optimize_share"]) == 2 and all(0 < s < 1 for s in pt["optimize_share"])
        assert (us, 8) in built and (us, None) in built  # a calibration split, then the evaluated pipeline


def test_the_cost_pipelines_work_grows_with_its_rounds_and_is_deterministic():
    from mlsys_flows.systems.cedar.workloads import Featurize, cost_pipeline, featurize_round_us

    a, b = Featurize(3)({"id": 7}), Featurize(3)({"id": 7})
    assert (a["x"] == b["x"]).all() and not (Featurize(4)({"id": 7})["x"] == a["x"]).all()

    def cost(rounds):
        t0 = time.perf_counter()
        Featurize(rounds)({"id": 1})
        return time.perf_counter() - t0

    assert min(cost(400) for _ in range(3)) > 5 * min(cost(4) for _ in range(3))
    assert featurize_round_us(repeats=1) > 0
    e0, e1 = cost_pipeline(8, 2, 8, 0).take(1, epoch=0)[0], cost_pipeline(8, 2, 8, 0).take(1, epoch=1)[0]
    assert not (e0["x"] == e1["x"]).all()  # the jitter is redrawn every epoch
