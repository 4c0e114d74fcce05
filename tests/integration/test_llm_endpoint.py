"""The OpenAI-compatible client (systems/common/llm.py) against a small local server that speaks the
OpenAI API (http.server on 127.0.0.1, a free port, started and stopped here): chat completions,
embeddings, the bearer key, malformed replies, HTTP errors and timeouts; and the task layer's
resolution of the key from a Prefect Secret block."""
from __future__ import annotations

import json
import re
import threading
import time

import numpy as np
import pytest
from openai_fake import FakeModel, serve

from mlsys_flows.systems.common.llm import LLMConfig, LLMError, OpenAICompatibleClient, llm_relevance, parse_score

KEY = "sk-test-not-a-real-key-123"


_WORD = re.compile(r"[a-z]{4,}")
_COMMON = {"what", "which", "with", "from", "that", "this", "every", "their", "there", "after", "about", "also",
           "city", "like", "where", "when", "local", "locals", "still", "most", "each"}


def keyword_grade(query: str, passage: str) -> int:
    """The fake model's rule for BAGEL's relevance prompt: 6 when the passage names the query's city, plus
    one per other shared content word (at most 4)."""
    from mlsys_flows.systems.bagel import CITIES

    city = any(c in query and c in passage for c in CITIES)
    shared = (set(_WORD.findall(query.lower())) & set(_WORD.findall(passage.lower()))) - _COMMON
    shared -= {c.lower() for c in CITIES}
    return 6 * city + min(4, len(shared))


def _split_prompt(user: str) -> tuple[str, str]:
    query = user.split("Query: ", 1)[1].split("\n\nPassage: ", 1)[0]
    return query, user.split("\n\nPassage: ", 1)[1]


class _Handler(FakeModel):
    mode = "ok"          # ok | malformed | notjson | slow | error | grade
    seen: list = []
    malformed_for: str | None = None   # grade mode: the first request with this query gets a malformed reply
    lock = threading.Lock()

    def do_POST(self):
        body = self.read_json()
        type(self).seen.append((self.path, self.headers.get("Authorization"), body))
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            return self.send_bytes(401, json.dumps({"error": {"message": "invalid api key"}}).encode())
        mode = type(self).mode
        if mode == "slow":
            time.sleep(1.0)
        if mode == "error":
            return self.send_bytes(500, b"{}")
        if mode == "notjson":
            return self.send_bytes(200, b"<html>oops</html>", "text/html")
        if self.path == "/v1/chat/completions":
            if mode == "malformed":
                return self.send_bytes(200, json.dumps({"choices": []}).encode())
            user = body["messages"][-1]["content"]
            answer = "7" if "Rate how relevant" in user else f"echo: {user}"
            if mode == "grade":
                query, passage = _split_prompt(user)
                with type(self).lock:
                    broken = query == type(self).malformed_for
                    if broken:
                        type(self).malformed_for = None
                if broken:   # one reply a model might give: no number in it
                    answer = "I cannot judge this passage."
                else:
                    grade = keyword_grade(query, passage)
                    answer = f'{{"score": {grade}}}' if grade % 2 else str(grade)   # both reply styles
            return self.send_bytes(200, json.dumps({"id": "x", "object": "chat.completion", "model": body["model"],
                                               "choices": [{"index": 0, "message": {"role": "assistant",
                                                                                    "content": answer}}]}).encode())
        if self.path == "/v1/embeddings":
            if mode == "malformed":
                return self.send_bytes(200, json.dumps({"data": [{"index": 0}]}).encode())
            rows = [{"object": "embedding", "index": i, "embedding": [float(len(t)), 1.0, 0.0]}
                    for i, t in enumerate(body["input"])]
            return self.send_bytes(200, json.dumps({"object": "list", "data": rows[::-1]}).encode())  # out of order
        self.send_bytes(404, b"{}")


@pytest.fixture()
def server():
    _Handler.mode, _Handler.seen, _Handler.malformed_for = "ok", [], None
    with serve(_Handler) as url:
        yield url


