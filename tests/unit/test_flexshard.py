"""FlexShard: plans fit the memory both plans are given, tiers follow the cost model, the replay
counts bytes exactly (hand-checked cases), and on the smoke workload FlexShard cuts traffic."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.flexshard import (FIELDS, FULL, NODE, SHARD, Params, Plan, Topology, access_estimates,
                                           baseline_capacity, chunk_from_npz, chunk_to_npz, flexshard, heldout_chunk,
                                           make_plans, plan_metrics, plans_from_npz, plans_to_npz, replay, rowwise,
                                           summarize, sync_matrices, tier_costs)

B = 256  # row bytes in the hand-made cases


def _topo(nodes=2, per_node=2, intra=300.0, inter=25.0):
    return Topology(nodes, per_node, intra, inter, B)


@st.composite
def instances(draw):
    nodes, per_node = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    if nodes * per_node < 2:
        per_node = 2
    sizes = draw(st.lists(st.integers(1, 300), min_size=1, max_size=3))
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    counts = (rng.zipf(1.6, offsets[-1]) * (rng.random(offsets[-1]) < 0.8)).astype(np.int64)
    return _topo(nodes, per_node), offsets, counts, draw(st.floats(0.0, 3.0))


@settings(max_examples=60, deadline=None)
@given(instances())
def test_plans_fit_the_same_per_device_memory(inst):
    topo, offsets, counts, headroom = inst
    lam, _, u = access_estimates(counts, offsets, 3, topo.devices)
    base = rowwise(offsets, topo)
    assert base.rows_per_device(topo).max() == baseline_capacity(offsets, topo.devices) == base.capacity_rows
    plan = flexshard(lam, u, offsets, topo, headroom)
    assert plan.capacity_rows == int(base.capacity_rows * (1 + headroom))
    assert plan.rows_per_device(topo).max() <= plan.capacity_rows
    assert set(np.unique(plan.tier)) <= {SHARD, NODE, FULL}
    assert (plan.owner[plan.tier == SHARD] < topo.devices).all() and (plan.owner[plan.tier == NODE] < topo.per_node).all()
    if topo.nodes == 1:
        assert not (plan.tier == NODE).any()
    cost = tier_costs(lam, u, topo)
    rows = np.arange(offsets[-1])
    assert cost[rows, plan.tier].sum() <= cost[:, SHARD].sum() + 1e-12  # never worse than no replication


@settings(max_examples=40, deadline=None)
@given(instances())
def test_unlimited_memory_gives_every_row_its_cheapest_tier(inst):
    topo, offsets, counts, _ = inst
    lam, _, u = access_estimates(counts, offsets, 3, topo.devices)
    plan = flexshard(lam, u, offsets, topo, headroom=1000.0)
    cost = tier_costs(lam, u, topo)
    if topo.nodes == 1:
        cost[:, NODE] = np.inf
    chosen = cost[np.arange(offsets[-1]), plan.tier]
    assert np.allclose(chosen, cost.min(axis=1), rtol=1e-12, atol=1e-18)


def test_no_headroom_means_no_replicas_and_hot_rows_get_replicated_first():
    offsets = np.array([0, 4000])
    counts = np.zeros(4000, np.int64)
    counts[:20] = np.arange(20, 0, -1) * 100_000  # 20 hot rows, hottest first
    counts[20:] = 1
    topo = _topo(2, 4)
    lam, _, u = access_estimates(counts, offsets, 1, topo.devices)
    assert (flexshard(lam, u, offsets, topo, 0.0).tier == SHARD).all()
    plan = flexshard(lam, u, offsets, topo, 0.01)  # room for a few replicas only
    assert (plan.tier[20:] == SHARD).all() and (plan.tier[:20] != SHARD).any()
    assert (np.diff(plan.tier[:20].astype(int)) <= 0).all()  # a hotter row never has a lower tier


def test_access_estimates_touch_probability():
    offsets = np.array([0, 3, 5])
    counts = np.array([6, 3, 1, 4, 0])  # table 0: 10 lookups, table 1: 4, over 2 iterations x 2 devices
    lam, q, u = access_estimates(counts, offsets, 2, 2)
    assert lam == pytest.approx(counts / 4)
    p = np.array([0.6, 0.3, 0.1, 1.0, 0.0])
    n = np.array([2.5, 2.5, 2.5, 1.0, 1.0])  # lookups per device per iteration into each table (B*L)
    assert q == pytest.approx(1 - (1 - p) ** n)
    assert u == pytest.approx(1 - (1 - p) ** (2 * n))


def _one_iteration(per_device: list[list[int]]):
    counts = np.array([[[len(x) for x in per_device]]])  # [iteration, table, device]
    return np.array([i for x in per_device for i in x], np.int64), counts


def test_replay_counts_bytes_by_hand():
    topo = _topo(2, 2)  # devices 0,1 on node 0; 2,3 on node 1
    tier = np.array([SHARD, SHARD, NODE, FULL, SHARD, SHARD], np.int8)
    owner = np.array([0, 3, 1, 0, 1, 2], np.int32)
    plan = Plan("t", tier, owner, 10)
    # device 0: row 0 (local), row 1 twice (inter, from 3), row 2 (NODE: node 0's copy on device 1, intra),
    # row 3 (FULL: local); device 2: row 2 (node 1's copy on device 3, intra), row 4 (inter, from 1)
    ids, counts = _one_iteration([[0, 1, 1, 2, 3], [], [2, 4], []])
    r = replay(plan, ids, counts, topo, total_rows=6)
    assert r["lookups"].tolist() == [7] and r["fetched_rows"].tolist() == [5]
    assert r["alltoall_inter_bytes"].tolist() == [2 * 3 * B]  # forward + backward
    assert r["alltoall_intra_bytes"].tolist() == [2 * 2 * B]
    # touched replicas: FULL row 3 (n=2, G=2: intra 2*n*(G-1) rows, inter 2*(n-1) rows), NODE row 2 (inter 2*(n-1))
    assert r["sync_intra_bytes"].tolist() == [4 * B] and r["sync_inter_bytes"].tolist() == [2 * B + 2 * B]
    # busiest links: forward inter out of device 3 (2 rows) -> x2 for backward, then the two sync steps
    wa, we = 1 / 300e9, 1 / 25e9
    # sync: FULL sends 2(G-1)/G of a row to the node peer, then 2(n-1)/n of its 1/G share across; device 1
    # also holds node 0's copy of NODE row 2 (2(n-1)/n of a row across)
    expected = 2 * max(2 * B * we, 1 * B * wa) + B * wa + (B / 2 + B) * we
    assert r["modeled_comm_latency_s"][0] == pytest.approx(expected)
    dedup = replay(plan, ids, counts, topo, total_rows=6, dedup=True)
    assert dedup["fetched_rows"].tolist() == [4] and dedup["alltoall_inter_bytes"].tolist() == [2 * 2 * B]


@settings(max_examples=30, deadline=None)
@given(full=st.integers(0, 50), node=st.lists(st.integers(0, 50), min_size=4, max_size=4))
def test_sync_matrices_are_hierarchical_allreduce_volumes(full, node):
    topo = _topo(2, 4)
    intra, inter = sync_matrices(np.array([float(full)]), np.array([node], float), topo)
    n, g = 2, 4
    assert intra.sum() == pytest.approx(2 * n * (g - 1) * full * B)
    assert inter.sum() == pytest.approx(2 * (n - 1) * full * B + 2 * (n - 1) * sum(node) * B)
    same = (np.arange(8)[:, None] // g) == (np.arange(8)[None, :] // g)
    assert intra[0][~same].sum() == 0 and inter[0][same].sum() == 0


def test_rowwise_fetches_all_but_one_in_d_lookups():
    p = Params.for_scale("smoke", rows=20_000, train_iterations=2, eval_iterations=2, replay_tasks=1)
    w = p.make_workload()
    ids, counts = heldout_chunk(w, 2, 0, p.seed)
    r = replay(rowwise(w.offsets, p.topology()), ids, counts, p.topology(), w.total_rows)
    assert r["fetched_rows"].sum() / r["lookups"].sum() == pytest.approx(7 / 8, abs=0.01)
    # inter-node share of fetches: 4 of the 7 other devices are on the other node
    assert r["alltoall_inter_bytes"].sum() / (r["alltoall_inter_bytes"] + r["alltoall_intra_bytes"]).sum() == \
        pytest.approx(4 / 7, abs=0.02)


def test_workload_is_deterministic_and_heldout_is_not_the_training_stream():
    p = Params.for_scale("smoke", rows=5_000, train_iterations=2, eval_iterations=2, replay_tasks=1)
    a, b = p.make_workload(), p.make_workload()
    assert np.array_equal(a.train_counts, b.train_counts)
    (ids1, c1), (ids2, c2) = heldout_chunk(a, 2, 0, p.seed), heldout_chunk(b, 2, 0, p.seed)
    assert np.array_equal(ids1, ids2) and np.array_equal(c1, c2)
    other, _ = heldout_chunk(a, 2, 1, p.seed)
    assert not np.array_equal(ids1[:1000], other[:1000])
    assert np.bincount(ids1, minlength=a.total_rows).tolist() != (a.train_counts // 1).tolist()
    round_trip = chunk_from_npz(chunk_to_npz(ids1, c1))
    assert np.array_equal(round_trip[0], ids1) and np.array_equal(round_trip[1], c1)
    assert c1.shape == (2, p.tables, p.devices) and c1.sum() == len(ids1)


def test_smoke_flexshard_cuts_traffic_and_modelled_latency():
    p = Params.for_scale("smoke")
    w = p.make_workload()
    plans = make_plans(p, w)
    loaded = plans_from_npz(plans_to_npz(plans))
    assert set(loaded) == set(plans) and all(np.array_equal(loaded[k].tier, plans[k].tier) for k in plans)
    ids, counts = heldout_chunk(w, 4, 0, p.seed)
    m = {k: summarize(replay(plans[k], ids, counts, p.topology(), w.total_rows)) for k in ("rowwise", "flexshard")}
    for k in m:
        m[k] |= plan_metrics(plans[k], p, plans["rowwise"].capacity_rows)
    assert set(FIELDS) <= set(m["flexshard"])
    assert m["flexshard"]["memory_vs_rowwise"] <= 1 + p.memory_headroom
    assert m["rowwise"]["alltoall_bytes"] / m["flexshard"]["alltoall_bytes"] > 1.5
    assert m["rowwise"]["alltoall_inter_bytes"] / m["flexshard"]["alltoall_inter_bytes"] > 2.0
    assert m["rowwise"]["comm_bytes"] / m["flexshard"]["comm_bytes"] > 1.3  # sync included
    assert m["rowwise"]["modeled_comm_latency_s"] / m["flexshard"]["modeled_comm_latency_s"] > 2.0


@pytest.mark.parametrize("overrides, field", [
    ({"rows": 10}, "rows"), ({"memory_headroom": -0.1}, "memory_headroom"), ({"inter_node_gb_s": 0}, "inter_node_gb_s"),
    ({"nodes": 1, "devices_per_node": 1}, "parameters"), ({"replay_tasks": 9, "eval_iterations": 8}, "parameters"),
])
def test_bad_params_name_the_field(overrides, field):
    with pytest.raises(ParamsError) as exc:
        Params.for_scale("smoke", **overrides)
    assert exc.value.field == field
    if field == "parameters":  # cross-field checks name the fields in the message
        assert all(k in str(exc.value) for k in overrides)
