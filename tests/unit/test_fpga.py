"""The FPGA device interface and the software board (mlsys_flows/devices/fpga/) behind the FPGA pool."""
from __future__ import annotations

import concurrent.futures
import hashlib
import multiprocessing
import os
import threading
import time
import uuid

import numpy as np
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from mlsys_flows.blocks import ResourcePool
from mlsys_flows.devices import fpga

K = "mlsys_flows.devices.fpga.kernels:"  # the diagnostic kernels


@pytest.fixture
def state(tmp_path):
    return str(tmp_path / "fpga")


def test_memory_regions_are_bounds_checked(state):
    with fpga.open_board("fpga-sw:0", state=state, memory_bytes=4096) as b:
        b.alloc("table", 1024)
        b.write("table", 1000, b"x" * 24)
        assert b.read("table", 1000, 24) == b"x" * 24
        assert b.read("table", 0, 8) == bytes(8)  # regions start zeroed
        with pytest.raises(fpga.BoundsError, match=r"access \[1000, 1025\) outside its bounds \[0, 1024\)"):
            b.write("table", 1000, b"x" * 25)
        with pytest.raises(fpga.BoundsError, match="outside its bounds"):
            b.read("table", 1020, 5)
        with pytest.raises(fpga.BoundsError):
            b.read("table", -1, 1)
        with pytest.raises(fpga.FpgaError, match="no region 'nope'"):
            b.read("nope", 0, 1)
        with pytest.raises(fpga.BoundsError, match="free memory"):
            b.alloc("big", 4096)
        with pytest.raises(fpga.FpgaError, match="already allocated"):
            b.alloc("table", 8)
        assert b.read("table", 1000, 24) == b"x" * 24  # failed accesses changed nothing
        # loading an image starts the board blank: the regions are gone
        b.load_image(fpga.diagnostic_image())
        with pytest.raises(fpga.FpgaError, match="no region 'table'"):
            b.read("table", 0, 1)
        # kernels on the device see the host's regions through board_memory(), with the same bounds
        b.alloc("table", 1024)
        b.write("table", 1000, b"x" * 24)
        assert b.run(K + "read_region", "table", 1000, 24) == b"x" * 24
        with pytest.raises(fpga.BoundsError, match="outside its bounds"):
            b.run(K + "read_region", "table", 1000, 25)
    with pytest.raises(fpga.FpgaError, match="only reachable from a kernel running on the device"):
        fpga.board_memory()


def test_image_measurement_and_signed_report(state):
    image = b"accelerator bitstream " * 100
    nonce, user = os.urandom(16), X25519PrivateKey.generate()
    user_pub = user.public_key().public_bytes_raw()
    with fpga.open_board("fpga-sw:0", state=state) as b:
        with pytest.raises(fpga.FpgaError, match="no image loaded"):
            b.attest(nonce, user_pub)
        assert b.load_image(image) == hashlib.sha256(image).digest()
        report = b.attest(nonce, user_pub)
        assert b.load_image(image + b"!") == hashlib.sha256(image + b"!").digest() != report.measurement
    assert report.measurement == hashlib.sha256(image).digest() and report.nonce == nonce
    root = Ed25519PublicKey.from_public_bytes(fpga.manufacturer_root_public_key(state))
    root.verify(report.device_certificate, fpga.certificate_payload(report.device, report.device_public_key))
    dev = Ed25519PublicKey.from_public_bytes(report.device_public_key)
    dev.verify(report.signature, report.payload())
    with pytest.raises(InvalidSignature):  # the signature covers the measurement
        dev.verify(report.signature, fpga.report_payload(report.device, hashlib.sha256(b"other").digest(),
                                                         nonce, user_pub, report.device_session_public_key))
    # the device key persists across openings (it is the board's, made once at the "factory")
    with fpga.open_board("fpga-sw:0", state=state) as b:
        b.load_image(image)
        assert b.attest(nonce, user_pub).device_public_key == report.device_public_key


