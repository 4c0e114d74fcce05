"""A thin, time-limited HiGHS (highspy) MILP call on sparse matrices, with the gap reported (shared by the
MILP-based systems: MoETuner, RecShard)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import sparse


@dataclass(frozen=True)
class MilpResult:
    x: np.ndarray            # incumbent (the warm start when the solver found nothing better)
    objective: float         # incumbent objective
    bound: float             # proven lower bound (minimization)
    gap: float               # (objective - bound) / |objective|; 0 when proven optimal
    status: str              # HiGHS model status, e.g. "Optimal", "Time limit reached"
    seconds: float


def solve_min(c: np.ndarray, a: sparse.spmatrix, row_lo: np.ndarray, row_hi: np.ndarray,
              col_lo: np.ndarray, col_hi: np.ndarray, integer: np.ndarray, *, time_limit_s: float,
              seed: int = 0, start: np.ndarray | None = None, floor: float = 0.0,
              mip_rel_gap: float = 1e-6) -> MilpResult:
    """Minimize ``c @ x`` s.t. ``row_lo <= a @ x <= row_hi``, ``col_lo <= x <= col_hi``, ``x[integer]``
    integral; ``floor`` is a known lower bound of the objective (0 for our nonnegative costs), used when
    HiGHS stops before proving a bound; the solve stops once within ``mip_rel_gap`` of the bound.
    ``start`` (a feasible point) is handed to HiGHS as the first incumbent, so a time-limited solve is
    never worse than it."""
    import highspy

    a = sparse.csc_matrix(a)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = a.shape[1], a.shape[0]
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = np.asarray(c, float), np.asarray(col_lo, float), np.asarray(col_hi, float)
    lp.row_lower_, lp.row_upper_ = np.asarray(row_lo, float), np.asarray(row_hi, float)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = a.indptr, a.indices, a.data
    lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous for i in integer]
    h = highspy.Highs()
    h.silent()
    for name, value in (("time_limit", float(time_limit_s)), ("threads", 1), ("random_seed", int(seed)),
                        ("mip_rel_gap", float(mip_rel_gap)), ("presolve", "on")):
        h.setOptionValue(name, value)
    h.passModel(lp)
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(map(float, start))
        sol.value_valid = True
        h.setSolution(sol)
    h.run()
    status = h.modelStatusToString(h.getModelStatus())
    info = h.getInfo()
    x = np.asarray(h.getSolution().col_value, float)
    if x.size != a.shape[1] or info.primal_solution_status == 0:
        if start is None:
            raise RuntimeError(f"HiGHS found no feasible solution ({status})")
        x = np.asarray(start, float)
    obj = float(np.dot(c, x))
    bound = float(info.mip_dual_bound)
    bound = min(max(bound if math.isfinite(bound) else floor, floor), obj)
    gap = 0.0 if obj - bound <= 1e-9 * max(1.0, abs(obj)) else (obj - bound) / max(abs(obj), 1e-12)
    return MilpResult(x=x, objective=obj, bound=bound, gap=float(gap), status=status, seconds=float(h.getRunTime()))
