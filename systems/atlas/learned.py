"""The learned synthesizer: MiniLM sentence embeddings (the packaged all-MiniLM-L6-v2 weights,
systems/common/text_embed.py) of each documentation sentence that names another component, and a
logistic decision rule on the raw 384-d embedding fitted on calibration pages (calibration systems written
with the training phrasings, never the evaluated systems or phrasings). Its L2 strength is chosen by
cross-validation grouped by template (a held-out fold holds only phrasings the fit never saw), so the
rule is picked for how it transfers to new phrasings, not how it fits the calibration sentences.

A sentence is turned into a relation query by masking: the mentioned component becomes "X", the page's
own component "this service", any other component "another service". A component's proposed
dependencies are the components named in at least one sentence the rule accepts. ``MentionSynthesizer``
(``atlas_mentions``, a deployable baseline) reads nothing: every component a page names is a dependency.
Pure: numpy, the embedding helper and scikit-learn's logistic regression (fit only).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from mlsys_flows.errors import MlsysError

from .docs import GROUP, alias, make_docs, mentions
from .model import make_system

# far above any evaluated system's seed (seed x 100 + k with seed < 2^31): calibration systems are never evaluated
CALIBRATION_SEED = 2 ** 40
# L2 strengths (inverse) the grouped cross-validation chooses from
C_GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0)
CV_FOLDS = 5


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
    """The fitted decision rule: P(dependency) = sigmoid(embedding . coef + intercept), accepted above 0.5."""

    coef: np.ndarray             # [384]
    intercept: float
    C: float                     # the L2 strength the grouped cross-validation chose
    calibration: dict = field(default_factory=dict)   # sentences, templates, in-sample and cross-validated scores

    def logit(self, emb: np.ndarray) -> np.ndarray:
        return emb @ self.coef + self.intercept

    def accept(self, emb: np.ndarray) -> np.ndarray:
        return self.logit(emb) > 0.0


def calibration_sentences(components: int, systems: int, omit: float, hard: float, stale: float,
                          distractor: float) -> tuple[list[str], np.ndarray, list[str]]:
    """Masked sentences of calibration systems' pages (training phrasings), their labels (the mentioned
    component is a callee) and their groups (the template each came from, a generated one by its frame)."""
    texts, labels, groups = [], [], []
    for k in range(systems):
        s = make_system(components, CALIBRATION_SEED + k)
        sources: list[dict] = []
        pages = make_docs(s, CALIBRATION_SEED + k, omit, hard, stale, distractor, phrasings="training", sources=sources)
        for v, page in enumerate(pages):
            for sent in _SPLIT.split(page):
                for u in mentions(sent, s.names):
                    if u != v:
                        t = sources[v].get(sent, "")
                        texts.append(mask(sent, s.names, u, v))
                        labels.append(u in s.calls[v])
                        groups.append(GROUP.get(t, t))
    return texts, np.asarray(labels, bool), groups


def _scores(pred: np.ndarray, labels: np.ndarray) -> dict:
    tp = int((pred & labels).sum())
    return {"accuracy": float(np.mean(pred == labels)), "precision": tp / max(int(pred.sum()), 1),
            "recall": tp / max(int(labels.sum()), 1)}


def fit_rule(texts: list[str], labels: np.ndarray, groups: list[str] | None = None, embed=_embed,
             Cs=C_GRID) -> SentenceRule:
    """Fit the logistic rule on the raw embeddings of labelled calibration sentences (L2, its strength
    chosen from ``Cs`` by accuracy in cross-validation grouped by ``groups``; a tie goes to the stronger
    regularisation). Without groups (or fewer than two) the middle of ``Cs`` is used."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GroupKFold

    labels = np.asarray(labels, bool)
    if len(set(labels.tolist())) < 2:
        raise CalibrationError("calibration sentences need both dependency and non-dependency mentions")
    if groups is not None and len(groups) != len(texts):
        raise CalibrationError(f"groups must give one template per sentence ({len(groups)} for {len(texts)})")
    uniq = sorted(set(texts))          # masked sentences repeat across pages: embed each once
    at = {t: i for i, t in enumerate(uniq)}
    emb = np.asarray(embed(uniq), float)[[at[t] for t in texts]]
    cv: dict[float, float] = {}
    ng = len(set(groups)) if groups is not None else 0
    if ng >= 2:
        folds = list(GroupKFold(n_splits=min(CV_FOLDS, ng)).split(emb, labels, groups))
        for C in Cs:
            hits = 0
            for tr, te in folds:
                if len(set(labels[tr].tolist())) < 2:
                    hits += int(np.sum(labels[te] == labels[tr][0]))
                    continue
                lr = LogisticRegression(C=C, max_iter=2000).fit(emb[tr], labels[tr])
                hits += int(np.sum(lr.predict(emb[te]).astype(bool) == labels[te]))
            cv[C] = hits / len(labels)
        best = max(Cs, key=lambda c: (round(cv[c], 9), -c))
    else:
        best = Cs[len(Cs) // 2]
    lr = LogisticRegression(C=best, max_iter=2000).fit(emb, labels)
    rule = SentenceRule(lr.coef_[0].astype(float), float(lr.intercept_[0]), float(best))
    rule.calibration = {"sentences": len(texts), "dependencies": int(labels.sum()), "templates": ng, "C": float(best),
                        "cv_accuracy": cv.get(best), "base_rate": float(labels.mean()),
                        **{f"in_sample_{k}": v for k, v in _scores(rule.accept(emb), labels).items()}}
    return rule


def sentence_scores(pages: list[str], names: list[str], calls: list, accept) -> dict:
    """Sentence-level counts of a decision ``accept(masked texts) -> bools`` on pages whose truth is
    known (``calls[v]``: v's callees): true/false positives and negatives over every (sentence, named
    component) candidate. Evaluation only: nothing is fitted on it."""
    texts, truth = [], []
    for v, page in enumerate(pages):
        for u, t in candidates(v, page, names):
            texts.append(t)
            truth.append(u in calls[v])
    truth_a = np.asarray(truth, bool)
    pred = np.asarray(accept(texts), bool) if texts else np.zeros(0, bool)
    return {"tp": int((pred & truth_a).sum()), "fp": int((pred & ~truth_a).sum()),
            "fn": int((~pred & truth_a).sum()), "tn": int((~pred & ~truth_a).sum())}


class EmbeddingSynthesizer:
    """The learned per-component agent: proposes the components named in accepted sentences."""

    name = "minilm"

    def __init__(self, rule: SentenceRule, embed=_embed):
        self.rule, self.embed = rule, embed
        self.calls = 0
        self.sentences = 0

    def propose(self, component: int, page: str, names: list[str]) -> list[int]:
        """The accepted components; ``last_evidence``: each one's highest logit over its accepted sentences
        (the cycle breaker's evidence)."""
        self.calls += 1
        self.last_evidence = {}
        cands = candidates(component, page, names)
        if not cands:
            return []
        self.sentences += len(cands)
        logit = self.rule.logit(self.embed([t for _, t in cands]))
        for (u, _), z in zip(cands, logit):
            if z > 0.0:
                self.last_evidence[u] = max(self.last_evidence.get(u, -np.inf), float(z))
        return sorted(self.last_evidence)

    def accept_texts(self, texts: list[str]) -> np.ndarray:
        return self.rule.accept(self.embed(texts)) if texts else np.zeros(0, bool)


class MentionSynthesizer:
    """The deployable documentation baseline a practitioner tries first: every component a page names is
    a dependency (no reading; the same composition and validation follow)."""

    name = "mentions"

    def __init__(self):
        self.calls = 0

    def propose(self, component: int, page: str, names: list[str]) -> list[int]:
        """Every named component; ``last_evidence``: the sentences naming each (the cycle breaker's evidence)."""
        self.calls += 1
        self.last_evidence = {}
        for u, _ in candidates(component, page, names):
            self.last_evidence[u] = self.last_evidence.get(u, 0) + 1
        return sorted(self.last_evidence)
