"""RecD issue 13: the arrival-order trainer sees the clustered trainers' samples, the turn order is
balanced over three trainers, and the mix sweep really changes the user/item id share. Each check
has a companion that feeds it a deliberately broken input and shows that it fails."""
from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.recd import Params
from mlsys_flows.systems.recd import pipeline as pl
from mlsys_flows.systems.recd import sweep as sw
from mlsys_flows.systems.recd.workload import (Schema, arrival_order, at_mix, expected_user_share, generate,
                                               ids_per_sample, user_id_share)

SHARE_TOLERANCE = 0.02


def _files(p: Params, arrival_table=None) -> tuple[bytes, bytes]:
    table = generate(p)
    arrival = arrival_order(table, p.seed) if arrival_table is None else arrival_table(table)
    rg = p.batch_size * p.batches_per_row_group
    return pl.parquet_bytes(arrival, rg), pl.parquet_bytes(table, rg)


def _flow_batches(p: Params, arrival: bytes, clustered: bytes) -> dict[str, list[pl.Batch]]:
    """The three trainers' batches exactly as the flow's train task reads them."""
    return {"kjt": list(pl.read_batches(arrival, p, dedup=False)),
            "kjt_clustered": list(pl.read_batches(clustered, p, dedup=False)),
            "ikjt": list(pl.read_batches(clustered, p, dedup=True))}


# ----- the arrival-order trainer sees the same multiset of samples -----------------------------------
def test_arrival_order_trainer_sees_the_same_samples_as_the_clustered_ones():
    p = Params.for_scale("smoke")
    batches = _flow_batches(p, *_files(p))
    digest = pl.check_same_samples(batches)
    assert len(digest) == 64
    # the orders really differ (else the check would be vacuous), the step counts do not
    assert not batches["kjt"][0].dense.equal(batches["kjt_clustered"][0].dense)
    assert len({len(b) for b in batches.values()}) == 1
    # and the digest ignores batching: other batch boundaries, same samples
    other = Params.for_scale("smoke", batch_size=48)
    assert pl.samples_digest(list(pl.read_batches(_files(other)[0], other, dedup=True))) == digest


def _drop_one_duplicate_another(table: pa.Table) -> pa.Table:
    rows = np.arange(table.num_rows)
    rows[-1] = rows[0]  # same row count, one sample twice, the last one missing
    return arrival_order(table.take(pa.array(rows)), 0)


def _flip_one_id(table: pa.Table) -> pa.Table:
    col = table.column("item_0").combine_chunks()
    values = col.flatten().to_numpy().copy()
    values[0] += 1
    flipped = pa.LargeListArray.from_arrays(col.offsets, pa.array(values))
    return arrival_order(table.set_column(table.schema.get_field_index("item_0"), "item_0", flipped), 0)


@pytest.mark.parametrize("broken", [_drop_one_duplicate_another, _flip_one_id])
def test_companion_different_samples_fail_the_digest_check(broken):
    p = Params.for_scale("smoke")
    batches = _flow_batches(p, *_files(p, arrival_table=broken))
    assert len({len(b) for b in batches.values()}) == 1  # same step count: only the digest can tell
    with pytest.raises(ValueError, match="different samples"):
        pl.check_same_samples(batches)


# ----- three trainers take turns fairly --------------------------------------------------------------
def order_imbalance(orders: list[list[str]]) -> list[str]:
    """What is unfair about a cycle of turn orders: a trainer more often in one position than another,
    or an ordered pair of neighbours more common than another."""
    names = sorted(orders[0])
    problems = []
    for pos in range(len(names)):
        counts = Counter(o[pos] for o in orders)
        if len({counts[n] for n in names}) != 1:
            problems.append(f"position {pos}: {dict(counts)}")
    pairs = Counter((a, b) for o in orders for a, b in zip(o, o[1:]))
    if len(names) > 1 and len({pairs[q] for q in itertools.permutations(names, 2)}) != 1:
        problems.append(f"neighbours: {dict(pairs)}")
    return problems


