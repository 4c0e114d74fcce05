"""ReCycle: the real decoupled 1F1B schedule of one stage pair on two processes (gloo, 127.0.0.1) runs
the order the simulator planned from the times the two processes measured: each micro-batch's F, then
Bi, then Bw on each stage, and B_weight really deferred (another operation runs between a
micro-batch's Bi and its Bw, and a Bw runs after a later micro-batch's forward).

Only the structure is tested here, on a small stage (operations of well under a millisecond) so the
run costs a few seconds and means the same on a busy machine. How well the simulator predicts the
pair's step time is a timing comparison and lives in a RunReport, not in a pass/fail test: the
recycle flow at quick (``pair_check=True``) runs the same pair (d=128, seq=64, 2 layers, 8
micro-batches) and reports ``pair_step_ms`` (measured, one sample per timed step) beside
``pair_predicted_ms`` (simulated), with each rank's calibrated F/Bi/Bw/optimizer times and the p2p
time as the prediction's assumptions (from which the naive serial sum, M * sum(F+Bi+Bw) + the
optimizer steps, follows) and the relative error in its notes; see benchmarks/results/recycle-quick.json
and docs/recycle.md."""
from __future__ import annotations

import copy

import pytest

from mlsys_flows.systems.recycle.pairrun import PairConfig, pair_plan, run_pair
from mlsys_flows.systems.recycle.sim import simulate

# A small stage (the run takes ~2.5 s on an idle machine, mostly two torch imports). The deferral
# does not depend on the measured times: stage 0 may keep 2 forwards in flight, so when its Bi0 ends,
# F2 is ready (its input is local) and in flight are 1 < 2, so F2 (or a ready backward) runs before
# Bw0, which waits while fewer than max_deferred=2 deferred ops are pending. 3 micro-batches would do;
# 4 leave room for more than one deferral.
CONFIG = PairConfig(d_model=32, heads=2, layers=1, micro_batch=2, seq=16, microbatches=4, steps=2,
                    warmup_steps=1, calibration_reps=2)


@pytest.fixture(scope="module")
def pair():
    return run_pair(CONFIG, timeout_s=120)


def check_planned(pair: dict) -> None:
    """Both ranks ran the order the simulator plans from the recorded times (the times both ranks
    measured and shared before planning)."""
    res = simulate(pair_plan(pair["times"], pair["p2p_s"], pair["config"]["microbatches"]), 1)
    assert [[list(x) for x in res.order(r, 0)] for r in (0, 1)] == pair["order"]


def check_order(pair: dict) -> None:
    """On each stage every micro-batch's F < Bi < Bw, each once, the optimizer step last; and Bw
    deferred: some micro-batch's Bw does not follow its Bi at once, and some Bw runs after a later
    micro-batch's forward."""
    m = pair["config"]["microbatches"]
    for order in pair["order"]:
        seen = [tuple(x) for x in order]
        assert sorted(seen) == sorted([(k, mb) for mb in range(m) for k in ("F", "Bi", "Bw")] + [("sync", -1)])
        for mb in range(m):
            assert seen.index(("F", mb)) < seen.index(("Bi", mb)) < seen.index(("Bw", mb))
        assert seen[-1] == ("sync", -1)
    first = [tuple(x) for x in pair["order"][0]]
    assert any(first[first.index(("Bi", mb)) + 1] != ("Bw", mb) for mb in range(m))
    assert any(first.index(("Bw", mb)) > first.index(("F", mb + 1)) for mb in range(m - 1))


@pytest.mark.timeout(180)
def test_the_real_pair_runs_the_planned_decoupled_schedule(pair):
    assert (pair["config"]["microbatches"], pair["config"]["steps"]) == (CONFIG.microbatches, CONFIG.steps)
    check_planned(pair)
    check_order(pair)
    # it really ran: one measured step per timed step (their values are not compared here)
    assert len(pair["measured_steps_s"]) == CONFIG.steps and all(s > 0 for s in pair["measured_steps_s"])
    assert pair["predicted_step_s"] > 0


def _bw_right_after_bi(order: list) -> list:
    """The same operations with every Bw moved to just after its Bi (no deferral)."""
    out = []
    for kind, mb in order:
        if kind != "Bw":
            out.append([kind, mb])
        if kind == "Bi":
            out.append(["Bw", mb])
    return out


def test_the_schedule_checks_fail_on_a_tampered_record(pair):
    """Companion: the same record with Bw undeferred, a Bw moved before its Bi, or rank 1's order
    swapped for rank 0's fails the checks."""
    bad = copy.deepcopy(pair)
    bad["order"] = [_bw_right_after_bi(o) for o in pair["order"]]
    with pytest.raises(AssertionError):
        check_order(bad)
    with pytest.raises(AssertionError):
        check_planned(bad)
    bad = copy.deepcopy(pair)
    o = bad["order"][1]
    i, j = o.index(["Bi", 0]), o.index(["Bw", 0])
    o[i], o[j] = o[j], o[i]
    with pytest.raises(AssertionError):
        check_order(bad)
    bad = copy.deepcopy(pair)
    bad["order"] = [pair["order"][0], pair["order"][0]]
    with pytest.raises(AssertionError):
        check_planned(bad)
