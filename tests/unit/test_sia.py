"""SIA's pure code: incremental QR equals a full retrain within the conditioning's tolerance (and a wrong
update is caught), the learned index answers exactly like a sorted array while retrains are in flight,
back-pressure stalls, the workloads, the parameters, and a kernel run on the software FPGA board."""
import bisect
import concurrent.futures
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.sia import Params, train
from mlsys_flows.systems.sia.bench import check_lookups, check_weights, clone, runs_for
from mlsys_flows.systems.sia.index import LearnedIndex, Server, common_prefix, image, inline_submit
from mlsys_flows.systems.sia.workload import KEY_WIDTH, fnv1a64, make_keys, op_stream

WIDTH = 12


def as_u8(keys: list[bytes], width: int = WIDTH) -> np.ndarray:
    arr = np.array(sorted(keys), dtype=f"S{width}")
    return arr.view(np.uint8).reshape(len(arr), width)


key_sets = st.lists(st.binary(min_size=1, max_size=WIDTH).filter(lambda b: b"\0" not in b),
                    min_size=2, max_size=300, unique=True)


def split(keys, data):
    k = data.draw(st.integers(1, len(keys) - 1))
    return sorted(keys[:k]), sorted(keys[k:])


# ---- equality of the incremental and the full retrain -------------------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys=key_sets, data=st.data(), n_feat=st.integers(2, WIDTH), ridge=st.sampled_from([1e-8, 1e-6, 1e-4]))
def test_incremental_qr_equals_full_retrain(keys, data, n_feat, ridge):
    old, new = split(keys, data)
    lam = ridge * len(old)
    full_old = train.retrain_full(as_u8(old), 0, n_feat, lam)
    merged = as_u8(old + new)
    inc = train.retrain_sia(merged, as_u8(new), full_old["r"], 0, n_feat, lam)
    check = train.check_equal_weights(inc["w"], merged, 0, n_feat, lam)
    assert check["ok"], check
    full = train.retrain_full(merged, 0, n_feat, lam)
    # the memoised R is the full retrain's R (both with a non-negative diagonal)
    scale = np.abs(full["r"]).max()
    assert np.allclose(inc["r"], full["r"], atol=1e-8 * scale), np.abs(inc["r"] - full["r"]).max() / scale
    assert inc["qr_rows"] == len(new) + n_feat + 1 < full["qr_rows"] + n_feat + 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys=key_sets, data=st.data(), n_feat=st.integers(2, WIDTH))
def test_dropping_r_old_fails_the_check(keys, data, n_feat):
    """The same check rejects a wrong update: the new keys' QR without the memoised R."""
    old, new = split(keys, data)
    lam = 1e-8 * len(old)
    merged = as_u8(old + new)
    broken = train.retrain_sia(merged, as_u8(new), train.ridge_rows(n_feat + 1, lam), 0, n_feat, lam)
    check = train.check_equal_weights(broken["w"], merged, 0, n_feat, lam)
    a_old = train.features(as_u8(old), 0, n_feat)
    assume(np.linalg.norm(a_old[:, :-1] - a_old[:, :-1].mean(0)) > 1e-3)  # old rows that carry information
    assume(check["bound"] < 1e-3)
    assert not check["ok"], check


def realistic(m_old=3000, m_new=200, seed=0):
    keys = np.sort(make_keys("ycsb", m_old + m_new, seed))
    rng = np.random.default_rng(seed)
    is_new = np.zeros(len(keys), bool)
    is_new[rng.choice(len(keys), m_new, replace=False)] = True
    u8 = keys.view(np.uint8).reshape(len(keys), KEY_WIDTH["ycsb"])
    offset = common_prefix(bytes(keys[0]), bytes(keys[-1]))
    return u8, u8[~is_new], u8[is_new], offset