@pytest.mark.parametrize("n", [2, 3, 4])
def test_turn_order_puts_every_trainer_everywhere_equally_often(n):
    names = ["kjt", "kjt_clustered", "ikjt", "extra"][:n]
    cycle = 2 * n if n % 2 else n
    orders = [pl.turn_order(names, t) for t in range(cycle)]
    assert all(sorted(o) == sorted(names) for o in orders)
    assert order_imbalance(orders) == []
    if n == 2:  # two trainers alternate strictly, as before
        assert orders == [names, names[::-1]]


def test_companion_a_fixed_or_rotating_only_order_is_unfair():
    names = ["kjt", "kjt_clustered", "ikjt"]
    assert order_imbalance([names] * 6)  # the same trainer always first
    rotations = [names[k:] + names[:k] for k in range(3)]
    assert order_imbalance(rotations * 2)  # fair positions, but ikjt always runs right after kjt_clustered


# ----- the mix sweep changes the user/item id share ----------------------------------------------------
def share_mismatches(p: Params, shares: tuple[float, ...], make=sw.mix_tables) -> list[str]:
    """Sweep points whose counted user-id share misses the requested one, or whose ids per sample
    moved away from the headline workload's (the KJT lookup volume must stay the same)."""
    bad = []
    base_ids = ids_per_sample(p)
    for share in shares:
        q, clustered, arrival = make(p, share)
        counted = user_id_share(clustered, Schema.of(q))
        ids = sum(len(clustered.column(c).combine_chunks().flatten()) for c in Schema.of(q).sparse) / clustered.num_rows
        if abs(counted - share) > SHARE_TOLERANCE or abs(user_id_share(arrival, Schema.of(q)) - counted) > 1e-12:
            bad.append(f"share {share}: counted {counted:.4f}")
        if abs(ids - base_ids) > 0.1 * base_ids:
            bad.append(f"share {share}: {ids:.1f} ids per sample, headline {base_ids:.1f}")
    return bad


@pytest.mark.parametrize("scale", ["smoke", "quick"])
def test_mix_sweep_changes_the_counted_user_share_as_requested(scale):
    # enough samples per point (>= 2,000) that the drawn list lengths are near their means
    p = Params.for_scale(scale, sweep_steps=8 if scale == "quick" else 40)
    shares = Params.for_scale("quick").mix_sweep
    assert len(shares) >= 4 and set(p.mix_sweep) <= set(shares) and any(abs(s - 0.75) < 1e-9 for s in shares)
    assert share_mismatches(p, shares) == []
    # the headline workload itself sits at its documented mix (~3/4 of the ids in user features)
    small = Params.for_scale(scale, sessions=300)  # the headline's lengths, fewer sessions
    assert abs(user_id_share(generate(small), Schema.of(p)) - 0.75) < SHARE_TOLERANCE
    assert abs(expected_user_share(p) - 0.75) < SHARE_TOLERANCE


def test_companion_a_sweep_that_ignores_the_mix_fails_the_share_check():
    p = Params.for_scale("smoke")

    def ignores_mix(p, share):  # broken: the headline's list lengths at every point
        return sw.mix_tables(p, expected_user_share(p))

    assert len(share_mismatches(p, p.mix_sweep, make=ignores_mix)) >= len(p.mix_sweep) - 1

    def grows_items(p, share):  # broken: the share right, but the item lists simply added on top
        q, c, a = sw.mix_tables(p, share)
        fat = type(p).model_validate({**p.model_dump(), "item_list_len": q.item_list_len, "sessions": q.sessions})
        return sw.mix_tables(fat, expected_user_share(fat))

    assert any("ids per sample" in m for m in share_mismatches(p, (0.25,), make=grows_items))


def lookup_savings(points: list[dict]) -> list[float]:
    """Counted per sweep point: ids a KJT trainer looks up / ids the IKJT trainer looks up."""
    return [pt["kjt_ids"] / pt["ikjt_ids"] for pt in points]


