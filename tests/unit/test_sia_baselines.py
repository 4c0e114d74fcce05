"""SIA's index baselines (SortedDict, OOBTree, the PGM-index with a delta buffer) answer exactly like a
sorted array on the workloads' operation streams, and the PGM-index's number keys keep the key order."""
import bisect

import numpy as np
import pytest

from mlsys_flows.systems.sia import baselines
from mlsys_flows.systems.sia.bench import check_lookups
from mlsys_flows.systems.sia.workload import make_keys, op_stream


@pytest.mark.parametrize("name", baselines.INDEXES)
@pytest.mark.parametrize("workload", ["ycsb", "twitter"])
def test_baselines_serve_the_stream_exactly(name, workload):
    keys = make_keys(workload, 5000, 1)
    s = op_stream(keys, 3000, 3000, 0.5, 1)
    kl = keys.tolist()
    index = baselines.build(name, keys[:3000], np.arange(3000), pgm_buffer=100)
    st = baselines.serve(index, kl, s.is_insert.tolist(), s.target.tolist())
    assert st.misses == 0 and st.ops == 3000 and len(st.lookup_ns) == 3000 - s.inserts
    present = kl[: 3000 + s.inserts]
    absent = kl[3000 + s.inserts:] + [k + b"~" for k in kl[:50]]
    assert check_lookups(index, present, list(range(len(present))), absent) == 0
    if name == "pgm":
        assert index.rebuilds - 1 == s.inserts // 100  # one rebuild per full buffer, after the initial build


def test_pgm_numbers_keep_the_key_order_and_clamp_keys_outside_the_prefix():
    loaded = np.array([b"user%05d" % i for i in range(0, 2000, 2)], dtype="S16")
    index = baselines.PgmIndex(loaded, np.arange(len(loaded)), buffer=10_000)
    assert index.prefix == b"user0"
    outside = [b"aaa", b"user", b"use", b"zzz", b"user1", b"userzzzzzzzzzzzz", b"user\x01", b"user0"]
    for i, k in enumerate(outside):
        index.insert(k, 10_000 + i)
    index.merge()
    ks = index.keys
    assert ks == sorted(ks)
    nums = [index.number(k) for k in ks]
    assert nums == sorted(nums)  # the order PGM sees is the key order (ties resolved by the key search)
    assert np.array_equal(index._numbers(index.arr), np.array(nums, dtype=np.uint64))
    for i, k in enumerate(outside):
        assert index.lookup(k) == 10_000 + i
    assert index.lookup(b"user00001") is None and index.lookup(b"user00002") == 1


def test_pgm_buffer_must_be_positive():
    keys = make_keys("ycsb", 100, 0)
    with pytest.raises(ValueError, match="pgm_buffer"):
        baselines.build("pgm", keys, np.arange(100), pgm_buffer=0)
    with pytest.raises(ValueError, match="unknown baseline index"):
        baselines.build("skiplist", keys, np.arange(100), pgm_buffer=8)


def test_baselines_agree_with_a_sorted_array_on_random_probes():
    keys = make_keys("twitter", 3000, 4)
    sk = sorted(keys.tolist())
    rng = np.random.default_rng(0)
    probes = [sk[i] for i in rng.choice(len(sk), 300, replace=False)] + [sk[i][:-1] for i in range(0, 3000, 97)]
    for name in baselines.INDEXES:
        index = baselines.build(name, keys, np.arange(3000), pgm_buffer=64)
        truth = dict(zip(keys.tolist(), range(3000)))
        for k in probes:
            i = bisect.bisect_left(sk, k)
            assert index.lookup(k) == (truth[k] if i < len(sk) and sk[i] == k else None), (name, k)
