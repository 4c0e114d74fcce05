"""RecShard's end-to-end sharded lookup: it returns exactly (bit for bit) the pooled embeddings of a plain
full-table lookup for every plan and both slow tiers; the memmap slow tier's files hold exactly the rows
the plan put in UVM and the timed lookup really reads them (overwriting a file changes exactly the slow
part of the output); the lookup's tier accesses equal the replay's HBM/UVM counts of the same batches;
the throughput definition follows the slowest device; and "greedy" is the best greedy plan under the
cost model of each metric. Every check is shown to fail on a broken plan, layout or choice."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mlsys_flows.systems.recshard import (GREEDY, HELD_OUT, Costs, Params, Plan, Profile, ShardedLookup, build_table,
                                          cheapest, choose_greedy, full_table_lookup, greedy_row, lookup,
                                          lookup_traces, make_plans, plan_costs, profile_table, replay, row_values,
                                          samples_per_s, trace, trace_prefix)


@pytest.fixture(scope="module")
def world():
    p = Params.for_scale("smoke", num_tables=6, gpus=2, rows_max=20_000, batch=256, train_batches=4, eval_batches=3,
                         lookup_batches=2)
    spec = p.specs()
    tables = {j: build_table(spec, j, p.seed, p.hot_fraction, p.hot_share) for j in range(p.num_tables)}
    samples = p.batch * p.train_batches
    prof = Profile(spec.dim, samples, [profile_table(tables[j], j, samples, p.seed) for j in tables])
    plans, warm, _ = make_plans(p, prof)
    plans["all_hbm"] = Plan(np.arange(6) % 2, prof.rows.copy())  # not a feasible plan: a layout test only
    plans["all_uvm"] = Plan(np.arange(6) % 2, np.zeros(6, np.int64))
    traces = lookup_traces(p, tables, prof)
    raw = {j: trace(tables[j], j, p.batch * p.eval_batches, p.seed, HELD_OUT) for j in tables}
    return p, tables, prof, plans, traces, raw


def _batch_ids(raw, j, b, batch):
    ids, lengths = raw[j]
    start = int(lengths[: b * batch].sum())
    ln = lengths[b * batch: (b + 1) * batch]
    return ids[start: start + int(ln.sum())], ln


def check_matches_full_table(lk: ShardedLookup, p: Params, tables, raw) -> None:
    """Every table is looked up on exactly one device, and its pooled embeddings equal (exactly) a plain
    full-table EmbeddingBag over the same held-out batch."""
    for b in range(lk.num_batches):
        seen = {}
        for d in range(lk.gpus):
            for j, pooled in lk.lookup(b, d).items():
                assert j not in seen, f"table {j} looked up on two devices"
                seen[j] = pooled
        assert sorted(seen) == sorted(tables), "a table was not looked up"
        for j, pooled in seen.items():
            ids, ln = _batch_ids(raw, j, b, p.batch)
            ref = full_table_lookup(p.seed, j, tables[j].rows, tables[j].dim, ids, ln)
            assert torch.equal(pooled.cpu(), ref), f"batch {b} table {j}: pooled embeddings differ from the full table"


def check_layout(lk: ShardedLookup, plan: Plan, traces, seed: int) -> None:
    """Device d's fast tensor holds exactly the touched rows of its tables that ``plan`` keeps in HBM (the
    hottest ``hot_rows`` by training rank) and its slow tier (the file on disk, read back independently)
    exactly the rest, in table order, with the right values."""
    for sh in lk.shards:
        mine = [j for j in sorted(traces) if plan.gpu[j] == sh.gpu]
        assert sh.tables == mine, f"device {sh.gpu} holds tables {sh.tables}, the plan puts {mine} there"
        fast, slow = [], []
        for j in mine:
            tr = traces[j]
            hot = tr.rank < plan.hot_rows[j]
            assert np.array_equal(sh.fast_rows[j], tr.ids[hot]) and np.array_equal(sh.slow_rows[j], tr.ids[~hot]), \
                f"table {j}: the tiers do not hold the rows the plan put there"
            fast.append(row_values(seed, j, tr.ids[hot], tr.dim).ravel())
            slow.append(row_values(seed, j, tr.ids[~hot], tr.dim).ravel())
        assert torch.equal(sh.fast.cpu(), torch.from_numpy(np.concatenate(fast))), f"device {sh.gpu}: fast tensor"
        slow = np.concatenate(slow)
        if lk.slow_tier == "memmap":
            on_disk = np.fromfile(sh.path, np.float32)
            assert np.array_equal(on_disk[: len(slow)], slow), f"device {sh.gpu}: the slow-tier file's rows"
        else:
            assert np.array_equal(np.asarray(sh.slow)[: len(slow)], slow)


def check_counts_match_replay(lk: ShardedLookup, counts: np.ndarray, batches: int) -> None:
    """The lookup's fast and slow accesses equal the replay's HBM and UVM counts of the same batches."""
    assert lk.fast_accesses() == counts[0, :batches].sum(), "fast-tier accesses != the replay's HBM hits"
    assert lk.slow_accesses() == counts[1, :batches].sum(), "slow-tier accesses != the replay's UVM accesses"


def test_the_lookup_trace_is_the_first_batches_of_the_held_out_trace(world):
    p, tables, prof, plans, traces, raw = world
    for j, table in tables.items():
        ids, lengths = trace_prefix(table, j, p.batch * p.eval_batches, p.batch * p.lookup_batches, p.seed, HELD_OUT)
        full_ids, full_lengths = raw[j]
        assert np.array_equal(lengths, full_lengths[: p.batch * p.lookup_batches])
        assert np.array_equal(ids, full_ids[: len(ids)])
        tr = traces[j]
        assert np.array_equal(tr.ids[tr.pos], ids) and tr.bounds[-1] == len(ids)


def test_row_values_are_exact_eighths_and_lazy():
    v = row_values(3, 1, np.array([0, 5, 70_000_000]), 16)
    assert v.dtype == np.float32 and v.shape == (3, 16)
    assert np.all(v * 8 == np.round(v * 8)) and v.min() >= -1 and v.max() < 1
    assert np.array_equal(v[1], row_values(3, 1, np.array([5]), 16)[0])  # a row's values do not depend on the others
    assert not np.array_equal(v, row_values(3, 2, np.array([0, 5, 70_000_000]), 16))  # nor do tables share rows
    assert len(np.unique(row_values(0, 0, np.arange(4096), 8), axis=0)) > 4000


@pytest.mark.parametrize("slow_tier", ["memmap", "host"])
@pytest.mark.parametrize("name", [*GREEDY, "recshard", "all_hbm", "all_uvm"])
def test_sharded_lookup_equals_the_full_table_lookup(world, tmp_path, name, slow_tier):
    p, tables, prof, plans, traces, raw = world
    lk = ShardedLookup(plans[name], traces, p.gpus, seed=p.seed, slow_tier=slow_tier, workdir=tmp_path, name=name)
    try:
        check_layout(lk, plans[name], traces, p.seed)
        check_matches_full_table(lk, p, tables, raw)
    finally:
        lk.close()
    assert list(tmp_path.iterdir()) == []  # close() removes the slow tier's files


def test_a_broken_slow_tier_fails_the_full_table_check(world, tmp_path):
    """Companion: zero the slow-tier files (a lookup that lost its UVM rows): the check must fail."""
    p, tables, prof, plans, traces, raw = world
    lk = ShardedLookup(plans["recshard"], traces, p.gpus, seed=p.seed, workdir=tmp_path)
    try:
        assert lk.slow_accesses() > 0
        for sh in lk.shards:
            np.memmap(sh.path, np.float32, "r+")[:] = 0
        with pytest.raises(AssertionError, match="differ from the full table"):
            check_matches_full_table(lk, p, tables, raw)
    finally:
        lk.close()


def test_the_timed_lookup_reads_the_uvm_rows_from_the_memmapped_file(world, tmp_path, monkeypatch):
    """The slow tier is a read-only np.memmap of a file on disk; overwriting the file's rows changes exactly
    the slow part of what the timed path (time_batch -> lookup) pools, so the lookup really reads it."""
    p, tables, prof, plans, traces, raw = world
    plan = plans["greedy_size"]
    lk = ShardedLookup(plan, traces, p.gpus, seed=p.seed, workdir=tmp_path)
    try:
        for sh in lk.shards:
            assert isinstance(sh.slow, np.memmap) and sh.slow.mode == "r"
            assert sh.path.startswith(str(tmp_path)) and (tmp_path / sh.path.split("/")[-1]).stat().st_size == \
                4 * max(1, sum(len(r) * sh.dims[j] for j, r in sh.slow_rows.items()))
        before = {(b, d): lk.lookup(b, d) for b in range(lk.num_batches) for d in range(p.gpus)}
        for sh in lk.shards:
            np.memmap(sh.path, np.float32, "r+")[:] += 2.0  # every UVM row + 2, through another mapping
        after, real = {}, ShardedLookup.lookup

        def spy(self, b, d):
            after[(b, d)] = out = real(self, b, d)
            return out

        monkeypatch.setattr(ShardedLookup, "lookup", spy)
        times = lk.time_all()  # the timed path
        assert times.shape == (lk.num_batches, p.gpus) and (times > 0).all() and set(after) == set(before)
        for (b, d), pooled in after.items():
            for j in lk.shards[d].tables:
                tr = traces[j]
                lo, hi = tr.bounds[b], tr.bounds[b + 1]
                in_uvm = tr.rank[tr.pos[lo:hi]] >= plan.hot_rows[j]
                uvm_ids_per_sample = np.bincount(tr.sample[lo:hi][in_uvm], minlength=p.batch)
                expected = torch.from_numpy(2.0 * uvm_ids_per_sample).float()[:, None].expand_as(pooled[j])
                assert torch.equal(pooled[j] - before[(b, d)][j], expected), f"table {j}: not the file's rows"
        assert any(lk.shards[d].batches[b][j][1].n for (b, d) in after for j in lk.shards[d].tables)
    finally:
        lk.close()


def test_lookup_tier_accesses_equal_the_replay_counts(world, tmp_path):
    p, tables, prof, plans, traces, raw = world
    counts = replay(tables, prof, plans, p.batch, p.eval_batches, p.seed)
    for name in [*GREEDY, "recshard"]:
        lk = ShardedLookup(plans[name], traces, p.gpus, seed=p.seed, slow_tier="host")
        check_counts_match_replay(lk, counts[name], p.lookup_batches)
    # companion: a lookup laid out for another plan (a broken plan handed to the lookup) fails the check
    broken = Plan(plans["recshard"].gpu, plans["recshard"].hot_rows // 2)
    lk = ShardedLookup(broken, traces, p.gpus, seed=p.seed, slow_tier="host")
    with pytest.raises(AssertionError, match="accesses"):
        check_counts_match_replay(lk, counts["recshard"], p.lookup_batches)
    # the MILP's plan serves fewer lookups from the slow tier than every greedy plan
    slow = {n: ShardedLookup(plans[n], traces, p.gpus, seed=p.seed, slow_tier="host").slow_accesses()
            for n in [*GREEDY, "recshard", "all_uvm"]}
    assert all(slow["recshard"] < slow[g] for g in GREEDY)
    assert not all(slow["all_uvm"] < slow[g] for g in GREEDY)  # companion: a broken (all-UVM) plan would not


@pytest.mark.parametrize("broken", ["hot_rows", "gpu"])
def test_the_layout_check_fails_on_a_broken_plan(world, tmp_path, broken):
    p, tables, prof, plans, traces, raw = world
    plan = plans["recshard"]
    lk = ShardedLookup(plan, traces, p.gpus, seed=p.seed, workdir=tmp_path)
    try:
        check_layout(lk, plan, traces, p.seed)  # the real plan passes
        j = int(np.argmax(plan.hot_rows))
        if broken == "hot_rows":
            other = Plan(plan.gpu, np.where(np.arange(len(plan.gpu)) == j, plan.hot_rows - 1, plan.hot_rows))
            msg = "do not hold the rows"
        else:
            other = Plan(np.where(np.arange(len(plan.gpu)) == j, 1 - plan.gpu, plan.gpu), plan.hot_rows)
            msg = "holds tables"
        with pytest.raises(AssertionError, match=msg):
            check_layout(lk, other, traces, p.seed)
    finally:
        lk.close()


def test_measure_plans_times_every_plan_interleaved_and_cleans_up(world, tmp_path):
    p, tables, prof, plans, traces, raw = world
    out = lookup.measure_plans({n: plans[n] for n in ("greedy_size", "recshard")}, traces, p.gpus, seed=p.seed,
                               device="cpu", slow_tier="memmap", workdir=tmp_path, repeats=2)
    assert set(out) == {"greedy_size", "recshard"}
    for r in out.values():
        assert len(r["times"]) == 2 and all(t.shape == (p.lookup_batches, p.gpus) and (t > 0).all() for t in r["times"])
        assert r["fast_accesses"] + r["slow_accesses"] == sum(len(tr.pos) for tr in traces.values())
    assert out["recshard"]["slow_accesses"] < out["greedy_size"]["slow_accesses"]
    assert list(tmp_path.iterdir()) == []


def test_throughput_follows_the_slowest_device_per_batch():
    times = np.array([[1.0, 3.0], [2.0, 1.0]])  # [batches, devices]
    parallel, serial = samples_per_s(times, 10)
    assert parallel == pytest.approx(20 / 5) and serial == pytest.approx(20 / 7)


def _check_greedy_choice(name: str, plans, prof, costs, batch, gpus) -> None:
    best = min(plan_costs(plans[g], prof, costs, batch, gpus).max() for g in GREEDY)
    assert plan_costs(plans[name], prof, costs, batch, gpus).max() <= best, f"{name} is not the cheapest greedy"


def test_greedy_is_chosen_under_the_cost_model_of_its_metric(world):
    p, tables, prof, plans, traces, raw = world
    assumed = p.model_costs(prof.dim)
    flat = Costs(np.full(prof.num_tables, 1e-9), np.full(prof.num_tables, 1e-9))  # no tier difference: pure balance
    for costs in (assumed, flat):
        chosen = choose_greedy(p, prof, plans, costs)
        assert chosen in GREEDY and chosen == cheapest({g: plans[g] for g in GREEDY}, prof, costs, p.batch, p.gpus)
        _check_greedy_choice(chosen, plans, prof, costs, p.batch, p.gpus)
    # companion: the greedy plan that is worst under a cost model fails the check
    worst = max(GREEDY, key=lambda g: plan_costs(plans[g], prof, assumed, p.batch, p.gpus).max())
    if plan_costs(plans[worst], prof, assumed, p.batch, p.gpus).max() > \
            min(plan_costs(plans[g], prof, assumed, p.batch, p.gpus).max() for g in GREEDY):
        with pytest.raises(AssertionError, match="not the cheapest"):
            _check_greedy_choice(worst, plans, prof, assumed, p.batch, p.gpus)
    # the "greedy" row takes each metric from the greedy chosen under that metric's cost model
    variants = {"greedy_size": {"a": 1.0, "run": 10.0}, "greedy_lookup": {"a": 2.0, "run": 20.0}}
    assert greedy_row(variants, "greedy_lookup", "greedy_size", {"run"}) == {"a": 1.0, "run": 20.0}
