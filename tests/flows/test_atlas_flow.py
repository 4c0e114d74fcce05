"""The atlas flow at smoke scale (the session's shared reference run): counted top-1/top-3 root-cause
accuracy for Atlas, its no-validation ablation, PC, z-score and the true graph, graph precision and
recall, the synthesizer's counts; and one run whose synthesizer is an OpenAI-compatible model on a
local server, its key from a Secret block, with a malformed reply that is counted, not fatal."""
import json
import re

import pytest
from openai_fake import FakeModel, serve
from faultkit import reference_run, warm_cluster

VARIANTS = {"atlas", "atlas_no_validation", "atlas_regex", "atlas_mentions", "atlas_no_docs", "pc_algorithm", "zscore",
            "true_graph"}


def test_atlas_flow_smoke(prefect_api):
    report, storage = reference_run("atlas")
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"], h["kind"]) == ("top1_accuracy", "pc_algorithm", "atlas", "counted")
    v, kinds, p = report["variants"], report["metric_kinds"], report["parameters"]
    assert set(v) == VARIANTS
    assert set(kinds.values()) == {"counted"}
    for name, m in v.items():
        assert m["incidents"] == p["systems"] * p["incidents"]
        assert 0.0 <= m["top1_accuracy"] <= m["top3_accuracy"] <= 1.0
        assert name == "zscore" or 0.0 <= m["edge_precision"] <= 1.0
    assert v["true_graph"]["edge_precision"] == v["true_graph"]["edge_recall"] == 1.0
    assert v["true_graph"]["top1_accuracy"] >= v["zscore"]["top1_accuracy"]
    a = v["atlas"]
    assert a["synth_requests"] == p["systems"] * p["components"] and a["malformed_replies"] == 0
    assert a["pruned_true_edges"] + a["pruned_false_edges"] <= a["validated_edges"]
    assert v["atlas_no_validation"]["edge_recall"] >= a["edge_recall"]      # validation only prunes
    assert {r["baseline"] for r in report["ratios"]} >= {"zscore", "true_graph", "atlas_no_validation"}
    # contract v3: the docs prior's ablation (the template alone, no component dependency) and the history regime
    assert h["mechanism"]["baseline"] == "atlas_no_docs" and v["atlas_no_docs"]["edge_recall"] == 0.0
    g = report["regime"]
    assert g["parameter"] == "history_samples" and [pt["value"] for pt in g["points"]] == [100.0, 200.0]
    assert g["headline_value"] == 200.0 and all(pt["kind"] == "counted" for pt in g["points"])
    assert any(k.endswith(".pkl") for k in storage.list("runs/atlas/"))
    # the learned synthesizer, its calibration, PC's level chosen on calibration incidents, the template deployable
    notes = " ".join(report["notes"])
    assert "all-MiniLM-L6-v2" in notes and "calibration phrasings" in notes and "calibration incidents" in notes
    assert report["roles"]["atlas_no_docs"] == ["deployable"] and v["pc_algorithm"]["pc_alpha"] > 0
    assert {r["baseline"] for r in report["ratios"]} >= {"atlas_regex", "atlas_no_docs"}
    assert {c["provenance"] for c in report["components"]} == {"learned", "packaged", "scripted"}
    # the packaged parts of the learned synthesizer are listed on their own
    assert {c["name"]: c["provenance"] for c in report["components"]}["minilm_embeddings"] == "packaged"
    # paired by system (one sample per system; a smoke run's single system gives the exact comparison)
    assert len(report["samples"]["atlas"]["top1_accuracy"]) == p["systems"]
    # the edge claims pair the systems too; every named component is a deployable baseline
    assert len(report["samples"]["pc_algorithm"]["edge_precision"]) == len(report["samples"]["atlas"]["edge_recall"]) == p["systems"]
    assert report["roles"]["atlas_mentions"] == ["deployable"] and "held-out sentences" in notes


KEY = "sk-atlas-flow-key-not-real"


class _Model(FakeModel):
    """Knows nothing but the documentation: answers with every component the page names after a
    dependency verb, except one component that gets a reply in prose (malformed)."""
    seen: list = []

    def do_POST(self):
        body = self.read_json()
        type(self).seen.append(self.headers.get("Authorization"))
        user = body["messages"][-1]["content"]
        me = re.search(r"Documentation of (\S+):", user).group(1)
        names = re.search(r"Components \(telemetry names\): (.*)\n", user).group(1).split(", ")
        page = user.split(f"Documentation of {me}:\n", 1)[1].split("\n\n", 1)[0]
        from mlsys_flows.systems.atlas.docs import DocParser

        deps = [names[u] for u in DocParser().propose(names.index(me), page, names)]
        answer = "I am not sure." if me == names[-1] else json.dumps({"component": me, "depends_on": deps})
        out = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": answer}}]}).encode()
        self.send_bytes(200 if self.headers.get("Authorization") == f"Bearer {KEY}" else 401, out)


@pytest.fixture()
def server():
    _Model.seen = []
    with serve(_Model) as url:
        yield url


def test_atlas_flow_with_an_llm_synthesizer(prefect_api, local_storage, server):
    from prefect.blocks.system import Secret

    from mlsys_flows import registry

    Secret(value=KEY).save("atlas-llm-key", overwrite=True)
    overrides = {"llm_base_url": server, "llm_model": "tiny", "api_key_secret": "atlas-llm-key", "incidents": 8,
                 "curve_points": 1}
    report = registry.get("atlas").load_flow()(scale="smoke", overrides=overrides, storage=local_storage,
                                               cluster=warm_cluster())
    p, a = report["parameters"], report["variants"]["atlas"]
    assert a["synth_requests"] == p["components"] == len(_Model.seen)
    assert a["malformed_replies"] == 1 and a["failed_requests"] == 0
    assert all(auth == f"Bearer {KEY}" for auth in _Model.seen)
    notes = " ".join(report["notes"])
    assert "chat model tiny" in notes and "1 malformed replies" in notes
    assert KEY not in json.dumps(report)
