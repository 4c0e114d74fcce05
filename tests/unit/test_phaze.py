"""PHAZE pure code: the scheduling ILP against brute force, the placement DP against exhaustive
enumeration, the memory check, the equal-area design space and the parameters."""
import random

import pytest

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.phaze import (LayerCost, Model, Params, PlacementError, Plan, ScheduleError, System,
                                       Tech, area_mm2, brute_force, candidates, dp_split, exhaustive,
                                       ilp_schedule, list_schedule, place, score_plan, tpuv4_like, validate)
from mlsys_flows.systems.phaze.ops import Op, layer_graphs


def tiny_layer() -> list[Op]:
    """A backward-like layer: dgrads on the critical path, wgrads free to fill idle tensor time."""
    return [Op("v0", "vector", 1.0),
            Op("dg1", "tensor", 3.0, ("v0",)), Op("wg1", "tensor", 4.0, ("v0",)),
            Op("v1", "vector", 5.0, ("dg1",)),
            Op("dg2", "tensor", 2.0, ("v1",)), Op("wg2", "tensor", 1.0, ("v1",)),
            Op("n1", "net", 2.0, ("dg2",)), Op("v2", "vector", 1.0, ("n1",))]


def random_layer(rng: random.Random, n: int) -> list[Op]:
    ops = []
    for i in range(n):
        deps = tuple(sorted({f"o{j}" for j in range(i) if rng.random() < 0.3}))
        ops.append(Op(f"o{i}", rng.choice(["tensor", "tensor", "vector", "net"]), float(rng.randint(1, 9)), deps))
    return ops


def test_ilp_matches_brute_force_on_a_tiny_layer():
    ops = tiny_layer()
    s = ilp_schedule(ops, time_limit_s=10, mip_rel_gap=1e-9)
    assert s.makespan == pytest.approx(brute_force(ops)) and s.gap == 0.0
    assert validate(ops, s.start) == pytest.approx(s.makespan)
    # the best order defers wg1 into the vector op's shadow: 1 + 3 + 5 + 2 + 2 + 1 = 14
    assert s.makespan == pytest.approx(14.0)
    assert sum(o.duration for o in ops) > s.makespan  # overlap really happens


@pytest.mark.parametrize("seed", range(8))
def test_ilp_matches_brute_force_on_random_layers(seed):
    ops = random_layer(random.Random(seed), 7)
    s = ilp_schedule(ops, time_limit_s=10, mip_rel_gap=1e-9)
    assert s.makespan == pytest.approx(brute_force(ops), rel=1e-7)
    validate(ops, s.start)


def test_a_suboptimal_or_broken_schedule_is_caught():
    ops = tiny_layer()
    best = brute_force(ops)
    # serial order (wg1 before dg1 on the critical path) is valid but longer: the comparison can fail
    serial, t = {}, 0.0
    for name in ("v0", "wg1", "dg1", "v1", "dg2", "wg2", "n1", "v2"):
        serial[name] = t
        t += next(o.duration for o in ops if o.name == name)
    assert validate(ops, serial) > best
    overlap = dict(ilp_schedule(ops).start)
    overlap["wg1"] = overlap["dg1"]          # two ops on the tensor unit at once
    with pytest.raises(ScheduleError, match="overlap"):
        validate(ops, overlap)
    early = dict(ilp_schedule(ops).start)
    early["v1"] = 0.0                        # before its dependency ends
    with pytest.raises(ScheduleError, match="dependency"):
        validate(ops, early)


def test_recompute_pass_is_forward_plus_backward_and_heuristic_is_a_bound():
    mdl = Model(layers=2, hidden=256, heads=4, seq=128, vocab=1024)
    g = layer_graphs("block", tpuv4_like(), Tech(), mdl, 2, 1)
    fwd, bwd, both = (ilp_schedule(g[k], time_limit_s=20, mip_rel_gap=1e-9) for k in ("fwd", "bwd", "bwd_recompute"))
    assert both.makespan == pytest.approx(fwd.makespan + bwd.makespan, rel=1e-6)
    assert bwd.makespan <= list_schedule(g["bwd"]).makespan * (1 + 1e-9)
    assert bwd.makespan < sum(o.duration for o in g["bwd"])