def test_images_record_code_hashes_debug_images_are_flagged_and_every_load_starts_blank(state):
    img = fpga.read_image(fpga.diagnostic_image())
    assert img.code == {k: fpga.kernel_code_hash(k) for k in img.kernels} and not img.debug
    assert all(k.partition(":")[0] in fpga.SHIPPED_KERNEL_MODULES for k in img.kernels)
    with pytest.raises(fpga.KernelRefused, match="not a kernel module the device ships"):
        fpga.build_image(["os:system"])
    dbg = fpga.build_image([K + "echo", "mlsys_flows.systems.shef.debug:shield_read"])
    assert fpga.read_image(dbg).debug
    user_pub = X25519PrivateKey.generate().public_key().public_bytes_raw()
    with fpga.open_board("fpga-sw:5", state=state) as b:
        b.load_image(dbg)
        assert b.attest(os.urandom(16), user_pub).debug
        b.load_image(fpga.diagnostic_image())
        report = b.attest(os.urandom(16), user_pub)
        assert not report.debug and b.run(K + "has_session_key")
        b.alloc("r", 64)
        b.load_image(fpga.diagnostic_image())  # the same image again: a blank device all the same
        with pytest.raises(fpga.FpgaError, match="no session key"):
            b.run(K + "has_session_key")
        with pytest.raises(fpga.FpgaError, match="no region 'r'"):
            b.read("r", 0, 1)
    with pytest.raises(fpga.FpgaError, match="only reachable from a kernel running on the device"):
        fpga.board_store()


def test_kernel_runs_in_the_board_process_with_plain_arguments(state):
    with fpga.open_board("fpga-sw:3", state=state) as b:
        b.load_image(fpga.diagnostic_image())
        out = b.run(K + "echo", 1, np.arange(3), flag=True)
        assert out["pid"] == b.pid != os.getpid()
        assert out["args"][0] == 1 and out["kwargs"] == {"flag": True}
        assert out["args"][1].tolist() == [0, 1, 2] and isinstance(out["args"][1], np.ndarray)  # numpy in and out
        with pytest.raises(fpga.KernelError, match="TypeError") as err:
            b.run(K + "busy", "one second")
        assert "Traceback" in err.value.remote
        with pytest.raises(fpga.FpgaError, match="package.module:function"):
            b.run("no_colon")
        # the session key from attestation is visible to kernels on the device only
        b.attest(b"n" * 16, X25519PrivateKey.generate().public_key().public_bytes_raw())
        assert b.run(K + "has_session_key")
    with pytest.raises(fpga.FpgaError, match="closed"):
        b.run(K + "echo")


def test_run_async_lets_the_host_work_meanwhile(state):
    with fpga.open_board("fpga-sw:0", state=state) as b:
        b.load_image(fpga.diagnostic_image())
        fut = b.run_async(K + "interval", 0.5)
        host_ticks = []
        while not fut.done():
            host_ticks.append(time.time())
            time.sleep(0.01)
        t0, t1 = fut.result()
        assert sum(t0 < t < t1 for t in host_ticks) >= 5  # the host ran while the device computed
        # the blocking call, by contrast, returns only after the device finished
        before = time.time()
        t0, t1 = b.run(K + "interval", 0.2)
        assert before <= t0 and time.time() >= t1


def _job(device: str, state: str, counter: str, hold: float, slots: int, enforce: bool = True) -> int:
    """One job: open the board (takes a slot) and mark itself active while its kernel runs."""
    return fpga.occupancy_job(device, counter, hold, state=state, slots=slots, enforce_slots=enforce)


def _peak(counter: str) -> int:
    with open(counter) as f:
        return int(f.read().split()[1])


@pytest.mark.parametrize("slots,jobs,hold", [(1, 3, 0.3), (2, 4, 1.0)])
def test_concurrent_thread_jobs_never_exceed_the_slots(state, tmp_path, slots, jobs, hold):
    counter = str(tmp_path / "occupancy")
    with concurrent.futures.ThreadPoolExecutor(jobs) as ex:
        peaks = list(ex.map(lambda _: _job("fpga-sw:1", state, counter, hold, slots), range(jobs)))
    assert _peak(counter) <= slots and max(peaks) <= slots
    if slots == 2:
        assert _peak(counter) == 2  # the measurement sees concurrency when the board allows it


def test_slot_check_is_what_bounds_concurrency(state, tmp_path):
    """The same jobs with the slot lock disabled overlap on the one-slot board: the check can fail."""
    counter = str(tmp_path / "occupancy")
    with concurrent.futures.ThreadPoolExecutor(3) as ex:
        list(ex.map(lambda _: _job("fpga-sw:1", state, counter, 1.5, 1, enforce=False), range(3)))
    assert _peak(counter) > 1


