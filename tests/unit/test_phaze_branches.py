"""PHAZE's branched operator graphs (GPT, Llama and parallel-attention blocks): the forward pass has
concurrency the scheduling ILP uses (never longer than running the ops one at a time, strictly shorter
somewhere), t = 1 drops the all-reduces without losing an ordering, recompute = forward + backward in
every style, and the co-search beats choosing the best single chip first once memory per chip binds."""
from __future__ import annotations

import random

import pytest

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.phaze import (STYLES, Model, Params, Tech, candidates, evaluate_all_sizes, ilp_schedule,
                                       list_schedule, regime_pick, tpuv4_like, validate)
from mlsys_flows.systems.phaze.ops import Op, layer_graphs
from mlsys_flows.systems.phaze.schedule import active_schedule, ancestors, warm_start

TECH = Tech(hbm_gb_s_per_stack=819.2)


def small(style: str) -> Model:
    return Model(layers=2, hidden=256, heads=4, seq=256, vocab=1024, style=style)


def named_ancestors(ops: list[Op]) -> dict[str, set[str]]:
    anc = ancestors(ops)
    return {o.name: {ops[i].name for i in a} for o, a in zip(ops, anc)}


@pytest.mark.parametrize("style", STYLES)
def test_forward_graphs_branch(style):
    fwd = layer_graphs("block", tpuv4_like(), TECH, small(style), 2, 1)["fwd"]
    succ = {o.name: [x.name for x in fwd if o.name in x.deps] for o in fwd}
    assert max(len(s) for s in succ.values()) >= 3          # the norm feeds Q, K and V (and the MLP in parallel)
    assert any(len(o.deps) >= 2 for o in fwd)               # branches meet again
    anc = named_ancestors(fwd)
    assert "q" not in anc["v"] and "v" not in anc["softmax"]  # V is independent of the scores
    if style == "llama":
        assert "up" not in anc["silu"] and "gate" not in anc["up"]
    if style == "parallel":
        assert not {"fc1", "gelu", "fc2"} & anc["proj"]


@pytest.mark.parametrize("style", STYLES)
def test_ilp_never_exceeds_the_serial_order_and_beats_it_in_the_forward_pass(style):
    """The serial order (every op after the previous one, in graph order) is one feasible schedule, so
    the ILP's makespan is at most its sum of durations; the branches let it be strictly shorter."""
    archs = [tpuv4_like(), *candidates(TECH, 81, 0)[1:81:30]]
    shorter = 0
    for arch in archs:
        for tp in (1, 2, 4):
            for mb in (1, 2):
                for kind in ("block", "head"):
                    for pas in ("fwd", "bwd"):
                        ops = layer_graphs(kind, arch, TECH, small(style), tp, mb)[pas]
                        s = ilp_schedule(ops, time_limit_s=0.1)
                        serial = sum(o.duration for o in ops)
                        assert validate(ops, s.start) == pytest.approx(s.makespan, rel=1e-9)
                        assert s.makespan <= serial * (1 + 1e-9)
                        assert s.makespan <= warm_start(ops).makespan * (1 + 1e-9)
                        shorter += kind == "block" and pas == "fwd" and s.makespan < serial * (1 - 1e-3)
    assert shorter > 0


def test_the_forward_overlap_is_what_the_dependencies_allow():
    """Llama forward at t = 1: the heuristics and the ILP overlap V's projection with the softmax and
    the up projection with the SiLU; no two ops on a unit overlap (validate)."""
    ops = layer_graphs("block", tpuv4_like(), TECH, small("llama"), 1, 2)["fwd"]
    s = ilp_schedule(ops, time_limit_s=5, mip_rel_gap=1e-9)
    end = {o.name: s.start[o.name] + o.duration for o in ops}
    overlaps = lambda a, b: s.start[a] < end[b] and s.start[b] < end[a]   # noqa: E731
    assert overlaps("up", "silu") or overlaps("v", "softmax") or overlaps("v", "rope_q") or overlaps("k", "rope_q")
    assert s.makespan < sum(o.duration for o in ops)


