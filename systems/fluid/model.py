"""A two-hidden-layer ReLU MLP in numpy (float32), its local SGD training and its FLOP count (pure).

The model is a list of six arrays ``[W1, b1, W2, b2, W3, b3]`` with ``W1: (in, h1)``, ``W2: (h1, h2)``,
``W3: (h2, out)``. A sub-model is the same structure with fewer hidden neurons (see ``dropout.py``).
"""
from __future__ import annotations

import time

import numpy as np

Weights = list  # [W1, b1, W2, b2, W3, b3], numpy float32 arrays


def init_mlp(n_in: int, hidden: int, n_out: int, seed: int) -> Weights:
    """He-initialised weights, zero biases."""
    rng = np.random.default_rng(seed)
    dims = [n_in, hidden, hidden, n_out]
    out: Weights = []
    for a, b in zip(dims[:-1], dims[1:]):
        out.append((rng.standard_normal((a, b)) * np.sqrt(2.0 / a)).astype(np.float32))
        out.append(np.zeros(b, np.float32))
    return out


def hidden_sizes(w: Weights) -> tuple[int, int]:
    return w[0].shape[1], w[2].shape[1]


def logits(w: Weights, x: np.ndarray) -> np.ndarray:
    h1 = np.maximum(x @ w[0] + w[1], 0.0)
    h2 = np.maximum(h1 @ w[2] + w[3], 0.0)
    return h2 @ w[4] + w[5]


def accuracy(w: Weights, x: np.ndarray, y: np.ndarray) -> float:
    with _blas().limit(limits=1):  # one BLAS thread: the same sums, so the same predictions, in every process
        return float(np.mean(np.argmax(logits(w, x), axis=1) == y))


def sgd_epochs(w: Weights, x: np.ndarray, y: np.ndarray, epochs: int, batch: int, lr: float,
               rng: np.random.Generator) -> Weights:
    """Plain minibatch SGD on softmax cross-entropy; returns new arrays (the input is not modified)."""
    w = [a.copy() for a in w]
    n, n_out = len(x), w[4].shape[1]
    eye = np.eye(n_out, dtype=np.float32)
    lr = np.float32(lr)
    for _ in range(epochs):
        order = rng.permutation(n)
        for s in range(0, n, batch):
            idx = order[s:s + batch]
            xb, yb = x[idx], eye[y[idx]]
            h1 = np.maximum(xb @ w[0] + w[1], 0.0)
            h2 = np.maximum(h1 @ w[2] + w[3], 0.0)
            z = h2 @ w[4] + w[5]
            z = np.exp(z - z.max(axis=1, keepdims=True))
            dz = (z / z.sum(axis=1, keepdims=True) - yb) / np.float32(len(idx))
            dh2 = (dz @ w[4].T) * (h2 > 0)
            dh1 = (dh2 @ w[2].T) * (h1 > 0)
            grads = (xb.T @ dh1, dh1.sum(0), h1.T @ dh2, dh2.sum(0), h2.T @ dz, dz.sum(0))
            for a, g in zip(w, grads):
                a -= lr * g
    return w


def train_flops(n_in: int, h1: int, h2: int, n_out: int, samples: int, epochs: int) -> float:
    """Multiply-add FLOPs of local training: 2 per MAC, forward + two backward matmuls (x3)."""
    return 6.0 * (n_in * h1 + h1 * h2 + h2 * n_out) * samples * epochs


def model_bytes(w: Weights) -> int:
    return int(sum(a.nbytes for a in w))


_CONTROLLER = None


def _blas():
    """threadpoolctl's controller, built once per process (building it scans the loaded libraries)."""
    global _CONTROLLER
    if _CONTROLLER is None:
        from threadpoolctl import ThreadpoolController

        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER


def train_client(job: dict) -> dict:
    """One client's local round (runs as a Dask task): SGD from the weights it was sent, on its data.

    ``job``: weights, x, y, epochs, batch, lr, seed, client, round, fault (None, "nan", "shape" or
    "raise": a deliberately faulty client). Returns the trained weights, the samples used and the
    thread CPU seconds the training took (measured)."""
    if job.get("fault") == "raise":
        raise RuntimeError(f"client {job['client']} crashed in round {job['round']} (injected fault)")
    rng = np.random.default_rng([job["seed"], job["round"], job["client"]])
    with _blas().limit(limits=1):  # one BLAS thread: reproducible sums and a CPU time that is the client's own
        start = time.thread_time()
        w = sgd_epochs(job["weights"], job["x"], job["y"], job["epochs"], job["batch"], job["lr"], rng)
        cpu_s = time.thread_time() - start
    if job.get("fault") == "nan":
        w[2] = w[2].copy()
        w[2][0, 0] = np.nan
    elif job.get("fault") == "shape":
        w[0] = w[0][:, :-1]
    return {"client": job["client"], "weights": w, "samples": int(len(job["x"])), "cpu_s": float(cpu_s)}
