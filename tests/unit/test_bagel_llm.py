"""BAGEL's LLM scorer and text workload, pure parts: the relevance-reply parser (and that it rejects what
it must), the judge's per-pair cache, failure counting and abort rule, the llm + digits rejection, and
the MiniLM text corpus (two distant relevant clusters, the query near one). The HTTP path against a
local OpenAI-compatible server is in tests/integration/test_llm_endpoint.py."""
import numpy as np
import pytest

from mlsys_flows.systems.bagel import (CITIES, LLMJudge, Params, dense_rank, evaluate_queries, make_corpus,
                                       parse_relevance, recall_at_k, text_queries)
from mlsys_flows.systems.common.llm import LLMError
from mlsys_flows.systems.common.params import ParamsError


@pytest.mark.parametrize("reply, grade", [("7", 0.7), ("  8/10", 0.8), ("Score: 3", 0.3), ("10", 1.0), ("0", 0.0),
                                          ('{"score": 6}', 0.6), ('```json\n{"relevance": 4.5}\n```', 0.45),
                                          ("<think>maybe 2? no, 9</think>5", 0.5), ("6.5", 0.65)])
def test_parse_relevance_reads_common_reply_styles(reply, grade):
    assert parse_relevance(reply) == pytest.approx(grade)


@pytest.mark.parametrize("reply", ["", "I cannot judge this.", "85", "-2", '{"answer": "yes"}', '{"score": true}',
                                   "<think>7</think>"])
def test_parse_relevance_rejects_unreadable_or_out_of_range_replies(reply):
    with pytest.raises(LLMError):
        parse_relevance(reply)


class FakeClient:
    """A model whose grade is the passage's number; passages in ``bad`` get an unreadable reply."""

    def __init__(self, bad=()):
        self.bad, self.prompts = set(bad), []

    def complete(self, prompt, max_tokens=64):
        self.prompts.append(prompt)
        i = int(prompt.rsplit("Passage: p", 1)[1])
        return "no idea" if i in self.bad else str(i % 11)


def test_judge_caches_pairs_and_counts_failures_per_method():
    client = FakeClient(bad={3})
    judge = LLMJudge(client, [f"p{i}" for i in range(20)], max_failed=0.5)
    a, b = judge.scorer(0, "q0"), judge.scorer(0, "q0")
    assert [a(i) for i in (2, 3, 4)] == [pytest.approx(0.2), 0.0, pytest.approx(0.4)]   # failed -> fallback 0
    assert [b(i) for i in (3, 4, 5)] == [0.0, pytest.approx(0.4), pytest.approx(0.5)]
    assert a.calls == b.calls == 3 and a.flags == [False, True, False] and b.flags == [True, False, False]
    assert judge.requests == 4 == len(client.prompts) and judge.failed == 1     # each pair requested once
    judge.scorer(1, "q1")(3)                                                    # another query: a new request
    assert judge.requests == 5 and judge.failed == 2 and "passage 3" in judge.failures[0]
    assert "Query: q1" in client.prompts[-1] and "Passage: p3" in client.prompts[-1]


def test_judge_aborts_when_the_endpoint_is_broken_not_noisy():
    judge = LLMJudge(FakeClient(bad=set(range(100))), [f"p{i}" for i in range(100)], max_failed=0.2, min_requests=10)
    s = judge.scorer(0, "q")
    for i in range(9):          # below min_requests: failed scores are counted, the run goes on
        assert s(i) == 0.0
    with pytest.raises(LLMError, match="10 of 10 LLM scoring requests failed"):
        s(9)


