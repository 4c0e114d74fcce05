"""Issue 47 review (session 7): the quick preset runs enough pairs that a loss against the strongest of the
three deployable plans can be decided, its SLO is warm latency (so it can bind for the all-CPU plan), and
the notes compute whether the SLO bound, which deployable plan another dominates on the evaluated videos,
and the run-order spread of static_oracle running all_cpu's plan. Pure, no processes."""
from __future__ import annotations

import pytest

from mlsys_flows.systems.common.verdict import CONFIDENCE
from mlsys_flows.systems.llama import VARIANTS, Params
from mlsys_flows.systems.llama import experiment as ex
from mlsys_flows.systems.llama.result import (DEPLOYABLE, dominance_note, equal_attainment_verdict, run_order_note,
                                              slo_binding_note)


def test_quick_can_decide_a_loss_against_the_strongest_of_the_deployable_plans():
    q = Params.for_scale("quick")
    # a sign-test interval over n pairs all on one side excludes 1 at level 1 - 2 / 2^n
    assert 2 / 2 ** q.repeats < (1 - CONFIDENCE) / len(DEPLOYABLE)
    n = q.repeats
    att = {v: [1.0] * n for v in VARIANTS}
    cost = {v: [1.0 + 0.01 * i for i in range(n)] for v in VARIANTS}
    cost["all_cpu"] = [0.5 * c for c in cost["llama"]]
    cost["best_static"] = [0.6 * c for c in cost["llama"]]
    cost["all_gpu"] = [2.0 * c for c in cost["llama"]]
    ev = equal_attainment_verdict(q, att, cost)
    assert ev["strongest"] == "all_cpu" and ev["verdict"].outcome == "loses"


def test_quick_derives_a_warm_slo_so_it_can_bind_for_all_cpu():
    q = Params.for_scale("quick")
    assert q.slo_s is None and q.slo_cold_starts == 0.0 and 0 < q.slo_fraction < 1
    # the SLO tightness sweep predicts fractions on both sides of the all-CPU plan's slowest warm video
    assert min(q.slo_sweep) < 1 < max(q.slo_sweep)
    assert q.slo_fraction not in ex.slo_fractions(q) and set(ex.slo_fractions(q)) == set(q.slo_sweep) - {q.slo_fraction}
    with pytest.raises(ValueError):
        Params.for_scale("quick", slo_sweep=[0.5, 0.5])


def test_the_binding_note_says_plainly_when_the_slo_binds_for_nobody():
    q = Params.for_scale("quick")
    att = {v: [1.0] * 8 for v in VARIANTS}
    assert "binds for nobody" in slo_binding_note(q, 0.01, att) and "at best tie" in slo_binding_note(q, 0.01, att)
    att["best_static"][0] = 0.9
    assert "does not bind for it" in slo_binding_note(q, 0.01, att)
    att["all_cpu"][:3] = [0.9] * 3
    text = slo_binding_note(q, 0.01, att)
    assert "all_cpu 3" in text and "binds for the cheapest all-CPU plan" in text


def test_the_dominance_note_flags_a_dominated_headline_baseline():
    n = 8
    att = {v: [1.0] * n for v in VARIANTS}
    att["best_static"] = [0.97] * n
    cost = {v: [1.0] * n for v in VARIANTS}
    cost["all_cpu"], cost["best_static"], cost["all_gpu"] = [0.8] * n, [0.9] * n, [2.0] * n
    labels = {"all_cpu": "a", "best_static": "b", "all_gpu": "c"}
    text = dominance_note(att, cost, labels)
    assert "best_static by all_cpu in 8 of 8 repeats" in text and "headline's baseline, best_static, is dominated" in text
    # equal cost and attainment is no dominance; a plan ahead in only half the repeats is not listed
    cost["best_static"] = [0.8] * 4 + [0.7] * 4
    att["best_static"] = [1.0] * n
    assert "best_static by all_cpu" not in dominance_note(att, cost, labels)


def test_the_run_order_note_measures_the_same_plan_run_later():
    cost = {"static_oracle": [0.9, 1.0, 1.1], "all_cpu": [1.0, 1.0, 1.0]}
    text = run_order_note({"static_oracle": "a", "all_cpu": "a"}, cost)
    assert "1.00x all_cpu's (median; 0.90-1.10x)" in text
    assert "not averaged out" in run_order_note({"static_oracle": "b", "all_cpu": "a"}, cost)