def _client(url, **kw):
    return OpenAICompatibleClient(LLMConfig(base_url=url, model="tiny", api_key=kw.pop("key", KEY), **kw))


def test_chat_and_embeddings(server):
    with _client(server) as c:
        assert c.complete("hello") == "echo: hello"
        path, auth, body = _Handler.seen[-1]
        assert path == "/v1/chat/completions" and auth == f"Bearer {KEY}" and body["model"] == "tiny"
        e = c.embed(["a", "abcd"])
        assert e.shape == (2, 3) and np.allclose(np.linalg.norm(e, axis=1), 1.0)
        assert e[1, 0] > e[0, 0]  # rows put back in input order by 'index'
        assert llm_relevance(c, "q", "p") == pytest.approx(0.7)
    assert KEY not in repr(c) and KEY not in repr(c.config)


def test_wrong_key_is_an_error_that_does_not_leak_the_key(server):
    with _client(server, key="sk-wrong-key") as c, pytest.raises(LLMError) as err:
        c.complete("hi")
    assert "401" in str(err.value) and "sk-wrong-key" not in str(err.value)


@pytest.mark.parametrize("mode, match", [("malformed", "malformed"), ("notjson", "not JSON"), ("error", "HTTP 500")])
def test_bad_replies_raise_clear_errors(server, mode, match):
    _Handler.mode = mode
    with _client(server) as c:
        with pytest.raises(LLMError, match=match):
            c.complete("hi")
        if mode == "malformed":
            with pytest.raises(LLMError, match="malformed embeddings"):
                c.embed(["x"])


def test_timeout(server):
    _Handler.mode = "slow"
    with _client(server, timeout_s=0.2, max_retries=0) as c, pytest.raises(LLMError, match="no reply within"):
        c.complete("hi")


def test_config_is_validated():
    with pytest.raises(ValueError):
        LLMConfig(base_url="not a url", model="m")
    with pytest.raises(ValueError):
        LLMConfig(base_url="http://x", model="")
    with pytest.raises(LLMError):
        parse_score("no number here")


def test_task_layer_resolves_the_key_from_a_secret_block(server, prefect_api):
    from prefect.blocks.system import Secret

    from mlsys_flows.tasks.common import llm_client

    Secret(value=KEY).save("llm-test-key", overwrite=True)
    with llm_client(server, "tiny", "llm-test-key") as c:
        assert c.complete("x") == "echo: x"
    with pytest.raises(ValueError, match="no Secret block"):
        llm_client(server, "tiny", "no-such-secret-block")


# ----- BAGEL with the LLM scorer: a flow run against the local server ------------------------------
BAGEL_OVERRIDES = dict(embedding="minilm", cities=6, per_cluster=5, queries=6, trials=1, budget=10, budget_points=2,
                       llm_model="tiny", api_key_secret="bagel-llm-key", beta_scale=0.1, explore_beta_scale=0.4,
                       gar_batches=[5], gar_neighbours=[8])


