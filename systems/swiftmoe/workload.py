"""A synthetic language whose expert popularity is skewed and drifts over training.

The vocabulary is split into ``regimes`` disjoint blocks; each regime is a sparse first-order
Markov chain over its block (every token has ``branching`` successors with Dirichlet
probabilities). A sequence is a run of ``segment_len``-token walks, each in a regime drawn from
the current mix (so one batch holds many regime draws and its expert load is not too noisy). The regime mix at iteration ``t`` is a
rotating hot spot: ``p_t(r) ~ exp(skew * cos(2*pi*(r/R - t/drift_period)))``, so a few regimes
(hence the experts the router assigns them to) are popular at any time and which ones changes
as training proceeds. The evaluation set mixes all regimes evenly; its Bayes loss (the true
conditional entropy of its next tokens) is the floor the target loss is set above.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Language:
    vocab: int
    regimes: int
    branching: int
    seed: int

    def chains(self) -> tuple[np.ndarray, np.ndarray]:
        """successors [V, branching] (token ids) and their probabilities [V, branching]."""
        rng = np.random.default_rng([self.seed, 1])
        block = self.vocab // self.regimes
        succ = np.empty((self.vocab, self.branching), dtype=np.int64)
        for tok in range(self.vocab):
            base = min(tok // block, self.regimes - 1) * block
            succ[tok] = base + rng.choice(block, size=self.branching, replace=False)
        prob = rng.dirichlet(np.ones(self.branching), size=self.vocab)
        return succ, prob


def regime_mix(t: np.ndarray | float, regimes: int, skew: float, drift_period: float) -> np.ndarray:
    """Probability of each regime at iteration(s) ``t``: [..., regimes]."""
    r = np.arange(regimes) / regimes
    logits = skew * np.cos(2 * np.pi * (r - np.asarray(t, dtype=float)[..., None] / drift_period))
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def _sequences(succ: np.ndarray, prob: np.ndarray, mix: np.ndarray, length: int, segment: int, block: int,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Sequences [n, length] made of walks of ``segment`` tokens, each in a regime drawn from its
    row of ``mix`` [n, R]; and the true log-probability of every next token [n, length-1] (a
    segment's first token has probability mix[regime] / block)."""
    n, regimes = mix.shape
    tok = np.empty((n, length), dtype=np.int64)
    logp = np.empty((n, length))
    cum = prob.cumsum(1)
    cmix = mix.cumsum(1)
    for i in range(length):
        if i % segment == 0:
            r = np.minimum((rng.random(n)[:, None] > cmix).sum(1), regimes - 1)
            tok[:, i] = r * block + rng.integers(0, block, size=n)
            logp[:, i] = np.log(mix[np.arange(n), r] / block)
        else:
            c = cum[tok[:, i - 1]]
            pick = np.minimum((rng.random(n)[:, None] > c).sum(1), c.shape[1] - 1)
            tok[:, i] = succ[tok[:, i - 1], pick]
            logp[:, i] = np.log(prob[tok[:, i - 1], pick])
    return tok, logp[:, 1:]


@dataclass
class Workload:
    train: np.ndarray         # [iterations, batch, seq_len + 1] token ids
    eval: np.ndarray          # [n_eval, seq_len + 1]
    bayes_loss: float         # true next-token entropy of the eval set (nats)

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        np.savez_compressed(buf, train=self.train, eval=self.eval, bayes_loss=np.float64(self.bayes_loss))
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Workload":
        z = np.load(io.BytesIO(data))
        return cls(train=z["train"], eval=z["eval"], bayes_loss=float(z["bayes_loss"]))


def make_workload(vocab: int, regimes: int, branching: int, skew: float, drift_period: float,
                  iterations: int, batch: int, seq_len: int, segment_len: int, n_eval: int, seed: int) -> Workload:
    lang = Language(vocab, regimes, branching, seed)
    succ, prob = lang.chains()
    block = vocab // regimes
    mix = np.repeat(regime_mix(np.arange(iterations), regimes, skew, drift_period), batch, axis=0)
    train, _ = _sequences(succ, prob, mix, seq_len + 1, segment_len, block, np.random.default_rng([seed, 2]))
    uniform = np.full((n_eval, regimes), 1.0 / regimes)
    ev, logp = _sequences(succ, prob, uniform, seq_len + 1, segment_len, block, np.random.default_rng([seed, 3]))
    return Workload(train=train.reshape(iterations, batch, seq_len + 1), eval=ev, bayes_loss=float(-logp.mean()))
