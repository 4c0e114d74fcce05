"""Contract v4 for swarm: the paper states its testbed's 12 drones and the headline runs at the grid's
largest N, so the spec says why (operating_point_reason); every metric's kind is the spec's."""
from __future__ import annotations

from mlsys_flows.systems.swarm import COUNTED, MEASURED, SIMULATED, SPEC


def test_the_headline_off_the_papers_point_says_why():
    r = SPEC.regime
    assert r.paper_value == 12.0 and "1805.01786" in r.paper_source
    assert "testbed" in r.operating_point_reason and "largest N" in r.operating_point_reason


def test_every_metric_has_one_kind():
    names = [*SIMULATED, *COUNTED, *MEASURED]
    assert len(names) == len(set(names)) == len(SPEC.kinds)
    assert SPEC.kinds["p99_decision_latency_s"] == "simulated" and SPEC.kinds["compute_s_mean"] == "measured"
