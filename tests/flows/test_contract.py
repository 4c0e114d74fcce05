"""The contract every implemented system meets, parametrized over the registry: its flow runs at
smoke scale on Dask, returns a RunReport with a finite, measured headline oriented by the
registry's claim, saves JSON and PNG on the storage block and publishes Prefect artifacts."""
import math

import pytest
from faultkit import reference_run

from mlsys_flows import registry
from mlsys_flows.platform.runner import run_system
from mlsys_flows.systems.common.runreport import RunReport, oriented_ratio
from mlsys_flows.systems.common.spec import ASSUMED

IMPLEMENTED = registry.names()


@pytest.fixture
def smoke_run(name):
    """The session's one smoke run of ``name`` (``faultkit.reference_run``), shared with the flow and
    fault tests: a fixture, so its first user pays for it in setup and the test body only checks. On
    the session's warm cluster (``faultkit.warm_cluster``; the embedded one for a run that kills
    workers, recycle's failover run)."""
    return reference_run(name)


@pytest.mark.parametrize("name", IMPLEMENTED)
def test_smoke_run_meets_the_contract(name, smoke_run):
    """The fault tests compare their runs with this one."""
    spec = registry.get(name)
    returned, storage = smoke_run
    report = RunReport.model_validate(returned)
    h, claim = report.headline, spec.headline
    assert (h.metric, h.baseline, h.technique, h.better) == (claim.metric, claim.baseline, claim.technique, claim.better)
    assert math.isfinite(h.ratio) and h.ratio > 0
    assert h.ratio == pytest.approx(oriented_ratio(report.variants[h.baseline][h.metric],
                                                   report.variants[h.technique][h.metric], h.better))
    assert h.paper == claim.paper
    # every claim of the spec is computed, each ratio labelled, the strongest baseline named
    assert [(r.metric, r.baseline, r.technique) for r in [h, *report.ratios]] == \
        [(c.metric, c.baseline, c.technique) for c in [claim, *(c for c in spec.claims if not c.headline)]]
    for r in [h, *report.ratios]:
        assert r.kind == report.metric_kinds[r.metric]
        assert r.kind not in ASSUMED or r.assumptions
        assert r.verdict is not None and (r.verdict.exact or r.verdict.outcome == "ties" or r.verdict.pairs >= 6)
    deployable = [b for b in spec.baselines if ("deployable" in spec.role(b) if spec.roles else "oracle" not in spec.role(b))]
    rivals = {b: report.variants[b][h.metric] for b in deployable if h.metric in report.variants.get(b, {})}
    c = report.constraint
    assert (c is not None) == (spec.constraint is not None)
    if c is not None:  # issue 47: the strongest among the deployable baselines that met the constraint
        assert {k.variant for k in c.baselines if not k.met} == set(c.excluded) and c.technique.variant == h.technique
        met = {b: v for b, v in rivals.items() if b not in c.excluded}
        rivals = met or {claim.baseline: report.variants[claim.baseline][h.metric]}
        assert bool(c.fallback) == (not met)
    best = max(rivals.values()) if h.better == "higher" else min(rivals.values())
    assert h.vs_strongest.baseline in rivals and rivals[h.vs_strongest.baseline] == best
    if spec.contract_v3:  # the mechanism's ablation and the regime sweep ran, even at smoke
        assert h.mechanism is not None and h.mechanism.baseline == spec.mechanism.ablation
        assert report.regime is not None and len(report.regime.points) >= 2
        assert report.regime.parameter == spec.regime.parameter and report.regime.wins
        assert report.roles == {b: list(r) for b, r in spec.roles.items()}
        assert any(c.title.startswith("regime") for c in report.curves)
    if spec.hardware:
        assert report.projection is not None and report.projection.kind == "modelled"
    assert set(report.metric_kinds) == set(report.metric_names())
    env = report.environment
    assert env.git_dirty is not None and len(env.code_hash) == 64 and env.load_before and env.load_after
    assert report.parameters["scale"] == "smoke"
    assert report.environment.cores >= 1 and report.wall_time_s > 0
    base = f"reports/{name}/{report.run_id}"
    assert storage.read_json(f"{base}.json")["headline"]["ratio"] == h.ratio
    assert storage.read_bytes(f"{base}.png")[:4] == b"\x89PNG"
    assert storage.list("task-results"), "the run's task results were not persisted on its storage"

    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId

        arts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"{name}-report", f"{name}-summary"])),
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[report.run_id])))
    assert {a.key for a in arts} == {f"{name}-report", f"{name}-summary"}
    # artifacts of the flow run itself: the UI's Artifacts tab lists them under the run, not a task run
    assert all(str(a.flow_run_id) == report.run_id and a.task_run_id is None for a in arts), \
        [(a.key, a.flow_run_id, a.task_run_id) for a in arts]


def test_bad_parameters_fail_before_the_flow_starts(local_storage):
    for name in IMPLEMENTED[:1]:
        from mlsys_flows.systems.common.params import ParamsError

        with pytest.raises(ParamsError, match="no_such_field"):
            run_system(name, "smoke", overrides={"no_such_field": 1}, storage=local_storage)
        assert local_storage.list() == []
