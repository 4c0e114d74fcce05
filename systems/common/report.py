"""The one RunReport schema every flow produces.

``measured_ratio`` and ``paper_ratio`` are oriented so that a value above 1 means the technique
beats the baseline (baseline time / technique time, technique throughput / baseline throughput).
"""
from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, Field

Better = Literal["higher", "lower"]


def oriented_ratio(baseline: float, technique: float, better: Better) -> float:
    """technique/baseline when higher is better, baseline/technique when lower is better."""
    num, den = (technique, baseline) if better == "higher" else (baseline, technique)
    if den == 0:
        return math.inf if num > 0 else float("nan")
    return num / den


class Ratio(BaseModel):
    """One measured comparison of the technique against one baseline on one metric."""

    metric: str = Field(description="Metric compared, a key of each variant's metrics.")
    baseline: str = Field(description="Variant name of the baseline.")
    technique: str = Field(description="Variant name of the technique.")
    better: Better = Field(description="Which direction of the raw metric is better.")
    baseline_value: float
    technique_value: float
    measured_ratio: float = Field(description="Oriented ratio measured in this run (>1: technique wins).")
    paper_ratio: float | None = Field(None, description="The paper's claim, oriented the same way.")

    @classmethod
    def of(cls, variants: dict[str, dict[str, float]], metric: str, baseline: str, technique: str,
           better: Better, paper_ratio: float | None = None) -> "Ratio":
        try:
            b, t = float(variants[baseline][metric]), float(variants[technique][metric])
        except KeyError as exc:
            raise KeyError(f"ratio {metric!r} needs variants {baseline!r} and {technique!r} with that metric; missing {exc}") from None
        return cls(metric=metric, baseline=baseline, technique=technique, better=better,
                   baseline_value=b, technique_value=t,
                   measured_ratio=oriented_ratio(b, t, better), paper_ratio=paper_ratio)


class Curve(BaseModel):
    """A series per variant, drawn as one panel of the report's plot."""

    title: str
    x_label: str
    y_label: str
    series: dict[str, tuple[list[float], list[float]]] = Field(description="variant -> (xs, ys)")
    log_y: bool = False


class Environment(BaseModel):
    device: str
    cores: int
    platform: str
    versions: dict[str, str]
    git_sha: str


class RunReport(BaseModel):
    system: str
    title: str
    paper: str
    scale: str
    run_id: str
    created_at: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat())
    parameters: dict[str, Any]
    variants: dict[str, dict[str, float]] = Field(description="variant -> metric -> value")
    headline: Ratio
    ratios: list[Ratio] = Field(default_factory=list, description="Further measured comparisons.")
    curves: list[Curve] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list, description="Why numbers differ from the paper, etc.")
    deterministic_metrics: list[str] = Field(default_factory=list, description="Metrics that depend only on the "
                                             "parameters and seed, equal in every run with the same parameters.")
    environment: Environment
    wall_time_s: float

    def summary_markdown(self) -> str:
        h = self.headline
        paper = f"{h.paper_ratio:.2f}x" if h.paper_ratio is not None else "n/a"
        lines = [
            f"# {self.title} ({self.system}, scale `{self.scale}`)",
            "",
            f"**Headline** {h.metric}: {h.technique} vs {h.baseline} = **{h.measured_ratio:.2f}x** measured "
            f"(paper: {paper}; >1 means the technique wins).",
            "",
            "| comparison | baseline | technique | measured | paper |",
            "|---|---|---|---|---|",
        ]
        for r in [h, *self.ratios]:
            pr = f"{r.paper_ratio:.2f}x" if r.paper_ratio is not None else "n/a"
            lines.append(f"| {r.metric}: {r.technique} vs {r.baseline} | {r.baseline_value:.4g} | "
                         f"{r.technique_value:.4g} | {r.measured_ratio:.2f}x | {pr} |")
        lines += ["", "| variant | " + " | ".join(self.metric_names()) + " |",
                  "|---|" + "---|" * len(self.metric_names())]
        for name, metrics in self.variants.items():
            lines.append(f"| {name} | " + " | ".join(_fmt(metrics.get(m)) for m in self.metric_names()) + " |")
        if self.notes:
            lines += ["", "**Notes**", *[f"- {n}" for n in self.notes]]
        env = self.environment
        lines += ["", f"Run `{self.run_id}` on {env.device}, {env.cores} cores, git `{env.git_sha[:10]}`, "
                      f"wall time {self.wall_time_s:.1f} s."]
        return "\n".join(lines)

    def metric_names(self) -> list[str]:
        names: list[str] = []
        for metrics in self.variants.values():
            names += [m for m in metrics if m not in names]
        return names

    def table_rows(self) -> list[dict[str, Any]]:
        return [{"variant": v, **m} for v, m in self.variants.items()]


def _fmt(v: float | None) -> str:
    return "" if v is None else f"{v:.4g}"
