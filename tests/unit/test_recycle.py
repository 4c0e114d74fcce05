"""ReCycle: the decoupled backward (B_input now, B_weight later) gives the fused backward's gradients and the
check catches a wrong stash; the simulator reproduces 1F1B's closed form, respects every dependency (a
validator shown to catch a tampered schedule), and the three policies build the plans they claim to."""
from __future__ import annotations

import pytest

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.recycle import (Cluster, LayerCosts, Params, SimulationError, bamboo_plan, best_oobleck,
                                         oobleck_plan, place_failures, recycle_plan, simulate)
from mlsys_flows.systems.recycle.experiment import compare
from mlsys_flows.systems.recycle.gantt import square_waves, window_of
from mlsys_flows.systems.recycle.sim import Group, MicroBatch, Plan

torch = pytest.importorskip("torch")
from mlsys_flows.systems.recycle.stage import (Stage, backward_fused, backward_input,  # noqa: E402
                                               backward_weight)


# --- decoupled backward ---------------------------------------------------------------------------------

def _grads(stage):
    return {n: p.grad.clone() for n, p in stage.named_parameters()}


def _fused_and_split(tamper=None):
    torch.manual_seed(0)
    ref, dec = Stage(32, 4, 2), Stage(32, 4, 2)
    dec.load_state_dict(ref.state_dict())
    xs = [torch.randn(3, 8, 32) for _ in range(2)]
    dys = [torch.randn(3, 8, 32) for _ in range(2)]
    ref_dx = []
    for x, dy in zip(xs, dys):  # fused: one micro-batch after the other
        x = x.clone().requires_grad_(True)
        ref_dx.append(backward_fused(ref, x, ref(x), dy).clone())
    ins = [x.clone().requires_grad_(True) for x in xs]
    outs = [dec(x) for x in ins]                          # F, F
    dx = [backward_input(dec, x, y, dy, k) for k, (x, y, dy) in enumerate(zip(ins, outs, dys))]  # Bi, Bi
    linear_grads_after_bi = [p.grad for n, p in dec.named_parameters() if ".fc1." in n or ".qkv." in n]
    if tamper:
        tamper(dec.store)
    for k in (1, 0):                                      # Bw later, in another order
        backward_weight(dec, k)
    return ref, dec, ref_dx, dx, linear_grads_after_bi


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6) for k in a)


def test_split_backward_gives_the_fused_gradients():
    ref, dec, ref_dx, dx, after_bi = _fused_and_split()
    assert all(g is None for g in after_bi)               # B_input left the weight gradients for later
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(ref_dx, dx))
    assert _same(_grads(ref), _grads(dec))
    assert not dec.store.pending


def test_gradient_check_fails_on_a_wrong_stash():
    def swap_inputs(store):  # pair micro-batch 0's output gradients with micro-batch 1's layer inputs
        a, b = store.pending[0], store.pending[1]
        store.pending[0] = [(layer, xb, dya) for (layer, _, dya), (_, xb, _) in zip(a, b)]

    def drop_one(store):     # forget one micro-batch's weight gradients
        store.pending[1] = []

    for tamper in (swap_inputs, drop_one):
        ref, dec, *_ = _fused_and_split(tamper)
        assert not _same(_grads(ref), _grads(dec))


# --- simulator ------------------------------------------------------------------------------------------

def _costs(p2p=0.0, ar=1e9):
    return LayerCosts(forward=1.0, backward_input=1.0, backward_weight=1.0, optimizer=0.0, layer_param_bytes=0.0,
                      activation_bytes=0.0, p2p_gb_s=1.0, p2p_latency_s=p2p, allreduce_gb_s=ar, backward_fused=2.0)