@pytest.mark.parametrize("style", STYLES)
def test_tp1_drops_all_reduces_and_keeps_every_ordering(style):
    g1 = layer_graphs("block", tpuv4_like(), TECH, small(style), 1, 1)
    g2 = layer_graphs("block", tpuv4_like(), TECH, small(style), 2, 1)
    for pas in ("fwd", "bwd"):
        assert not any(o.unit == "net" for o in g1[pas]) and any(o.unit == "net" for o in g2[pas])
        net = {o.name for o in g2[pas] if o.unit == "net"}
        a1, a2 = named_ancestors(g1[pas]), named_ancestors(g2[pas])
        assert a1 == {n: a - net for n, a in a2.items() if n not in net}


@pytest.mark.parametrize("style", STYLES)
def test_recompute_pass_joins_forward_and_backward_at_one_op(style):
    """Every re-run forward op precedes the forward's one sink and every backward op follows it, so the
    pass's optimal makespan is forward + backward (checked with the ILP on the GPT block in test_phaze)."""
    g = layer_graphs("block", tpuv4_like(), TECH, small(style), 2, 1)
    ops = g["bwd_recompute"]
    anc = named_ancestors(ops)
    refwd = [o.name for o in ops if o.name.startswith("re_")]
    assert len(refwd) == len(g["fwd"]) and len(ops) == len(g["fwd"]) + len(g["bwd"])
    sink = refwd[-1]
    assert anc[sink] == set(refwd) - {sink}
    assert all(sink in anc[o.name] for o in ops if not o.name.startswith("re_"))


@pytest.mark.parametrize("seed", range(6))
def test_heuristics_are_valid_schedules(seed):
    rng = random.Random(seed)
    ops = []
    for i in range(14):
        deps = tuple(sorted({f"o{j}" for j in range(i) if rng.random() < 0.25}))
        ops.append(Op(f"o{i}", rng.choice(["tensor", "tensor", "vector", "net"]), float(rng.randint(1, 9)), deps))
    for s in (list_schedule(ops), active_schedule(ops), warm_start(ops)):
        assert validate(ops, s.start) == pytest.approx(s.makespan)
    assert warm_start(ops).makespan == min(list_schedule(ops).makespan, active_schedule(ops).makespan)


def test_llama_block_is_llama_2_7b_shaped():
    m = Model(layers=32, hidden=4096, heads=32, seq=4096, vocab=32000, style="llama")
    assert m.ffn() == 11008
    assert m.total_params() == pytest.approx(6.74e9, rel=0.005)
    gpt = Model(layers=24, hidden=2048, heads=16, seq=2048, vocab=51200)
    assert gpt.ffn() == 8192 and gpt.block_params() == 12 * 2048 ** 2 + 13 * 2048
    with pytest.raises(ValueError, match="style"):
        Model(1, 64, 1, 16, 256, style="moe")
    with pytest.raises(ParamsError, match="block_style"):
        Params.for_scale("smoke", block_style="moe")


def test_co_search_beats_single_chip_first_only_where_memory_binds():
    """Smoke model, three equal-area designs: the best single chip (12 arrays, 4 HBM stacks), a slower one
    with 6 stacks, and the TPUv4-like one. With memory to spare the fast chip also trains fastest; at a
    few tens of MiB per stack it must recompute or pipeline deeper and the 6-stack design wins."""
    p = Params.for_scale("smoke", regime_gib_per_stack=[0.03, 1.0, 8.0])
    grid = {a.name: a for a in candidates(p.tech(), 81, 0)}
    res = {n: evaluate_all_sizes(p, grid[n]) for n in ("tpuv4_like", "tc12x128_vc4_hbm4", "tc12x128_vc2_hbm6")}
    assert max(res, key=lambda n: res[n][""]["single_chip_samples_per_s"]) == "tc12x128_vc4_hbm4"
    sweep = regime_pick(res)
    assert sweep[0.03]["phaze"] > 1.05 * sweep[0.03]["single_chip_first"]
    assert sweep[0.03]["phaze"] == res["tc12x128_vc2_hbm6"][""]["regime_throughput"][0.03]
    assert sweep[8.0]["phaze"] == sweep[8.0]["single_chip_first"] == sweep[1.0]["phaze"]
