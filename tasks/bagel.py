"""Prefect tasks of the BAGEL flow: build the workload (embeddings + queries), evaluate query chunks."""
from __future__ import annotations

import pickle
import time

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.bagel import Params, digits_embeddings, evaluate_queries, make_queries


@task(name="bagel-workload")
def make_workload(p: Params, storage: ObjectStorage, key: str) -> str:
    """Digit embeddings (PCA to p.dim) and the queries, each with two distant relevant clusters."""
    X, labels = digits_embeddings(p.dim, p.normalize)
    queries = make_queries(X, labels, p.queries, p.per_cluster, p.query_noise, p.far_quantile, p.relevance_width,
                           p.seed)
    storage.write_bytes(key, pickle.dumps({"X": X, "queries": queries}))
    get_run_logger().info("digits workload: %d passages x %d dims, %d queries, %d relevant per query",
                          len(X), X.shape[1], len(queries), len(queries[0].relevant))
    return key


@task(name="bagel-evaluate")
def evaluate(p: Params, storage: ObjectStorage, key: str, start: int, stop: int) -> dict:
    """Dense retriever, top-B rerank and BAGEL on queries[start:stop] at every budget of the curve."""
    data = pickle.loads(storage.read_bytes(key))
    started = time.perf_counter()
    res = evaluate_queries(data["X"], data["queries"][start:stop], p.budgets(), p.config(), p.score_noise, p.top_k,
                           p.explore_beta_scale)
    b = p.budget
    get_run_logger().info("queries %d-%d in %.1f s: recall@k at B=%d: %s", start, stop,
                          time.perf_counter() - started, b,
                          ", ".join(f"{m} {sum(r[b]) / (stop - start):.3f}" for m, r in res["recall"].items()))
    return res