def test_concurrent_process_jobs_never_exceed_the_slot(state, tmp_path):
    counter = str(tmp_path / "occupancy")
    with concurrent.futures.ProcessPoolExecutor(3, mp_context=multiprocessing.get_context("spawn")) as ex:
        futs = [ex.submit(fpga.occupancy_job, "fpga-sw:2", counter, 0.3, state=state, slots=1) for _ in range(3)]
        assert max(f.result() for f in futs) == 1
    assert _peak(counter) == 1


def test_slot_timeout_and_release(state):
    with fpga.open_board("fpga-sw:4", state=state) as b:
        t0 = time.monotonic()
        with pytest.raises(fpga.SlotTimeout, match="all 1 slot"):
            fpga.open_board("fpga-sw:4", state=state, slot_timeout=0.2)
        assert time.monotonic() - t0 >= 0.2
        assert b.slot == 0
    with fpga.open_board("fpga-sw:4", state=state, slot_timeout=5) as b2:  # released on close
        assert b2.slot == 0
    with pytest.raises(fpga.FpgaError, match="no FPGA driver for 'f1:0'"):
        fpga.open_board("f1:0")


def _pool_job(pool: ResourcePool, state: str, counters: str) -> str:
    with pool.claim() as device:
        with fpga.open_board(device, state=state, slot_timeout=60) as b:
            b.load_image(fpga.diagnostic_image())
            b.run(K + "occupancy", os.path.join(counters, device.replace(":", "_")), 0.3)
            b.run(K + "occupancy", os.path.join(counters, "pool"), 0.0)
        return device


def test_pool_claims_spread_jobs_and_never_exceed_each_device(state, tmp_path):
    """Flow-level: tasks claim the FPGA pool; each gets a board of the inventory no other job holds."""
    pool = ResourcePool(kind="fpga", devices=["fpga:0", "fpga:1"], name=f"t{uuid.uuid4().hex[:8]}",
                        limit_concurrency=False)
    assert pool.device() == "fpga-sw:0"
    counters = str(tmp_path)
    with concurrent.futures.ThreadPoolExecutor(5) as ex:
        used = list(ex.map(lambda _: _pool_job(pool, state, counters), range(5)))
    assert set(used) == {"fpga-sw:0", "fpga-sw:1"}
    assert _peak(os.path.join(counters, "fpga-sw_0")) == 1 and _peak(os.path.join(counters, "fpga-sw_1")) == 1


def test_pool_claim_waits_for_a_free_device():
    pool = ResourcePool(kind="fpga", devices=["fpga-sw:0"], name=f"t{uuid.uuid4().hex[:8]}",
                        limit_concurrency=False)
    order: list[str] = []
    with pool.claim() as device:
        assert device == "fpga-sw:0"
        def second():
            with pool.claim():
                order.append("second")
        t = threading.Thread(target=second)
        t.start()
        time.sleep(0.3)
        order.append("first released")
    t.join(10)
    assert order == ["first released", "second"]


def test_run_context_gives_fpga_tasks_this_machines_software_board():
    """Without a devices block, ctx.devices passed to an fpga task becomes the local software board
    pool; GPU and plain tasks keep the local GPU pool."""
    from mlsys_flows.flows.common import RunContext

    class FakeTask:
        name = "fake"

        def submit(self, *args, **kwargs):
            return args, kwargs

    ctx = RunContext(spec=None, params=None, storage=None, cluster=None, run_id="r")
    args, kwargs = ctx.submit(FakeTask(), 1, ctx.devices, pool=ctx.devices, device="fpga")
    assert args[0] == 1 and args[1].kind == kwargs["pool"].kind == "fpga"
    assert args[1].devices == ["fpga-sw:0"] and not args[1].limit_concurrency
    for device in ("gpu", None):
        args, _ = ctx.submit(FakeTask(), ctx.devices, device=device)
        assert args[0].kind == "gpu" and args[0] == ctx.devices
    lab = ResourcePool(kind="gpu", name="lab")  # a pool the task was handed explicitly is left alone
    assert ctx.submit(FakeTask(), lab, device="fpga")[0][0] is lab
