"""The learned synthesizer: MiniLM sentence embeddings (the packaged all-MiniLM-L6-v2 weights,
systems/common/text_embed.py) of each documentation sentence that names another component, compared with
relation prototypes, and a logistic decision rule over those similarities fitted on calibration pages
(calibration systems written with the calibration phrasings, never the evaluated systems or phrasings).

A sentence is turned into a relation query by masking: the mentioned component becomes "X", the page's
own component "this service", any other component "another service". Its features are the cosine
similarities of its embedding to every prototype (generic statements of "this service depends on X" and
of the ways a mention is no dependency: negation, the past, callers, ownership); the logistic rule over
them is fitted on the calibration sentences, labelled by the calibration systems' true call graphs. A
component's proposed dependencies are the components named in at least one sentence the rule accepts.
Pure: numpy, the embedding helper and scikit-learn's logistic regression (fit only).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from mlsys_flows.errors import MlsysError

from .docs import alias, make_docs, mentions
from .model import make_system

# far above any evaluated system's seed (seed x 100 + k with seed < 2^31): calibration systems are never evaluated
CALIBRATION_SEED = 2 ** 40

# statements of the relation, written as relations (no template of either phrasing set)
DEPENDS = ("this service calls X.", "this service depends on X.", "this service sends requests to X.",
           "this service reads data from X.", "this service needs X to answer its requests.",
           "X is a dependency of this service.", "this service stores its data in X.",
           "if X fails, this service fails.")
NOT_DEPENDS = ("this service does not call X.", "X calls this service.", "this service used to depend on X, but no "
               "longer does.", "X is owned by the same team as this service.", "X is unrelated to this service.",
               "X is a client of this service.", "this service stopped using X.")
PROTOTYPES = DEPENDS + NOT_DEPENDS

class CalibrationError(MlsysError, ValueError):
    """The learned synthesizer cannot be calibrated (or was not)."""


_SPLIT = re.compile(r"(?<=[.!?])\s+")


def _forms(name: str) -> list[str]:
    return [name, alias(name)[4:]]


def mask(sentence: str, names: list[str], target: int, me: int) -> str:
    """The sentence as a relation query: ``target`` -> X, ``me`` -> "this service", others -> "another service"."""
    text = sentence
    order = sorted(range(len(names)), key=lambda i: -len(names[i]))
    for i in order:
        for form in sorted(_forms(names[i]), key=len, reverse=True):
            word = "X" if i == target else "this service" if i == me else "another service"
            pat = re.compile(r"(?:\bthe\s+)?(?<![\w-])" + re.escape(form) + r"(?![\w-]|\.(cpu|queue|latency|errors))",
                             re.I)
            text = pat.sub(word, text)
    return text


def candidates(component: int, page: str, names: list[str]) -> list[tuple[int, str]]:
    """(mentioned component, masked sentence) for every sentence of the page and every other component it names."""
    out = []
    for sent in _SPLIT.split(page):
        for u in mentions(sent, names):
            if u != component:
                out.append((u, mask(sent, names, u, component)))
    return out


def _embed(texts: list[str]) -> np.ndarray:
    from mlsys_flows.systems.common.text_embed import embed

    return embed(texts)


@dataclass
class SentenceRule:
    """The fitted decision rule: P(dependency) = sigmoid(features . coef + intercept), accepted above 0.5."""

    prototypes: np.ndarray       # [P, 384] prototype embeddings
    coef: np.ndarray             # [P]
    intercept: float
    calibration: dict            # sentences, positives, precision/recall on the calibration sentences

    def features(self, emb: np.ndarray) -> np.ndarray:
        return emb @ self.prototypes.T

    def accept(self, emb: np.ndarray) -> np.ndarray:
        return self.features(emb) @ self.coef + self.intercept > 0.0


def calibration_sentences(components: int, systems: int, omit: float, hard: float, stale: float,
                          distractor: float) -> tuple[list[str], np.ndarray]:
    """Masked sentences of calibration systems' pages (calibration phrasings) and their labels (the
    mentioned component is a callee)."""
    texts, labels = [], []
    for k in range(systems):
        s = make_system(components, CALIBRATION_SEED + k)
        pages = make_docs(s, CALIBRATION_SEED + k, omit, hard, stale, distractor, phrasings="calibration")
        for v, page in enumerate(pages):
            for u, text in candidates(v, page, s.names):
                texts.append(text)
                labels.append(u in s.calls[v])
    return texts, np.asarray(labels, bool)


def fit_rule(texts: list[str], labels: np.ndarray, embed=_embed) -> SentenceRule:
    """Fit the logistic rule on labelled calibration sentences (balanced classes, L2, C=1)."""
    from sklearn.linear_model import LogisticRegression

    if len(set(labels.tolist())) < 2:
        raise CalibrationError("calibration sentences need both dependency and non-dependency mentions")
    protos = embed([p[0].upper() + p[1:] for p in PROTOTYPES])
    emb = embed(texts)
    lr = LogisticRegression(C=1.0, class_weight="balanced", max_iter=2000).fit(emb @ protos.T, labels)
    rule = SentenceRule(protos, lr.coef_[0].astype(float), float(lr.intercept_[0]), {})
    pred = rule.accept(emb)
    tp = int((pred & labels).sum())
    rule.calibration = {"sentences": len(texts), "dependencies": int(labels.sum()),
                        "precision": tp / max(int(pred.sum()), 1), "recall": tp / max(int(labels.sum()), 1)}
    return rule


class EmbeddingSynthesizer:
    """The learned per-component agent: proposes the components named in accepted sentences."""

    name = "minilm"

    def __init__(self, rule: SentenceRule, embed=_embed):
        self.rule, self.embed = rule, embed
        self.calls = 0
        self.sentences = 0

    def propose(self, component: int, page: str, names: list[str]) -> list[int]:
        self.calls += 1
        cands = candidates(component, page, names)
        if not cands:
            return []
        self.sentences += len(cands)
        ok = self.rule.accept(self.embed([t for _, t in cands]))
        return sorted({u for (u, _), a in zip(cands, ok) if a})
