"""Issue 47 for fluid: FedAvg that drops its stragglers (waits only for the fastest valid updates of each
round, its drop fraction tuned on calibration seeds that are never evaluated), runs that stop at their
target, and a regime that re-runs the federation at each straggler slowdown (stragglers re-detected and
sub-models re-sized to it) instead of re-timing the headline's runs."""
from __future__ import annotations

import numpy as np
import pytest

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.fluid import (REGIME_POLICIES, REGIME_RERUN, SPEC, Config, Params, drop_count, fastest_valid,
                                       make_workload, observed_s, plan_stragglers, run_federation,
                                       slow_stragglers, smoothed, time_to_target, tune_drop_fraction, with_trajectory)
from mlsys_flows.systems.fluid.federation import profile_flops
from mlsys_flows.systems.fluid.model import train_client
from mlsys_flows.systems.fluid.result import _point, seed_target, tuned_drop_fraction

H, CLIENTS, ROUNDS = 16, 6, 6


def _cfg(**over) -> Config:
    base = dict(hidden=H, rounds=ROUNDS, epochs=1, batch=16, lr=0.05, theta_init=1e-3, theta_growth=1.25,
                comm_latency_s=0.0, bandwidth_mb_s=100.0, faulty_clients=0, seed=3, straggler_fraction=0.2,
                min_r=0.5, ref_gflops=10.0, redetect_every=1, drop_fraction=0.2)
    return Config(**{**base, **over})


def _workload(slowdown=1.5):
    w = slow_stragglers(make_workload(CLIENTS, 0.5, 0.25, 1.0, 2.5, seed=3), H, 1, 0.2, slowdown)
    return w, plan_stragglers(w, H, 1, 0.2, 0.5, 10.0)


def _run(w, plan, cfg, policy, **kw):
    def run_clients(jobs):
        out = []
        for j in jobs:
            try:
                out.append(train_client(j))
            except RuntimeError as exc:
                out.append(exc)
        return out
    return run_federation(w, plan, cfg, policy, run_clients, **kw)


def _finish(w, speed_row):
    flops = profile_flops(w, H, 1)
    return {c: observed_s(flops[c], H, H, speed_row[c], 10.0) for c in range(w.clients)}


def test_drop_count_and_fastest_valid():
    assert [drop_count(16, f) for f in (0.0, 0.01, 0.1, 0.2, 0.3, 0.5)] == [0, 1, 2, 3, 5, 8]
    assert drop_count(2, 0.9) == 1  # never every client
    with pytest.raises(ValueError):
        drop_count(4, 1.0)
    # the first to arrive, ties to the lower client; a client with no valid update is not in the race
    assert fastest_valid({0: 3.0, 1: 1.0, 2: 2.0, 4: 1.0}, 2) == [1, 4]
    assert fastest_valid({0: 3.0, 2: 2.0}, 5) == [0, 2]


def test_fedavg_drop_excludes_the_slowest_clients_of_each_round_even_one_that_became_slow_mid_run():
    w, plan = _workload()
    x = min(range(CLIENTS), key=lambda c: _finish(w, w.speed)[c])  # the fastest client of the profile ...
    traj = np.tile(w.speed, (ROUNDS, 1))
    traj[3, x] *= 20.0  # ... is the slowest by far in round 3 only
    dyn = with_trajectory(w, traj)
    cfg = _cfg()
    n = drop_count(CLIENTS, cfg.drop_fraction)
    h = _run(dyn, plan, cfg, "fedavg_drop")
    wait = _run(dyn, plan, cfg, "fedavg_wait")
    for t in range(ROUNDS):
        fin = _finish(w, traj[t])
        slowest = sorted(sorted(fin, key=lambda c: -fin[c])[:n])
        assert h.dropped[t] == slowest  # the slowest of that very round (a race, not a lagged estimate)
        assert sorted(c for c, *_ in h.trained[t]) == sorted(set(range(CLIENTS)) - set(slowest))
        assert all(k == H for _, k, _, _ in h.trained[t])  # full model everywhere: nothing is dropped within
    assert x in h.dropped[3] and all(x not in d for i, d in enumerate(h.dropped) if i != 3)
    assert all(d == [] for d in wait.dropped)
    # it does not wait for the dropped: each round is as long as its slowest aggregated client
    assert h.round_s[3] < wait.round_s[3] and h.round_model_s[3] < wait.round_model_s[3]
    link = h.trained[3][0][3]  # every client ships the full model: the same communication time
    assert h.round_model_s[3] == pytest.approx(link + max(f for c, f in _finish(w, traj[3]).items() if c not in h.dropped[3]))
    # the dropped clients' training ran (CPU spent) but their updates are not in the model
    assert h.client_cpu_s[3] > sum(cpu for _, _, cpu, _ in h.trained[3])
    assert h.accuracy != wait.accuracy


