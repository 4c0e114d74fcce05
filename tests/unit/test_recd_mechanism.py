"""RecD's mechanism ablation (the IKJT on arrival-order batches) and the regime parameter (the
duplicated share of looked-up ids): pure code, no flow."""
from __future__ import annotations

import numpy as np
import pytest

from mlsys_flows.systems.recd import SPEC, Params
from mlsys_flows.systems.recd import pipeline as pl
from mlsys_flows.systems.recd import sweep as sw
from mlsys_flows.systems.recd.workload import arrival_order, generate


@pytest.fixture(scope="module")
def tables():
    p = Params.for_scale("smoke")
    clustered = generate(p)
    return p, clustered, arrival_order(clustered, p.seed)


def test_the_ablation_is_the_ikjt_on_arrival_order_and_finds_every_repeat_there(tables):
    p, clustered, arrival = tables
    kjt = pl.table_batches(arrival, p, dedup=False)
    ablation = pl.table_batches(arrival, p, dedup=True, adjacent=False)
    adjacent_only = pl.table_batches(arrival, p, dedup=True)  # the clustered reader's one-pass dedup
    ikjt = pl.table_batches(clustered, p, dedup=True)
    assert pl.samples_digest(ablation) == pl.samples_digest(kjt) == pl.samples_digest(ikjt)
    # hashing finds at least the adjacent repeats, and on arrival order strictly more of them
    assert pl.looked_up_ids(ablation) < pl.looked_up_ids(adjacent_only) <= pl.looked_up_ids(kjt)
    # without clustering the IKJT leaves out far fewer ids (smoke: 80 sessions, so some repeats remain)
    assert pl.duplicated_share(kjt, ablation) < 0.5 * pl.duplicated_share(pl.table_batches(clustered, p, dedup=False), ikjt)


def test_the_ablation_trains_the_same_math_as_kjt_on_the_same_batches(tables):
    p, _, arrival = tables
    batches = {"kjt": pl.table_batches(arrival, p, dedup=False),
               sw.ABLATION: pl.table_batches(arrival, p, dedup=True, adjacent=False)}
    out = pl.train_interleaved(batches, p)
    assert np.max(np.abs(np.array(out["kjt"]["losses"]) - np.array(out[sw.ABLATION]["losses"]))) < 1e-4


def test_duplicated_share_counts_the_ids_the_ikjt_leaves_out(tables):
    p, clustered, _ = tables
    kjt = pl.table_batches(clustered, p, dedup=False)
    assert pl.duplicated_share(kjt, kjt) == 0.0
    share = pl.duplicated_share(kjt, pl.table_batches(clustered, p, dedup=True))
    # only user ids repeat, and clustered batches hold ~batch/12 sessions: most user ids are repeats
    user = sum(b.sparse[1].num_values() for b in kjt) / pl.looked_up_ids(kjt)
    assert 0.5 * user < share < user


def test_regime_points_grow_with_the_user_share():
    p = Params.for_scale("smoke")
    lo, hi = (sw.mix_point(p, s) for s in p.mix_sweep)
    assert lo["duplicated_share"] < 0.2 < 0.5 < hi["duplicated_share"]
    assert set(sw.TRAINERS) <= set(lo) and len(lo["ikjt"]["rates"]) == p.repeats


def test_spec_declares_contract_v3():
    assert SPEC.contract_v3 and SPEC.mechanism.ablation == sw.ABLATION
    assert "oracle" not in SPEC.role("kjt") and "oracle" not in SPEC.role("kjt_clustered")
    assert len(Params.for_scale("quick").mix_sweep) >= 4 and len(Params.for_scale("smoke").mix_sweep) == 2
