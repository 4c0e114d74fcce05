"""DSI's remaining review items (issue 30): whole-process pinning of the processes beside the trainer
(and which ones may be pinned), a `full` preset that fits a 64 GB disk, the free-disk check, and the
controller scaling past one worker while the stall stays high."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.dsi import Params
from mlsys_flows.systems.dsi import data as d
from mlsys_flows.systems.dsi.cpu import (HAS_AFFINITY, dpp_workers_wanted, helper_pins, pin_process,
                                         process_identity, restore_process)
from mlsys_flows.systems.dsi.dpp import Controller, run_dpp
from test_dsi import dataset  # noqa: F401  (the smoke dataset fixture, shared with test_dsi.py)


def _masks(pid: int) -> dict[int, set[int]]:
    return {int(t): os.sched_getaffinity(int(t)) for t in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.skipif(not HAS_AFFINITY, reason="no sched_setaffinity on this OS")
def test_a_whole_process_is_pinned_by_pid_and_restored():
    core = min(os.sched_getaffinity(0))
    # a child with three threads running; it starts a fourth when told (after the pin)
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, threading, time
        stop = threading.Event()
        for _ in range(3):
            threading.Thread(target=stop.wait, daemon=True).start()
        print("ready", flush=True)
        sys.stdin.readline()
        threading.Thread(target=stop.wait, daemon=True).start()
        print("started", flush=True)
        sys.stdin.readline()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        original = _masks(child.pid)
        assert len(original) >= 4
        before = pin_process(child.pid, [core])
        assert set(before) == set(original) and before == original
        assert all(m == {core} for m in _masks(child.pid).values())       # every thread, not just the main one
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "started"
        now = _masks(child.pid)
        assert len(now) == len(original) + 1 and all(m == {core} for m in now.values())  # a new thread inherits
        restore_process(child.pid, before)
        after = _masks(child.pid)
        assert all(after[t] == original[t] for t in original)
        assert all(after[t] == original[child.pid] for t in set(after) - set(original))  # new ones: the main's mask
    finally:
        child.kill()
        child.wait()
    restore_process(child.pid, before)  # the process is gone: nothing to undo, no error
    assert pin_process(child.pid, [core]) == {}


def _ident(pid: int, *ancestors: int, machine: str | None = "boot/host") -> dict:
    return {"pid": pid, "ancestors": list(ancestors), "machine": machine}


def test_only_the_runs_own_cluster_beside_the_trainer_is_pinned():
    sched = _ident(100, 1)                           # the flow's process runs the embedded scheduler
    trainer = _ident(301, 201, 100, 1)               # worker 301, its nanny 201, started by the flow
    workers = {"tcp://a": trainer, "tcp://b": _ident(302, 202, 100, 1),
               "tcp://c": _ident(400, 1),                           # joined from a `dask worker` on this machine
               "tcp://d": _ident(302, 202, 100, 1, machine="other")}  # same pids on another machine
    pins, note = helper_pins(trainer, sched, workers, "tcp://a", own_cluster=True)
    assert pins == {"scheduler (the flow's process)": 100, "nanny of the trainer's worker": 201,
                    "DPP worker tcp://b": 302, "nanny of tcp://b": 202}
    assert 301 not in pins.values() and 400 not in pins.values() and "embedded" in note
    # a cluster the run did not start (an address, the server's warm cluster): nothing
    assert helper_pins(trainer, sched, workers, "tcp://a", own_cluster=False)[0] == {}
    # a scheduler elsewhere, or one that is not the trainer's ancestor: nothing
    assert helper_pins(trainer, _ident(100, 1, machine="other"), workers, "tcp://a", True)[0] == {}
    assert helper_pins(_ident(301, 201, 7, 1), sched, workers, "tcp://a", True)[0] == {}
    # a threads cluster: the workers are the trainer's own process
    pins, note = helper_pins(_ident(100, 1), sched, {"inproc://a": _ident(100, 1)}, "inproc://a", True)
    assert pins == {} and "threads" in note
    # no /proc: never the same machine
    assert helper_pins(_ident(301, machine=None), _ident(100, machine=None), {}, "tcp://a", True)[0] == {}


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="no /proc")
def test_a_process_knows_its_ancestors_and_machine():
    me = process_identity()
    assert me["pid"] == os.getpid() and me["ancestors"][0] == os.getppid() and me["machine"]


def test_one_dpp_worker_per_dpp_core_up_to_max_workers():
    assert dpp_workers_wanted(64, [0], list(range(1, 16))) == 15
    assert dpp_workers_wanted(4, [0], list(range(1, 16))) == 4
    assert dpp_workers_wanted(8, [0], [1]) == 1
    assert dpp_workers_wanted(8, [0], [0]) == 1      # one core shared: more processes add no CPU
    # more than one per DPP core: the controller gets workers to add (sharing their core), never on the trainer's
    assert dpp_workers_wanted(8, [0], [1], per_core=2) == 2
    assert dpp_workers_wanted(3, [0], [1, 2], per_core=2) == 3
    assert dpp_workers_wanted(8, [0], [0], per_core=2) == 1
    assert dpp_workers_wanted(8, [0], [1], per_core=Params.for_scale("quick").workers_per_dpp_core) == 2  # 2 cores


def test_the_controller_scales_up_while_the_stall_stays_high_and_back_down():
    p = Params.for_scale("smoke", min_workers=1, start_workers=1, max_workers=6)
    c = Controller(p)
    stalls = [0.4] * 8 + [0.0] * 8                    # a stalled trainer, then a full queue and no stall
    targets = [c.decide(t, s, 0.0 if s else 1.0, live=15) for t, s in enumerate(stalls)]
    assert targets == [2, 3, 4, 5, 6, 6, 6, 6, 5, 4, 3, 2, 1, 1, 1, 1]
    # a stall just above stall_high still adds workers; between the thresholds the pool holds
    c = Controller(p)
    assert [c.decide(t, s, 0.5, live=15) for t, s in enumerate([0.06, 0.06, 0.03, 0.03])] == [2, 3, 3, 3]


def test_the_master_gives_the_controller_every_live_worker(dataset, monkeypatch):
    """The cap is the executor's live workers, not one: with four, the controller may use four."""
    from test_dsi_v3 import _Pool

    p, storage, items = dataset
    p = p.model_copy(update={"control_interval_s": 0.001, "max_workers": 8})
    seen = []
    original = Controller.decide

    def record(self, now, stall, fill, live, **kw):
        seen.append(live)
        return original(self, now, stall, fill, live, **kw)

    class Four(_Pool):
        def workers(self):
            return ["w0", "w1", "w2", "w3"]

    monkeypatch.setattr(Controller, "decide", record)
    run_dpp(items, Four(storage, p), p.used_columns(), p)
    assert seen and set(seen) == {4}


