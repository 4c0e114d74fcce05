"""Fault localization on a causal graph, the same procedure for every graph.

1. A metric is *anomalous* when its mean over the fault window is more than ``threshold`` normal
   standard deviations from its normal mean (raw z-score, no graph).
2. Regression-based hypothesis testing (as in CIRCA): each metric is regressed on its parents in the
   graph over normal-operation telemetry; its *unexplained anomaly* is the mean residual over the
   fault window in units of the residual's normal sd.
3. A metric is a *root candidate* when it is anomalous and none of its parents is (its anomalous
   parents would explain it, even through effects the linear fit cannot see, such as timeouts).
Components are ranked by their best metric: root candidates first, each group by unexplained anomaly.
With the empty graph every anomalous metric is a candidate and the residual is the z-score: plain
z-score ranking."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model import component_of


@dataclass
class Localizer:
    parent: np.ndarray        # [V, V] bool: parent[i, j] = i is a parent of j
    W: np.ndarray             # [V, V] regression coefficients (column j: j's regression on its parents)
    b0: np.ndarray            # [V] intercepts
    sd: np.ndarray            # residual sd per variable
    mean0: np.ndarray         # normal mean per variable
    sd0: np.ndarray           # normal sd per variable

    @classmethod
    def fit(cls, G: np.ndarray, history: np.ndarray) -> "Localizer":
        """Regressions of every variable on its parents in G (G[i, j]: i is a parent of j; an
        unoriented edge makes each a parent of the other) over the history window."""
        n, V = history.shape
        parent = G & ~np.eye(V, dtype=bool)
        W, b0, sd = np.zeros((V, V)), np.zeros(V), np.empty(V)
        for j in range(V):
            pa = np.flatnonzero(parent[:, j])
            X = np.column_stack([np.ones(n), history[:, pa]])
            beta, *_ = np.linalg.lstsq(X, history[:, j], rcond=None)
            resid = history[:, j] - X @ beta
            sd[j] = max(float(np.sqrt(resid @ resid / max(n - len(pa) - 1, 1))), 1e-9)
            b0[j], W[pa, j] = beta[0], beta[1:]
        return cls(parent, W, b0, sd, history.mean(axis=0), np.maximum(history.std(axis=0), 1e-9))

    def anomaly(self, window: np.ndarray) -> np.ndarray:
        """Per variable: |mean residual over the window| / normal residual sd."""
        resid = window.mean(axis=0) - (self.b0 + window.mean(axis=0) @ self.W)   # linear: mean of residuals
        return np.abs(resid) / self.sd

    def scores(self, window: np.ndarray, threshold: float) -> np.ndarray:
        """Per variable: unexplained anomaly, plus 1e6 for root candidates."""
        a = self.anomaly(window)
        anomalous = np.abs(window.mean(axis=0) - self.mean0) / self.sd0 > threshold
        has_anomalous_parent = (self.parent & anomalous[:, None]).any(axis=0)
        return a + 1e6 * (anomalous & ~has_anomalous_parent)

    def rank(self, window: np.ndarray, n_components: int, threshold: float = 2.0) -> np.ndarray:
        """Components, most likely root cause first (score ties broken by component index)."""
        a = self.scores(window, threshold)[1:]            # traffic is no component
        score = a.reshape(n_components, -1).max(axis=1)   # columns 1 + 4c + m
        return np.argsort(-score, kind="stable")


def rank_of(order: np.ndarray, root: int) -> int:
    """1-based position of the root cause in a ranking."""
    return int(np.flatnonzero(order == root)[0]) + 1


def edge_scores(G: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """Precision/recall of a graph's directed edges vs the truth (an unoriented edge counts as both
    directions), over metric-level edges."""
    off = ~np.eye(len(G), dtype=bool)
    g, t = G & off, truth & off
    tp = int((g & t).sum())
    return {"precision": tp / max(int(g.sum()), 1), "recall": tp / max(int(t.sum()), 1), "edges": int(g.sum())}


def component_edges(G: np.ndarray, n: int) -> set[tuple[int, int]]:
    """Component-level edges (u, v): some metric of u is a parent of some metric of v, u != v."""
    out = set()
    for i, j in zip(*np.nonzero(G)):
        cu, cv = component_of(int(i)), component_of(int(j))
        if cu >= 0 and cv >= 0 and cu != cv:
            out.add((cu, cv))
    return out


def set_scores(found: set, truth: set) -> dict[str, float]:
    tp = len(found & truth)
    return {"precision": tp / max(len(found), 1), "recall": tp / max(len(truth), 1), "edges": len(found)}