def test_evaluate_reports_failed_scores_of_each_method():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 4))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    from mlsys_flows.systems.bagel import Query, BagelConfig

    q = Query(X[0], np.zeros(60), np.array([0, 1]), np.array([0]), np.zeros(60), (0, 1))
    top = int(dense_rank(X, q.q)[0])
    judge = LLMJudge(FakeClient(bad={top}), [f"p{i}" for i in range(60)], max_failed=1.0)
    res = evaluate_queries(X, [q], [4, 8], BagelConfig(seeds=2, refit_every=2), 0.0, explore_beta_scale=1.0,
                           make_scorer=lambda j, q: judge.scorer(j, "q"))
    # the dense top-1 is every method's first call: one failed score each, one failed request in all
    assert {m: res["failed"][m][8] for m in res["failed"]} == {"rerank": [1], "bagel": [1], "bagel_explore": [1]}
    assert judge.failed == 1
    assert "failed" not in evaluate_queries(X, [q], [4], BagelConfig(seeds=2), 0.05)   # the oracle has none


def test_llm_scorer_needs_text():
    with pytest.raises(ParamsError, match="'llm_base_url'"):
        Params.for_scale("quick", embedding="digits", llm_base_url="http://127.0.0.1:8000/v1")
    with pytest.raises(ParamsError, match="'llm_base_url'"):   # smoke runs on digits
        Params.for_scale("smoke", llm_base_url="http://127.0.0.1:8000/v1")
    p = Params.for_scale("quick", embedding="minilm", llm_base_url="http://127.0.0.1:8000/v1", api_key_secret="k")
    assert p.llm_base_url and p.embedding == "minilm"
    with pytest.raises(ParamsError, match="'embedding'"):
        Params.for_scale("smoke", embedding="words")
    with pytest.raises(ParamsError, match="'cities'"):
        Params.for_scale("smoke", cities=len(CITIES) + 1)


def test_text_corpus_is_seeded_and_complete():
    a, b = make_corpus(3, 4, seed=1), make_corpus(3, 4, seed=1)
    assert a.texts == b.texts and len(a.texts) == 3 * 8 * 4
    for c in range(3):
        for asp in range(8):
            idx = np.flatnonzero((a.city == c) & (a.aspect == asp))
            assert len(idx) == 4 and all(a.cities[c] in a.texts[i] for i in idx)
    assert make_corpus(3, 4, seed=2).texts != a.texts


@pytest.fixture(scope="module")
def minilm_workload():
    from mlsys_flows.systems.bagel.text import text_workload
    from mlsys_flows.systems.common.text_embed import embed

    return text_workload(5, 4, 6, 0.5, 0.3, 0.1, 0, embed)


def test_text_queries_have_two_distant_clusters_with_the_query_near_one(minilm_workload):
    X, qs, texts, qtexts = (minilm_workload[k] for k in ("X", "queries", "texts", "query_texts"))
    assert X.shape == (5 * 8 * 4, 384) and np.allclose(np.linalg.norm(X, axis=1), 1.0, atol=1e-4)
    near_recall, far_recall = [], []
    for q, t in zip(qs, qtexts):
        far = np.setdiff1d(q.relevant, q.near)
        assert len(q.near) == len(far) == 4
        city = next(c for c in CITIES if c in t)
        assert all(city in texts[i] for i in q.relevant) and (q.relevance[q.relevant] == 1.0).all()
        order = dense_rank(X, q.q)
        near_recall.append(recall_at_k(order, q.near, 8))
        far_recall.append(recall_at_k(order, far, 8))
        assert np.linalg.norm(X[far] - q.q, axis=1).mean() > np.linalg.norm(X[q.near] - q.q, axis=1).mean()
    # the dense neighbourhood holds the near cluster and mostly misses the far one
    assert np.mean(near_recall) >= 0.75 and np.mean(far_recall) <= 0.35


def test_text_queries_reject_a_broken_relevance(minilm_workload):
    """The check above fails on a workload whose 'far' cluster is the query's own (a broken generator)."""
    X, qs = minilm_workload["X"], minilm_workload["queries"]
    broken = [recall_at_k(dense_rank(X, q.q), q.near, 8) for q in qs]   # near used as far
    assert not np.mean(broken) <= 0.35
