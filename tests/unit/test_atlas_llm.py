"""Atlas's LLM synthesizer over HTTP: the OpenAI-compatible client against a small local server that
speaks the chat-completions API (http.server on 127.0.0.1, a free port). The fake model knows the true
call graph and answers one prompt per component; it sends one non-JSON reply, one with an unknown
name, one that closes a cycle and one HTTP 500. The run completes, counts each problem, sends the
bearer key, and the synthesized graph is exactly the truth minus what the bad replies lost."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
from openai_fake import FakeModel, serve

from mlsys_flows.systems.atlas import Params
from mlsys_flows.systems.atlas.docs import DocParser
from mlsys_flows.systems.atlas.evaluate import build, calibration_incidents, learn_graphs
from mlsys_flows.systems.common.graphs import is_acyclic
from mlsys_flows.systems.atlas.synth import PROMPT, LLMSynthesizer, synthesize
from mlsys_flows.systems.common.llm import LLMConfig, OpenAICompatibleClient

KEY = "sk-atlas-test-key-not-real"


class _Model(FakeModel):
    names: list[str] = []
    calls: list[list[int]] = []
    broken: dict[str, str] = {}     # component name -> "notjson" | "unknown" | "cycle" | "error"
    seen: list = []

    def do_POST(self):
        body = self.read_json()
        cls = type(self)
        cls.seen.append((self.path, self.headers.get("Authorization"), body))
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            return self.send_json(401, {"error": "bad key"})
        user = body["messages"][-1]["content"]
        me = re.search(r"Documentation of (\S+):", user).group(1)
        v = cls.names.index(me)
        deps = [cls.names[u] for u in cls.calls[v]]
        mode = cls.broken.get(me)
        if mode == "error":
            return self.send_json(500, {"error": "overloaded"})
        if mode == "notjson":
            answer = f"{me} depends on " + " and ".join(deps)
        else:
            if mode == "unknown":
                deps = deps + ["redis-cluster-7"]
            if mode == "cycle":    # names one of its callers as a dependency
                deps = deps + [cls.names[next(w for w in range(len(cls.names)) if v in cls.calls[w])]]
            answer = "```json\n" + json.dumps({"component": me, "depends_on": deps}) + "\n```"
        self.send_json(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": answer}}]})


@pytest.fixture()
def server():
    _Model.seen, _Model.broken = [], {}
    with serve(_Model) as url:
        yield url


def test_llm_synthesizer_over_http_counts_bad_replies(server):
    p = Params.for_scale("smoke", components=12, curve_points=1)
    s, pages, history, past = build(p, 4)
    _Model.names, _Model.calls = s.names, s.calls
    callees = [v for v in range(s.n) if s.calls[v]]
    called = [v for v in range(s.n) if s.callers(v) and s.calls[v]]
    bad = {"notjson": callees[0], "error": callees[1], "unknown": callees[2], "cycle": called[-1]}
    assert len(set(bad.values())) == 4
    _Model.broken = {s.names[v]: m for m, v in bad.items()}
    with OpenAICompatibleClient(LLMConfig(base_url=server, model="tiny", api_key=KEY, max_retries=0)) as client:
        agent = LLMSynthesizer(client)
        syn = synthesize(agent, pages, s.names)
    assert syn.requests == s.n == len(_Model.seen) and agent.calls == s.n
    assert all(path == "/v1/chat/completions" and auth == f"Bearer {KEY}" for path, auth, _ in _Model.seen)
    assert (syn.malformed, syn.failed, syn.unknown_names) == (1, 1, 1)
    assert syn.cycle_edges_removed >= 1 and is_acyclic(syn.edges, s.n)
    prompt = _Model.seen[0][2]["messages"][-1]["content"]
    assert prompt == PROMPT.format(names=", ".join(s.names), me=s.names[0], page=pages[0])
    truth = s.component_edges()
    lost = {(u, v) for v in (bad["notjson"], bad["error"]) for u in s.calls[v]}
    # everything but the lost components' dependencies, and at most the cycle-breaking's removals
    assert len(truth - lost - syn.edges) <= syn.cycle_edges_removed
    assert syn.edges - truth <= {(u, bad["cycle"]) for u in range(s.n)}
    assert not (lost & syn.edges)
    assert any("not JSON" in m for m in syn.problems) and any("redis-cluster-7" in m for m in syn.problems)
    assert any("request failed" in m for m in syn.problems)


def test_learn_graphs_with_the_llm_agent_beats_the_parser_on_recall(server):
    """A model that reads documentation perfectly gets the dependencies the keyword parser misses
    (prose-only phrasings); the rest of the pipeline is the same code path."""
    p = Params.for_scale("smoke", components=12, curve_points=1, doc_hard=0.6, doc_omit=0.0)
    s, pages, history, past = build(p, 5)
    _Model.names, _Model.calls = s.names, s.calls
    calib = calibration_incidents(p, s, 5)
    with OpenAICompatibleClient(LLMConfig(base_url=server, model="tiny", api_key=KEY)) as client:
        llm = learn_graphs(p, s, pages, history, past, LLMSynthesizer(client), calib)
    parsed = learn_graphs(p, s, pages, history, past, DocParser(), calib)
    h = p.headline_setting()
    assert llm["synthesis"]["malformed_replies"] == 0 and llm["synthesis"]["synth_requests"] == s.n
    assert llm["settings"][h]["stats"]["atlas_no_validation"]["edge_recall"] == 1.0
    assert parsed["settings"][h]["stats"]["atlas_no_validation"]["edge_recall"] < 1.0
    assert np.isfinite(llm["settings"][h]["localizers"]["atlas"].sd).all()
