"""Swarm control: optimal assignment (checked by brute force), task conservation, message loss and failure
effects, the measured solve time on the event clock, and the crossover helper."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.swarm import (POLICIES, Params, SimConfig, Swarm, assignment_cost, brute_force_optimum,
                                       check_optimal, crossover, greedy_nearest, hungarian, simulate, travel_cost)
from mlsys_flows.systems.swarm.sim import FAILED


def fake_clock(step: float = 1e-5):
    """A deterministic stand-in for perf_counter: every call advances by ``step``."""
    c = itertools.count()
    return lambda: next(c) * step


SMALL = dict(n_drones=20, horizon_s=60.0, warmup_s=10.0, seed=3)


# ----- assignment -----
@pytest.mark.parametrize("shape", [(5, 5), (6, 4), (3, 7), (8, 8), (1, 5)])
def test_hungarian_is_optimal_by_brute_force(shape):
    rng = np.random.default_rng(sum(shape))
    for _ in range(5):
        cost = travel_cost(rng.uniform(0, 500, (shape[0], 2)), rng.uniform(0, 500, (shape[1], 2)), 15.0)
        pairs = hungarian(cost)
        check_optimal(cost, pairs)
        assert assignment_cost(cost, pairs) == pytest.approx(brute_force_optimum(cost))


def test_check_optimal_rejects_a_broken_assignment():
    cost = np.array([[1.0, 10.0, 10.0], [10.0, 1.0, 10.0], [10.0, 10.0, 1.0]])
    check_optimal(cost, [(0, 0), (1, 1), (2, 2)])
    with pytest.raises(ValueError, match="optimum"):
        check_optimal(cost, [(0, 1), (1, 0), (2, 2)])           # swapped: valid but not optimal
    with pytest.raises(ValueError, match="twice"):
        check_optimal(cost, [(0, 0), (0, 1), (2, 2)])           # a drone used twice
    with pytest.raises(ValueError, match="maximal"):
        check_optimal(cost, [(0, 0), (1, 1)])                   # a task left out


def test_greedy_is_valid_but_can_be_suboptimal():
    # drone 0 is nearest to both tasks: greedy takes the cheapest pair first and pays for it
    cost = np.array([[1.0, 2.0], [2.0, 100.0]])
    greedy = greedy_nearest(cost)
    assert assignment_cost(cost, greedy) == 101.0 > brute_force_optimum(cost) == 4.0
    with pytest.raises(ValueError):
        check_optimal(cost, greedy)


# ----- simulator -----
@pytest.mark.parametrize("policy", POLICIES)
def test_every_arrived_task_is_accounted_for(policy):
    cfg = SimConfig(**SMALL, failure_rate_per_h=60.0, radio_loss=0.2, backhaul_loss=0.05)
    s = Swarm(cfg, policy, clock=fake_clock())
    res = s.run()
    c = res.counts
    assert c["tasks_arrived"] == len(s.w.arr_t) == len(s.tasks) > 30
    assert c["tasks_arrived"] == c["tasks_completed"] + c["tasks_dropped"] + c["tasks_pending"] + c["tasks_in_service"]
    states = [t.state for t in s.tasks]
    assert states.count("done") == c["tasks_completed"] and states.count("dropped") == c["tasks_dropped"]
    assert all(t.done - t.arrival >= t.service - 1e-9 for t in s.tasks if t.state == "done")


def test_conservation_counts_unfinished_tasks_when_the_run_is_cut_short():
    cfg = SimConfig(**SMALL)
    res = Swarm(cfg, "centralized", clock=fake_clock()).run(drain=False)    # stopped at the horizon
    c = res.counts
    assert c["tasks_pending"] + c["tasks_in_service"] > 0
    assert c["tasks_arrived"] == c["tasks_completed"] + c["tasks_dropped"] + c["tasks_pending"] + c["tasks_in_service"]


def test_message_loss_makes_distributed_control_worse():
    runs = {loss: simulate(SimConfig(**SMALL, radio_loss=loss, failure_rate_per_h=0.0), "distributed",
                           clock=fake_clock()) for loss in (0.0, 0.4)}
    clean, lossy = runs[0.0].counts, runs[0.4].counts
    assert clean["messages_lost"] == 0 < lossy["messages_lost"]
    assert lossy["wasted_trips"] > clean["wasted_trips"]          # lost claims and TAKENs: duplicate flights
    assert runs[0.4].metrics()["travel_m_per_task"] > runs[0.0].metrics()["travel_m_per_task"]


def test_failures_remove_drones():
    cfg = SimConfig(**SMALL, failure_rate_per_h=120.0)
    for policy in POLICIES:
        s = Swarm(cfg, policy, clock=fake_clock())
        res = s.run()
        failed = np.flatnonzero(s.state == FAILED)
        assert res.counts["drones_failed"] == len(failed) > 0
        for d in failed:   # a failed drone serves nothing after its failure
            t_fail = s.w.fail_t[d]
            assert not any(t.server == d and t.start > t_fail for t in s.tasks)
    assert simulate(SimConfig(**SMALL, failure_rate_per_h=0.0), "centralized", clock=fake_clock()).counts["drones_failed"] == 0


def test_the_measured_solve_time_is_on_the_event_clock():
    cfg = SimConfig(**SMALL, rtt_jitter_s=0.0, backhaul_loss=0.0)
    fast = simulate(cfg, "centralized", clock=fake_clock(1e-6)).metrics()
    slow = simulate(cfg, "centralized", clock=fake_clock(0.25)).metrics()   # each solve "takes" 0.25 s
    assert fast["p50_decision_latency_s"] == pytest.approx(cfg.rtt_s, abs=0.01)
    assert slow["p50_decision_latency_s"] >= 0.25 + cfg.rtt_s
    assert slow["compute_s_mean"] == pytest.approx(0.25)


def test_centralized_plans_are_never_worse_than_greedy_on_travel():
    cfg = SimConfig(**SMALL, failure_rate_per_h=0.0)
    hung = simulate(cfg, "centralized", clock=fake_clock()).metrics()
    greedy = simulate(cfg, "centralized_greedy", clock=fake_clock()).metrics()
    assert hung["travel_m_per_task"] <= greedy["travel_m_per_task"]


# ----- crossover -----
def test_crossover_interpolates_in_log_n():
    cr = crossover([10, 100, 1000], [5.0, 5.0, 5.0], [2.0, 4.0, 8.0])
    assert cr.n == pytest.approx(100 * 10 ** 0.25)            # difference 1 -> -3: a quarter of the interval
    assert cr.interpolate([10, 100, 1000], [0.0, 4.0, 8.0]) == pytest.approx(5.0)
    assert "between N=100 and N=1000" in cr.note


def test_crossover_at_or_below_the_smallest_n():
    cr = crossover([10, 100], [1.0, 1.0], [2.0, 3.0])
    assert cr.n == 10 and "at or below" in cr.note


def test_crossover_free_curves_give_none_with_a_note():
    cr = crossover([10, 100, 1000], [5.0, 6.0, 7.0], [1.0, 2.0, 3.0])
    assert cr.n is None and "no crossover" in cr.note
    assert cr.interpolate([10, 100, 1000], [1.0, 2.0, 3.0]) is None
    with pytest.raises(ValueError):
        crossover([10, 10], [1.0, 1.0], [2.0, 2.0])


# ----- parameters -----
def test_params_reject_a_bad_grid_naming_it():
    for bad in ([100, 12], [12, 12], [2, 100], [12]):
        with pytest.raises(ParamsError) as exc:
            Params.for_scale("smoke", n_grid=bad)
        assert exc.value.field.split(".")[0] == "n_grid"
    p = Params.for_scale("quick")
    assert p.config(1000).horizon_s == pytest.approx(max(p.min_horizon_s, p.tasks_per_run / (p.load * 1000 / p.service_mean_s)))
    assert math.isclose(p.config(12).warmup_s * 3, p.config(12).horizon_s)


def test_decision_latency_is_one_task_side_definition_for_both_controls():
    """Arrival to the serving drone's order, every wait included: a task no drone ever committed to counts its
    whole deadline; under distributed control a task nobody heard waits for a re-announce, so its latency is at
    least the announce interval, which the per-request latency (from the re-announce) leaves out. A task's time
    to service (arrival to service start, flight included) is never shorter than its decision latency."""
    from mlsys_flows.systems.swarm.sim import Task, task_decision_latency, task_time_to_service

    t = Task(np.zeros(2), arrival=10.0, service=1.0, deadline=70.0)
    assert task_decision_latency(t) == 60.0
    t.decided = 10.5
    assert task_decision_latency(t) == 0.5
    cfg = SimConfig(**SMALL, failure_rate_per_h=0.0, radio_loss=0.6, announce_interval_s=5.0)
    for policy in POLICIES:
        s = Swarm(cfg, policy, clock=fake_clock())
        res = s.run()
        lat = [task_decision_latency(k) for k in s.tasks if cfg.warmup_s <= k.arrival <= cfg.horizon_s]
        assert sorted(res.decision_latency_s) == sorted(lat) and all(x >= 0 for x in lat)
        assert all(task_time_to_service(k) >= task_decision_latency(k) - 1e-12 for k in s.tasks)
        assert all(k.decided <= k.first_start for k in s.tasks if not math.isnan(k.first_start))
        assert res.metrics()["p99_time_to_service_s"] >= res.metrics()["p99_decision_latency_s"]
        if policy == "distributed":  # lossy radio: some task missed its first announcement and waited >= 5 s
            assert max(lat) >= cfg.announce_interval_s > res.metrics()["p99_request_latency_s"]


def test_each_repeat_is_a_workload_of_its_own_shared_by_every_policy():
    """Repeat r draws its workload from seed + r (what the flow's task runs): the repeats are
    independent pairs, not reruns of one workload (whose interval would span only the measured solve
    times' jitter); build_result refuses a repeat whose policies ran different workloads."""
    from mlsys_flows.systems.swarm import simulate_repeat
    from mlsys_flows.systems.swarm.result import build_result

    p = Params.for_scale("smoke", n_grid=[12, 24])
    assert p.config(12, 0) == p.config(12) and p.config(12, 1).seed == p.seed + 1
    runs = {(r, n, q): simulate_repeat(p, n, q, r) for r in range(2) for n in p.n_grid for q in POLICIES}
    arrivals = {r: {q: runs[(r, 12, q)]["metrics"]["tasks_arrived"] for q in POLICIES} for r in range(2)}
    assert all(len(set(by.values())) == 1 for by in arrivals.values()), arrivals  # one workload per repeat
    assert arrivals[0]["centralized"] != arrivals[1]["centralized"], arrivals
    result = build_result(p, 2, runs)
    assert len(result.samples["distributed"]["tasks_arrived"]) == 2 and result.deterministic == {"n_drones"}
    runs[(1, 24, "distributed")] = simulate_repeat(p, 24, "distributed", 0)  # another repeat's workload
    with pytest.raises(ValueError, match="repeat 1, N=24: the policies ran different workloads"):
        build_result(p, 2, runs)


def test_a_replanned_order_does_not_keep_its_tasks_decision():
    """Review B1: the Hungarian re-plans drones en route. A task whose drone is sent elsewhere (or stopped)
    before reaching it is not decided by that order: its decision is the order of the drone that serves it
    (scripted orders, as the backend's replies arrive at the drones; every time in s)."""
    from mlsys_flows.systems.swarm.sim import Workload, task_decision_latency, task_time_to_service

    cfg = SimConfig(n_drones=3, horizon_s=100.0, warmup_s=0.0, failure_rate_per_h=0.0, speed_m_s=10.0)
    w = Workload(drone_xy=np.array([[0.0, 0.0], [200.0, 0.0], [0.0, 1000.0]]), fail_t=np.full(3, np.inf),
                 arr_t=np.array([1.0, 2.0, 16.0]), task_xy=np.array([[100.0, 0.0], [0.0, 100.0], [500.0, 500.0]]),
                 service_s=np.array([5.0, 5.0, 5.0]))
    s = Swarm(cfg, "centralized", workload=w, clock=fake_clock())

    def at(t, handler, *args):
        s.now = t
        getattr(s, "on_" + handler)(*args)

    at(1.0, "arrive", 0)
    at(1.5, "assign", 0, 0, 1)            # drone 0 is sent to task 0 ...
    at(2.0, "arrive", 1)
    at(2.5, "assign", 0, 1, 2)            # ... and re-planned to task 1 before reaching it
    t0, t1 = s.tasks[0], s.tasks[1]
    assert math.isnan(t0.decided)         # task 0 is pending with no drone heading there: undecided
    at(4.0, "assign", 1, 0, 2)            # drone 1 is sent to task 0 (100 m: 10 s) and serves it
    at(14.0, "reach", 1, 0, float(s.eta[1]))
    assert t0.state == "started" and t0.server == 1
    assert task_decision_latency(t0) == pytest.approx(3.0)          # 4.0 - 1.0, not the withdrawn 1.5 - 1.0
    assert task_time_to_service(t0) == pytest.approx(13.0)          # the flight counts here
    at(15.0, "assign", 0, -1, 3)          # drone 0 is stopped: nobody heads to task 1 any more
    assert math.isnan(t1.decided) and task_decision_latency(t1) == cfg.deadline_s
    assert task_time_to_service(t1) == cfg.deadline_s                # never started: its deadline
    # a swap whose orders arrive out of order: drone 2's order to task 2 lands before drone 0's (earlier)
    # one is withdrawn; the task's decision is then drone 2's order, the one still standing
    at(16.0, "arrive", 2)
    at(16.5, "assign", 0, 2, 4)
    at(17.0, "assign", 2, 2, 4)
    assert s.tasks[2].decided == 16.5
    at(17.5, "assign", 0, 1, 5)           # drone 0 leaves task 2 (back to task 1)
    assert s.tasks[2].decided == 17.0 and t1.decided == 17.5