def test_wrong_updates_on_real_keys_fail_and_the_right_one_passes():
    merged, old, new, offset = realistic()
    nf, lam = 16, 1e-8 * len(old)
    r_old = train.retrain_full(old, offset, nf, lam)["r"]
    good = train.retrain_sia(merged, new, r_old, offset, nf, lam)
    assert train.check_equal_weights(good["w"], merged, offset, nf, lam)["ok"]
    no_memo = train.retrain_sia(merged, new, train.ridge_rows(nf + 1, lam), offset, nf, lam)
    assert not train.check_equal_weights(no_memo["w"], merged, offset, nf, lam)["ok"]
    # stale right-hand side: the old keys' positions before the inserts shifted them
    r = train.update_r(r_old, train.features(new, offset, nf))
    a_old = train.features(old, offset, nf)
    stale = train.solve_with_r(r, a_old, np.arange(len(old), dtype=float), lam)
    assert not train.check_equal_weights(stale, merged, offset, nf, lam)["ok"]
    # no refinement: semi-normal equations lose accuracy but stay within the bound here or not -- either
    # way the tolerance must not be looser than a 1e-6 relative error on these well-conditioned groups
    assert train.check_equal_weights(good["w"], merged, offset, nf, lam)["bound"] < 1e-6


def test_repeated_incremental_updates_stay_equal():
    keys = np.sort(make_keys("twitter", 4000, 3))
    u8 = keys.view(np.uint8).reshape(len(keys), KEY_WIDTH["twitter"])
    rng = np.random.default_rng(1)
    order = rng.permutation(len(keys))
    nf, lam = 24, 1e-8 * 1000
    present = np.sort(order[:1000])
    r = train.retrain_full(u8[present], 0, nf, lam)["r"]
    for step in range(10):
        batch = np.sort(order[1000 + step * 300: 1300 + step * 300])
        present = np.sort(np.concatenate([present, batch]))
        out = train.retrain_sia(u8[present], u8[batch], r, 0, nf, lam)
        r = out["r"]
        assert train.check_equal_weights(out["w"], u8[present], 0, nf, lam)["ok"], step


# ---- the index: exact lookups ----------------------------------------------------------------------
def ground_truth(keys, values):
    order = np.argsort(keys)
    return list(keys[order].tolist()), list(np.asarray(values)[order])


def sorted_array_lookup(sk, sv, key):
    i = bisect.bisect_left(sk, key)
    return sv[i] if i < len(sk) and sk[i] == key else None


@pytest.mark.parametrize("scheme", ["full_retrain", "sia"])
@pytest.mark.parametrize("workload", ["ycsb", "twitter"])
def test_lookups_match_a_sorted_array_through_inserts_and_retrains(scheme, workload):
    keys = make_keys(workload, 6000, 5)
    loaded = 4000
    index = LearnedIndex(keys[:loaded], np.arange(loaded), 512, 16, 1e-8)
    server = Server(index, scheme, inline_submit, threshold=16, cap=32)
    kl = keys.tolist()
    for i in range(loaded, 5500):
        server.insert(kl[i], i)
    server.drain()
    assert server.stats.retrains > 20
    sk, sv = ground_truth(keys[:5500], np.arange(5500))
    probes = kl[:5500:7] + kl[5500:] + [k + b"!" for k in kl[:200]]
    for k in probes:
        assert index.lookup(k) == sorted_array_lookup(sk, sv, k), k
    items, vals = index.all_items()
    assert items == sk and vals == sv
    if scheme == "sia":
        worst, ratio = check_weights(index)
        assert ratio <= 1.0 and worst < 1e-8


def test_lookups_exact_while_retrains_are_in_flight():
    """Retrains that have not completed: the frozen buffer and the new buffer are searched."""
    keys = make_keys("ycsb", 3000, 9)
    index = LearnedIndex(keys[:2000], np.arange(2000), 256, 16, 1e-8)
    held: list[concurrent.futures.Future] = []
    calls: list[tuple] = []

    def deferred(kernel, *args):
        fut = concurrent.futures.Future()
        held.append(fut)
        calls.append((kernel, args))
        return fut

    server = Server(index, "sia", deferred, threshold=8, cap=10_000)
    kl = keys.tolist()
    for i in range(2000, 2600):
        server.insert(kl[i], i)
        if i % 50 == 0:
            for k in kl[:i + 1:37]:
                assert index.lookup(k) is not None
    assert server.inflight and all(not f.done() for f in held)
    sk, sv = ground_truth(keys[:2600], np.arange(2600))
    for k in kl[:2600:5] + kl[2600:2700]:
        assert index.lookup(k) == sorted_array_lookup(sk, sv, k)
    server.submit = inline_submit  # from here on retrains complete at once
    for fut, (kernel, args) in zip(list(held), list(calls)):
        fut.set_result(inline_submit(kernel, *args).result())
    server.poll()
    server.drain()
    for k in kl[:2600:5] + kl[2600:2700]:
        assert index.lookup(k) == sorted_array_lookup(sk, sv, k)


