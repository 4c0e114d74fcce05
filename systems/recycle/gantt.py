"""Schedules as pictures: square-wave series for a report Curve, and a matplotlib Gantt chart (pure)."""
from __future__ import annotations

import io

KINDS = ("F", "Bi", "Bw", "B", "RF", "sync")
COLORS = {"F": "tab:blue", "Bi": "tab:orange", "Bw": "tab:green", "B": "tab:red", "RF": "tab:purple", "sync": "tab:gray"}
HEIGHT = 0.8


def window_of(schedule: dict, first: int = 1, last: int = 1) -> tuple[float, float]:
    """Time span (seconds) from the end of iteration ``first - 1`` to the end of iteration ``last``."""
    ends = schedule["iteration_end"]
    last = min(last, len(ends) - 1)
    return (ends[first - 1] if first > 0 else 0.0), ends[last]


def _by_worker_kind(schedule: dict, t0: float, t1: float) -> dict[tuple[int, str], list[tuple[float, float]]]:
    out: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for wk, k, _it, _mb, s, e in schedule["records"]:
        if e > t0 and s < t1:
            out.setdefault((wk, k), []).append((s, e))
    for segs in out.values():
        segs.sort()
    return out


def focus_rows(workers: list[str]) -> list[int]:
    """Rows worth drawing in a small panel: the most damaged pipeline and one intact pipeline (worker
    names are '<pipeline>s<stage>')."""
    pipes: dict[str, list[int]] = {}
    for i, name in enumerate(workers):
        pipes.setdefault(name.rsplit("s", 1)[0], []).append(i)
    full = max(len(v) for v in pipes.values())
    damaged = sorted((v for v in pipes.values() if len(v) < full), key=len)
    intact = [v for v in pipes.values() if len(v) == full]
    return sorted((damaged[0] if damaged else []) + (intact[-1] if intact else []))


def square_waves(schedule: dict, t0: float, t1: float, rows: list[int] | None = None,
                 kinds: tuple[str, ...] = ("F", "Bi", "Bw", "B", "RF")) -> dict[str, tuple[list[float], list[float]]]:
    """One series per operation kind: for every worker row a line at the row's height that rises by
    HEIGHT while the worker runs an operation of that kind (times in ms from ``t0``)."""
    rows = rows if rows is not None else list(range(len(schedule["workers"])))
    series = {}
    grouped = _by_worker_kind(schedule, t0, t1)
    for kind in kinds:
        xs, ys = [], []
        any_op = False
        for y, w in enumerate(rows):
            segs = grouped.get((w, kind), [])
            xs.append(0.0), ys.append(float(y))
            for s, e in segs:
                s, e = (max(s, t0) - t0) * 1e3, (min(e, t1) - t0) * 1e3
                xs += [s, s, e, e]
                ys += [y, y + HEIGHT, y + HEIGHT, y]
                any_op = True
            xs += [(t1 - t0) * 1e3, 0.0]
            ys += [float(y), float(y)]
        if any_op:
            series[kind] = (xs, ys)
    return series


def render_gantt(schedules: dict[str, dict], t_windows: dict[str, tuple[float, float]]) -> bytes:
    """A PNG with one Gantt panel (workers x time, one colour per operation kind) per schedule."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch

    n = len(schedules)
    fig, axes = plt.subplots(n, 1, figsize=(11, 2.2 + 0.22 * max(len(s["workers"]) for s in schedules.values()) * n),
                             squeeze=False)
    for ax, (name, sch) in zip(axes.ravel(), schedules.items()):
        t0, t1 = t_windows[name]
        grouped = _by_worker_kind(sch, t0, t1)
        for kind in KINDS:  # one collection of rectangles per operation kind
            boxes = [[(a, w), (a, w + HEIGHT), (b, w + HEIGHT), (b, w)]
                     for w in range(len(sch["workers"])) for s, e in grouped.get((w, kind), [])
                     for a, b in [((max(s, t0) - t0) * 1e3, (min(e, t1) - t0) * 1e3)]]
            if boxes:
                ax.add_collection(PolyCollection(boxes, facecolors=COLORS[kind], edgecolors="none"))
        ax.set_ylim(0, len(sch["workers"]))
        ax.set_yticks([w + HEIGHT / 2 for w in range(len(sch["workers"]))], sch["workers"], fontsize=6)
        ax.set_xlim(0, (t1 - t0) * 1e3)
        ax.set_title(f"{name}: one steady iteration", fontsize=9)
        ax.set_xlabel("time (ms, simulated)")
    fig.legend(handles=[Patch(color=COLORS[k], label=k) for k in KINDS], loc="upper right", fontsize=8, ncol=len(KINDS))
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
