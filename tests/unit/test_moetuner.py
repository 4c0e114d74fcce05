"""MoETuner: the ILPs' plans satisfy their constraints and are optimal on small instances (brute force,
from a cold start and inside the full planner, whose warm start from the baselines would make a
"no worse than the baselines" check pass by construction); each property check is shown to fail on a
deliberately broken placement; traces and parameters are validated."""
from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.moetuner import (CostModel, Params, RoutingTrace, Topology, TraceError, check_placement,
                                          contiguous, evaluate, plan_and_evaluate, profile, synthetic_trace)
from mlsys_flows.systems.moetuner.placement import (PlanError, best_layer_mapping, best_simple_mapping,
                                                    brute_force_clusters, brute_force_mapping,
                                                    cluster_transitions, colocation_bound, greedy_layer,
                                                    ilp1_clusters, ilp2_mapping, ilp2_window,
                                                    ilp2_window_colocation, inflow_cost, min_id_placement,
                                                    layer_sweeps, mapping_cost, max_cluster_load, moetuner,
                                                    outflow_cost, sequential_mapping, two_level_links)

loads = st.lists(st.integers(0, 1000), min_size=6, max_size=6).map(lambda xs: np.array(xs, float))


@settings(max_examples=25, deadline=None)
@given(load=loads)
def test_ilp1_is_balanced_and_matches_brute_force(load):
    r = ilp1_clusters(load, 3, time_limit_s=10)
    assert np.bincount(r.cluster_of, minlength=3).tolist() == [2, 2, 2]  # each expert once, 2 per cluster
    assert r.gap == 0.0
    assert r.max_load == pytest.approx(brute_force_clusters(load, 3))
    assert r.max_load <= max_cluster_load(load, greedy_layer(load, 3), 3) + 1e-9
    assert r.max_load <= max_cluster_load(load, contiguous(1, 6, 3)[0], 3) + 1e-9


def _instance(seed: int, g: int, layers: int, experts: int):
    trace = synthetic_trace(4000, layers, experts, 2, 1.0, 0.8, 2, seed)
    prof = profile(trace)
    clusters = np.stack([ilp1_clusters(prof.load[l], g, time_limit_s=5).cluster_of for l in range(layers)])
    return prof, clusters, cluster_transitions(prof, clusters, g)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ilp2_single_node_matches_brute_force(seed):
    topo = Topology(1, 3, 100.0, 10.0)
    _, _, cc = _instance(seed, 3, 4, 6)
    m = ilp2_mapping(cc, topo.pair_weight(), window=3, time_limit_s=30, symmetric=True, seed=seed)
    for perm in m.perms:  # cluster -> GPU is a bijection in every layer
        assert sorted(perm.tolist()) == [0, 1, 2]
    assert m.cost == pytest.approx(brute_force_mapping(cc, topo.pair_weight()))
    assert m.gap == pytest.approx(0.0, abs=1e-6)


def test_two_level_links_reads_the_topology():
    node, intra, inter = two_level_links(Topology(2, 3, 100.0, 5.0).pair_weight())
    assert node.tolist() == [0, 0, 0, 1, 1, 1] and (intra, inter) == (pytest.approx(1.0), pytest.approx(20.0))
    assert two_level_links(np.array([[0, 1, 2], [1, 0, 3], [2, 3, 0]], float)) is None  # not node-uniform


def test_ilp2_two_nodes_matches_brute_force_and_beats_sequential():
    topo = Topology(2, 2, 100.0, 5.0)
    w = topo.pair_weight()
    _, _, cc = _instance(3, 4, 3, 8)
    m = ilp2_mapping(cc, w, window=2, time_limit_s=60, symmetric=False)
    assert all(sorted(p.tolist()) == [0, 1, 2, 3] for p in m.perms)
    assert m.cost == pytest.approx(brute_force_mapping(cc, w))
    assert m.bound <= m.cost + 1e-9 and m.gap == pytest.approx(1 - m.bound / m.cost)
    assert sum(colocation_bound(c, w) for c in cc) <= m.cost + 1e-9  # a valid lower bound
    assert m.cost <= mapping_cost(cc, w, sequential_mapping(cc, w, np.arange(4))) + 1e-9
    assert m.cost <= mapping_cost(cc, w, np.tile(np.arange(4), (3, 1))) + 1e-9


