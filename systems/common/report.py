"""The one RunReport schema every flow produces.

Every ratio, the paper's value beside it, is oriented so that a value above 1 means the technique
beats the baseline (baseline time / technique time, technique throughput / baseline throughput).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, Field

from .spec import KINDS, Better, Claim, Kind, SystemSpec


def oriented_ratio(baseline: float, technique: float, better: Better) -> float:
    """technique/baseline when higher is better, baseline/technique when lower is better."""
    num, den = (technique, baseline) if better == "higher" else (baseline, technique)
    if den == 0:
        return math.inf if num > 0 else float("nan")
    return num / den


class Assumption(BaseModel):
    """A constant that shapes a modelled or simulated number: its value and where it comes from."""

    value: float | str
    unit: str = ""
    source: str = Field(description="Where the value comes from: 'measured in this run', a datasheet, the paper.")


def param_assumptions(params: BaseModel, *names: str) -> dict[str, Assumption]:
    """Parameters that act as constants of a model, each with its description as the source."""
    fields = type(params).model_fields
    return {n: Assumption(value=getattr(params, n), source=f"parameter {n}: {fields[n].description}") for n in names}


class Ratio(BaseModel):
    """One comparison of the technique against one baseline on one metric, from this run."""

    metric: str = Field(description="Metric compared, a key of each variant's metrics.")
    baseline: str = Field(description="Variant name of the baseline.")
    technique: str = Field(description="Variant name of the technique.")
    better: Better = Field(description="Which direction of the raw metric is better.")
    kind: Kind = Field(description="measured (wall clock), counted (exact), modelled (from constants) or "
                                   "simulated (a simulator's clock).")
    baseline_value: float
    technique_value: float
    ratio: float = Field(description="Oriented ratio from this run (>1: technique wins); of medians when repeated.")
    range: tuple[float, float] | None = Field(None, description="Min and max of the ratio over the repeats.")
    repeats: int = Field(1, description="Samples behind each side's value.")
    paper: float | None = Field(None, description="The paper's claim, oriented the same way.")
    statement: str = ""
    assumptions: dict[str, Assumption] = Field(default_factory=dict, description="Constants behind a modelled or "
                                               "simulated ratio.")
    vs_strongest: "Ratio | None" = Field(None, description="Headline only: the technique against the best "
                                         "baseline variant of this run on the same metric.")

    @classmethod
    def of(cls, variants: dict[str, dict[str, float]], claim: Claim, kinds: dict[str, str],
           samples: dict[str, dict[str, list[float]]] | None = None,
           assumptions: dict[str, dict[str, Assumption]] | None = None) -> "Ratio":
        metric, base, tech = claim.metric, claim.baseline, claim.technique
        try:
            b, t = float(variants[base][metric]), float(variants[tech][metric])
        except KeyError as exc:
            raise ContractError(f"ratio {metric!r} needs variants {base!r} and {tech!r} with that metric; "
                                f"missing {exc}") from None
        kind = kinds.get(metric)
        if kind is None:
            raise ContractError(f"metric {metric!r} has no kind (measured, counted, modelled or simulated)")
        used = dict((assumptions or {}).get(metric, {}))
        if kind in ("modelled", "simulated") and not used:
            raise ContractError(f"{kind} metric {metric!r} lists no assumptions")
        bs = (samples or {}).get(base, {}).get(metric) or [b]
        ts = (samples or {}).get(tech, {}).get(metric) or [t]
        return cls(metric=metric, baseline=base, technique=tech, better=claim.better, kind=kind,
                   baseline_value=b, technique_value=t, ratio=oriented_ratio(b, t, claim.better),
                   range=_ratio_range(bs, ts, claim.better), repeats=min(len(bs), len(ts)),
                   paper=claim.paper, statement=claim.statement, assumptions=used)

    def label(self) -> str:
        spread = f", {self.range[0]:.2f}-{self.range[1]:.2f} over {self.repeats}" if self.range else ""
        return f"{self.ratio:.2f}x {self.kind}{spread}"


class ContractError(ValueError):
    """A system's result breaks the measurement contract (a missing kind, variant or assumption)."""


def _ratio_range(bs: list[float], ts: list[float], better: Better) -> tuple[float, float] | None:
    """Min-max of the ratio over repeats: pairwise when both sides were sampled together
    (interleaved), else over every pairing; None for a single sample."""
    if len(bs) < 2 and len(ts) < 2:
        return None
    pairs = zip(bs, ts) if len(bs) == len(ts) else ((b, t) for b in bs for t in ts)
    rs = [oriented_ratio(b, t, better) for b, t in pairs]
    return (min(rs), max(rs))