def random_costs(rng: random.Random, n: int, tps, mbs) -> dict:
    base = [(rng.uniform(1, 5), rng.uniform(2, 9), rng.uniform(1, 6), rng.uniform(0.5, 3), rng.uniform(1, 8))
            for _ in range(n)]
    out = {}
    for t in tps:
        for b in mbs:
            out[(t, b)] = [LayerCost(f * b / t * 1e-3, bw * b / t * 1e-3, (f + bw) * b / t * 1e-3 * 1.05,
                                     st * b / t * 2**29, ip * b * 2**25, par / t * 2**23)
                           for f, bw, ip, st, par in base]
    return out


@pytest.mark.parametrize("seed", range(10))
def test_placement_dp_matches_exhaustive_enumeration(seed):
    rng = random.Random(seed)
    tps, mbs = (1, 2), (1, 2)
    costs = random_costs(rng, 5, tps, mbs)
    sysm = System(chips=4, global_batch=8, hbm_bytes=rng.choice([1, 2, 3, 4, 8]) * 2**30, link_gb_s=50.0,
                  link_latency_us=2.0, state_bytes_per_param=16.0, boundary_bytes_per_sample=2**20)
    best, tried = place(costs, sysm, tps, mbs)
    ref = exhaustive(costs, sysm, tps, mbs)
    assert tried > 0
    if ref is None:
        assert best is None
        return
    assert best is not None and best.iteration_s == pytest.approx(ref.iteration_s, rel=1e-12)
    it, mems = score_plan(best, costs[(best.tp, best.micro_batch)], sysm)   # the DP's plan re-scored
    assert it == pytest.approx(best.iteration_s) and max(mems) <= sysm.hbm_bytes


def _memory_case():
    cost = LayerCost(1e-3, 2e-3, 3.1e-3, stash_bytes=4 * 2**30, input_bytes=2**28, params=2**24)
    costs = [cost] * 4
    sysm = System(chips=1, global_batch=4, hbm_bytes=8 * 2**30, link_gb_s=50.0, link_latency_us=2.0,
                  state_bytes_per_param=16.0, boundary_bytes_per_sample=2**20)
    return costs, sysm


def test_memory_check_rejects_an_over_memory_plan():
    costs, sysm = _memory_case()
    # one stage stashing 4 layers x 1 micro-batch x 4 GiB = 16 GiB + 1 GiB of state > 8 GiB
    stash = Plan(1, 1, 1, 4, (0, 4), (False,), 0.0)
    with pytest.raises(PlacementError, match="HBM"):
        score_plan(stash, costs, sysm)
    # recomputing keeps only the inputs (+ one layer's activations): 1 + 1 + 4 GiB fits
    it, mems = score_plan(Plan(1, 1, 1, 4, (0, 4), (True,), 0.0), costs, sysm)
    assert max(mems) <= sysm.hbm_bytes
    plan = dp_split(costs, 1, 1, 1, 4, sysm)
    assert plan is not None and plan.recompute == (True,) and plan.iteration_s == pytest.approx(it)
    # a DP that ignored memory would stash (it is faster); the independent check catches it
    unchecked = dp_split(costs, 1, 1, 1, 4, System(**{**sysm.__dict__, "hbm_bytes": 1e18}))
    assert unchecked.recompute == (False,) and unchecked.iteration_s < plan.iteration_s
    with pytest.raises(PlacementError):
        score_plan(unchecked, costs, sysm)
    # nothing fits at all: no plan
    assert dp_split(costs, 1, 1, 1, 4, System(**{**sysm.__dict__, "hbm_bytes": 2 * 2**30})) is None


def test_design_space_is_equal_area_and_holds_the_tpuv4_like_chip():
    tech = Tech()
    ref = tpuv4_like()
    assert ref.peak_tflops(tech) == pytest.approx(275, rel=0.01)      # 8 x 128^2 MACs at 1.05 GHz
    designs = candidates(tech, 16, 0)
    assert len(designs) == 16 and designs[0] == ref and len({d.name for d in designs}) == 16
    budget = area_mm2(ref, tech)
    for d in designs:
        assert budget - tech.sram_mm2_per_mib <= area_mm2(d, tech) <= budget + 1e-9
    assert len(candidates(tech, 81, 0)) == 81
    assert len({(d.tc_dim, d.tensor_cores, d.hbm_stacks) for d in candidates(tech, 81, 0)}) > 9


def test_params_reject_bad_values_naming_the_field():
    with pytest.raises(ParamsError, match="chips"):
        Params.for_scale("smoke", chips=0)
    with pytest.raises(ParamsError, match="heads|hidden"):
        Params.for_scale("smoke", heads=7)
    p = Params.for_scale("quick")
    assert p.space().tps == (1, 2, 4, 8) and p.space().mbs == (1, 2, 4)
