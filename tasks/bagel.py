"""Prefect tasks of the BAGEL flow: build the workload (embeddings + queries), evaluate query chunks
(with the offline oracle, or an OpenAI-compatible LLM endpoint as the scorer when configured)."""
from __future__ import annotations

import pickle
import time

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.bagel import Params, digits_embeddings, evaluate_queries, make_queries
from mlsys_flows.tasks.common import llm_client


@task(name="bagel-workload")
def make_workload(p: Params, storage: ObjectStorage, key: str) -> str:
    """Digit embeddings (PCA to p.dim), or the generated text corpus embedded with MiniLM, and the queries,
    each with two distant relevant clusters."""
    started = time.perf_counter()
    if p.embedding == "minilm":
        from mlsys_flows.systems.bagel.text import text_workload
        from mlsys_flows.systems.common.text_embed import embed

        data = text_workload(p.cities, p.per_cluster, p.queries, p.far_quantile, p.same_city, p.same_aspect, p.seed,
                             embed)
        what = "MiniLM text corpus (packaged model, offline)"
    else:
        X, labels = digits_embeddings(p.dim, p.normalize)
        data = {"X": X, "queries": make_queries(X, labels, p.queries, p.per_cluster, p.query_noise, p.far_quantile,
                                                p.relevance_width, p.seed)}
        what = "digits"
    storage.write_bytes(key, pickle.dumps(data))
    X, queries = data["X"], data["queries"]
    get_run_logger().info("%s workload: %d passages x %d dims, %d queries, %d relevant per query, built in %.1f s",
                          what, len(X), X.shape[1], len(queries), len(queries[0].relevant),
                          time.perf_counter() - started)
    return key


@task(name="bagel-evaluate")
def evaluate(p: Params, storage: ObjectStorage, key: str, start: int, stop: int) -> dict:
    """Dense retriever, top-B rerank and BAGEL on queries[start:stop] at every budget of the curve."""
    data = pickle.loads(storage.read_bytes(key))
    log = get_run_logger()
    started = time.perf_counter()
    args = (data["X"], data["queries"][start:stop], p.budgets(), p.config(), p.score_noise, p.top_k,
            p.explore_beta_scale)
    if p.llm_base_url:
        from mlsys_flows.systems.bagel import LLMJudge

        texts = data["query_texts"][start:stop]
        with llm_client(p.llm_base_url, p.llm_model, p.api_key_secret, timeout_s=p.llm_timeout_s) as client:
            judge = LLMJudge(client, data["texts"], fallback=0.0, max_failed=p.llm_max_failed)
            res = evaluate_queries(*args, make_scorer=lambda j, q: judge.scorer(start + j, texts[j]))
        res["llm"] = judge.stats()
        log.info("LLM %s at %s: %d scoring requests, %d failed (scored 0)", p.llm_model, p.llm_base_url,
                 judge.requests, judge.failed)
        for msg in judge.failures:
            log.warning("failed LLM score: %s", msg)
    else:
        res = evaluate_queries(*args)
    b = p.budget
    log.info("queries %d-%d in %.1f s: recall@k at B=%d: %s", start, stop, time.perf_counter() - started, b,
             ", ".join(f"{m} {sum(r[b]) / (stop - start):.3f}" for m, r in res["recall"].items()))
    return res
