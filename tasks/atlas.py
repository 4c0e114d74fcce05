"""Prefect tasks of the Atlas flow: once, fit the learned synthesizer's rule on calibration pages; per
microservice system, synthesize (the learned synthesizer or an OpenAI-compatible model, and the scripted
parser as a reference) and validate Atlas's graph and learn the PC graph; per chunk of incidents,
simulate and rank root causes with every graph."""
from __future__ import annotations

import pickle
import time

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.atlas import Params
from mlsys_flows.systems.atlas.docs import DocParser
from mlsys_flows.systems.atlas.evaluate import build, calibration_incidents, learn_graphs, rank_incidents
from mlsys_flows.systems.atlas.learned import (CalibrationError, EmbeddingSynthesizer, SentenceRule, calibration_sentences,
                                                fit_rule)
from mlsys_flows.tasks.common import llm_client


def _stats_only(learned: dict) -> dict:
    return {"synthesis": learned["synthesis"], "problems": learned["problems"],
            "settings": {st: {"stats": v["stats"]} for st, v in learned["settings"].items()}}


@task(name="atlas-calibrate-synthesizer")
def calibrate(p: Params) -> SentenceRule:
    """Fit the learned synthesizer's decision rule on the calibration systems' pages (training
    phrasings, own seeds: no evaluated page)."""
    started = time.perf_counter()
    texts, labels, groups = calibration_sentences(p.components, p.calibration_systems, p.doc_omit, p.doc_hard,
                                                  p.doc_stale, p.doc_distractor)
    rule = fit_rule(texts, labels, groups)
    c = rule.calibration
    get_run_logger().info("synthesizer rule fitted on %d calibration sentences (%d dependencies, %d template groups) in "
                          "%.1f s: C %g chosen by grouped cross-validation (accuracy %.3f on unseen templates, base "
                          "rate %.3f)", c["sentences"], c["dependencies"], c["templates"], time.perf_counter() - started,
                          c["C"], c["cv_accuracy"] or 0.0, c["base_rate"])
    return rule


@task(name="atlas-learn-graphs")
def learn(p: Params, storage: ObjectStorage, seed: int, key: str, rule: SentenceRule | None = None) -> dict:
    """Build one system (call graph, SCM, documentation, history), synthesize Atlas's graph with one
    agent request per component, validate it on the history, learn PC on the same history, fit every
    variant's localizer; save them at ``key``. Returns the graph statistics."""
    log = get_run_logger()
    started = time.perf_counter()
    s, pages, history, past = build(p, seed)
    calib = calibration_incidents(p, s, seed)
    if p.llm_base_url:
        from mlsys_flows.systems.atlas.synth import LLMSynthesizer

        with llm_client(p.llm_base_url, p.llm_model, p.api_key_secret, timeout_s=p.llm_timeout_s) as client:
            learned = learn_graphs(p, s, pages, history, past, LLMSynthesizer(client), calib, DocParser())
        learned["synthesis"]["agent"] = "llm"
    else:
        if rule is None:
            raise CalibrationError("the learned synthesizer needs its calibrated rule (the atlas-calibrate-synthesizer task)")
        learned = learn_graphs(p, s, pages, history, past, EmbeddingSynthesizer(rule), calib, DocParser())
        learned["synthesis"].update(agent="minilm", calibration=rule.calibration)
    storage.write_bytes(key, pickle.dumps({"system": s, "learned": learned}))
    syn = learned["synthesis"]
    log.info("system %d: %d components, %d true dependencies; %s synthesizer: %d requests, %d malformed, %d failed, "
             "%d unknown names, %d cycle edges removed; built and learned in %.1f s", seed, s.n,
             len(s.component_edges()), syn["agent"], syn["synth_requests"], syn["malformed_replies"],
             syn["failed_requests"], syn["unknown_names"], syn["cycle_edges_removed"], time.perf_counter() - started)
    for msg in learned["problems"]:
        log.warning("synthesizer: %s", msg)
    return _stats_only(learned)


@task(name="atlas-rank-incidents")
def rank(p: Params, storage: ObjectStorage, key: str, seed: int, start: int, stop: int) -> dict:
    """Simulate incidents [start, stop) of one system and rank their root causes with every graph."""
    data = pickle.loads(storage.read_bytes(key))
    started = time.perf_counter()
    out = rank_incidents(p, data["system"], seed, data["learned"], start, stop)
    r = out["ranks"][p.headline_setting()]
    get_run_logger().info("system %d incidents %d-%d in %.1f s: top-1 hits %s", seed, start, stop,
                          time.perf_counter() - started,
                          ", ".join(f"{v} {sum(x == 1 for x in ranks)}" for v, ranks in r.items()))
    return out