def test_error_bound_window_is_what_makes_lookups_exact():
    """A model whose error bound is understated misses keys: the window search is real."""
    keys = make_keys("ycsb", 3000, 2)
    index = LearnedIndex(keys, np.arange(3000), 1024, 16, 1e-8)
    assert check_lookups(index, keys.tolist()[:500], list(range(500)), []) == 0
    for g in index.groups:
        g.err = 0
    assert check_lookups(index, keys.tolist()[:500], list(range(500)), []) > 0


def test_full_buffer_stalls_until_the_retrain_completes():
    keys = make_keys("ycsb", 3000, 4)
    index = LearnedIndex(keys[:2000], np.arange(2000), 2000, 16, 1e-8)  # one group
    gate = threading.Event()
    pool = concurrent.futures.ThreadPoolExecutor(1)

    def slow(kernel, *args):
        def work():
            gate.wait(5)
            return inline_submit(kernel, *args).result()
        return pool.submit(work)

    server = Server(index, "full_retrain", slow, threshold=4, cap=8)
    kl = keys.tolist()
    threading.Timer(0.2, gate.set).start()
    for i in range(2000, 2012):
        server.insert(kl[i], i)
    server.drain()
    pool.shutdown()
    assert server.stats.stalls == 1 and server.stats.stall_s > 0.1
    assert server.stats.retrains == 2
    assert all(index.lookup(kl[i]) == i for i in range(2012))


def test_server_rejects_bad_settings():
    index = LearnedIndex(make_keys("ycsb", 600, 0), np.arange(600), 256, 8, 1e-8)
    with pytest.raises(ValueError):
        Server(index, "sgd", inline_submit, 4, 8)
    with pytest.raises(ValueError):
        Server(index, "sia", inline_submit, 8, 4)
    with pytest.raises(ValueError):
        LearnedIndex(np.array([b"a", b"a"], dtype="S4"), np.arange(2), 2, 2, 1e-8)


def test_clone_is_independent():
    index = LearnedIndex(make_keys("ycsb", 1200, 0), np.arange(1200), 256, 8, 1e-8)
    c = clone(index)
    server = Server(c, "sia", inline_submit, 4, 8)
    extra = make_keys("ycsb", 1300, 0).tolist()[1200:]
    for i, k in enumerate(extra[:40]):
        server.insert(k, 5000 + i)
    server.drain()
    assert all(c.lookup(k) is not None for k in extra[:40])
    assert all(index.lookup(k) is None for k in extra[:40])
    assert [g.err for g in index.groups] == [g.err for g in clone(index).groups]


# ---- workloads and parameters ----------------------------------------------------------------------
def test_workload_keys():
    y = make_keys("ycsb", 2000, 0)
    assert len(set(y.tolist())) == 2000 and all(k.startswith(b"user") and k[4:].isdigit() for k in y.tolist())
    assert np.array_equal(make_keys("ycsb", 2000, 0), y) and not np.array_equal(make_keys("ycsb", 2000, 1), y)
    tw = make_keys("twitter", 2000, 0).tolist()
    assert len(set(tw)) == 2000 and all(k.count(b":") == 3 and k.split(b":")[2].isdigit() for k in tw)
    # YCSB's FNV-1a 64 of record 0: the offset basis hashed with eight zero bytes
    h = 0xCBF29CE484222325
    for _ in range(8):
        h = (h * 0x100000001B3) & (2**64 - 1)
    assert int(fnv1a64(np.array([0]))[0]) == h
    with pytest.raises(ValueError):
        make_keys("tpcc", 10, 0)


def test_op_stream_reads_present_keys_only():
    keys = make_keys("ycsb", 1500, 0)
    s = op_stream(keys, 1000, 800, 0.5, 0)
    present = 1000
    for ins, t in zip(s.is_insert.tolist(), s.target.tolist()):
        if ins:
            assert t == present
            present += 1
        else:
            assert 0 <= t < present
    assert 300 < s.inserts < 500
    with pytest.raises(ValueError):
        op_stream(keys, 1000, 5000, 0.5, 0)


