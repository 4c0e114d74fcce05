"""Training a group's linear model by QR: the full retrain (SIndex-style) and SIA's incremental one (pure numpy).

A group's keys are rows of a ``uint8`` matrix (fixed width, zero padded). Its model maps the
``n_feat`` characters after the group's common prefix (each /256) and a bias to the key's position
in the group's sorted array. Training is ridge-stabilised least squares: minimise
``||A w - y||^2 + lam ||w||^2``, i.e. least squares on ``[A; sqrt(lam) I]`` (a character that is
constant in a group would make ``A`` rank deficient).

* :func:`retrain_full` (the baseline): one Householder QR of all ``m`` rows, with ``y`` appended as
  a last column so the same factorisation yields ``R`` and ``Q^T y`` (LAPACK ``geqrf`` via
  ``numpy.linalg.qr(mode="r")``): ``O(m n^2)``.
* :func:`retrain_sia` (SIA): the ``R`` of the last training is kept (memoised); only the ``d`` new
  rows are factorised, stacked under it: ``qr([R_old; A_new])`` has the same ``R^T R = A^T A`` as a
  QR of all rows, in ``O((n + d) n^2)``. Inserting keys shifts the positions ``y`` of the old keys,
  so the right-hand side ``Q^T y = R^{-T} A^T y`` is recomputed from ``A^T y`` (``O(m n)``, a
  matrix-vector product, not a factorisation), followed by one step of iterative refinement
  (corrected semi-normal equations) so the weights carry the accuracy of a QR solve.

Both kernels then compute the group's error bound (the largest ``|A w - y|`` over its keys) that
lookups search within. They are the device kernels: plain numpy arrays in and out, run inline on
the host or in the FPGA board's process; their ``_shared`` twins take the arrays as shared-memory
descriptors (:mod:`.shared`), so only a few hundred bytes cross the host-device pipe.
"""
from __future__ import annotations

import time

import numpy as np
from scipy.linalg import solve_triangular

from mlsys_flows.devices.fpga import device_kernel

EPS = float(np.finfo(np.float64).eps)
_BLAS_LIMIT: list = []


def single_thread_blas() -> None:
    """Pin this process's BLAS/LAPACK to one thread (once): the board's kernels and the host's inline
    retrains each get one core, and tiny QRs do not spin up (and contend with) a thread pool."""
    if _BLAS_LIMIT:
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        _BLAS_LIMIT.append(None)
        return
    _BLAS_LIMIT.append(threadpool_limits(limits=1))


