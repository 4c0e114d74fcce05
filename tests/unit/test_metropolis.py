"""AI Metropolis, pure code: out-of-order = global sync (same world, same clusters), the check fails
on an unsafe rule, the executors, the oracle bound, parameters."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.metropolis import (Config, Params, ScheduleError, execute, initial_world, ready_clusters,
                                            same_steps, simulate, step_cluster, world_digest)
from mlsys_flows.systems.metropolis.engine import PrioritySlots, SimExecutor, run


def cfg(**kw) -> Config:
    base = dict(agents=12, steps=12, map_size=20, radius=2, max_speed=1, hotspots=3, hotspot_prob=0.7, act_prob=0.5,
                talk_prob=0.6, max_turns=4, cooldown=2, latency_median_s=0.01, latency_sigma=0.7, seed=0)
    return Config(**(base | kw))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("speed", [1, 2])
def test_out_of_order_reaches_the_global_world(seed, speed):
    c = cfg(seed=seed, max_speed=speed)
    g = simulate("global_sync", c, 3)
    o = simulate("out_of_order", c, 3)
    r = simulate("oracle", c, 3, truth=g.truth())
    assert o.digest == g.digest == r.digest
    assert same_steps(g, o) and same_steps(g, r)
    assert len(g.steps) == len(o.steps) and g.llm_calls == o.llm_calls == r.llm_calls
    assert g.max_clock_spread == 0  # the barrier: nobody runs ahead


def test_the_agents_really_meet_and_run_ahead():
    """The equivalence test is not vacuous: agents cluster, converse, and out-of-order runs ahead."""
    c = cfg()
    g, o = simulate("global_sync", c, 3), simulate("out_of_order", c, 3)
    assert any(len(m) >= 2 for _, m in g.steps) and g.conversations > 0
    assert o.max_clock_spread >= 2


def test_equivalence_check_fails_on_an_unsafe_rule():
    """Dropping the speed term (an agent may step while a lagging one could still walk into its range)
    breaks the equivalence, and the comparison sees it."""
    broken = [s for s in range(6)
              if simulate("out_of_order", cfg(seed=s), 3, safety=0).digest != simulate("global_sync", cfg(seed=s), 3).digest]
    assert broken, "an unsafe rule should diverge for some seed"
    c = cfg(seed=broken[0])
    b, g = simulate("out_of_order", c, 3, safety=0), simulate("global_sync", c, 3)
    assert not same_steps(b, g)


def test_oracle_needs_the_truth_and_an_unknown_policy_fails():
    c = cfg()
    with pytest.raises(ValueError, match="oracle"):
        simulate("oracle", c, 2)
    with pytest.raises(ValueError, match="unknown policy"):
        simulate("lockstep", c, 2)


@pytest.mark.parametrize("seed", range(4))
def test_without_slot_contention_oracle_le_out_of_order_le_global(seed):
    """With a slot per agent the makespan is the dependency DAG's longest path: fewer dependencies can
    only help (oracle's are a subset of out-of-order's, which are a subset of global sync's)."""
    c = cfg(seed=seed, agents=16)
    g = simulate("global_sync", c, 16)
    o = simulate("out_of_order", c, 16)
    r = simulate("oracle", c, 16, truth=g.truth())
    assert r.makespan_s <= o.makespan_s + 1e-12 <= g.makespan_s + 2e-12
    assert o.makespan_s < g.makespan_s


def test_one_slot_serializes_every_call():
    c = cfg()
    for policy in ("global_sync", "out_of_order"):
        o = simulate(policy, c, 1)
        assert o.makespan_s == pytest.approx(o.busy_call_s, rel=1e-9)


def test_global_sync_waits_for_the_barrier():
    c = cfg()
    clock = np.array([1] * 6 + [0] * 6)
    pos = np.array([(a.x, a.y) for a in initial_world(c)])
    busy = np.zeros(12, dtype=bool)
    assert all(t == 0 for t, _ in ready_clusters("global_sync", c, clock, pos, busy))
    # an agent far from every lagging one may run ahead out of order, a close one may not
    far = np.array([(0, 0)] + [(19, 19)] * 11)
    clock = np.array([3] + [0] * 11)
    assert (3, (0,)) in ready_clusters("out_of_order", c, clock, far, busy)
    near = far.copy()
    near[1] = (2 + 3, 0)  # within radius + 3 steps of agent 0
    assert (3, (0,)) not in ready_clusters("out_of_order", c, clock, near, busy)


def test_step_is_a_function_of_the_cluster_only():
    c = cfg()
    w = initial_world(c)
    a = step_cluster([w[3], w[1], w[2]], 5, c)
    b = step_cluster([w[2], w[3], w[1]], 5, c)
    assert a == b and a.members == (1, 2, 3)
    assert world_digest(w) != world_digest(list(a.new) + [x for x in w if x.id not in a.members])


def test_sim_executor_reports_a_stuck_schedule():
    with pytest.raises(ScheduleError):
        SimExecutor(2).wait_any()


def test_priority_slots_bound_concurrency_and_serve_lagging_first():
    slots, lock, state, order = PrioritySlots(2), threading.Lock(), {"now": 0, "peak": 0}, []

    def call(prio):
        slots.acquire(prio)
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
            order.append(prio)
        time.sleep(0.01)
        with lock:
            state["now"] -= 1
        slots.release()

    slots.acquire(-1), slots.acquire(-1)  # hold both slots while the waiters queue up
    threads = [threading.Thread(target=call, args=(p,)) for p in (5, 3, 9, 1, 7, 2)]
    for th in threads:
        th.start()
    time.sleep(0.2)
    slots.release(), slots.release()
    for th in threads:
        th.join()
    assert state["peak"] <= 2
    assert order[:2] == [1, 2] and sorted(order) == [1, 2, 3, 5, 7, 9]


def test_real_threads_reach_the_same_world():
    c = cfg(agents=8, steps=6, latency_median_s=0.003)
    g = simulate("global_sync", c, 3)
    for policy in ("global_sync", "out_of_order", "oracle"):
        o = execute(policy, c, 3, truth=g.truth())
        assert o.digest == g.digest and same_steps(o, g)
        assert o.makespan_s > 0


def test_run_stops_on_a_deadlock():
    class Nothing(SimExecutor):
        def submit(self, *a):
            pass
    # an executor that never runs what it is given: the runner must notice, not hang
    with pytest.raises(ScheduleError):
        run("out_of_order", cfg(), Nothing(2))


def test_params_reject_bad_values_by_field():
    with pytest.raises(ParamsError, match="radius"):
        Params.for_scale("smoke", radius=30, map_size=24)
    with pytest.raises(ParamsError, match="latency_median_s"):
        Params.for_scale("smoke", latency_median_s=0)
    with pytest.raises(ParamsError, match="llm_slots"):
        Params.for_scale("smoke", llm_slots=0)
    assert Params.for_scale("quick").sweep_slots() == [4, 8, 16, 32, 64]


def test_radius_sweep_simulates_every_policy_and_a_town_wider_than_its_map_leaves_nothing_to_reorder():
    from mlsys_flows.systems.metropolis import Params, sweep_radius

    p = Params.for_scale("smoke", regime_radius=[0, 23])
    out = sweep_radius(p)
    assert sorted(out) == [0, 23] and all(set(m) == {"global_sync", "out_of_order", "oracle"} for m in out.values())
    assert out[0]["out_of_order"] < out[0]["global_sync"]  # small radius: agents run ahead of each other
    # radius >= the map: every lagging agent can reach every other, so the rule is the barrier
    assert out[23]["out_of_order"] == out[23]["global_sync"]
    with pytest.raises(Exception):
        Params.for_scale("smoke", regime_radius=[1, 1])
