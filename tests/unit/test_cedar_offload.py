"""cedar's offload decision: the rule (Amdahl model gated, calibrated by a measured trial) on given
numbers, and on real pipelines with 2 worker processes: a stage that parallelizes is offloaded and
yields the same samples; the same checks fail when the decision is forced inline.

No test here compares wall-clock times of two code paths. The CPU-heavy stage's decision is tested
with the trial's measurement given (the one input that depends on how busy the machine is), and the
trial's arithmetic (steady rate, fill) on a virtual clock. Whether offloading the CPU-heavy stage is
really faster on this machine is measured by ``python -m benchmarks.cedar_offload``
(benchmarks/results/cedar-offload.json: inline vs offloaded epoch, repeats, the machine's load, and
the decision the optimizer's own trial takes); cedar's RunReport measures the optimized pipelines."""
from __future__ import annotations

import time
import types

import pytest

import mlsys_flows.systems.cedar.optimizer as optimizer
from mlsys_flows.systems.cedar import Pipeline
from mlsys_flows.systems.cedar.optimizer import _amdahl, expected_offload_s, offload_pays
from mlsys_flows.systems.cedar.pipeline import ChunkJob, Op, _run_chunk
from mlsys_flows.systems.cedar.workloads import multiset


def offloads(serial_s, stage_s, main_s, ipc_s, trial, workers=2, cores=2, min_speedup=1.2) -> bool:
    model_s = _amdahl(stage_s, main_s, ipc_s / 2, ipc_s / 2, workers, cores)
    expected = expected_offload_s(stage_s, main_s, ipc_s / 2, *trial, workers, cores) if trial else None
    return offload_pays(serial_s, model_s, expected, min_speedup)


# ----- the rule on given numbers -------------------------------------------------------------------

def test_cpu_heavy_stage_on_two_idle_cores_is_offloaded():
    # 2 s of stage work, 50 ms in the main process; the trial ran the stage 1.8x faster on 2 workers
    assert offloads(2.05, 2.0, 0.05, 0.04, trial=(0.40, 0.22))
    assert expected_offload_s(2.0, 0.05, 0.02, 0.40, 0.22, 2, 2) == pytest.approx(2.0 * 0.22 / 0.40 + 0.05)
    # a free core lets the main process's work overlap with the workers
    assert expected_offload_s(2.0, 0.05, 0.02, 0.40, 0.22, 2, 4) == pytest.approx(2.0 * 0.22 / 0.40)


def test_no_offload_when_the_trial_or_the_model_says_it_does_not_pay():
    assert not offloads(2.05, 2.0, 0.05, 0.04, trial=(0.40, 0.41))  # a busy machine: no second core
    assert not offloads(2.05, 2.0, 0.05, 0.04, trial=None)           # no trial, no offload
    assert not offloads(1.0, 0.2, 0.8, 0.04, trial=(0.40, 0.20))     # Amdahl: the main process dominates
    assert not offloads(2.05, 2.0, 0.05, 4.0, trial=(0.40, 0.22))    # IPC costs more than the stage


def test_the_rule_check_fails_when_the_decision_is_forced_inline():
    """Companion: the same numbers with the decision forced inline (min_speedup out of reach)."""
    with pytest.raises(AssertionError):
        assert offloads(2.05, 2.0, 0.05, 0.04, trial=(0.40, 0.22), min_speedup=float("inf"))


# ----- on real pipelines ------------------------------------------------------------------------

def cpu_heavy(s):
    """About 3 ms of pure-Python work (holds the GIL: only processes run it in parallel)."""
    t = 0
    for i in range(60_000):
        t += i * i
    return s | {"h": t + s["a"]}


def io_bound(s):
    """3 ms of waiting (a read from slow storage): parallel workers overlap it on any machine."""
    time.sleep(0.003)
    return s | {"h": s["a"] * 2}


def base(n):
    return Pipeline.from_list([{"a": i} for i in range(n)], seed=0)


def check_offloaded(fast) -> None:
    """The first stage runs on worker processes in the cold phase, by a cost decision backed by a
    trial that measured a speedup."""
    stage = fast.plan.steps[0]
    decision = next(d for d in fast.plan.decisions if d.rule == "offload" and d.detail.startswith("cold"))
    assert stage.cold == "process" and decision.applied, fast.explain()
    assert "trial on" in decision.detail and "mode='always'" not in decision.detail and decision.est_gain_s > 0


