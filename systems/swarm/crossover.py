"""Where distributed control's decision latency starts to beat centralized control's, on an N grid."""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Crossover:
    n: float | None          # the interpolated swarm size; None: no crossing on the grid
    note: str
    index: int | None = None  # the grid interval [index, index + 1] holding the crossing
    weight: float = 0.0       # position inside that interval, in log N (0 = left point)

    def interpolate(self, ns: list[float], ys: list[float]) -> float | None:
        """``ys`` (values on the grid ``ns``) at the crossover, linear in log N."""
        if self.n is None or self.index is None:
            return None
        if self.weight == 0.0:
            return float(ys[self.index])
        i = self.index
        return float(ys[i] + self.weight * (ys[i + 1] - ys[i]))


def crossover(ns: list[float], technique: list[float], baseline: list[float], what: str = "p99") -> Crossover:
    """The smallest N at which ``technique`` (lower is better) drops below ``baseline``.

    Interpolated linearly in log N between the two grid points where technique - baseline changes
    sign from >= 0 to < 0. If the technique is already lower at the smallest N, the crossover is
    reported as that N ("at or below"). If it is never lower, n is None with a note. ``what`` names
    the compared quantity in the note (the latency percentile)."""
    if not (len(ns) == len(technique) == len(baseline)) or not ns:
        raise ValueError("ns, technique and baseline must be non-empty and of equal length")
    if any(b <= a for a, b in zip(ns, ns[1:])):
        raise ValueError("ns must be strictly increasing")
    d = [t - b for t, b in zip(technique, baseline)]
    if d[0] < 0:
        return Crossover(float(ns[0]), f"distributed is already faster at the smallest N={ns[0]:g}: the crossover "
                                       f"is at or below it", 0, 0.0)
    for i in range(len(ns) - 1):
        if d[i] >= 0 > d[i + 1]:
            w = d[i] / (d[i] - d[i + 1])
            n = math.exp(math.log(ns[i]) + w * (math.log(ns[i + 1]) - math.log(ns[i])))
            return Crossover(n, f"between N={ns[i]:g} and N={ns[i + 1]:g}, interpolated linearly in log N "
                                f"on the difference of the two {what} latencies", i, w)
    return Crossover(None, f"no crossover on the grid N={', '.join(f'{x:g}' for x in ns)}: distributed never "
                           "has the lower value")
