"""COMM-RAND's regime points (contract v4): a point counts only where every policy reached random
batching's target and kept its final accuracy within accuracy_gap_points; otherwise it says who broke what."""
from __future__ import annotations

from mlsys_flows.systems.commrand import Params
from mlsys_flows.systems.commrand.result import regime_sample


def _res(comm_rand_tta, comm_rand_acc=0.90):
    def policy(tta, acc):
        return {"tta_s": [tta], "cap_s": [3.0], "test_acc": acc}
    return {"target": 0.85, "random": policy(1.0, 0.91), "community": policy(0.8, 0.90),
            "comm_rand": policy(comm_rand_tta, comm_rand_acc)}


def test_a_point_where_every_policy_met_the_target_at_parity_is_valid():
    pt = regime_sample(Params.for_scale("smoke"), 0.9, _res(0.7))
    assert pt.valid and pt.invalid == "" and pt.samples["comm_rand"] == [0.7]


def test_a_missed_target_or_parity_invalidates_the_point_naming_who():
    p = Params.for_scale("smoke")
    missed = regime_sample(p, 0.5, _res(None))
    assert not missed.valid and "comm_rand did not reach the target 0.8500" in missed.invalid
    worse = regime_sample(p, 0.5, _res(0.7, comm_rand_acc=0.91 - (p.accuracy_gap_points + 1) / 100))
    assert not worse.valid and "comm_rand ended" in worse.invalid and "below random's 91.00%" in worse.invalid
