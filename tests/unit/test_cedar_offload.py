"""cedar's offload decision: the rule (Amdahl model gated, calibrated by a measured trial) on given
numbers, and on real pipelines with 2 worker processes: a stage that parallelizes is offloaded;
the same checks fail when the decision is forced inline."""
from __future__ import annotations

import os
import time

import pytest

from mlsys_flows.systems.cedar import Pipeline
from mlsys_flows.systems.cedar.optimizer import _amdahl, expected_offload_s, offload_pays
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


def idle_share(seconds: float = 1.0) -> float:
    """Share of all CPUs idle over ``seconds`` (Linux /proc/stat; 0.0 where it is unreadable)."""
    def snap():
        with open("/proc/stat") as fh:
            v = [int(x) for x in fh.readline().split()[1:]]
        return v[3] + v[4], sum(v[:8])  # idle + iowait, total

    try:
        i0, t0 = snap()
        time.sleep(seconds)
        i1, t1 = snap()
    except (OSError, ValueError, IndexError):
        return 0.0
    return (i1 - i0) / max(t1 - t0, 1)


def cores_free() -> bool:
    """2 usable cores, both idle now (this test's process sleeps while it samples)."""
    return len(os.sched_getaffinity(0)) >= 2 and idle_share() >= 0.85


@pytest.mark.timeout(120)
def test_io_bound_stage_is_offloaded_to_two_workers():
    p = base(240).map(io_bound, name="slow_read").batch(8)
    with p.optimize(workers=2) as fast:
        check_offloaded(fast)
        assert multiset(fast.iterate(0)) == multiset(p.iterate(0))


@pytest.mark.timeout(120)
def test_cpu_heavy_stage_with_two_cores_is_offloaded():
    if not cores_free():
        pytest.skip("needs 2 idle cores: while other processes keep a core busy, the trial rightly measures "
                    "no gain from a second worker")
    p = base(240).map(cpu_heavy, name="heavy").batch(8)
    with p.optimize(workers=2) as fast:
        check_offloaded(fast)
        t0 = time.perf_counter()
        out = multiset(fast.iterate(0))
        t_fast = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref = multiset(p.iterate(0))
    t_inline = time.perf_counter() - t0
    assert out == ref and t_inline / t_fast > 1.2  # the offloaded plan really is faster


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


def test_trial_reads_the_steady_rate_of_whole_rounds():
    """_trial on a stage of 20 ms waits per chunk, 2 workers, 6 chunks: inline ~120 ms, the steady
    parallel rate ~60 ms for the same chunks (the first round's latency is reported apart)."""
    from concurrent.futures import ThreadPoolExecutor

    from mlsys_flows.systems.cedar.optimizer import _trial
    from mlsys_flows.systems.cedar.pipeline import ChunkJob, Op

    def wait(s):
        time.sleep(0.005)
        return s

    job = ChunkJob((Op("map", "wait", wait),), 0, None, 0)
    chunks = [[((i * 4 + j,), {"a": i * 4 + j}) for j in range(4)] for i in range(6)]
    with ThreadPoolExecutor(2) as ex:
        t_in, t_par, fill = _trial(ex.submit, job, chunks, 2, False, threshold=1.2)
    assert 0.11 <= t_in < 0.5 and fill >= 0
    assert 1.5 <= t_in / t_par <= 2.6, (t_in, t_par, fill)