def test_params_validation_names_the_field():
    assert Params.for_scale("smoke").repeats == 1
    with pytest.raises(ParamsError, match="buffer_cap"):
        Params.for_scale("smoke", threshold=64, buffer_cap=32)
    with pytest.raises(ParamsError, match="insert_share"):
        Params.for_scale("smoke", insert_share=0.0)
    with pytest.raises(ParamsError, match="group_size"):
        Params.for_scale("smoke", loaded_keys=2048, group_size=4096)
    with pytest.raises(ParamsError, match="pgm_buffer"):
        Params.for_scale("smoke", pgm_buffer=0)
    with pytest.raises(ParamsError, match="buffer_cap"):   # the compiled path's buffers would not fit
        Params.for_scale("smoke", loaded_keys=10_000_000, group_size=256, buffer_cap=1_000_000)
    idx = {"sorteddict", "btree", "pgm"}
    assert {r.variant for r in runs_for("ycsb", True)} == {
        "full_retrain", "sia", "sia_nomemo", "full_retrain_readheavy", "sia_readheavy", "full_retrain_inline", "sia_inline",
        *idx, *(f"{b}_readheavy" for b in idx)}
    assert {r.variant for r in runs_for("twitter", False)} == {
        "full_retrain_twitter", "sia_twitter", "full_retrain_twitter_readheavy", "sia_twitter_readheavy",
        *(f"{b}_twitter" for b in idx), *(f"{b}_twitter_readheavy" for b in idx)}


# ---- the kernels on the software FPGA board -----------------------------------------------------------
def test_kernels_run_on_the_software_board():
    import os

    from mlsys_flows.devices.fpga import open_board

    merged, old, new, offset = realistic(1500, 100, 1)
    lam = 1e-8 * len(old)
    r_old = train.retrain_full(old, offset, 16, lam)["r"]
    with open_board("fpga-sw:0") as board:
        board.load_image(image())
        pid = board.run("mlsys_flows.systems.sia.train:warm_up")
        fut = board.run_async("mlsys_flows.systems.sia.train:retrain_sia", merged, new, r_old, offset, 16, lam)
        full = board.run("mlsys_flows.systems.sia.train:retrain_full", merged, offset, 16, lam)
        inc = fut.result()
    assert pid != os.getpid()
    here = train.retrain_sia(merged, new, r_old, offset, 16, lam)
    assert np.array_equal(inc["w"], here["w"]) and inc["err"] == here["err"]
    assert train.weight_difference(inc["w"], full["w"]) <= train.check_equal_weights(inc["w"], merged, offset, 16, lam)["bound"]


def test_submission_blocking_is_counted_as_stall():
    """The host's time inside submit (inline: the whole retrain) is stall, once, also on the back-pressure path."""
    import time as _time

    keys = make_keys("ycsb", 3000, 3)
    index = LearnedIndex(keys[:2000], np.arange(2000), 512, 8, 1e-8)

    def slow_submit(kernel, *args, **kw):
        _time.sleep(0.01)
        return inline_submit(kernel, *args, **kw)

    server = Server(index, "sia", slow_submit, threshold=8, cap=8)
    kl = keys.tolist()
    st = server.run(kl, [True] * 400, list(range(2000, 2400)))
    assert st.retrains >= 10 and st.submit_s >= 0.01 * st.retrains
    summ = st.summary()
    assert summ["submit_share"] == st.submit_s / st.elapsed_s
    assert summ["stall_share"] == (st.stall_s + st.submit_s) / st.elapsed_s <= 1.0


def test_regime_plan_reuses_the_measured_mixes():
    from mlsys_flows.systems.sia.bench import regime_plan

    p = Params.for_scale("smoke", insert_share=0.5, read_heavy_insert_share=0.05)
    plan = regime_plan(p, [0.05, 0.3, 0.5], inline=True)
    assert plan[0.5] == {"sia": "sia", "full_retrain": "full_retrain", "full_retrain_inline": "full_retrain_inline",
                         "sorteddict": "sorteddict", "btree": "btree", "pgm": "pgm"}
    assert plan[0.05] == {"sia": "sia_readheavy", "full_retrain": "full_retrain_readheavy",
                          "full_retrain_inline": ("full_retrain", False), "sorteddict": "sorteddict_readheavy",
                          "btree": "btree_readheavy", "pgm": "pgm_readheavy"}
    assert plan[0.3]["sia"] == ("sia", True) and plan[0.3]["btree"] == ("btree", False)
    assert "full_retrain_inline" not in regime_plan(p, [0.3], inline=False)[0.3]
