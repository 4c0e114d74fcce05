"""Retrain arguments through shared memory: the board gets a small descriptor, computes what the inline
kernel computes, and no segment of ours is left in /dev/shm after a run, also when a kernel fails, a
send fails or a retrain never comes back."""
import concurrent.futures
import pickle

import numpy as np
import pytest

from mlsys_flows.devices.fpga import KernelError, open_board
from mlsys_flows.systems.sia import train
from mlsys_flows.systems.sia.index import LearnedIndex, Server, image
from mlsys_flows.systems.sia.shared import PREFIX, SharedSubmit, attach, leftover_segments
from mlsys_flows.systems.sia.workload import make_keys

FULL = "mlsys_flows.systems.sia.train:retrain_full"
SIA = "mlsys_flows.systems.sia.train:retrain_sia"


def ours(before):
    return [n for n in leftover_segments() if n not in before]


def sorted_u8(n=3000, seed=0):
    keys = np.sort(make_keys("ycsb", n, seed))
    return keys.view(np.uint8).reshape(len(keys), keys.dtype.itemsize)


def test_only_a_descriptor_crosses_and_the_kernel_reads_the_segment():
    sent = []

    def run_async(kernel, *args):
        sent.append((kernel, args))
        fut = concurrent.futures.Future()
        with attach(args) as resolved:  # what the device does
            fut.set_result(getattr(train, kernel.rpartition(":")[2])(*resolved))
        return fut

    before = leftover_segments()
    u = sorted_u8()
    with SharedSubmit(run_async) as sub:
        out = sub(FULL, u, 4, 16, 1e-8).result()
    kernel, args = sent[0]
    assert kernel == FULL + "_shared"
    assert not any(isinstance(a, np.ndarray) for a in args) and len(pickle.dumps(args)) < 512 < u.nbytes
    ref = train.retrain_full(u, 4, 16, 1e-8)
    assert np.array_equal(out["w"], ref["w"]) and out["err"] == ref["err"]
    assert sub.calls == 1 and sub.shared_bytes == u.nbytes
    assert ours(before) == []


def test_server_on_the_board_through_shared_memory_leaves_no_segment():
    keys = make_keys("ycsb", 6000, 2)
    before = leftover_segments()
    with open_board("fpga-sw:0") as board:
        board.load_image(image())
        for scheme in ("full_retrain", "sia"):
            index = LearnedIndex(keys[:4000], np.arange(4000), 1024, 16, 1e-8)
            with SharedSubmit(board.run_async) as sub:
                st = Server(index, scheme, sub, threshold=32, cap=64).run(keys.tolist(), [True] * 1500,
                                                                            list(range(4000, 5500)))
                assert st.retrains > 10 and sub.calls == st.retrains
                assert sub.created <= sub.calls  # segments are reused once their retrain is back
            assert ours(before) == []
            assert all(index.lookup(k) == i for i, k in enumerate(keys.tolist()[:5500]))
            if scheme == "sia":
                from mlsys_flows.systems.sia.bench import check_weights
                assert check_weights(index)[1] <= 1.0


def test_no_segment_left_when_a_kernel_fails_on_the_board():
    before = leftover_segments()
    with open_board("fpga-sw:0") as board:
        board.load_image(image())
        with SharedSubmit(board.run_async) as sub:
            bad_r = np.zeros((3, 3))  # wrong shape for 16 features: the kernel raises on the device
            fut = sub(SIA, sorted_u8(), sorted_u8(40, 1), bad_r, 4, 16, 1e-8)
            with pytest.raises(KernelError):
                fut.result()
            assert not sub.idle  # a failed call's segment is not kept for reuse
    assert ours(before) == []


def test_no_segment_left_when_the_send_fails_or_a_retrain_never_returns():
    before = leftover_segments()

    def broken(kernel, *args):
        raise OSError("pipe closed")

    sub = SharedSubmit(broken)
    with pytest.raises(OSError):
        sub(FULL, sorted_u8(), 4, 16, 1e-8)
    assert ours(before) == []
    held = []
    with SharedSubmit(lambda k, *a: held.append(concurrent.futures.Future()) or held[-1]) as sub:
        sub(FULL, sorted_u8(), 4, 16, 1e-8)
        sub(FULL, sorted_u8(), 4, 16, 1e-8)
        assert len(ours(before)) == 2
    assert ours(before) == []  # close() unlinked what was still out


def test_attach_refuses_foreign_segments():
    with pytest.raises(ValueError, match="not one of this system's"):
        with attach((("__sia_shm__", "some_other_segment", 0, (4,), "|u1"),)):
            pass
    assert PREFIX.startswith("mlsys_sia")
