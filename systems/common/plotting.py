"""Render a RunReport as a PNG (matplotlib, Agg backend; pure)."""
from __future__ import annotations

import io

from .runreport import RunReport


def warm() -> None:
    """Import matplotlib (Agg) now, so that the first plot does not wait for it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401


def render_png(report: RunReport) -> bytes:
    warm()
    import matplotlib.pyplot as plt

    panels = 1 + len(report.curves)
    cols = min(panels, 3)
    rows = (panels + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    flat = axes.ravel()

    h = report.headline
    names = [n for n in report.variants if h.metric in report.variants[n]]
    values = [report.variants[n][h.metric] for n in names]
    colors = ["tab:orange" if n == h.technique else ("tab:blue" if n in (h.baseline, h.vs_strongest.baseline)
                                                      else "tab:gray") for n in names]
    ax = flat[0]
    ax.bar(names, values, color=colors)
    paper = f", paper {h.paper:.2f}x" if h.paper else ""
    verdict = report.verdict()
    first = (f"{verdict.label()} vs {h.vs_strongest.baseline}" if verdict is not None
             else f"{h.vs_strongest.ratio:.2f}x vs {h.vs_strongest.baseline}")
    ax.set_title(f"{h.metric} ({h.kind}): {first}\n{h.ratio:.2f}x vs {h.baseline}{paper}", fontsize=9)
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)

    for ax, curve in zip(flat[1:], report.curves):
        for name, (xs, ys) in curve.series.items():
            if name in curve.hollow:
                ax.plot(xs, ys, label=name, linestyle="none", marker="o", markerfacecolor="none")
            else:
                ax.plot(xs, ys, label=name, linewidth=1.4)
        ax.set_title(curve.title, fontsize=10)
        ax.set_xlabel(curve.x_label)
        ax.set_ylabel(curve.y_label)
        if curve.log_y:
            ax.set_yscale("log")
        ax.legend(fontsize=8)
    for ax in flat[panels:]:
        ax.axis("off")
    fig.suptitle(f"{report.title} [{report.scale}]", fontsize=11)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()