class Curve(BaseModel):
    """A series per variant, drawn as one panel of the report's plot."""

    title: str
    x_label: str
    y_label: str
    series: dict[str, tuple[list[float], list[float]]] = Field(description="variant -> (xs, ys)")
    log_y: bool = False


class Environment(BaseModel):
    device: str
    cores: int = Field(description="CPUs of the machine.")
    usable_cores: int = Field(0, description="CPUs this process may run on (its affinity mask).")
    platform: str
    versions: dict[str, str]
    git_sha: str
    git_dirty: bool | None = Field(None, description="Tracked files differed from the commit (None: no git).")
    code_hash: str = Field("", description="sha256 of the system's own code: systems/<name>/ (and any family "
                                           "package it uses), tasks/<name>.py, flows/<name>.py.")
    harness_hash: str = Field("", description="sha256 of the shared harness (systems/common, flows/tasks common, "
                                              "blocks, platform modules).")
    load_before: tuple[float, float, float] | None = Field(None, description="1/5/15-min load average at the start.")
    load_after: tuple[float, float, float] | None = Field(None, description="1/5/15-min load average at the end.")


class RunReport(BaseModel):
    system: str
    title: str
    paper: str
    scale: str
    run_id: str
    created_at: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat())
    parameters: dict[str, Any]
    variants: dict[str, dict[str, float]] = Field(description="variant -> metric -> value (median of the samples "
                                                  "where the metric was repeated)")
    metric_kinds: dict[str, Kind] = Field(description="metric -> measured | counted | modelled | simulated")
    samples: dict[str, dict[str, list[float]]] = Field(default_factory=dict, description="variant -> metric -> "
                                                       "every repeat's value, for repeated (timed) metrics")
    assumptions: dict[str, dict[str, Assumption]] = Field(default_factory=dict, description="modelled or simulated "
                                                          "metric -> the constants behind it")
    headline: Ratio
    ratios: list[Ratio] = Field(default_factory=list, description="The system's other claims, computed in this run.")
    curves: list[Curve] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list, description="Why numbers differ from the paper, etc.")
    deterministic_metrics: list[str] = Field(default_factory=list, description="Metrics that depend only on the "
                                             "parameters and seed, equal in every run with the same parameters.")
    environment: Environment
    wall_time_s: float

    def summary_markdown(self) -> str:
        h, s = self.headline, self.headline.vs_strongest
        lines = [
            f"# {self.title} ({self.system}, scale `{self.scale}`)",
            "",
            f"**Headline** {h.metric}: {h.technique} vs {h.baseline} = **{h.label()}** (paper: {_x(h.paper)}; "
            ">1 means the technique wins).",
        ]
        if s is not None:
            lines.append(f"Against the strongest baseline of this run, **{s.baseline}**: {s.label()}.")
        lines += ["", "| comparison | kind | baseline | technique | ratio | range | paper |",
                  "|---|---|---|---|---|---|---|"]
        for r in [h, *self.ratios]:
            spread = f"{r.range[0]:.2f}-{r.range[1]:.2f}" if r.range else ""
            lines.append(f"| {r.metric}: {r.technique} vs {r.baseline} | {r.kind} | {_fmt(r.baseline_value)} | "
                         f"{_fmt(r.technique_value)} | {r.ratio:.2f}x | {spread} | {_x(r.paper)} |")
        names = self.metric_names()
        lines += ["", "| variant | " + " | ".join(f"{m} ({self.metric_kinds.get(m, '?')})" for m in names) + " |",
                  "|---|" + "---|" * len(names)]
        for name, metrics in self.variants.items():
            lines.append(f"| {name} | " + " | ".join(_fmt(metrics.get(m)) for m in names) + " |")
        if self.assumptions:
            lines += ["", "**Assumptions** (modelled and simulated metrics)"]
            for metric, consts in self.assumptions.items():
                lines.append(f"- {metric}: " + "; ".join(f"{k} = {a.value}{(' ' + a.unit) if a.unit else ''} "
                                                         f"({a.source})" for k, a in consts.items()))
        if self.notes:
            lines += ["", "**Notes**", *[f"- {n}" for n in self.notes]]
        env = self.environment
        load = f", load {env.load_before[0]:.2f} -> {env.load_after[0]:.2f}" if env.load_before and env.load_after else ""
        lines += ["", f"Run `{self.run_id}` on {env.device}, {env.usable_cores or env.cores} usable cores{load}, "
                      f"git `{env.git_sha[:10]}`{' (dirty)' if env.git_dirty else ''}, code `{env.code_hash[:10]}`, "
                      f"wall time {self.wall_time_s:.1f} s."]
        return "\n".join(lines)

    def metric_names(self) -> list[str]:
        names: list[str] = []
        for metrics in self.variants.values():
            names += [m for m in metrics if m not in names]
        return names

    def table_rows(self) -> list[dict[str, str]]:
        """One row per claim, headline first, every number formatted: what the paper claims beside
        what this run measured, so the table reads left to right without scrolling."""
        rows = []
        for r in [self.headline, *self.ratios]:
            rows.append({
                "claim": f"{r.metric}: {r.technique} vs {r.baseline}" + (" (headline)" if r is self.headline else ""),
                "paper": _x(r.paper),
                "this run": f"{r.ratio:.2f}x",
                "kind": r.kind,
                "range": f"{r.range[0]:.2f}-{r.range[1]:.2f}x" if r.range else "",
                "baseline value": _fmt(r.baseline_value),
                "technique value": _fmt(r.technique_value),
                "vs strongest": f"{r.vs_strongest.ratio:.2f}x vs {r.vs_strongest.baseline}" if r.vs_strongest else "",
            })
        return rows

    def parameters_markdown(self) -> str:
        """The run's resolved parameters (preset of its scale plus overrides), as a markdown table."""
        lines = ["| parameter | value |", "|---|---|"]
        lines += [f"| {k} | `{v}` |" for k, v in self.parameters.items()]
        return "\n".join(lines)