@pytest.mark.timeout(120)
def test_io_bound_stage_is_offloaded_to_two_workers():
    p = base(240).map(io_bound, name="slow_read").batch(8)
    with p.optimize(workers=2) as fast:
        check_offloaded(fast)
        assert multiset(fast.iterate(0)) == multiset(p.iterate(0))


# What a trial of the CPU-heavy stage gives on 2 cores: (inline s, parallel s at the steady rate,
# fill s). With a free core the second worker nearly halves it (1.8x); with the cores busy with other
# work, no gain. What it really is on this machine, at its load, is for benchmarks/cedar_offload.py.
TRIAL_IDLE = (0.40, 0.22, 0.0)
TRIAL_BUSY = (0.40, 0.41, 0.0)


@pytest.fixture
def trial_measures(monkeypatch):
    """Stand in for the optimizer's measured trial (its only input that depends on how busy the
    machine is) with given numbers, on 2 usable cores; the profile (stage and main-process costs,
    serialization, round trips) is still measured. Returns the calls it saw."""
    calls = []

    def use(result):
        def trial(submit, job, chunks, workers, warm, threshold):
            calls.append({"workers": workers, "warm": warm, "chunks": len(chunks), "threshold": threshold})
            return result

        monkeypatch.setattr(optimizer, "_trial", trial)
        monkeypatch.setattr(optimizer, "_cores", lambda: 2)
        return calls

    return use


@pytest.mark.timeout(120)
def test_cpu_heavy_stage_with_two_cores_is_offloaded(trial_measures):
    """Given the measured stage costs and a trial that measured the 2-worker speedup of an idle
    machine, the plan offloads the CPU-heavy stage to 2 worker processes, decided by that trial, and
    the offloaded plan yields the same samples as the pipeline as written. Whether it is faster on
    this machine now is a timing question: benchmarks/cedar_offload.py measures it."""
    calls = trial_measures(TRIAL_IDLE)
    p = base(240).map(cpu_heavy, name="heavy").batch(8)
    with p.optimize(workers=2) as fast:
        check_offloaded(fast)
        assert calls and calls[0]["workers"] == 2 and not calls[0]["warm"]
        decision = next(d for d in fast.plan.decisions if d.rule == "offload" and d.detail.startswith("cold"))
        assert "inline 400 ms, on 2 workers 220 ms" in decision.detail, decision.detail
        out = multiset(fast.iterate(0))
    assert out == multiset(p.iterate(0))


def test_cpu_heavy_stage_stays_inline_when_the_trial_measures_no_gain(trial_measures):
    """Companion: the same pipeline and profile, with the trial a busy machine gives: the stage
    stays inline, and check_offloaded fails."""
    calls = trial_measures(TRIAL_BUSY)
    p = base(240).map(cpu_heavy, name="heavy").batch(8)
    with p.optimize(workers=2) as fast:
        assert calls and fast.plan.steps[0].cold == "inline", fast.explain()
        with pytest.raises(AssertionError):
            check_offloaded(fast)


@pytest.mark.parametrize("force", [{"workers": 1}, {"workers": 2, "min_speedup": float("inf")}])
def test_the_offload_check_fails_when_the_decision_is_forced_inline(force):
    """Companion: the same pipeline, the decision forced inline (one worker, or an unreachable
    threshold): check_offloaded must fail."""
    p = base(48).map(io_bound, name="slow_read").batch(8)
    with p.optimize(**force) as fast:
        assert fast.plan.steps[0].cold == "inline"
        with pytest.raises(AssertionError):
            check_offloaded(fast)