def validate(plan: Plan, res) -> None:
    """Every dependency and worker exclusivity of a simulated schedule (raises AssertionError)."""
    by = {(r.kind, r.iteration, r.mb, r.stage): r for r in res.records if r.worker >= 0 and r.kind != "sync"}
    assert len(by) == sum(1 for r in res.records if r.worker >= 0 and r.kind != "sync")
    for (kind, it, mb, s), r in by.items():
        route = plan.microbatches[mb].route
        assert r.end - r.start >= 0
        assert plan.microbatches[mb].route[s] == r.worker
        if kind == "F" and s > 0:
            prev = by[("F", it, mb, s - 1)]
            assert r.start >= prev.end + (plan.p2p_s if route[s - 1] != route[s] else 0) - 1e-12
        if kind in ("Bi", "B"):
            assert r.start >= by[("F", it, mb, s)].end - 1e-12
            if s + 1 < len(route):
                assert r.start >= by[(kind, it, mb, s + 1)].end - 1e-12
        if kind == "Bw":
            assert r.start >= by[("Bi", it, mb, s)].end - 1e-12
    for w in range(len(plan.workers)):
        rs = sorted((r for r in res.records if r.worker == w), key=lambda r: r.start)
        assert all(a.end <= b.start + 1e-12 for a, b in zip(rs, rs[1:])), f"worker {w} runs two ops at once"


@pytest.mark.parametrize("S,M", [(2, 4), (4, 8), (3, 5)])
def test_fused_1f1b_matches_the_closed_form(S, M):
    cl = Cluster(1, S, M, 1, 1)
    plan = recycle_plan(cl, _costs(), [], decoupled=False, staggered=False)
    res = simulate(plan, 1)
    assert res.makespan == pytest.approx((M + S - 1) * 3.0)   # (M + S - 1) x (F + B)
    validate(plan, res)


def test_decoupled_fills_bubbles_and_stays_valid():
    cl = Cluster(2, 4, 8, 1, 1)
    fused = simulate(recycle_plan(cl, _costs(0.1), [], decoupled=False, staggered=False), 3)
    plan = recycle_plan(cl, _costs(0.1), [])
    dec = simulate(plan, 3)
    validate(plan, dec)
    assert dec.steady_iteration_s() < fused.steady_iteration_s()
    # the work is the same, only placed differently
    assert sum(r.end - r.start for r in dec.records if r.kind in ("F", "Bi", "Bw")) == \
        pytest.approx(sum(r.end - r.start for r in fused.records if r.kind in ("F", "B")))


def test_validator_catches_a_tampered_schedule():
    cl = Cluster(1, 3, 4, 1, 1)
    plan = recycle_plan(cl, _costs(), [])
    res = simulate(plan, 1)
    validate(plan, res)
    r = next(r for r in res.records if r.kind == "F" and r.stage == 2)
    r.start, r.end = r.start - 2.5, r.end - 2.5   # a forward before its input arrived
    with pytest.raises(AssertionError):
        validate(plan, res)


def test_recycle_reroutes_to_peers_of_the_same_stage():
    cl = Cluster(4, 4, 6, 1, 1)
    failed = [(1, 2)]
    plan = recycle_plan(cl, _costs(), failed)
    assert "p1s2" not in plan.workers and len(plan.workers) == 15
    loads = {}
    for mb in plan.microbatches:
        for s, w in enumerate(mb.route):
            assert plan.workers[w].endswith(f"s{s}")        # same stage (same weights)
            loads[w] = loads.get(w, 0) + 1
    peers = [loads[plan.workers.index(f"p{p}s2")] for p in (0, 2, 3)]
    assert sum(peers) == 24 and max(peers) - min(peers) <= 1
    res = simulate(plan, 3)
    validate(plan, res)
    free = simulate(recycle_plan(cl, _costs(), []), 3)
    assert free.steady_iteration_s() <= res.steady_iteration_s()


def test_staggered_optimizer_is_no_slower_than_a_barrier():
    cl = Cluster(4, 4, 4, 1, 1)
    costs = LayerCosts(1.0, 1.0, 1.0, 0.5, 4e9, 0.0, 1.0, 0.0, 1.0, 2.0)
    stag = simulate(recycle_plan(cl, costs, [(0, 1)]), 4).steady_iteration_s()
    barrier = simulate(recycle_plan(cl, costs, [(0, 1)], staggered=False), 4).steady_iteration_s()
    assert stag < barrier