def test_windowed_ilp2_never_worse_than_its_warm_start():
    topo = Topology(2, 2, 100.0, 5.0)
    w = topo.pair_weight()
    _, _, cc = _instance(4, 4, 6, 8)
    m = ilp2_mapping(cc, w, window=2, time_limit_s=3, symmetric=False)
    assert m.cost <= mapping_cost(cc, w, sequential_mapping(cc, w, np.arange(4))) + 1e-9
    assert 0.0 <= m.gap <= 1.0 and m.bound <= m.cost + 1e-9


def _exhaustive_mapping_optimum(cc: np.ndarray, weight: np.ndarray) -> float:
    """The least profiled ILP 2 objective over every cluster->GPU bijection of every layer, by
    enumeration written apart from the library (4 GPUs, 3 layers: 24^3 = 13,824 mappings): per
    transition, the worst pair's weighted traffic, where GPU pair (i, j) carries cc[c, c'] for the
    cluster c on i and the cluster c' on j."""
    g = cc.shape[1]
    perms = [np.array(p) for p in itertools.permutations(range(g))]
    # cost of a transition depends only on the two layers' mappings: tabulate it for every pair
    cost = np.empty((len(cc), len(perms), len(perms)))
    for t, flows in enumerate(cc):
        for a, pa in enumerate(perms):
            for b, pb in enumerate(perms):
                traffic = np.zeros((g, g))
                traffic[pa[:, None], pb[None, :]] = flows
                cost[t, a, b] = (traffic * weight).max()
    best = np.zeros(len(perms))  # dynamic programming over layers (a chain): exact
    for t in range(len(cc)):
        best = (best[:, None] + cost[t]).min(axis=0)
    return float(best.min())


def _check_mapping_optimal(perms: np.ndarray, cc: np.ndarray, weight: np.ndarray) -> None:
    """Every layer's cluster->GPU map is a bijection and the mapping's objective is the exhaustive optimum."""
    g = cc.shape[1]
    for l, perm in enumerate(np.asarray(perms)):
        assert sorted(perm.tolist()) == list(range(g)), f"layer {l}: {perm.tolist()} is not a bijection"
    got, best = mapping_cost(cc, weight, np.asarray(perms)), _exhaustive_mapping_optimum(cc, weight)
    assert got <= best * (1 + 1e-9), f"objective {got} > the optimum {best}"


@functools.lru_cache(maxsize=None)
def _two_node_instance():
    topo = Topology(2, 2, 100.0, 5.0)  # 2 nodes of 2 GPUs: links of weight 0 (same GPU), 1 and 20
    _, _, cc = _instance(3, 4, 3, 8)
    return cc, topo.pair_weight()


@pytest.mark.parametrize("formulation", [ilp2_window, ilp2_window_colocation])
def test_ilp2_from_a_cold_start_matches_exhaustive_search(formulation):
    # no warm start, no heuristic, no window: one ILP over all layers must find the optimum by itself
    # (both formulations: the RLT one for any link weights, the co-location one for node-uniform links)
    cc, w = _two_node_instance()
    perms, res = formulation(cc, w, None, fix_first=False, fix_last=False, time_limit_s=120)
    assert res.status == "Optimal"
    _check_mapping_optimal(perms, cc, w)
    assert res.objective == pytest.approx(_exhaustive_mapping_optimum(cc, w))