def test_warm_phase_trial_reads_a_trial_cache_and_leaves_nothing_behind(tmp_path):
    """With a cache, the warm phase is tried the way it runs (workers read cache shards) on a
    trial cache that is removed afterwards."""
    def expensive(s):
        time.sleep(0.004)
        return s | {"e": s["a"] + 1}

    def aug(s, rng):
        time.sleep(0.003)
        return s | {"r": float(rng.random())}

    p = base(120).map(expensive, name="expensive").map(aug, name="aug", random=True).batch(8)
    with p.optimize(epochs=3, cache=str(tmp_path), workers=2) as fast:
        warm = next(d for d in fast.plan.decisions if d.rule == "offload" and d.detail.startswith("warm"))
        assert "trial on" in warm.detail or "no trial" in warm.detail, fast.explain()
        assert not [q for q in tmp_path.rglob("*") if "-trial-" in str(q) or "probe-" in q.name]
        assert [multiset(fast.iterate(e)) for e in range(2)] == [multiset(p.iterate(e)) for e in range(2)]


class VirtualClock:
    """Seconds that pass only when virtual work says so (the trial reads it as its perf_counter)."""

    def __init__(self) -> None:
        self.t = 0.0

    def perf_counter(self) -> float:
        return self.t


CLOCK = VirtualClock()


def virtual_work(s):
    """5 ms of work on CLOCK. Module level, so cloudpickle pickles it by reference and the job a
    worker unpickles advances this CLOCK, not a copy."""
    CLOCK.t += 0.005
    return s


class VirtualPool:
    """An executor of ``workers`` virtual workers on CLOCK: a job runs at once, its work (the virtual
    time it used) is placed on the worker free first, from the clock at submission, and waiting for
    its result moves the clock to its end. ``extra`` adds seconds to given chunk ids (a slow round)."""

    class Done:
        def __init__(self, out, end: float):
            self.out, self.end = out, end

        def result(self):
            CLOCK.t = max(CLOCK.t, self.end)
            return self.out

        def cancel(self) -> bool:
            return False

    def __init__(self, workers: int, extra: dict[int, float] | None = None):
        self.free, self.extra = [0.0] * workers, extra or {}

    def submit(self, fn, *args):
        t_submit = CLOCK.t
        out = fn(*args)
        work = CLOCK.t - t_submit + (self.extra.get(args[2], 0.0) if fn is _run_chunk else 0.0)
        CLOCK.t = t_submit
        w = min(range(len(self.free)), key=self.free.__getitem__)
        self.free[w] = max(t_submit, self.free[w]) + work
        return self.Done(out, self.free[w])


@pytest.fixture
def virtual_trial(monkeypatch):
    """Run _trial on 6 chunks of 4 items of virtual_work, with CLOCK as its clock, on a VirtualPool."""
    monkeypatch.setattr(optimizer, "time", types.SimpleNamespace(perf_counter=CLOCK.perf_counter))
    CLOCK.t = 0.0
    job = ChunkJob((Op("map", "work", virtual_work),), 0, None, 0)
    chunks = [[((i * 4 + j,), {"a": i * 4 + j}) for j in range(4)] for i in range(6)]
    return lambda pool: optimizer._trial(pool.submit, job, chunks, 2, False, threshold=1.2)


@pytest.mark.parametrize("extra,fill", [({}, 0.0), ({0: 0.03, 1: 0.03}, 0.03)], ids=["even", "slow-first-round"])
def test_trial_reads_the_steady_rate_of_whole_rounds(virtual_trial, extra, fill):
    """_trial on 6 chunks of 4 items of 5 ms of work each (a virtual clock: exact, whatever the
    machine's load), 2 workers: inline 120 ms; on the workers 3 rounds of 20 ms, so the steady rate
    gives 60 ms for the same chunks; a first round 30 ms slower (filling the workers) is reported
    apart as the fill and leaves the steady rate alone."""
    assert virtual_trial(VirtualPool(2, extra)) == pytest.approx((0.120, 0.060, fill), abs=1e-9)


def test_the_steady_rate_check_fails_on_serial_workers(virtual_trial):
    """Companion: the same trial where the 2 submitted workers share one (a busy machine) reads no
    speedup: the parallel side takes as long as inline and the 60 ms expectation fails."""
    t_in, t_par, fill = virtual_trial(VirtualPool(1))
    assert (t_in, t_par, fill) == pytest.approx((0.120, 0.120, 0.0), abs=1e-9)
    with pytest.raises(AssertionError):
        assert t_par == pytest.approx(0.060, abs=1e-9)
