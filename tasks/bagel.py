"""Prefect tasks of the BAGEL flow: build the workload (embeddings + queries), evaluate query chunks
(with the offline oracle, or an OpenAI-compatible LLM endpoint as the scorer when configured)."""
from __future__ import annotations

import pickle
import time

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.bagel import Params, evaluate_queries
from mlsys_flows.tasks.common import llm_client


def _embedder(p: Params):
    if p.embedding != "minilm":
        return None
    from mlsys_flows.systems.common.text_embed import embed
    return embed


@task(name="bagel-workload")
def make_workload(p: Params, storage: ObjectStorage, key: str, trial: int = 0) -> str:
    """Digit embeddings (PCA to p.dim), or the generated text corpus embedded with MiniLM, and the queries of
    trial ``trial`` (seed + trial), each with two distant relevant clusters."""
    started = time.perf_counter()
    data = p.workload(trial, embed=_embedder(p))
    what = "MiniLM text corpus (packaged model, offline)" if p.embedding == "minilm" else "digits"
    storage.write_bytes(key, pickle.dumps(data))
    X, queries = data["X"], data["queries"]
    get_run_logger().info("%s workload, trial %d: %d passages x %d dims, %d queries, %d relevant per query, built in "
                          "%.1f s", what, trial, len(X), X.shape[1], len(queries), len(queries[0].relevant),
                          time.perf_counter() - started)
    return key


@task(name="bagel-regime")
def regime(p: Params, per_cluster: int) -> dict:
    """One regime point: rerank, BAGEL and its exploitation-only ablation at the headline budget with
    ``per_cluster`` relevant passages per cluster (offline oracle, the first trial's seed)."""
    data = p.workload(0, per_cluster, p.regime_queries, embed=_embedder(p))
    res = evaluate_queries(data["X"], data["queries"], [p.budget], p.config(), p.score_noise, p.top_k, None,
                           exploit=True)
    out = {m: sum(r[p.budget]) / len(r[p.budget]) for m, r in res["recall"].items()}
    out["_outside_top_b"] = sum(res["outside_top_b"][p.budget]) / len(data["queries"])
    get_run_logger().info("bagel regime per_cluster=%d: %s", per_cluster, {k: round(v, 3) for k, v in out.items()})
    return out


@task(name="bagel-evaluate")
def evaluate(p: Params, storage: ObjectStorage, key: str, start: int, stop: int) -> dict:
    """Dense retriever, top-B rerank and BAGEL on queries[start:stop] at every budget of the curve."""
    data = pickle.loads(storage.read_bytes(key))
    log = get_run_logger()
    started = time.perf_counter()
    args = (data["X"], data["queries"][start:stop], p.budgets(), p.config(), p.score_noise, p.top_k,
            p.explore_beta_scale)
    kwargs = {"exploit": True}
    if p.llm_base_url:
        from mlsys_flows.systems.bagel import LLMJudge

        texts = data["query_texts"][start:stop]
        with llm_client(p.llm_base_url, p.llm_model, p.api_key_secret, timeout_s=p.llm_timeout_s) as client:
            judge = LLMJudge(client, data["texts"], fallback=0.0, max_failed=p.llm_max_failed)
            res = evaluate_queries(*args, make_scorer=lambda j, q: judge.scorer(start + j, texts[j]), **kwargs)
        res["llm"] = judge.stats()
        log.info("LLM %s at %s: %d scoring requests, %d failed (scored 0)", p.llm_model, p.llm_base_url,
                 judge.requests, judge.failed)
        for msg in judge.failures:
            log.warning("failed LLM score: %s", msg)
    else:
        res = evaluate_queries(*args, **kwargs)
    b = p.budget
    log.info("queries %d-%d in %.1f s: recall@k at B=%d: %s", start, stop, time.perf_counter() - started, b,
             ", ".join(f"{m} {sum(r[b]) / (stop - start):.3f}" for m, r in res["recall"].items()))
    return res