def test_the_controller_adds_a_worker_at_start_up_and_the_master_uses_it(dataset):
    """Event-driven, no clock threshold: no tick falls inside the run (a control interval of ten minutes), so
    the only decision is the one taken when the first result arrives. Until then the trainer has waited the
    whole time (its wait in progress counts), so the stall is above stall_high and the pool grows from
    start_workers=1 to the second worker, which then runs work items (the smoke dataset has more items than
    the first worker's prefetch). On the old master the stall read 0 until a batch arrived, and no tick came."""
    from test_dsi_v3 import _Pool

    p, storage, items = dataset
    p = p.model_copy(update={"control_interval_s": 600.0, "start_workers": 1, "max_workers": 2, "prefetch": 2})
    assert len(items) > p.prefetch
    metrics, details = run_dpp(items, _Pool(storage, p), p.used_columns(), p)
    hist = details["workers_over_time"]
    assert [w for _, w in hist] == [1, 2, 2] and metrics["workers_max"] == 2    # start, start-up decision, end
    assert set(details["items_by_worker"]) == {"w0", "w1"} and sum(details["items_by_worker"].values()) == len(items)
    assert sorted(details["delivered_items"]) == [it.id for it in items]


def test_the_full_preset_fits_a_64_gb_disk():
    full = Params.for_scale("full")
    assert d.dataset_bytes(full) < 40e9
    assert d.dataset_bytes(Params.for_scale("smoke")) < d.dataset_bytes(Params.for_scale("quick")) < d.dataset_bytes(full)


