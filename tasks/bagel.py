"""Prefect tasks of the BAGEL flow: build a workload (embeddings, evaluated, regime and calibration queries),
tune BAGEL's UCB factor and GAR on the calibration queries, evaluate query chunks (with the offline oracle,
or an OpenAI-compatible LLM endpoint as the scorer when configured)."""
from __future__ import annotations

import pickle
import time

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.bagel import Params
from mlsys_flows.systems.bagel.plan import build, evaluate_part, evaluate_same_city, tune
from mlsys_flows.tasks.common import llm_client


def _embedder(kind: str):
    if kind != "minilm":
        return None
    from mlsys_flows.systems.common.text_embed import embed
    return embed


@task(name="bagel-workload")
def make_workload(p: Params, storage: ObjectStorage, key: str, kind: str) -> str:
    """The digit embeddings (PCA to p.dim) or the generated text corpus embedded once with MiniLM, and every
    query of the run: each trial's (seed + trial), the regime's and the calibration queries."""
    started = time.perf_counter()
    data = build(p, kind, _embedder(kind))
    what = "MiniLM text corpus (packaged model, offline)" if kind == "minilm" else "digits"
    storage.write_bytes(key, pickle.dumps(data))
    get_run_logger().info("%s workload: %d passages x %d dims, %d trials of %d queries, %d calibration queries, "
                          "built in %.1f s", what, len(data["X_all"]), data["X_all"].shape[1], p.trials, p.queries,
                          len(data["parts"]["calibration"]["queries"]), time.perf_counter() - started)
    return key


@task(name="bagel-calibrate")
def calibrate(p: Params, storage: ObjectStorage, key: str) -> dict:
    """BAGEL's UCB factor and GAR's (batch, neighbours), tuned on the workload's calibration queries."""
    started = time.perf_counter()
    tuned = tune(p, pickle.loads(storage.read_bytes(key)))
    get_run_logger().info("bagel calibration (%s) in %.1f s: beta_scale %s, GAR (batch, neighbours) %s", key,
                          time.perf_counter() - started, tuned["beta_scale"], tuned["gar"])
    return tuned


@task(name="bagel-regime")
def regime(p: Params, storage: ObjectStorage, key: str, tuned: dict, per_cluster: int) -> dict:
    """One regime point: rerank, GAR, BAGEL and its exploitation-only ablation at the headline budget with
    ``per_cluster`` relevant passages per cluster (offline oracle, the first trial's seed)."""
    data = pickle.loads(storage.read_bytes(key))
    res = evaluate_part(p, data, tuned, f"regime{per_cluster}", budgets=[p.budget], explore=False)
    n = len(data["parts"][f"regime{per_cluster}"]["queries"])
    out = {m: sum(r[p.budget]) / len(r[p.budget]) for m, r in res["recall"].items() if m != "bagel_explore"}
    out["_outside_top_b"] = sum(res["outside_top_b"][p.budget]) / n
    get_run_logger().info("bagel regime per_cluster=%d: %s", per_cluster, {k: round(v, 3) for k, v in out.items()})
    return out


@task(name="bagel-same-city")
def same_city(p: Params, storage: ObjectStorage, key: str, tuned: dict, value: float) -> dict:
    """The bridge re-graded: rerank, GAR, BAGEL and bagel_exploit at the headline budget on the first
    ``regime_queries`` queries of trial 0 with the oracle grading the query's city under its other aspects
    ``value`` (minilm; offline oracle, nothing re-embedded)."""
    data = pickle.loads(storage.read_bytes(key))
    res = evaluate_same_city(p, data, tuned, value, p.regime_queries)
    out = {"recall": {m: r[p.budget] for m, r in res["recall"].items()},
           "far_recall": {m: r[p.budget] for m, r in res["far_recall"].items()}}
    get_run_logger().info("bagel same_city=%g: recall@k %s", value,
                          {m: round(sum(r) / len(r), 3) for m, r in out["recall"].items()})
    return out


@task(name="bagel-evaluate")
def evaluate(p: Params, storage: ObjectStorage, key: str, tuned: dict, trial: int, start: int, stop: int,
             claim: bool = False) -> dict:
    """Dense retriever, top-B rerank, GAR and BAGEL (and its ablations unless ``claim``: the second workload)
    on trial ``trial``'s queries[start:stop] at every budget of the curve."""
    data = pickle.loads(storage.read_bytes(key))
    log = get_run_logger()
    started = time.perf_counter()
    part = f"trial{trial}"
    if p.llm_base_url and not claim:
        from mlsys_flows.systems.bagel import LLMJudge
        from mlsys_flows.systems.bagel.plan import part_view

        _, _, qtexts, texts = part_view(data, part)
        qtexts = qtexts[start:stop]
        with llm_client(p.llm_base_url, p.llm_model, p.api_key_secret, timeout_s=p.llm_timeout_s) as client:
            judge = LLMJudge(client, texts, fallback=0.0, max_failed=p.llm_max_failed)
            res = evaluate_part(p, data, tuned, part, start, stop,
                                make_scorer=lambda j, q: judge.scorer(start + j, qtexts[j]))
        res["llm"] = judge.stats()
        log.info("LLM %s at %s: %d scoring requests, %d failed (scored 0)", p.llm_model, p.llm_base_url,
                 judge.requests, judge.failed)
        for msg in judge.failures:
            log.warning("failed LLM score: %s", msg)
    else:
        res = evaluate_part(p, data, tuned, part, start, stop, claim=claim)
    b = p.budget
    log.info("%s %s queries %d-%d in %.1f s: recall@k at B=%d: %s", data["kind"], part, start, stop,
             time.perf_counter() - started, b,
             ", ".join(f"{m} {sum(r[b]) / (stop - start):.3f}" for m, r in res["recall"].items()))
    return res