def test_a_faulty_fast_client_is_replaced_by_the_next_to_arrive():
    w, plan = _workload()
    cfg = _cfg(faulty_clients=1)  # client 0 sends a NaN update in round 1
    h = _run(w, plan, cfg, "fedavg_drop")
    fin = _finish(w, w.speed)
    n = drop_count(CLIENTS, cfg.drop_fraction)
    assert [c for c, _ in h.excluded[1]] == [0]
    valid = {c: v for c, v in fin.items() if c != 0}
    assert sorted(c for c, *_ in h.trained[1]) == fastest_valid(valid, CLIENTS - n)
    assert len(h.trained[1]) == CLIENTS - n  # still the same number waited for


def test_the_drop_fraction_is_tuned_on_calibration_seeds_only():
    assert tune_drop_fraction({0.3: [5.0, 6.0], 0.1: [7.0, 9.0], 0.2: [4.0, 6.0]}) == 0.2
    assert tune_drop_fraction({0.3: [5.0], 0.2: [5.0]}) == 0.2  # a tie: the one that drops less data
    p = Params.for_scale("quick")
    cal, evaluated = p.calibration_seed_list(), [p.seed + i for i in range(p.repeats)]
    assert len(cal) == p.calibration_seeds and not set(cal) & set(evaluated)
    # the flow's choice reads only the calibration runs, against each calibration seed's own target
    targets = {cal[0]: 0.9, cal[1]: 0.8}
    runs = {(s, d): {"accuracy": [0.5, 0.95, 0.95, 0.95], "round_s": [1.0] * 4} for s in cal for d in p.drop_fractions}
    runs[cal[0], p.drop_fractions[-1]] = {"accuracy": [0.95] * 4, "round_s": [1.0] * 4}
    runs[cal[1], p.drop_fractions[-1]] = {"accuracy": [0.85, 0.95, 0.95, 0.95], "round_s": [1.0] * 4}
    assert tuned_drop_fraction(p, targets, runs) == p.drop_fractions[-1]
    assert seed_target(p, {"accuracy": [0.1, 0.9, 0.9, 0.9]}) == pytest.approx(p.target_fraction * 0.9)


def test_fedavg_drop_is_a_deployable_baseline_with_its_own_claims():
    assert "fedavg_drop" in SPEC.baselines and "deployable" in SPEC.role("fedavg_drop")
    assert {(c.metric, c.baseline) for c in SPEC.claims if c.baseline == "fedavg_drop"} == {
        ("time_to_accuracy_s", "fedavg_drop"), ("final_accuracy", "fedavg_drop")}
    assert set(REGIME_POLICIES) == {"fluid", *SPEC.baselines}


@pytest.mark.parametrize("bad, field", [({"drop_fractions": [0.0]}, "drop_fractions"),
                                        ({"drop_fractions": [0.2, 0.2]}, "drop_fractions"),
                                        ({"calibration_seeds": 0}, "calibration_seeds")])
def test_bad_drop_parameters_fail_naming_the_field(bad, field):
    with pytest.raises(ParamsError) as e:
        Params.for_scale("smoke", **bad)
    assert e.value.field == field


