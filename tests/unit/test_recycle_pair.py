"""ReCycle: the real decoupled 1F1B schedule of one stage pair on two processes (gloo, 127.0.0.1) runs the
order the simulator planned, and the simulator predicts its step time within TOLERANCE from the times
the two processes measured just before. A naive prediction (no pipelining: every operation of both
stages one after another) is shown to fall outside the same tolerance, so the check can fail."""
from __future__ import annotations

import pytest

from mlsys_flows.systems.recycle.pairrun import PairConfig, pair_plan, run_pair
from mlsys_flows.systems.recycle.sim import simulate

TOLERANCE = 0.35  # relative step-time error allowed on a shared 2-core machine (docs/recycle.md)


def within(measured: float, predicted: float) -> bool:
    """Off by at most TOLERANCE either way, as a factor (35% too slow and 35% too fast count alike)."""
    return max(measured / predicted, predicted / measured) <= 1 + TOLERANCE


def spare_cores() -> float:
    """Cores nobody else is using now (one second's sample of the whole machine)."""
    import psutil

    return psutil.cpu_count() * (1 - psutil.cpu_percent(interval=1.0) / 100)


@pytest.fixture(scope="module")
def pair():
    # The check compares a schedule of two processes that run side by side with its prediction:
    # it needs two cores to itself. With a core taken by another job the two stages time-share one
    # core, which is not the pipeline being predicted (a real measurement of something else).
    spare = spare_cores()
    if spare < 1.6:
        pytest.skip(f"needs 2 idle cores for the two pipeline stages; {spare:.1f} idle now")
    # Operations of 15-30 ms each: with 3 ms ones (d=96, seq=64) fixed per-operation costs the
    # calibration does not see (autograd set-up, a blocked receive's wake-up) made the measured step
    # look serial on one CI machine (110 ms measured, 65 ms predicted, 116 ms serial).
    config = PairConfig(d_model=192, heads=4, layers=2, micro_batch=4, seq=128, microbatches=8, steps=3,
                        warmup_steps=1, calibration_reps=5)
    first = run_pair(config, timeout_s=240)
    if within(first["measured_step_s"], first["predicted_step_s"]):
        return first
    # The idle-core check above sees one second before a run of several: a job that wakes up during
    # it (a test server's background loop) breaks the pair's timing. Measure once more, and keep the
    # first run in the result so a failure shows both.
    second = run_pair(config, timeout_s=240)
    second["first_attempt"] = {k: first[k] for k in ("measured_step_s", "predicted_step_s")}
    return second


def test_simulator_predicts_the_real_pair_step(pair):
    assert within(pair["measured_step_s"], pair["predicted_step_s"]), pair
    # both ranks ran the planned order: each micro-batch F, Bi, Bw once per stage, Bw after its Bi
    plan = pair_plan(pair["times"], pair["p2p_s"], pair["config"]["microbatches"])
    res = simulate(plan, 1)
    assert [[list(x) for x in res.order(r, 0)] for r in (0, 1)] == pair["order"]
    for order in pair["order"]:
        seen = [tuple(x) for x in order]
        for mb in range(pair["config"]["microbatches"]):
            assert seen.index(("F", mb)) < seen.index(("Bi", mb)) < seen.index(("Bw", mb))
    # Bw was really deferred somewhere: at least one Bw runs after a later micro-batch's forward
    first = [tuple(x) for x in pair["order"][0]]
    assert any(first.index(("Bw", mb)) > first.index(("F", mb + 1)) for mb in range(pair["config"]["microbatches"] - 1))


def test_naive_prediction_is_outside_the_tolerance(pair):
    times = pair["times"]
    serial = pair["config"]["microbatches"] * sum(t["forward"] + t["backward_input"] + t["backward_weight"] for t in times) \
        + sum(t["optimizer"] for t in times)
    assert not within(pair["measured_step_s"], serial), (serial, pair)