def _swap_two_clusters(perms: np.ndarray, cc: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The first swap of two clusters' GPUs in one layer that makes the objective worse."""
    for l, (a, b) in itertools.product(range(len(perms)), itertools.combinations(range(perms.shape[1]), 2)):
        bad = perms.copy()
        bad[l, [a, b]] = bad[l, [b, a]]
        if mapping_cost(cc, w, bad) > mapping_cost(cc, w, perms) * (1 + 1e-6):
            return bad
    raise AssertionError("no worsening swap")


def _two_clusters_on_one_gpu(perms: np.ndarray, cc: np.ndarray, w: np.ndarray) -> np.ndarray:
    bad = perms.copy()
    bad[1, 1] = bad[1, 0]
    return bad


@pytest.mark.parametrize("breakage, message", [(_swap_two_clusters, "> the optimum"),
                                               (_two_clusters_on_one_gpu, "layer 1: .* not a bijection")])
def test_the_mapping_check_fails_on_a_worse_mapping(breakage, message):
    cc, w = _two_node_instance()
    perms, _ = ilp2_window_colocation(cc, w, None, fix_first=False, fix_last=False, time_limit_s=120)
    _check_mapping_optimal(perms, cc, w)  # the unbroken input passes
    with pytest.raises(AssertionError, match=message):
        _check_mapping_optimal(breakage(perms, cc, w), cc, w)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_one_layer_remap_is_exact(seed):
    # best_layer_mapping against all 24 mappings of the middle layer, neighbours fixed
    rng = np.random.default_rng(seed)
    w = Topology(2, 2, 100.0, 5.0).pair_weight()
    cc = rng.integers(0, 50, size=(2, 4, 4)).astype(float) * (rng.random((2, 4, 4)) < 0.5)
    prev, nxt = rng.permutation(4), rng.permutation(4)
    perm, val = best_layer_mapping(inflow_cost(cc[0], w, prev), outflow_cost(cc[1], w, nxt))
    every = [mapping_cost(cc, w, np.stack([prev, np.array(p), nxt])) for p in itertools.permutations(range(4))]
    assert val == pytest.approx(min(every))
    assert mapping_cost(cc, w, np.stack([prev, perm, nxt])) == pytest.approx(val)


def test_layer_sweeps_never_worse_and_rank_aligned_variant_is_the_identity_mapping():
    topo = Topology(2, 2, 100.0, 5.0)
    w = topo.pair_weight()
    prof, _, cc = _instance(4, 4, 6, 8)
    simple = best_simple_mapping(cc, w)
    swept, passes = layer_sweeps(cc, w, simple, first_free=0)
    assert passes >= 1 and mapping_cost(cc, w, swept) <= mapping_cost(cc, w, simple) + 1e-9
    assert swept[0, 0] == 0  # a free layer 0 keeps cluster 0 on GPU 0, as the ILP windows require
    plan = moetuner(prof, w, ilp1_time_limit_s=5, ilp2_time_limit_s=3, ilp2_window=2, symmetric=False)
    check_placement(plan.ilp1_only, 4)
    groups = lambda gpu_of: [sorted(sorted(np.flatnonzero(layer == k).tolist()) for k in range(4)) for layer in gpu_of]
    assert groups(plan.ilp1_only) == groups(plan.gpu_of)  # the ablation keeps ILP 1's clusters
    objective = lambda gpu_of: mapping_cost(cluster_transitions(prof, gpu_of, 4), w, np.tile(np.arange(4), (6, 1)))
    assert np.array_equal(plan.rank_aligned, plan.clusters)  # cluster k on GPU k in every layer
    assert objective(plan.rank_aligned) == pytest.approx(plan.stats["ilp2_identity_objective"])
    assert plan.stats["ilp2_heuristic_objective"] <= plan.stats["ilp2_identity_objective"] + 1e-9
    assert objective(plan.gpu_of) == pytest.approx(plan.stats["ilp2_objective"])
    assert plan.stats["ilp2_objective"] <= plan.stats["ilp2_sweep_objective"] + 1e-9
    assert plan.stats["ilp2_sweep_objective"] <= plan.stats["ilp2_heuristic_objective"] + 1e-9


def test_the_ablation_removes_only_the_routing_aware_placement():
    """The mechanism's ablation is ILP 1's clusters labelled by their smallest expert id: the same clusters
    (so the same set of per-GPU loads in every layer), placed without reading the routing. The structural
    parts hold at any seed; that ILP 2's plan differs from the ablation's and has a lower profiled objective
    is checked at the smoke preset's seed 0 only (a property of this trace, not a theorem)."""
    p = Params.for_scale("smoke")
    trace = p.make_trace()
    topo = p.topologies()["1node"]
    prof = profile(trace.split(p.profile_fraction, p.seed)[0])
    plan = moetuner(prof, topo.pair_weight(), ilp1_time_limit_s=p.ilp1_time_limit_s,
                    ilp2_time_limit_s=p.ilp2_time_limit_s, ilp2_window=p.ilp2_window, symmetric=True, seed=p.seed)
    assert np.array_equal(plan.rank_aligned, plan.clusters)
    groups = lambda gpu_of: [sorted(sorted(np.flatnonzero(layer == k).tolist()) for k in range(topo.gpus))
                             for layer in gpu_of]
    assert groups(plan.ilp1_only) == groups(plan.clusters) == groups(plan.gpu_of)  # clusters relabelled only
    loads = lambda gpu_of: np.stack([np.bincount(gpu_of[l], weights=prof.load[l], minlength=topo.gpus)
                                     for l in range(p.layers)])
    assert np.allclose(np.sort(loads(plan.ilp1_only), 1), np.sort(loads(plan.gpu_of), 1))  # same GPU loads
    # smoke seed 0 only: ILP 2 moves clusters off the blind labelling and lowers the profiled objective
    assert not np.array_equal(plan.ilp1_only, plan.gpu_of)
    objective = lambda gpu_of: mapping_cost(cluster_transitions(prof, gpu_of, topo.gpus), topo.pair_weight(),
                                            np.tile(np.arange(topo.gpus), (p.layers, 1)))
    assert objective(plan.ilp1_only) > plan.stats["ilp2_objective"] + 1e-9
    out = plan_and_evaluate(p, trace, "1node")
    assert not np.array_equal(out["moetuner_ilp1"]["plan"], out["moetuner"]["plan"])
    assert out["moetuner_ilp1"]["metrics"]["moe_compute_s"] == pytest.approx(out["moetuner"]["metrics"]["moe_compute_s"])


def test_the_ablation_labelling_reads_neither_load_nor_routing():
    """The ablation's labelling is a function of the cluster membership alone: GPU k holds the cluster with
    the k-th smallest lowest expert id, in every layer. Relabelling ILP 1's clusters at random (what any
    load or routing order would do) leaves it unchanged; ILP 1's own labels (rank-aligned) follow load rank."""
    rng = np.random.default_rng(3)
    clusters = np.stack([rng.permutation(np.repeat(np.arange(4), 3)) for _ in range(5)])
    blind = min_id_placement(clusters)
    check_placement(blind, 4)
    for layer in blind:  # the smallest expert id of GPU k's experts rises with k
        firsts = [int(np.flatnonzero(layer == k)[0]) for k in range(4)]
        assert firsts == sorted(firsts) and firsts[0] == 0
    for _ in range(5):
        relabel = np.stack([rng.permutation(4) for _ in range(5)])
        assert np.array_equal(min_id_placement(np.take_along_axis(relabel, clusters, axis=1)), blind)
    # ILP 1's own labels do follow load rank: the heaviest expert opens cluster 0 in every layer
    p = Params.for_scale("smoke")
    prof = profile(p.make_trace().split(p.profile_fraction, p.seed)[0])
    plan = moetuner(prof, p.topologies()["1node"].pair_weight(), ilp1_time_limit_s=p.ilp1_time_limit_s,
                    ilp2_time_limit_s=p.ilp2_time_limit_s, ilp2_window=p.ilp2_window, symmetric=True)
    assert all(plan.rank_aligned[l, int(np.argmax(prof.load[l]))] == 0 for l in range(p.layers))
    assert np.array_equal(plan.ilp1_only, min_id_placement(plan.clusters))


def _balanced_partitions(items: tuple[int, ...], size: int):
    """Every split of ``items`` into unordered groups of ``size`` (8 experts in pairs: 105 splits)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for others in itertools.combinations(rest, size - 1):
        left = tuple(x for x in rest if x not in others)
        for tail in _balanced_partitions(left, size):
            yield [(first, *others), *tail]


@functools.lru_cache(maxsize=None)
def _exhaustive_optimum(load: tuple[float, ...], num_gpus: int) -> float:
    return min(max(sum(load[e] for e in group) for group in split)
               for split in _balanced_partitions(tuple(range(len(load))), len(load) // num_gpus))


def _exhaustive_max_load(load: np.ndarray, num_gpus: int) -> float:
    """The best largest per-GPU load over all balanced placements, by enumeration (written apart from
    the library's ``brute_force_clusters``; 12 experts in 4 groups of 3: 15,400 splits)."""
    return _exhaustive_optimum(tuple(float(x) for x in load), num_gpus)


def _check_every_layer_balanced_and_optimal(gpu_of: np.ndarray, load: np.ndarray, num_gpus: int) -> None:
    """The placement keeps E/G experts per GPU and, in every layer, its largest GPU load equals the
    exhaustive optimum (so it is no worse than any baseline, warm start or not)."""
    check_placement(gpu_of, num_gpus)  # PlanError is an AssertionError
    for l, layer_load in enumerate(load):
        got = max(float(layer_load[gpu_of[l] == k].sum()) for k in range(num_gpus))
        best = _exhaustive_max_load(layer_load, num_gpus)
        assert got <= best * (1 + 1e-9), f"layer {l}: largest GPU load {got} > the optimum {best}"


@functools.lru_cache(maxsize=None)
def _tuner_profile():
    # 4 layers of 12 experts on 4 GPUs; seed 5 is one where the planner's warm start (the better of
    # contiguous and greedy in each layer) is not optimal in layer 1 (the companion test's
    # _returns_its_warm_start case shows it), so a planner that kept its warm start would fail
    return profile(synthetic_trace(8000, 4, 12, 2, 1.2, 0.8, 2, 5))


def _warm_start(prof) -> np.ndarray:
    """What ``moetuner`` hands ILP 1 in each layer: the better of the two baselines."""
    cont = contiguous(1, prof.load.shape[1], 4)[0]
    return np.stack([min((cont, greedy_layer(load, 4)), key=lambda c: max_cluster_load(load, c, 4))
                     for load in prof.load])


@pytest.mark.parametrize("follow_routing", [False, True])
def test_moetuner_plan_is_balanced_and_its_layer_loads_match_exhaustive_search(follow_routing):
    # ILP 1 is warm-started from the better baseline, so "no worse than the baselines" would hold by
    # construction; the plan is checked against the exhaustive optimum instead (load_slack=0: the
    # routing-following second phase must keep phase 1's optimal largest load)
    prof = _tuner_profile()
    topo = Topology(2, 2, 100.0, 5.0)
    plan = moetuner(prof, topo.pair_weight(), ilp1_time_limit_s=5, ilp2_time_limit_s=5, ilp2_window=3,
                    symmetric=False, follow_routing=follow_routing)
    _check_every_layer_balanced_and_optimal(plan.gpu_of, prof.load, 4)


def test_ilp1_from_a_cold_start_matches_exhaustive_search_on_the_tuner_profile():
    prof = _tuner_profile()
    clusters = np.stack([ilp1_clusters(load, 4, time_limit_s=10).cluster_of for load in prof.load])
    _check_every_layer_balanced_and_optimal(clusters, prof.load, 4)


def _returns_its_warm_start(good: np.ndarray, prof) -> np.ndarray:
    """A planner whose ILP never improved on its warm start."""
    return _warm_start(prof)


def _two_heaviest_together(good: np.ndarray, prof) -> np.ndarray:
    """Layer 0 with its two heaviest experts moved onto one GPU (still E/G experts per GPU)."""
    bad = good.copy()
    e1, e2 = np.argsort(-prof.load[0], kind="stable")[:2]
    if bad[0, e1] != bad[0, e2]:
        partner = next(e for e in range(bad.shape[1]) if e != e1 and bad[0, e] == bad[0, e1])
        bad[0, e2], bad[0, partner] = bad[0, e1], bad[0, e2]
    return bad


def _one_gpu_overfull(good: np.ndarray, prof) -> np.ndarray:
    bad = good.copy()
    bad[1, bad[1] == 1] = 0  # GPU 1's experts of layer 1 join GPU 0's
    return bad


@pytest.mark.parametrize("breakage, message", [(_returns_its_warm_start, "layer 1: largest GPU load"),
                                               (_two_heaviest_together, "layer 0: largest GPU load"),
                                               (_one_gpu_overfull, "layer 1: experts per GPU")])
def test_the_layer_load_check_fails_on_a_broken_placement(breakage, message):
    prof = _tuner_profile()
    good = np.stack([ilp1_clusters(load, 4, time_limit_s=10).cluster_of for load in prof.load])
    _check_every_layer_balanced_and_optimal(good, prof.load, 4)  # the unbroken input passes
    with pytest.raises(AssertionError, match=message):
        _check_every_layer_balanced_and_optimal(breakage(good, prof), prof.load, 4)


def test_check_placement_rejects_unequal_split():
    bad = contiguous(2, 8, 4)
    bad[1, 0] = 3
    with pytest.raises(PlanError, match="layer 1"):
        check_placement(bad, 4)


def test_evaluate_by_hand():
    # 2 tokens, 2 layers, top-1, 2 experts on 2 GPUs: token 0 stays on GPU 0, token 1 crosses 0 -> 1
    trace = RoutingTrace.from_arrays(np.array([[[0], [0]], [[0], [1]]]))
    topo = Topology(1, 2, 1.0, 1.0)  # 1 GB/s
    cost = CostModel(expert_us_per_token=1.0, non_moe_us_per_token=2.0, token_bytes=1000, batch_tokens=2)
    r = evaluate(trace, np.array([[0, 1], [0, 1]]), topo, cost)["metrics"]
    # layer 0: GPU 0 has 2 tokens (2 us); transfer 1 token 0->1 (1 us); non-MoE 2*2/2 = 2 us each layer
    # layer 1: 1 token per GPU (1 us)
    assert r["end_to_end_time_s"] == pytest.approx((2 + 1 + 2 + 1 + 2) * 1e-6)
    assert r["communication_s"] == pytest.approx(1e-6)


def test_synthetic_trace_has_sparse_transitions_and_skew():
    trace = synthetic_trace(20000, 3, 16, 2, 1.0, 0.9, 2, 0)
    prof = profile(trace)
    assert prof.load[0].max() > 3 * prof.load[0].min()  # Zipf skew
    rows = prof.transitions[0] / prof.transitions[0].sum(1, keepdims=True)
    top4 = np.sort(rows, 1)[:, -4:].sum(1)  # a top-2 token's 2 experts x 2 successors each
    assert np.median(top4) > 0.6


def test_trace_validation_names_the_field():
    with pytest.raises(TraceError, match="'experts'.*shape"):
        RoutingTrace.from_arrays(np.zeros((4, 2)))
    with pytest.raises(TraceError, match="'experts'.*distinct"):
        RoutingTrace.from_arrays(np.zeros((4, 2, 2), int), num_experts=4)
    with pytest.raises(TraceError, match="'experts'.*out of range"):
        RoutingTrace.from_arrays(np.full((4, 2, 1), 5), num_experts=4)
    with pytest.raises(TraceError, match="'experts'.*integer"):
        RoutingTrace.from_arrays(np.zeros((4, 2, 1)))
    t = synthetic_trace(100, 2, 4, 2, 1.0, 0.5, 1, 0)
    back = RoutingTrace.from_npz(t.to_npz())
    assert back.num_experts == 4 and np.array_equal(back.experts, t.experts)


def test_params_reject_bad_values_by_field():
    with pytest.raises(ParamsError, match="num_experts"):
        Params.for_scale("smoke", num_experts=10)  # not a multiple of 2 * gpus_per_node = 4
    with pytest.raises(ParamsError, match="'tokens'"):
        Params.for_scale("quick", tokens=10**9)
    with pytest.raises(ParamsError, match="'affinity'"):
        Params.for_scale("quick", affinity=1.5)
    with pytest.raises(ParamsError, match="'top_k'"):
        Params.for_scale("quick", top_k=0)
    assert Params.for_scale("quick").profile_fraction == 0.25


def test_plan_and_evaluate_smoke_both_setups():
    p = Params.for_scale("smoke", ilp2_time_limit_s=1.0)
    trace = p.make_trace()
    for setup, gpus in (("1node", 2), ("2node", 4)):
        out = plan_and_evaluate(p, trace, setup)
        assert set(out) == {"contiguous", "greedy", "moetuner_ilp1", "moetuner_rank_aligned", "moetuner"}
        for r in out.values():
            check_placement(r["plan"], gpus)
            assert r["metrics"]["end_to_end_time_s"] > 0


# --- contract v3: the bandwidth regime, its fast pricing, the measured kernel ---------------------------------

def test_traffic_pricing_matches_the_serving_model():
    from mlsys_flows.systems.moetuner.evaluate import end_to_end_s, traffic

    p = Params.for_scale("smoke")
    trace = p.make_trace()
    rng = np.random.default_rng(0)
    for topo in p.topologies().values():
        gpu_of = np.stack([rng.permutation(np.arange(p.num_experts) % topo.gpus) for _ in range(p.layers)])
        sizes = np.bincount(np.arange(trace.tokens) // p.batch_tokens)
        got = end_to_end_s(traffic(trace, gpu_of, topo.gpus, p.batch_tokens), sizes, topo, p.cost_model())
        assert got == pytest.approx(evaluate(trace, gpu_of, topo, p.cost_model())["metrics"]["end_to_end_time_s"])
        # a slower inter-node link never makes a two-node placement faster
        slow = Topology(topo.nodes, topo.gpus_per_node, topo.intra_node_gb_s, topo.inter_node_gb_s / 10)
        priced = end_to_end_s(traffic(trace, gpu_of, topo.gpus, p.batch_tokens), sizes, slow, p.cost_model())
        assert priced >= got if topo.nodes == 1 else priced > got


def test_bandwidth_regime_reuses_the_run_and_replans_ilp2():
    from mlsys_flows.systems.moetuner import REGIME_VARIANTS, bandwidth_regime

    p = Params.for_scale("smoke", regime_bandwidth_ratios=[64.0, 1.0, 16.0])
    assert p.regime_bandwidth_ratios == [1.0, 16.0, 64.0]
    trace = p.make_trace()
    out = plan_and_evaluate(p, trace, "2node", kernel_us_per_token=100.0)
    assert {"contiguous_kernel", "moetuner_kernel"} <= set(out)
    assert out["contiguous_kernel"]["metrics"]["moe_compute_s"] > 100 * out["contiguous"]["metrics"]["moe_compute_s"]
    clusters = out["moetuner"].pop("clusters")
    done = {n: out[n]["metrics"]["end_to_end_time_s"] for n in REGIME_VARIANTS}
    reg = bandwidth_regime(p, trace, {n: r["plan"] for n, r in out.items()}, clusters, done)
    assert list(reg) == [1.0, 16.0, 64.0] and reg[16.0] == done       # 100 / 6.25: the run's own setting
    for n in REGIME_VARIANTS:                                            # slower links, longer times
        assert reg[1.0][n] < reg[16.0][n] < reg[64.0][n]
    with pytest.raises(ParamsError):
        Params.for_scale("smoke", regime_bandwidth_ratios=[0.5, 2.0])


def test_measured_kernel_scales_with_the_expert_width():
    from mlsys_flows.systems.moetuner.kernel import expert_flops_per_token, measure_expert_us_per_token

    k = measure_expert_us_per_token(64, 512, tokens=8, d_ff_slice=128, repeats=3)
    assert k["us_per_token"] > 0 and len(k["samples_us"]) == 3 and k["d_ff_slice"] == 128
    assert k["gflop_s"] == pytest.approx(expert_flops_per_token(64, 512) / (k["us_per_token"] * 1e3))
    assert measure_expert_us_per_token(64, 16, tokens=8, d_ff_slice=128, repeats=2)["d_ff_slice"] == 16


def test_successors_can_be_drawn_independently_of_popularity():
    """By default an expert's successors are drawn with the next layer's popularity and weighted by it, so a
    popular expert is everyone's likely successor (load rank stands in for routing); with
    ``successors_by_popularity=False`` each expert's successors are drawn uniformly and weighted equally."""
    args = dict(tokens=65_536, layers=3, num_experts=16, top_k=1, zipf_s=1.2, affinity=1.0, fanout=2, seed=0)
    share_of_top = {}
    for by_pop in (True, False):
        prof = profile(synthetic_trace(**args, successors_by_popularity=by_pop))
        top = np.argmax(prof.load[1])  # the most popular expert of layer 1: how many experts hand it tokens?
        share_of_top[by_pop] = float((prof.transitions[0][:, top] > 0.2 * prof.transitions[0].sum(1)).mean())
        if not by_pop:  # each expert's two successors get about equal shares
            t = prof.transitions[0]
            two = -np.sort(-t, axis=1)[:, :2]
            assert np.all(two[:, 1] > 0.7 * two[:, 0])
    assert share_of_top[True] > share_of_top[False]