def test_the_byte_estimate_matches_the_written_files():
    p = Params.for_scale("smoke")
    written = sum(len(d.to_parquet(d.generate_file(p, i), p.rows_per_group)) for i in range(p.files))
    assert written <= d.dataset_bytes(p) <= 1.3 * written   # an over-estimate, but a close one


def test_a_dataset_larger_than_the_free_disk_fails_naming_the_parameter():
    p = Params.for_scale("full")
    with pytest.raises(ParamsError, match="'files'.*18.4 GB.*has 10.0 GB free"):
        d.check_fits(p, 10 * 10**9, "file:///data")
    d.check_fits(p, 100 * 10**9, "file:///data")                       # fits
    d.check_fits(p, None, "s3://bucket")                                # free space unknown: no check
    d.check_fits(p.model_copy(update={"dataset": "existing"}), 1, "x")  # nothing generated


def test_pinning_is_skipped_on_one_core_and_for_a_cluster_the_run_did_not_start():
    from mlsys_flows.tasks.dsi import off_trainer

    with off_trainer(None, "tcp://a", {"trainer_cores": [0], "dpp_cores": [0]}) as rec:  # no client call
        assert rec["pinned"] == {} and "pinning skipped" in rec["note"]

    class Client:  # the run's processes as a cluster started elsewhere would report them
        def run_on_scheduler(self, fn):
            return fn()

        def run(self, fn):
            return {"tcp://b": fn()}

    cpu = {"trainer_cores": [0], "dpp_cores": [1], "own_cluster": False}
    if HAS_AFFINITY:
        with off_trainer(Client(), "tcp://a", cpu) as rec:
            assert rec["pinned"] == {} and "not started by this run" in rec["note"]


def test_only_the_runs_own_cluster_grows_to_one_dpp_worker_per_dpp_core():
    from mlsys_flows.tasks.dsi import grow_for_dpp

    class Cluster:
        def __init__(self):
            self.n = 2

        def scale(self, n):
            self.n = n

    class Client:
        def __init__(self):
            self.cluster = Cluster()

        def scheduler_info(self, n_workers=-1):
            return {"workers": {f"w{i}": {} for i in range(self.cluster.n)}}

        def wait_for_workers(self, n, timeout=None):
            assert self.cluster.n >= n

    assert grow_for_dpp(Client(), True, 15) == 16      # the trainer's worker and 15 DPP workers
    assert grow_for_dpp(Client(), True, 1) == 2        # 2 cores: already there
    assert grow_for_dpp(Client(), False, 15) == 2      # a cluster started elsewhere keeps its size


def test_a_dsi_run_starts_its_own_cluster_with_the_offered_dpp_workers():
    from mlsys_flows.systems.common.params import SystemParams
    from mlsys_flows.systems.dsi.cpu import available_cores, split_cores

    p = Params.for_scale("quick")
    trainer, dpp, _ = split_cores(available_cores())
    assert p.embedded_workers() == 1 + dpp_workers_wanted(p.max_workers, trainer, dpp, p.workers_per_dpp_core)
    if len(available_cores()) == 2:
        assert p.embedded_workers() == 3                    # the trainer's worker and two DPP workers on one core
    assert p.own_cluster()                                  # never the server's warm cluster, which it would pin
    base = SystemParams()
    assert base.own_cluster() is False and base.embedded_workers() is None
