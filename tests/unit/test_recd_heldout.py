"""RecD at equal held-out quality (issue 45): a held-out set drawn from the same generator and disjoint
from the training sessions, every trainer's held-out logloss evaluated identically, and the headline as
time to a declared held-out target, where a trainer that misses the target is counted as a miss."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from mlsys_flows.systems.common.report import build_report
from mlsys_flows.systems.common.runreport import Environment
from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.common.verdict import MIN_PAIRS
from mlsys_flows.systems.recd import CALIBRATION_SEEDS, SPEC, Params
from mlsys_flows.systems.recd import pipeline as pl
from mlsys_flows.systems.recd.result import build_result
from mlsys_flows.systems.recd.sweep import HEADLINE_TRAINERS
from mlsys_flows.systems.recd.workload import Schema, arrival_order, generate_split, logloss

ENV = Environment(device="cpu", cores=2, platform="x", versions={}, git_sha="abc", git_dirty=False, code_hash="c0de")


def test_the_heldout_set_is_fixed_per_seed_and_disjoint_from_training():
    p = Params.for_scale("smoke")
    train, held, prob = generate_split(p)
    s = Schema.of(p).session
    train_ids, held_ids = set(train.column(s).to_pylist()), set(held.column(s).to_pylist())
    assert train_ids == set(range(p.sessions)) and held_ids == set(range(p.sessions, p.sessions + p.heldout_sessions))
    assert len(prob) == held.num_rows > 0 and np.all((prob > 0) & (prob < 1))
    again = generate_split(p)
    assert again[1].equals(held) and again[0].equals(train)  # fixed per seed
    other = generate_split(Params.for_scale("smoke", seed=p.seed + 1))[1]
    assert not other.equals(held)
    # no held-out sample is a training sample: their digests share no sample hash
    tb, hb = pl.table_batches(train, p, dedup=False), pl.table_batches(held, p, dedup=False)
    assert pl.samples_digest(tb + hb) != pl.samples_digest(tb)
    labels = held.column(Schema.of(p).label).to_numpy()
    # the generator's own probabilities predict its labels better than the base rate
    assert logloss(labels, prob) < logloss(labels, np.full(len(labels), labels.mean()))


def test_every_trainer_is_evaluated_on_the_same_heldout_batches_from_the_same_start():
    p = Params.for_scale("smoke")
    train, held, _ = generate_split(p)
    arrival = arrival_order(train, p.seed)
    batches = {"kjt": pl.table_batches(arrival, p, dedup=False),
               "kjt_clustered": pl.table_batches(train, p, dedup=False),
               "ikjt": pl.table_batches(train, p, dedup=True)}
    heldout = pl.table_batches(held, p, dedup=True)
    out = pl.train_interleaved(batches, p, heldout=heldout)
    turns = -(-len(batches["kjt"]) // p.chunk_steps)
    for n, r in out.items():
        assert len(r["evals"]) == turns + 1 and r["evals"][0][0] == 0 and r["evals"][-1][0] == r["samples"]
        assert all(math.isfinite(l) and l > 0 for _, l in r["evals"])
    assert len({r["evals"][0][1] for r in out.values()}) == 1  # the same init, the same held-out batches
    # the same math on the same batches: the same held-out curve; arrival order: its own
    assert max(abs(a[1] - b[1]) for a, b in zip(out["ikjt"]["evals"], out["kjt_clustered"]["evals"])) < 1e-4
    # the held-out KJT and IKJT batches give the same logloss (evaluation is identical whatever the format)
    model = pl.build_model(p)
    assert pl.heldout_logloss(model, heldout) == pytest.approx(
        pl.heldout_logloss(model, pl.table_batches(held, p, dedup=False)), abs=1e-5)
    # without held-out batches nothing is evaluated
    assert pl.train_interleaved({"kjt": batches["kjt"][:2]}, p)["kjt"]["evals"] == []


def test_samples_to_target_interpolates_between_evaluations_and_reports_a_miss():
    evals = [(0, 0.70), (100, 0.68), (200, 0.66), (300, 0.67)]
    assert pl.samples_to_target(evals, 0.67) == pytest.approx(150.0)
    assert pl.samples_to_target(evals, 0.66) == pytest.approx(200.0)
    assert pl.samples_to_target(evals, 0.71) == 0.0
    assert pl.samples_to_target(evals, 0.65) is None
    assert pl.heldout_target(0.69, 0.49, 0.25) == pytest.approx(0.64)


def test_one_noisy_evaluation_below_the_target_is_no_crossing():
    """Review of issue 45: the held-out curve jumps 0.01-0.027 between evaluations; the crossing is read from
    the running mean of SMOOTH_EVALS evaluations, so a single dip does not count."""
    dip = [(0, 0.70), (100, 0.69), (200, 0.655), (300, 0.69), (400, 0.69), (500, 0.69)]
    assert pl.samples_to_target(dip, 0.66) is not None  # the raw curve would call it reached
    assert pl.samples_to_target(pl.smoothed_evals(dip), 0.66) is None
    steady = [(0, 0.70), (100, 0.68), (200, 0.66), (300, 0.65), (400, 0.65)]
    sm = pl.smoothed_evals(steady)
    assert sm[2] == (200.0, pytest.approx((0.70 + 0.68 + 0.66) / 3)) and sm[0] == (0.0, 0.70)
    assert pl.samples_to_target(sm, 0.66) == pytest.approx(1000 / 3)  # 0.6633 at 300, 0.6533 at 400
    assert pl.final_heldout(steady) == pytest.approx(np.mean([0.70, 0.68, 0.66, 0.65, 0.65]))
    assert pl.final_heldout(steady, 2) == pytest.approx(0.65)


SEEDS = 6  # verdict.MIN_PAIRS: the fewest independent pairs that decide


def _fake(curves: dict[str, list[float]], rates: dict[str, float], target: float = 0.66, seeds: int = SEEDS,
          per_seed: dict[int, dict[str, list[float]]] | None = None):
    """build_result's inputs for trainers with the given held-out curves (100 samples per turn) and rates on
    ``seeds`` evaluated seeds (``per_seed[i]`` overrides seed i's curves; rates vary a little by seed)."""
    p = Params.for_scale("smoke", mix_sweep=(), eval_seeds=seeds)
    data = {"clustered_bytes": 100, "dedup_clustered": 4.0, "arrival_bytes": 300, "dedup_arrival": 1.1,
            "user_id_share": 0.75, "target_logloss": target, "heldout_samples": 50, "heldout_base_logloss": 0.69,
            "heldout_bayes_logloss": 0.5}
    reader = {n: [10.0, 11.0, 12.0] for n in ("kjt", "kjt_clustered", "ikjt")}

    def run(i: int) -> dict:
        cs = {**curves, **(per_seed or {}).get(i, {})}
        out = {}
        for n in HEADLINE_TRAINERS:
            ls = cs.get(n, cs["kjt"] if n in ("kjt", "ikjt_arrival") else cs["ikjt"])
            out[n] = {"chunk_rates": [rates.get(n, 1000.0) * (1 + 0.01 * i)] * 4, "samples": 100 * (len(ls) - 1),
                      "evals": [[100 * j, l] for j, l in enumerate(ls)]}
        return out

    trained = {"device": "cpu", "digest": "0" * 64}
    first = run(0)
    for n in HEADLINE_TRAINERS:
        trained[n] = {**first[n], "losses": [0.7] * 10, "user_values": 10, "looked_up_ids": 100}
    trained["seeds"] = [{"seed": p.seed + i, "heldout_samples": 50, "heldout_base_logloss": 0.69,
                         "heldout_bayes_logloss": 0.5, "target_logloss": target, "trainers": run(i)}
                        for i in range(seeds)]
    return p, data, reader, trained


def _report(*args):
    p = args[0]
    return build_report(SPEC, params=p.model_dump(mode="json"), result=build_result(*args, []), run_id="r",
                        environment=ENV, wall_time_s=1.0)


def test_the_headline_is_time_to_the_heldout_target_paired_by_seed_with_heldout_logloss_for_every_variant():
    assert (SPEC.headline.metric, SPEC.headline.better) == ("time_to_target_s", "lower")
    assert SPEC.constraint is not None and SPEC.constraint.metric == "reached_target"
    assert SPEC.pairing == "seeds" and Params.for_scale("quick").eval_seeds >= MIN_PAIRS
    curves = {"kjt": [0.70, 0.68, 0.66, 0.65, 0.65, 0.65], "ikjt": [0.70, 0.69, 0.67, 0.655, 0.65, 0.65]}
    rep = _report(*_fake(curves, {"kjt": 1000.0, "kjt_clustered": 1500.0, "ikjt": 3000.0, "ikjt_arrival": 1000.0}))
    for n in HEADLINE_TRAINERS:
        ls = curves["kjt"] if n in ("kjt", "ikjt_arrival") else curves["ikjt"]
        assert rep.variants[n]["heldout_logloss"] == pytest.approx(np.mean(ls[-pl.FINAL_EVALS:]))
        assert rep.variants[n]["reached_target"] == 1.0 and rep.variants[n]["target_logloss"] == 0.66
        assert len(rep.samples[n]["time_to_target_s"]) == SEEDS == len(rep.samples[n]["reached_target"])
    # smoothed (mean of 3): kjt 0.6767, 0.6633, 0.6533 at 200, 300, 400 -> crosses 0.66 at 333.3
    s_kjt = pl.samples_to_target(pl.smoothed_evals([(100 * i, l) for i, l in enumerate(curves["kjt"])]), 0.66)
    s_ikjt = pl.samples_to_target(pl.smoothed_evals([(100 * i, l) for i, l in enumerate(curves["ikjt"])]), 0.66)
    assert s_kjt == pytest.approx(1000 / 3) and s_ikjt > s_kjt
    assert rep.variants["kjt"]["samples_to_target"] == pytest.approx(s_kjt)
    assert rep.variants["ikjt"]["samples_to_target"] == pytest.approx(s_ikjt)
    # time = samples to the target / samples/s, per seed: ikjt faster on every seed -> a decided win
    assert rep.headline.ratio == pytest.approx((s_kjt / 1000) / (s_ikjt / 3000), rel=1e-6)
    assert rep.headline.verdict.outcome == "wins" and rep.headline.verdict.pairs == SEEDS
    assert rep.headline.vs_strongest.baseline == "kjt_clustered" and rep.constraint.excluded == []
    assert {"heldout_logloss", "samples_to_target"} <= set(rep.deterministic_metrics)
    assert any("Every trainer reached the target on every evaluated seed" in n for n in rep.notes)


def test_a_trainer_that_misses_the_target_is_counted_and_never_wins():
    curves = {"kjt": [0.70, 0.68, 0.66, 0.65, 0.65], "ikjt": [0.70, 0.69, 0.67, 0.665, 0.665]}
    rates = {"kjt": 1000.0, "kjt_clustered": 1500.0, "ikjt": 30000.0, "ikjt_arrival": 1000.0}
    rep = _report(*_fake(curves, rates))
    assert rep.variants["ikjt"]["reached_target"] == 0.0 and rep.variants["kjt_clustered"]["reached_target"] == 0.0
    # charged the whole run (a lower bound), and though that time is shorter, the miss wins nothing
    assert rep.variants["ikjt"]["samples_to_target"] == 400.0 and rep.headline.ratio > 1
    assert rep.constraint.technique.met is False and "kjt_clustered" in rep.constraint.excluded
    assert rep.headline.vs_strongest.baseline == "kjt"
    assert rep.headline.verdict.outcome != "wins" and rep.headline.vs_strongest.verdict.outcome != "wins"
    assert any("Missed the target" in n and "seed 0: kjt_clustered, ikjt" in n for n in rep.notes)


def test_a_miss_on_one_seed_is_reported_and_leaves_too_few_pairs_to_decide():
    curves = {"kjt": [0.70, 0.68, 0.66, 0.65, 0.65], "ikjt": [0.70, 0.69, 0.67, 0.655, 0.65]}
    flat = [0.70, 0.69, 0.68, 0.68, 0.68]
    rep = _report(*_fake(curves, {"kjt": 1000.0, "ikjt": 3000.0}, per_seed={3: {"ikjt": flat}}))
    assert rep.samples["ikjt"]["reached_target"] == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    assert any("seed 3: kjt_clustered, ikjt" in n for n in rep.notes)
    # five pairs stand at the constraint: fewer than MIN_PAIRS, so no win whatever the samples say
    assert rep.headline.verdict.outcome == "ties"


def test_when_no_trainer_reaches_the_target_no_ratio_is_claimed():
    flat = [0.70, 0.69, 0.68, 0.68, 0.68]
    rep = _report(*_fake({"kjt": flat, "ikjt": flat}, {"kjt": 1000.0, "ikjt": 3000.0}))
    assert all(rep.variants[n]["reached_target"] == 0.0 for n in HEADLINE_TRAINERS)
    assert any("No trainer reached the target on seed(s) 0, 1, 2, 3, 4, 5" in n and "no time to the target" in n
               for n in rep.notes)
    v = rep.headline.verdict
    assert v.outcome == "ties" and v.ratio is None and "no pair of 6 met the constraint" in v.why


def test_the_calibration_chooses_the_target_below_every_final_window_with_a_margin():
    from mlsys_flows.systems.recd import calibrate
    from mlsys_flows.systems.recd.seeds import evaluated_seeds

    assert len(CALIBRATION_SEEDS) >= 3
    quick = Params.for_scale("quick")
    assert not set(evaluated_seeds(quick)) & set(CALIBRATION_SEEDS)  # the calibration seeds are never evaluated
    with pytest.raises(ParamsError, match="calibration seed"):
        evaluated_seeds(Params.for_scale("quick", seed=998))
    p = Params.for_scale("smoke", seed=CALIBRATION_SEEDS[0], eval_seeds=1)
    found = calibrate.fractions_closed(p)
    assert set(found) == {"kjt", "ikjt"}
    assert all(math.isfinite(f["final"]) and f["final"] <= f["best_smoothed"] + 1e-12 < 1 for f in found.values())
    fake = {1000: {"kjt": {"final": 0.08}, "ikjt": {"final": 0.06}}, 1001: {"kjt": {"final": 0.12}, "ikjt": {"final": 0.1}}}
    assert calibrate.choose(fake) == pytest.approx(calibrate.MARGIN * 0.06)
    with pytest.raises(ValueError, match="closed none"):
        calibrate.choose({1000: {"kjt": {"final": -0.01}}})
    run = {"seed": 1000, "heldout_base_logloss": 0.69, "heldout_bayes_logloss": 0.49,
           "trainers": {"kjt": {"evals": [(0, 0.69), (100, 0.66), (200, 0.66), (300, 0.66)]},
                        "ikjt": {"evals": [(0, 0.69), (100, 0.69), (200, 0.65), (300, 0.69)]}}}
    # target at 0.1: 0.67; kjt's smoothed curve gets there, ikjt's one dip does not
    assert calibrate.check_reached([run], 0.1) == ["seed 1000 ikjt"]
    # the declared quick target sits at the margin below what the calibration found at quick (docs/recd.md)
    assert quick.target_fraction <= calibrate.choose(calibrate.QUICK_CALIBRATION)
    assert set(calibrate.QUICK_CALIBRATION) == set(CALIBRATION_SEEDS)


def test_the_committed_quick_run_reached_the_target_on_every_evaluated_seed():
    """The committed quick report (regenerated by the lead): every trainer reached the declared target on every
    evaluated seed, and where one did not, the notes say so. Fails when the target is out of reach at quick."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "recd-quick.json"
    report = json.loads(path.read_text())
    reached = {n: report["samples"].get(n, {}).get("reached_target", []) for n in HEADLINE_TRAINERS}
    if any(len(xs) < MIN_PAIRS for xs in reached.values()):
        pytest.skip("the committed recd quick report predates the per-seed headline (issue 45): regenerate it")
    missed = sorted({n for n, xs in reached.items() if min(xs) < 1.0})
    notes = " ".join(report["notes"])
    assert all("seed" in notes and n in notes for n in missed) and ("Missed the target" in notes) == bool(missed)
    assert not missed, f"quick: {missed} missed the held-out target on an evaluated seed; recalibrate (calibrate.py)"