def test_oobleck_shrinks_or_drops_and_keeps_the_global_batch():
    cl = Cluster(4, 4, 8, 2, 1)
    plan = oobleck_plan(cl, _costs(), [(2, 1)])
    assert len(plan.microbatches) == 32
    three = [w for w in plan.workers if w.startswith("q2")]
    assert len(three) == 3                                   # the damaged pipeline has S - 1 stages
    per_pipe = {}
    for mb in plan.microbatches:
        per_pipe[mb.route[0]] = per_pipe.get(mb.route[0], 0) + 1
        assert sum(d[0] for d in mb.durations) == 8          # every layer once
    assert per_pipe[plan.workers.index("q2s0")] < per_pipe[0]  # the slower pipeline gets fewer micro-batches
    dropped = oobleck_plan(cl, _costs(), [(2, 1)], drop=True)
    assert len(dropped.workers) == 12 and len(dropped.microbatches) == 32
    plan, res, choice = best_oobleck(cl, _costs(), [(2, 1)], 3)
    validate(plan, res)


def test_bamboo_runs_redundant_forwards_and_merges_a_failed_stage():
    cl = Cluster(2, 4, 4, 1, 1)
    free = bamboo_plan(cl, _costs(), [])
    assert all(len(d) == 5 and d[4] == 1.0 for mb in free.microbatches for d in mb.durations)
    plan = bamboo_plan(cl, _costs(), [(0, 2)])
    route = plan.microbatches[0].route
    assert route[1] == route[2] == plan.workers.index("p0s1")   # the predecessor runs the failed stage
    res = simulate(plan, 2)
    validate(plan, res)
    assert res.steady_iteration_s() > simulate(free, 2).steady_iteration_s()


def test_place_failures_constraints():
    for f in (1, 2, 4):
        got = place_failures(4, 4, f, seed=3)
        assert len(set(got)) == f
        for p, s in got:
            assert (p, (s + 1) % 4) not in got
    with pytest.raises(ValueError):
        place_failures(2, 2, 4, 0)


def test_simulator_rejects_a_plan_that_cannot_run():
    bad = Plan(workers=["a"], microbatches=[MicroBatch((0, 0), ((1, 1, 1, 2), (1, 1, 1, 2)))], groups=[Group((0,), 0.0)],
               limits=[0])  # no room for a single forward
    with pytest.raises(SimulationError):
        simulate(bad, 1)
    with pytest.raises(SimulationError):
        simulate(Plan(workers=["a"], microbatches=[MicroBatch((3,), ((1, 1, 1, 2),))], groups=[], limits=[1]), 1)


def test_compare_and_gantt_series():
    p = Params.for_scale("smoke")
    times = {"forward": 1e-3, "backward_input": 1e-3, "backward_weight": 5e-4, "backward_fused": 1.3e-3, "optimizer": 1e-4,
             "param_bytes": 1e6, "activation_bytes": 1e5}
    from mlsys_flows.systems.recycle.experiment import layer_costs
    m, sch, info = compare(p, layer_costs(times, p), (1, 2), 1, ("recycle_f1",))
    assert {"nofail", "oobleck_f0", "bamboo_f0", "recycle_f1", "recycle_fused_f1", "oobleck_f2"} <= set(m)
    assert m["recycle_f1"]["throughput"] <= m["nofail"]["throughput"]
    assert m["oobleck_f1"]["stall_ms"] > m["recycle_f1"]["stall_ms"] > 0 == m["bamboo_f1"]["stall_ms"]
    t0, t1 = window_of(sch["recycle_f1"])
    series = square_waves(sch["recycle_f1"], t0, t1)
    assert {"F", "Bi", "Bw"} <= set(series)  # one series per operation kind that ran
    xs, ys = series["F"]
    assert len(xs) == len(ys) and min(xs) >= 0 and max(xs) <= (t1 - t0) * 1e3 + 1e-9


@pytest.mark.parametrize("field,value", [("heads", 3), ("pipelines", 1), ("p2p_gb_s", 0.0)])
def test_params_reject_bad_values(field, value):
    with pytest.raises(ParamsError) as e:
        Params.for_scale("smoke", **{field: value})
    assert e.value.field == field or field in str(e.value)