def test_a_run_that_stops_at_its_target_gives_the_full_runs_time_to_target():
    w, plan = _workload()
    full = _run(w, plan, _cfg(), "fluid")
    target = sorted(smoothed(full.accuracy))[len(full.accuracy) // 2]  # the stop rule reads the smoothed curve
    cut = _run(w, plan, _cfg(), "fluid", stop_at=target)
    reached = time_to_target(full.accuracy, full.round_s, target)[1]
    assert len(cut.accuracy) == reached < ROUNDS and cut.accuracy == full.accuracy[:reached]
    assert cut.stragglers == full.stragglers[:reached] and cut.r == full.r[:reached]
    # the clock's compute is each client's median CPU over the rounds run, so compare the modelled part
    assert time_to_target(cut.accuracy, cut.round_s, target)[1] == reached


def test_a_regime_point_re_runs_the_federation_with_sub_models_sized_to_its_slowdown():
    """At a higher slowdown the re-detected stragglers get smaller sub-models in every round: the point is a
    new federation, not the headline's runs re-timed (whose sizes stay those chosen at the headline's)."""
    p = Params.for_scale("smoke")
    w15, w3 = p.workload(p.seed), p.at_slowdown(3.0).workload(p.seed)
    assert w3.slowed == w15.slowed and np.array_equal(w3.trajectory > w3.speed, w15.trajectory > w15.speed)
    r15, r3 = p.plan(w15).r, p.at_slowdown(3.0).plan(w3).r
    compared = [c for c in w15.slowed if c in r15 and c in r3 and r15[c] > p.min_submodel]
    assert compared and all(r3[c] < r15[c] for c in compared)
    # the regime sample at a non-headline slowdown is read from the re-run histories
    seeds, targets = [0, 1], [0.8, 0.8]

    def hist(acc, dt):  # one client (0, slowed) that trains the full model in 1 CPU s every round
        return {"accuracy": acc, "round_s": [dt] * len(acc), "trained": [[(0, 64, 1.0, 0.0)]] * len(acc),
                "speed": [[1.5]] * len(acc), "slowed": [0]}
    # the smoothed accuracy (running mean over 3 rounds) reaches 0.8 exactly at the end of round 2 / round 3
    runs = {(s, pol): hist([0.6, 1.0], 1.0) for s in seeds for pol in REGIME_POLICIES}
    rerun = {(3.0, s, pol): hist([0.7, 0.7, 1.0 + 1e-9], 2.0 if pol == "fluid" else 3.0) for s in seeds for pol in REGIME_RERUN}
    head = _point(p, p.straggler_slowdown, seeds, targets, runs, rerun)
    at3 = _point(p, 3.0, seeds, targets, runs, rerun)
    assert head.samples["fluid"] == pytest.approx([2.0, 2.0]) and at3.samples["fluid"] == pytest.approx([6.0, 6.0])
    assert at3.samples["fedavg_drop"] == pytest.approx([9.0, 9.0]) and at3.valid
    # FedAvg-wait's headline run re-timed: the slowed client 3 / 1.5 times slower in both rounds
    assert head.samples["fedavg_wait"] == pytest.approx([2.0, 2.0]) and at3.samples["fedavg_wait"] == pytest.approx([6.0, 6.0])
    rerun[3.0, 1, "fluid"] = hist([0.7, 0.7, 0.9], 2.0)  # FLuID misses the target in a seed there: invalid
    assert not _point(p, 3.0, seeds, targets, runs, rerun).valid


def test_fedavg_wait_does_not_depend_on_the_speeds_so_the_regime_may_re_time_it():
    """Everything FedAvg-wait trains is the same at every straggler slowdown (only the clock moves), so its
    regime point is its headline run re-timed; the dropout policies are not (their sub-models follow the speeds)."""
    w15, _ = _workload(1.5)
    w3, _ = _workload(3.0)
    traj = np.tile(w15.speed, (ROUNDS, 1))
    traj[2:4, 1] *= 4.0
    a = with_trajectory(w15, traj)
    b = with_trajectory(w3, traj * np.where(np.isin(np.arange(CLIENTS), w15.slowed), 2.0, 1.0))
    pa, pb = plan_stragglers(a, H, 1, 0.2, 0.5, 10.0), plan_stragglers(b, H, 1, 0.2, 0.5, 10.0)
    ha, hb = _run(a, pa, _cfg(), "fedavg_wait"), _run(b, pb, _cfg(), "fedavg_wait")
    assert ha.accuracy == hb.accuracy
    assert [[(c, k) for c, k, _, _ in d] for d in ha.trained] == [[(c, k) for c, k, _, _ in d] for d in hb.trained]
    fa, fb = _run(a, pa, _cfg(), "fluid"), _run(b, pb, _cfg(), "fluid")
    assert fa.r != fb.r  # FLuID's sub-models follow the slowdown: its point must be re-run