def _counted_points(p: Params, dedup_ikjt: bool = True) -> list[dict]:
    out = []
    for share in p.mix_sweep:
        q, clustered, arrival = sw.mix_tables(p, share)
        kjt = pl.table_batches(arrival, q, dedup=False)
        ikjt = pl.table_batches(clustered, q, dedup=dedup_ikjt)
        out.append({"kjt_ids": sum(s.num_values() for b in kjt for s in b.sparse),
                    "ikjt_ids": sum(s.num_values() for b in ikjt for s in b.sparse)})
    return out


def test_the_ikjt_saving_grows_with_the_user_share():
    """Counted, not timed: the lookup work IKJT saves rises with the share of user-feature ids."""
    savings = lookup_savings(_counted_points(Params.for_scale("smoke")))
    assert all(a < b for a, b in zip(savings, savings[1:])) and savings[0] > 1.0


def test_companion_no_dedup_shows_no_saving():
    savings = lookup_savings(_counted_points(Params.for_scale("smoke"), dedup_ikjt=False))
    assert not all(a < b for a, b in zip(savings, savings[1:]))


def test_mix_point_trains_both_trainers_on_the_same_samples_with_one_sample_per_repeat():
    p = Params.for_scale("smoke", repeats=3, sweep_steps=8)
    pt = sw.mix_point(p, 0.5)
    assert sw.sweep_turn_steps(p) == 2 and pt["samples"] == p.sweep_steps * p.batch_size
    for n in sw.TRAINERS:
        assert len(pt[n]["rates"]) == 3 and len(pt[n]["losses"]) == p.sweep_steps
    assert np.max(np.abs(np.subtract(pt["kjt_clustered"]["losses"], pt["ikjt"]["losses"]))) < 1e-4
    assert abs(pt["user_id_share"] - 0.5) < SHARE_TOLERANCE and len(pt["digest"]) == 64
    r = sw.ratio_points([pt])
    assert all(np.isfinite(v[0]) and v[0] > 0 for k, v in r.items()) and r["low"][0] <= r["high"][0]
    assert sw.variant_name("ikjt", 0.985) == "ikjt@mix0.985"


def test_ratio_points_are_ikjt_over_the_baseline_with_the_pairwise_range():
    pts = [{"user_id_share": 0.5, "kjt": {"rates": [100.0, 100.0, 100.0]}, "kjt_clustered": {"rates": [200.0] * 3},
            "ikjt": {"rates": [200.0, 300.0, 250.0]}}]
    assert sw.ratio_points(pts) == {"share": [0.5], "ratio": [2.5], "low": [2.0], "high": [3.0]}
    assert sw.ratio_points(pts, "kjt_clustered") == {"share": [0.5], "ratio": [1.25], "low": [1.0], "high": [1.5]}


def test_mix_parameters_fail_naming_the_field():
    for bad in ([0.0, 0.5], [0.5, 1.0], [0.2, 0.2], [0.1] * 9, ["x"], [float("nan")]):
        with pytest.raises(ParamsError, match="'mix_sweep"):
            Params.for_scale("smoke", mix_sweep=bad)
    assert Params.for_scale("smoke", mix_sweep=[0.9, 0.3]).mix_sweep == (0.3, 0.9)
    assert Params.for_scale("smoke", mix_sweep=[]).mix_sweep == ()
    with pytest.raises(ValueError, match="between 0 and 1"):
        at_mix(Params.for_scale("smoke"), 1.0)
    # a sweep point that would be an invalid workload fails before any work too
    with pytest.raises(ParamsError, match="mix_sweep share 0.1 needs lists"):
        Params.for_scale("smoke", user_list_len=8192, item_features=1, mix_sweep=[0.1, 0.5])
    with pytest.raises(ParamsError, match="sessions per mix_sweep point"):
        Params.for_scale("smoke", sessions=10_000, batch_size=65_536, sweep_steps=1_000)
    assert Params.for_scale("smoke", sessions=10_000, batch_size=65_536, sweep_steps=1_000, mix_sweep=[]).mix_sweep == ()