# --- contract v3: the mechanism ablation (decoupled Oobleck) and the failures-per-window regime --------------

def test_decoupled_oobleck_steps_per_group_of_shared_layers():
    from mlsys_flows.systems.recycle.policies import _layer_groups

    # equal splits: one group per stage position; a shrunk pipeline's shards overlap and merge groups
    assert sorted(ms for ms, _ in _layer_groups([[2, 2], [2, 2]])) == [(0, 2), (1, 3)]
    assert _layer_groups([[2, 2], [4]]) == [((0, 1, 2), 4)]
    cl = Cluster(4, 4, 4, 1, 1)
    plan = oobleck_plan(cl, _costs(), [], decoupled=True)
    assert plan.decoupled and not plan.barrier and sorted(len(g.members) for g in plan.groups) == [4, 4, 4, 4]
    free = simulate(recycle_plan(cl, _costs(), []), 3).steady_iteration_s()
    res = simulate(plan, 3)
    validate(plan, res)
    assert res.steady_iteration_s() == pytest.approx(free)  # no failure: nothing but the rerouting differs
    assert res.steady_iteration_s() < simulate(oobleck_plan(cl, _costs(), []), 3).steady_iteration_s()


def test_regime_samples_and_params():
    from mlsys_flows.systems.recycle.experiment import layer_costs, regime_samples

    p = Params.for_scale("smoke", regime_failures=[2, 0])
    assert p.regime_failures == [0, 2] and p.failure_counts() == (1, 2, 4)
    times = {"forward": 1e-3, "backward_input": 1e-3, "backward_weight": 5e-4, "backward_fused": 1.3e-3, "optimizer": 1e-4,
             "param_bytes": 1e6, "activation_bytes": 1e5}
    m, _, _ = compare(p, layer_costs(times, p), p.failure_counts(), 1)
    r = regime_samples(m, p.regime_failures, 1)
    assert r[0]["recycle_f1"] == m["nofail"]["throughput"]
    assert r[2]["oobleck_decoupled_f1"] == m["oobleck_decoupled_f2"]["throughput"]
    # the ablation pays the same restart as Oobleck
    assert m["oobleck_decoupled_f1"]["stall_ms"] > m["recycle_f1"]["stall_ms"]
    # a measured restart replaces restart_iterations: every failure charges Oobleck exactly that many seconds more
    measured, _, _ = compare(p, layer_costs(times, p), p.failure_counts(), 1, restart_s=0.25)
    it_plain = m["oobleck_f0"]["iteration_ms"]
    for f in p.failure_counts():
        assert measured[f"oobleck_f{f}"]["stall_ms"] == pytest.approx(f * (p.lost_iterations * it_plain + 250.0))
        assert measured[f"recycle_f{f}"]["stall_ms"] == m[f"recycle_f{f}"]["stall_ms"]  # ReCycle never restarts
    with pytest.raises(ParamsError):
        Params.for_scale("smoke", regime_failures=[1, 1])
    with pytest.raises(ParamsError):
        Params.for_scale("smoke", regime_failures=[0, 12])  # cannot be placed on 4 x 4 workers


def test_a_fused_backward_costs_what_was_measured_not_input_plus_weight():
    """Review (2026-12-06): the plans without decoupling (Oobleck, Bamboo, the fused ablation) paid
    B_input + B_weight for their one backward pass, 12.17 ms where the run measured 10.75 ms. They pay
    the measured fused time now: a cheaper fused backward speeds up a fused plan and leaves a decoupled
    one as it was."""
    from dataclasses import replace

    cl = Cluster(2, 4, 4, 1, 1)
    split, cheaper = _costs(), replace(_costs(), backward_fused=1.5)
    fused_s = [simulate(oobleck_plan(cl, c, []), 3).steady_iteration_s() for c in (split, cheaper)]
    decoupled_s = [simulate(recycle_plan(cl, c, []), 3).steady_iteration_s() for c in (split, cheaper)]
    assert fused_s[1] < fused_s[0]
    assert decoupled_s[1] == decoupled_s[0]