def test_bagel_llm_scorer_flow(server, prefect_api, local_storage, caplog, capfd):
    """The bagel flow with the LLM scorer on the MiniLM text corpus: the fake model grades by a keyword
    rule, one reply holds no number. The run completes, counts that failed score (scored 0), sends the
    key from the Secret block, never shows it, and its recall is exactly what the rule gives in process."""
    import logging

    from prefect.blocks.system import Secret

    from mlsys_flows import registry
    from mlsys_flows.systems.bagel import Params, dense_rank, evaluate_queries, text_queries
    from mlsys_flows.systems.bagel.text import make_corpus
    from mlsys_flows.systems.common.text_embed import embed

    Secret(value=KEY).save("bagel-llm-key", overwrite=True)
    p = Params.for_scale("smoke", **BAGEL_OVERRIDES, llm_base_url=server)
    # the first query's text (it depends on the aspect geometry, so embed the corpus as the flow will)
    corpus = make_corpus(p.cities, p.per_cluster, p.seed)
    first = text_queries(corpus, embed(corpus.texts).astype(np.float64), p.queries, p.far_quantile, p.same_city,
                         p.same_aspect, p.seed)[0][1]
    _Handler.mode, _Handler.malformed_for = "grade", first
    caplog.set_level(logging.INFO)
    from faultkit import warm_cluster

    # on the session's warm cluster, as against `mlsys-flows server`: its workers have MiniLM and torch imported
    state = registry.get("bagel").load_flow()(scale="smoke", overrides={**BAGEL_OVERRIDES, "llm_base_url": server},
                                              storage=local_storage, cluster=warm_cluster(), return_state=True)
    assert state.is_completed(), state
    report = state.result()
    assert _Handler.malformed_for is None, "the malformed reply was never sent"
    assert all(auth == f"Bearer {KEY}" for _, auth, _ in _Handler.seen)
    v = report["variants"]
    failed = {m: v[m]["failed_scores"] for m in ("rerank", "bagel", "bagel_explore")}
    # the broken pair is the first query's dense top-1: every scoring method asks about it once, for 1 of 6 queries
    assert all(f == pytest.approx(1 / p.queries) for f in failed.values()), failed
    assert report["metric_kinds"]["failed_scores"] == "counted"
    notes = " ".join(report["notes"])
    assert "1 failed scores" in notes and f"{len(_Handler.seen)} requests" in notes

    # the same evaluation in process, with the rule as the scorer and 0 for the malformed pair
    import pickle

    key = next(k for k in local_storage.list("runs/bagel/") if k.endswith("workload.pkl"))
    data = pickle.loads(local_storage.read_bytes(key))
    X, queries, texts, qtexts = data["X"], data["queries"], data["texts"], data["query_texts"]
    assert qtexts[0] == first
    broken = (0, int(dense_rank(X, queries[0].q)[0]))

    def rule_scorer(j, q):
        def score(i):
            score.calls += 1
            return 0.0 if (j, i) == broken else keyword_grade(qtexts[j], texts[i]) / 10.0
        score.calls = 0
        return score

    expected = evaluate_queries(X, queries, p.budgets(), p.config(), p.score_noise, p.top_k, p.explore_beta_scale,
                                make_scorer=rule_scorer, exploit=True, gar=(5, 8))
    for m in (m for m in v if not m.startswith("digits_")):   # digits_*: the second workload, oracle-scored
        assert v[m]["recall_at_k"] == pytest.approx(np.mean(expected["recall"][m][p.budget])), m
    # the check has power: the same rule with another query's grades gives another BAGEL recall
    wrong = evaluate_queries(X, queries, p.budgets(), p.config(), p.score_noise, p.top_k, p.explore_beta_scale,
                             make_scorer=lambda j, q: rule_scorer((j + 1) % len(queries), q))
    assert any(v[m]["recall_at_k"] != pytest.approx(np.mean(wrong["recall"][m][p.budget]))
               for m in ("bagel", "bagel_explore"))
    out, err = capfd.readouterr()
    logs = "\n".join(r.getMessage() for r in caplog.records)
    api_logs = _api_logs(state.state_details.flow_run_id, until="failed LLM score")
    for text in (json.dumps(report), logs, out + err, api_logs):
        assert KEY not in text


def _api_logs(flow_run_id, until: str) -> str:
    """The run's log lines in the Prefect API (the Dask workers' task logs included), once ``until`` shows."""
    from faultkit import wait_until
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    def read():
        with get_client(sync_client=True) as client:
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                                    limit=200)
        text = "\n".join(log.message for log in logs)
        return text if until in text else None

    return wait_until(read, timeout=30, interval=0.5, what=f"{until!r} in the run's API logs")


def test_bagel_rejects_the_llm_scorer_on_digits():
    from mlsys_flows.systems.bagel import Params
    from mlsys_flows.systems.common.params import ParamsError

    with pytest.raises(ParamsError, match="'llm_base_url'.*embedding='minilm'"):
        Params.for_scale("smoke", llm_base_url="http://127.0.0.1:9/v1")
    assert Params.for_scale("smoke", embedding="minilm", llm_base_url="http://127.0.0.1:9/v1").llm_base_url