def _fmt(v: float | None) -> str:
    return "" if v is None else f"{v:.4g}"


def _x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


@dataclass
class SystemResult:
    """What a system body computed. ``variants`` maps each variant (technique and baselines) to its
    metrics; ``kinds`` says what every metric is. A metric in ``samples`` was repeated (variants
    interleaved): the report keeps each sample and uses the median as the variant's value."""

    variants: dict[str, dict[str, float]]
    kinds: dict[str, Kind]
    samples: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    assumptions: dict[str, dict[str, Assumption]] = field(default_factory=dict)
    curves: list[Curve] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Metrics that depend only on the parameters and seed (counts, bytes, losses): equal in every
    # run with the same parameters, a worker fault included. None: the counted metrics (a modelled
    # or simulated one may rest on a constant measured in the run).
    deterministic: set[str] | None = None

    def medians(self) -> dict[str, dict[str, float]]:
        out = {v: dict(m) for v, m in self.variants.items()}
        for v, metrics in self.samples.items():
            for m, xs in metrics.items():
                if not xs:
                    raise ContractError(f"variant {v!r} metric {m!r} has no samples")
                out.setdefault(v, {})[m] = float(statistics.median(xs))
        return out

    def deterministic_metrics(self, variants: dict[str, dict[str, float]]) -> list[str]:
        names = {m for metrics in variants.values() for m in metrics}
        chosen = self.deterministic if self.deterministic is not None else \
            {m for m in names if self.kinds.get(m) == "counted"}
        return sorted(names & set(chosen))


def build_report(spec: SystemSpec, *, params: dict[str, Any], result: SystemResult, run_id: str,
                 environment: Environment, wall_time_s: float) -> RunReport:
    """The RunReport of one run: every claim of ``spec`` computed from ``result``, the headline with
    its ratio against the strongest baseline present. Raises ContractError on an unlabelled metric."""
    variants = result.medians()
    metrics = {m for ms in variants.values() for m in ms}
    unlabelled = sorted(metrics - set(result.kinds))
    if unlabelled:
        raise ContractError(f"{spec.name}: metrics without a kind: {', '.join(unlabelled)}")
    bad = {m: k for m, k in result.kinds.items() if k not in KINDS}
    if bad:
        raise ContractError(f"{spec.name}: unknown kinds {bad}; use one of {', '.join(KINDS)}")

    def ratio(claim: Claim) -> Ratio:
        return Ratio.of(variants, claim, result.kinds, result.samples, result.assumptions)

    head = spec.headline
    headline = ratio(head)
    rivals = [b for b in spec.baselines if head.metric in variants.get(b, {})]
    best = max(rivals, key=lambda b: oriented_ratio(1.0, variants[b][head.metric], head.better))
    headline.vs_strongest = ratio(Claim(head.metric, best, head.technique, head.better,
                                        statement=f"the strongest baseline of this run on {head.metric}"))
    kinds = {m: k for m, k in result.kinds.items() if m in metrics}
    return RunReport(system=spec.name, title=spec.title, paper=spec.paper, scale=str(params.get("scale")),
                     run_id=run_id, parameters=params, variants=variants, metric_kinds=kinds,
                     samples=result.samples, assumptions=result.assumptions, headline=headline,
                     ratios=[ratio(c) for c in spec.claims if not c.headline], curves=result.curves,
                     notes=result.notes, deterministic_metrics=result.deterministic_metrics(variants),
                     environment=environment, wall_time_s=wall_time_s)