@pytest.mark.parametrize("failed", [[], [(1, 0)], [(0, 1), (1, 3)]])
def test_each_plan_is_charged_its_own_backward(failed):
    """Issue 48: every plan pays its own costs. A plan that does not decouple (Oobleck, Bamboo, the fused
    ablation, and the failover run's restart) runs one backward per micro-batch and stage, charged the
    measured fused time; a decoupled plan (ReCycle, decoupled Oobleck) runs B_input and B_weight, charged
    theirs. Every record of the schedule, not only the iteration time."""
    from mlsys_flows.systems.recycle.failover import FailoverConfig, costs_from, plans

    c = LayerCosts(forward=1.0, backward_input=1.3, backward_weight=0.9, optimizer=0.0, layer_param_bytes=0.0,
                   activation_bytes=0.0, p2p_gb_s=1.0, p2p_latency_s=0.0, allreduce_gb_s=1e9, backward_fused=1.7)
    L = 2
    cl = Cluster(2, 4, 4, L, 1)
    fused = {"oobleck": best_oobleck(cl, c, failed, 2)[0], "bamboo": bamboo_plan(cl, c, failed),
             "recycle_fused": recycle_plan(cl, c, failed, decoupled=False, staggered=False)}
    decoupled = {"recycle": recycle_plan(cl, c, failed), "oobleck_decoupled": best_oobleck(cl, c, failed, 2, decoupled=True)[0]}
    if len(failed) <= 1:  # the failover run's plans (2 x 2) from per-stage times: what its ranks replay
        cfg = FailoverConfig(layers_per_stage=L, victims=(2,) if failed else (3,))
        times = [{"forward": 2.0, "backward_input": 2.6, "backward_weight": 1.8, "backward_fused": 3.4, "optimizer": 0.0,
                  "param_bytes": 1e6}] * 4
        pl = plans(costs_from(times, 1e-4, 1e-3, cfg), cfg)
        fused["failover_restart"] = pl.restart
        decoupled |= {"failover_rerouted": pl.rerouted, "failover_restart_decoupled": pl.restart_decoupled}
    for name, plan in {**fused, **decoupled}.items():
        res = simulate(plan, 2)
        records = [r for r in res.records if r.worker >= 0 and r.kind in ("B", "Bi", "Bw")]
        layers = {(r.iteration, r.mb, r.stage): plan.microbatches[r.mb].durations[r.stage][0] / c.forward
                  for r in records}  # the layers of that stage: its forward over one layer's
        kinds = {r.kind for r in records}
        if name in fused:
            assert kinds == {"B"}, name
            assert all(r.end - r.start == pytest.approx(layers[(r.iteration, r.mb, r.stage)] * c.backward_fused)
                       for r in records), name
        else:
            assert kinds == {"Bi", "Bw"}, name
            per = {"Bi": c.backward_input, "Bw": c.backward_weight}
            assert all(r.end - r.start == pytest.approx(layers[(r.iteration, r.mb, r.stage)] * per[r.kind])
                       for r in records), name


def test_quick_and_full_repeat_enough_for_a_verdict_and_smoke_keeps_its_rank_0_draw():
    """Each repeat is one calibration -> simulation pair of the headline: quick and full must give the
    verdict at least MIN_PAIRS of them (with 3, every verdict was 'ties (fewer than 6)' by construction);
    smoke stays one sample, seed 7, which draws rank 0 for the failover run."""
    from mlsys_flows.systems.common.verdict import MIN_PAIRS
    from mlsys_flows.systems.recycle.failover import draw_failure

    for scale in ("quick", "full"):
        assert Params.for_scale(scale).repeats >= MIN_PAIRS, scale
    smoke = Params.for_scale("smoke")
    assert smoke.repeats == 1 and smoke.seed == 7
    victims, _ = draw_failure(smoke.seed, smoke.failover_steps, smoke.failover_victims, smoke.failover_fail_step)
    assert list(victims) == [0]