def one_blas_thread():
    """A context in which BLAS/LAPACK use one thread, restored on exit (the host side: a Dask worker
    process is shared with other tasks, so its limit must not outlive the measurement)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        from contextlib import nullcontext
        return nullcontext()
    return threadpool_limits(limits=1)


def features(keys: np.ndarray, offset: int, n_feat: int) -> np.ndarray:
    """``(m, n_feat + 1)`` float64: the characters ``offset .. offset+n_feat-1`` of each key /256
    (zero past a key's end), then a bias column of ones."""
    keys = np.asarray(keys, dtype=np.uint8)
    m, width = keys.shape
    a = np.zeros((m, n_feat + 1))
    hi = min(width, offset + n_feat)
    if hi > offset:
        np.multiply(keys[:, offset:hi], 1.0 / 256.0, out=a[:, : hi - offset])
    a[:, n_feat] = 1.0
    return a


def _upper(r: np.ndarray, n: int) -> np.ndarray:
    """The leading ``n x n`` block of an R factor, with non-negative diagonal (R is unique up to the
    signs of its rows; fixing them makes two factorisations comparable)."""
    r = np.triu(r[:n, :n])
    return r * np.where(np.diag(r) < 0, -1.0, 1.0)[:, None]


def ridge_rows(n: int, lam: float) -> np.ndarray:
    """The R of the regularisation rows alone: where a group's memo starts before its first keys."""
    return np.sqrt(lam) * np.eye(n)


def solve_full(a: np.ndarray, y: np.ndarray, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Least squares by one QR of ``[A y; sqrt(lam) I 0]``: returns (w, R)."""
    m, n = a.shape
    aug = np.zeros((m + n, n + 1))
    aug[:m, :n], aug[:m, n] = a, y
    aug[m:, :n] = np.sqrt(lam) * np.eye(n)
    r_aug = np.linalg.qr(aug, mode="r")
    signs = np.where(np.diag(r_aug[:n, :n]) < 0, -1.0, 1.0)
    r = np.triu(r_aug[:n, :n]) * signs[:, None]
    z = r_aug[:n, n] * signs
    return solve_triangular(r, z), r


def update_r(r_old: np.ndarray, a_new: np.ndarray) -> np.ndarray:
    """SIA's memoised factorisation: the R of ``[R_old; A_new]`` (``R^T R = R_old^T R_old + A_new^T A_new``)."""
    n = r_old.shape[0]
    if len(a_new) == 0:
        return r_old.copy()
    return _upper(np.linalg.qr(np.vstack([r_old, a_new]), mode="r"), n)


def solve_with_r(r: np.ndarray, a: np.ndarray, y: np.ndarray, lam: float, refine: int = 1) -> np.ndarray:
    """Weights from a factor ``R`` of ``[A; sqrt(lam) I]``: ``w = R^{-1} R^{-T} A^T y`` (``R^{-T} A^T y``
    is ``Q^T y``), then ``refine`` steps of iterative refinement on the residual."""
    def apply(g: np.ndarray) -> np.ndarray:
        return solve_triangular(r, solve_triangular(r, g, trans="T"))

    w = apply(a.T @ y)
    for _ in range(refine):
        resid = y - a @ w
        w = w + apply(a.T @ resid - lam * w)
    return w


def error_bound(a: np.ndarray, w: np.ndarray) -> int:
    """The largest distance between a key's predicted (rounded) and true position in its group."""
    if len(a) == 0:
        return 0
    pred = np.rint(a @ w)
    return int(np.max(np.abs(pred - np.arange(len(a)))))


@device_kernel
def retrain_full(keys: np.ndarray, offset: int, n_feat: int, lam: float) -> dict:
    """Baseline kernel: QR of all of the group's (merged, sorted) keys. Returns weights, R, error
    bound and the kernel's own compute time."""
    single_thread_blas()
    t0 = time.perf_counter()
    a = features(keys, offset, n_feat)
    w, r = solve_full(a, np.arange(len(a), dtype=np.float64), lam)
    err = error_bound(a, w)
    return {"w": w, "r": r, "err": err, "kernel_s": time.perf_counter() - t0, "qr_rows": len(a)}


@device_kernel
def retrain_sia(keys: np.ndarray, new_keys: np.ndarray, r_old: np.ndarray, offset: int, n_feat: int,
                lam: float) -> dict:
    """SIA kernel: factorise only ``new_keys`` under the memoised ``r_old``; ``keys`` (the merged,
    sorted group, new keys included) supplies ``A^T y`` and the error bound."""
    single_thread_blas()
    t0 = time.perf_counter()
    r = update_r(r_old, features(new_keys, offset, n_feat))
    a = features(keys, offset, n_feat)
    w = solve_with_r(r, a, np.arange(len(a), dtype=np.float64), lam)
    err = error_bound(a, w)
    return {"w": w, "r": r, "err": err, "kernel_s": time.perf_counter() - t0, "qr_rows": len(new_keys) + len(r)}


@device_kernel
def retrain_sia_nomemo(keys: np.ndarray, new_keys: np.ndarray, r_old: np.ndarray, offset: int, n_feat: int,
                       lam: float) -> dict:
    """The mechanism's ablation: :func:`retrain_sia` with the memoisation removed and nothing else. It
    takes the same arguments (the host ships the new keys and the memoised ``r_old`` as for SIA, so the
    offload's cost is the same) and solves the same way (``R^{-T} A^T y`` plus a refinement step, the
    same error bound), but factorises ``R`` from scratch, from the ridge rows and every key of the
    merged group, instead of updating ``r_old`` with the new keys."""
    single_thread_blas()
    t0 = time.perf_counter()
    a = features(keys, offset, n_feat)
    r = update_r(ridge_rows(n_feat + 1, lam), a)
    w = solve_with_r(r, a, np.arange(len(a), dtype=np.float64), lam)
    err = error_bound(a, w)
    return {"w": w, "r": r, "err": err, "kernel_s": time.perf_counter() - t0, "qr_rows": len(a) + len(r)}


@device_kernel
def retrain_full_shared(keys, offset: int, n_feat: int, lam: float) -> dict:
    """:func:`retrain_full` with its key array in a shared-memory segment (a descriptor, :mod:`.shared`)."""
    from .shared import attach

    with attach((keys,)) as (k,):
        return retrain_full(k, offset, n_feat, lam)


@device_kernel
def retrain_sia_shared(keys, new_keys, r_old, offset: int, n_feat: int, lam: float) -> dict:
    """:func:`retrain_sia` with its arrays in a shared-memory segment (descriptors, :mod:`.shared`)."""
    from .shared import attach

    with attach((keys, new_keys, r_old)) as (k, new, r):
        return retrain_sia(k, new, r, offset, n_feat, lam)


@device_kernel
def retrain_sia_nomemo_shared(keys, new_keys, r_old, offset: int, n_feat: int, lam: float) -> dict:
    """:func:`retrain_sia_nomemo` with its arrays in a shared-memory segment (descriptors, :mod:`.shared`)."""
    from .shared import attach

    with attach((keys, new_keys, r_old)) as (k, new, r):
        return retrain_sia_nomemo(k, new, r, offset, n_feat, lam)


# ---------------------------------------------------------------------------------------------
# equality of the two trainings, within what the conditioning allows


def weight_tolerance(a: np.ndarray, y: np.ndarray, lam: float, w: np.ndarray, c: float = 64.0) -> float:
    """A bound on the relative 2-norm difference of two backward-stable least-squares solutions of
    ``[A; sqrt(lam) I] w = [y; 0]`` (Golub & Van Loan, Thm 5.3.1): each is within
    ``eps' (2 kappa / cos(theta) + tan(theta) kappa^2)`` of the exact one, with ``eps' = c n u`` the
    backward error of Householder QR (``u`` unit roundoff), ``kappa`` the 2-norm condition number of the
    stacked matrix and ``theta`` the angle between ``y`` and its fit; the bound is doubled for two."""
    m, n = a.shape
    aug = np.vstack([a, np.sqrt(lam) * np.eye(n)])
    s = np.linalg.svd(aug, compute_uv=False)
    kappa = float(s[0] / s[-1])
    resid = np.concatenate([y - a @ w, -np.sqrt(lam) * w])
    ynorm = float(np.linalg.norm(y))
    sin_t = min(float(np.linalg.norm(resid)) / ynorm, 1.0) if ynorm else 0.0
    cos_t = max(np.sqrt(1.0 - sin_t ** 2), 1e-300)
    eps = c * n * EPS / 2
    return 2.0 * eps * (2.0 * kappa / cos_t + (sin_t / cos_t) * kappa ** 2)


def weight_difference(w_test: np.ndarray, w_ref: np.ndarray) -> float:
    """Relative 2-norm difference ``||w_test - w_ref|| / ||w_ref||``."""
    den = float(np.linalg.norm(w_ref))
    return float(np.linalg.norm(np.asarray(w_test) - w_ref)) / (den if den else 1.0)


def check_equal_weights(w_test: np.ndarray, keys: np.ndarray, offset: int, n_feat: int, lam: float) -> dict:
    """Compare ``w_test`` with a full QR retrain on ``keys``: {rel_diff, bound, ok}."""
    a = features(keys, offset, n_feat)
    y = np.arange(len(a), dtype=np.float64)
    w_ref, _ = solve_full(a, y, lam)
    diff, bound = weight_difference(w_test, w_ref), weight_tolerance(a, y, lam, w_ref)
    return {"rel_diff": diff, "bound": bound, "ok": bool(diff <= bound)}


@device_kernel
def warm_up() -> int:
    """A tiny retrain of each kind, so the device process has imported and pinned everything before
    a clock starts; returns the process id."""
    import os

    keys = (np.arange(64, dtype=np.uint8)[:, None] + np.arange(4, dtype=np.uint8)).astype(np.uint8)
    out = retrain_full(keys, 0, 4, 1e-8)
    retrain_sia(keys, keys[:4], out["r"], 0, 4, 1e-8)
    retrain_sia_nomemo(keys, keys[:4], out["r"], 0, 4, 1e-8)
    return os.getpid()
