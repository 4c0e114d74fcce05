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

from . import formatting as fmt
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
                                         "deployable baseline variant of this run on the same metric (every "
                                         "baseline but oracles where the spec declares no roles).")
    vs_oracle: "Ratio | None" = Field(None, description="Headline only: the technique against the best baseline "
                                      "chosen in hindsight (role oracle): an upper bound, never the headline.")
    mechanism: "Ratio | None" = Field(None, description="Headline only: the technique against its ablation (only "
                                      "the paper's key mechanism removed) on the same metric.")

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
        return f"{fmt.ratio(self.ratio)} {self.kind}{spread}"


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


class RegimePoint(BaseModel):
    """The headline ratio at one value of the regime parameter, against the strongest deployable
    baseline at that value."""

    value: float
    ratio: float
    range: tuple[float, float] | None = None
    kind: Kind
    baseline: str = Field(description="The strongest deployable baseline at this value (the denominator).")
    repeats: int = 1


class RegimeReport(BaseModel):
    parameter: str
    unit: str = ""
    points: list[RegimePoint]
    crossover: float | None = Field(description="Where the ratio crosses 1 (linear between the two points "
                                                "around it): the technique stops (or starts) beating the "
                                                "strongest deployable baseline; None when it never crosses.")
    wins: str = Field(description="'above' or 'below' the crossover; 'between' or 'outside' the crossover and "
                                  "crossover_end; 'everywhere' or 'nowhere' in the range; 'mixed' (more crossings).")
    crossover_end: float | None = Field(None, description="Where the ratio crosses 1 again (wins 'between', "
                                                          "'outside' or 'mixed'); None with one crossing or none.")
    headline_value: float | None = Field(None, description="The parameter's value in the headline's workload.")
    paper_value: float | None = None
    paper_source: str = ""
    statement: str = ""


def regime_phrase(regime: dict | None) -> str:
    """A regime (a report's ``regime``, as JSON) in a few words: where the technique wins."""
    if not regime:
        return ""
    unit = f" {regime['unit']}" if regime.get("unit") else ""
    if regime["wins"] in ("everywhere", "nowhere"):
        lo, hi = regime["points"][0]["value"], regime["points"][-1]["value"]
        return f"wins {regime['wins']} over {regime['parameter']} {fmt.number(lo)}-{fmt.number(hi)}{unit}"
    if regime["wins"] in ("between", "outside", "mixed"):
        lo, hi = fmt.number(regime["crossover"], 3), fmt.number(regime["crossover_end"], 3)
        where = "wins between" if regime["wins"] == "between" else \
            "wins outside" if regime["wins"] == "outside" else "crosses 1 several times between"
        return f"{where} {regime['parameter']} = {lo} and {hi}{unit}"
    return f"wins {regime['wins']} {regime['parameter']} = {fmt.number(regime['crossover'], 3)}{unit}"


def v3_cells(report: dict) -> dict[str, str]:
    """Contract v3 of a report (as JSON), formatted for tables: the mechanism's ablation, the oracle,
    the regime and the projection ('' where the report has none)."""
    h = report["headline"]

    def vs(r):
        return f"{fmt.ratio(r['ratio'])} vs {r['baseline']}" if r else ""
    p = report.get("projection")
    return {"mechanism": vs(h.get("mechanism")), "oracle": vs(h.get("vs_oracle")),
            "regime": regime_phrase(report.get("regime")),
            "projection": f"{fmt.ratio(p['ratio'])} modelled" if p else ""}


# How each comparison of a report (as JSON) is named: (where it is, words after the baseline, words in brackets)
_ROLES = ((lambda r: r["headline"], "", "headline"),
          (lambda r: r["headline"].get("vs_strongest"), ", the strongest deployable baseline", ""),
          (lambda r: r["headline"].get("mechanism"), ", its ablation", "the mechanism alone"),
          (lambda r: r["headline"].get("vs_oracle"), ", the hindsight oracle", "an upper bound"),
          (lambda r: r.get("projection"), "", "projected at the paper's hardware"))


def claim_rows(report: dict) -> list[tuple[str, dict]]:
    """Every comparison of a report (as JSON) once, headline first, each with its name: the headline,
    the strongest deployable baseline, the mechanism's ablation, the oracle, the projection and the
    spec's other claims. A comparison reached twice (the strongest baseline is also a claim, or the
    headline's own baseline) is one row whose name says both."""
    candidates = [(where(report), after, label) for where, after, label in _ROLES]
    candidates += [(r, "", "") for r in report.get("ratios") or []]
    found: dict[tuple, tuple[dict, list[str], list[str]]] = {}
    for r, after, label in candidates:
        if not r:
            continue
        key = (r["metric"], r["baseline"], r["technique"], r["baseline_value"], r["technique_value"])
        _, afters, labels = found.setdefault(key, (r, [], []))
        afters += [after] if after and after not in afters else []
        labels += [label] if label and label not in labels else []
    return [(f"{r['metric']}: {r['technique']} vs {r['baseline']}" + "".join(afters)
             + (f" ({'; '.join(labels)})" if labels else ""), r) for r, afters, labels in found.values()]


def variant_tables(report: dict, width: int = 6) -> list[tuple[list[str], list[list[str]]]]:
    """A report's (as JSON) variants and metrics as (columns, rows) tables of at most ``width`` value
    columns: a row per metric and a column per variant, or a row per variant when there are more
    variants than metrics. Every value with its unit, at its metric's noise floor over all variants."""
    variants, kinds = report["variants"], report.get("metric_kinds", {})
    names = list(variants)
    metrics = list(dict.fromkeys(m for ms in variants.values() for m in ms))
    cells = {m: dict(zip(names, fmt.column(m, [variants[v].get(m) for v in names]))) for m in metrics}
    labels = {m: f"{m} ({kinds.get(m, '?')})" for m in metrics} | {v: v for v in names}
    by_metric = len(names) <= len(metrics)
    corner, row_keys, col_keys = ("metric (kind)", metrics, names) if by_metric else ("variant", names, metrics)
    tables = []
    for start in range(0, len(col_keys), width):
        cols = col_keys[start:start + width]
        rows = [[labels[r], *(cells[r][c] if by_metric else cells[c][r] for c in cols)] for r in row_keys]
        tables.append(([corner, *(labels[c] for c in cols)], rows))
    return tables


SMOKE_NOTE = ("Smoke run: a pipeline check on a tiny workload. Its ratios are not "
              "measurements of the technique; run at scale quick or full for those.")


def crossover(points: list[tuple[float, float]]) -> tuple[float | None, str, float | None]:
    """(where the ratio crosses 1, where the technique wins, where it crosses back) over (value, ratio)
    points, each crossing linearly interpolated. One crossing: wins 'above' or 'below' it. Two: wins
    'between' them, or 'outside' them. More: 'mixed' (the first and last crossing are given)."""
    pts = sorted(points)
    if all(r > 1 for _, r in pts):
        return None, "everywhere", None
    if all(r <= 1 for _, r in pts):
        return None, "nowhere", None
    xs = [x0 + (1 - r0) * (x1 - x0) / (r1 - r0) if r1 != r0 else x0
          for (x0, r0), (x1, r1) in zip(pts, pts[1:]) if (r0 > 1) != (r1 > 1)]
    starts_winning = pts[0][1] > 1
    if len(xs) == 1:
        return xs[0], "below" if starts_winning else "above", None
    if len(xs) == 2:
        return xs[0], "outside" if starts_winning else "between", xs[1]
    return xs[0], "mixed", xs[-1]
    if all(r <= 1 for _, r in pts):
        return None, "nowhere"
    for (x0, r0), (x1, r1) in zip(pts, pts[1:]):
        if (r0 > 1) != (r1 > 1):
            x = x0 + (1 - r0) * (x1 - x0) / (r1 - r0) if r1 != r0 else x0
            return x, "below" if r0 > 1 else "above"
    return None, "everywhere"


class Environment(BaseModel):
    device: str
    cores: int = Field(description="CPUs of the machine.")
    usable_cores: int = Field(0, description="CPUs this process may run on (its affinity mask).")
    platform: str
    versions: dict[str, str]
    git_sha: str
    git_dirty: bool | None = Field(None, description="Tracked code differed from the commit: files other than "
                                   "results, docs and generated outputs (None: no git).")
    dirty_files: list[str] = Field(default_factory=list, description="Those files: the code that ran is the "
                                   "commit's exactly when this is empty.")
    code_hash: str = Field("", description="sha256 of the system's own code: systems/<name>/ (and any family "
                                           "package it uses), tasks/<name>.py, flows/<name>.py.")
    harness_hash: str = Field("", description="sha256 of the shared harness (systems/common, flows/tasks common, "
                                              "blocks, platform modules).")
    load_before: tuple[float, float, float] | None = Field(None, description="1/5/15-min load average at the start.")
    load_after: tuple[float, float, float] | None = Field(None, description="1/5/15-min load average at the end.")
    distributed: list[dict[str, Any]] = Field(default_factory=list, description="Each launch of torch.distributed "
                                              "ranks in the run (ctx.ranks): world_size, backend, workers, devices, "
                                              "seconds.")


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
    roles: dict[str, list[str]] = Field(default_factory=dict, description="Baseline variant -> its roles: "
                                        "deployable, paper, oracle (contract v3).")
    regime: RegimeReport | None = Field(None, description="The headline ratio swept over the parameter that "
                                        "governs the effect, with its crossover (contract v3).")
    projection: Ratio | None = Field(None, description="The headline metric at the paper's hardware constants, "
                                     "modelled from this run's measured and counted quantities; never the headline.")
    notes: list[str] = Field(default_factory=list, description="Why numbers differ from the paper, etc.")
    deterministic_metrics: list[str] = Field(default_factory=list, description="Metrics that depend only on the "
                                             "parameters and seed, equal in every run with the same parameters.")
    environment: Environment
    wall_time_s: float

    def summary_markdown(self) -> str:
        h, s = self.headline, self.headline.vs_strongest
        lines = [f"# {self.title} ({self.system}, scale `{self.scale}`)", ""]
        if self.scale == "smoke":
            lines += [f"> **{SMOKE_NOTE}**", ""]
        lines.append(f"**Headline** {h.metric}: {h.technique} vs {h.baseline} = **{h.label()}** (paper: "
                     f"{fmt.ratio(h.paper)}; >1 means the technique wins).")
        if s is not None:
            lines.append(f"Against the strongest deployable baseline of this run, **{s.baseline}**: {s.label()}.")
        if h.mechanism is not None:
            lines.append(f"The paper's mechanism alone (technique vs **{h.mechanism.baseline}**, the ablation): "
                         f"{h.mechanism.label()}.")
        if h.vs_oracle is not None:
            lines.append(f"Against the hindsight oracle **{h.vs_oracle.baseline}** (an upper bound): {h.vs_oracle.label()}.")
        if self.regime is not None:
            lines.append(self.regime_sentence())
        if self.projection is not None:
            p = self.projection
            lines.append(f"Projection at the paper's hardware ({p.metric}, {p.technique} vs {p.baseline}): "
                         f"{p.label()}; constants under Assumptions.")
        lines += ["", "| comparison | kind | baseline | technique | ratio | range | paper |",
                  "|---|---|---|---|---|---|---|"]
        for name, r in claim_rows(self.model_dump(mode="json")):
            base, tech = fmt.column(r["metric"], [r["baseline_value"], r["technique_value"]])
            lines.append(f"| {name} | {r['kind']} | {base} | {tech} | {fmt.ratio(r['ratio'])} | "
                         f"{fmt.ratio_range(r.get('range'), r['kind'])} | {fmt.ratio(r.get('paper'))} |")
        lines += ["", *self.variants_markdown()]
        if self.assumptions:
            lines += ["", "**Assumptions** (modelled and simulated metrics)"]
            for metric, consts in self.assumptions.items():
                lines.append(f"- {metric}: " + "; ".join(f"{k} = {fmt.exact(a.value)}{(' ' + a.unit) if a.unit else ''} "
                                                         f"({a.source})" for k, a in consts.items()))
        if self.notes:
            lines += ["", "**Notes**", *[f"- {n}" for n in self.notes]]
        env = self.environment
        load = f", load {env.load_before[0]:.2f} -> {env.load_after[0]:.2f}" if env.load_before and env.load_after else ""
        lines += ["", f"Run `{self.run_id}` on {env.device}, {env.usable_cores or env.cores} usable cores{load}, "
                      f"git `{env.git_sha[:10]}`{' (dirty)' if env.git_dirty else ''}, code `{env.code_hash[:10]}`, "
                      f"wall time {self.wall_time_s:.1f} s."]
        return "\n".join(lines)

    def variants_markdown(self) -> list[str]:
        """Every variant's metrics as markdown tables narrow enough for a panel (``variant_tables``)."""
        lines: list[str] = []
        for columns, rows in variant_tables(self.model_dump(mode="json")):
            lines += [""] if lines else []
            lines += ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|",
                      *("| " + " | ".join(row) + " |" for row in rows)]
        return lines

    def regime_sentence(self) -> str:
        g = self.regime
        pts = ", ".join(f"{fmt.number(p.value)}: {fmt.ratio(p.ratio)}" for p in g.points)
        unit = f" {g.unit}" if g.unit else ""
        paper = f"; the paper's setting: {fmt.number(g.paper_value)}{unit}" if g.paper_value is not None else ""
        return (f"Regime over **{g.parameter}** (ratio against the strongest deployable baseline at each value: "
                f"{pts}): the technique {regime_phrase(g.model_dump())}{paper}.")

    def metric_names(self) -> list[str]:
        names: list[str] = []
        for metrics in self.variants.values():
            names += [m for m in metrics if m not in names]
        return names

    def table_rows(self) -> list[dict[str, str]]:
        """One row per comparison, headline first, each once (``claim_rows``), every number with its
        unit: what the paper claims beside what this run measured, narrow enough to read without
        scrolling."""
        rows = []
        for name, r in claim_rows(self.model_dump(mode="json")):
            base, tech = fmt.column(r["metric"], [r["baseline_value"], r["technique_value"]])
            rows.append({"claim": name, "paper": fmt.ratio(r.get("paper")), "this run": fmt.ratio(r["ratio"]),
                         "kind": r["kind"], "range": fmt.ratio_range(r.get("range"), r["kind"]),
                         "baseline value": base, "technique value": tech})
        return rows

    def table_description(self) -> str:
        """The table artifact's description: the headline in words; a smoke run says its ratios are
        not measurements."""
        h = self.headline
        text = f"{self.title}: {h.metric} {h.technique} vs {h.baseline} = {h.label()} (paper {fmt.ratio(h.paper)})"
        return f"{SMOKE_NOTE} {text}" if self.scale == "smoke" else text

    def parameters_markdown(self) -> str:
        """The run's resolved parameters (preset of its scale plus overrides), as a markdown table."""
        lines = ["| parameter | value |", "|---|---|"]
        lines += [f"| {k} | `{fmt.exact(v)}` |" for k, v in self.parameters.items()]
        return "\n".join(lines)


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
    # Contract v3: the headline metric swept over the spec's regime parameter, and the projection at
    # the paper's hardware where the spec declares hardware this machine lacks.
    regime: list["RegimeSample"] = field(default_factory=list)
    regime_headline_value: float | None = None
    projection: "Projection | None" = None

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


@dataclass
class RegimeSample:
    """One value of the regime parameter: every variant's samples of the headline metric there."""

    value: float
    samples: dict[str, list[float]]
    kind: Kind


@dataclass
class Projection:
    """The headline metric of the baseline and the technique at the paper's hardware constants,
    computed from this run's measured and counted quantities (kind ``modelled``)."""

    baseline_value: float
    technique_value: float
    assumptions: dict[str, Assumption]
    statement: str = ""


def _strongest(names, values: dict[str, float], better: Better) -> str:
    """The name among ``names`` whose value is best in the ``better`` direction."""
    return max(names, key=lambda n: oriented_ratio(1.0, values[n], better))


def _rivals(spec: SystemSpec, present) -> tuple[list[str], list[str]]:
    """(deployable baselines, oracles) among the variants ``present``. A spec that declares no roles
    yet: every baseline is taken as deployable."""
    deployable = [b for b in spec.baselines if b in present and
                  ("deployable" in spec.role(b) if spec.roles else "oracle" not in spec.role(b))]
    oracles = [b for b in spec.baselines if b in present and "oracle" in spec.role(b)]
    return deployable, oracles


def _regime(spec: SystemSpec, result: SystemResult) -> tuple[RegimeReport, Curve]:
    head = spec.headline
    points = []
    for sample in sorted(result.regime, key=lambda s: s.value):
        if head.technique not in sample.samples:
            raise ContractError(f"{spec.name}: regime point {sample.value:g} has no {head.technique!r} samples")
        med = {v: statistics.median(xs) for v, xs in sample.samples.items() if xs}
        deployable, _ = _rivals(spec, med)
        if not deployable:
            raise ContractError(f"{spec.name}: regime point {sample.value:g} has no deployable baseline")
        best = _strongest(deployable, med, head.better)
        bs, ts = sample.samples[best], sample.samples[head.technique]
        points.append(RegimePoint(value=sample.value, ratio=oriented_ratio(med[best], med[head.technique], head.better),
                                  range=_ratio_range(bs, ts, head.better), kind=sample.kind, baseline=best,
                                  repeats=min(len(bs), len(ts))))
    cross, wins, cross_end = crossover([(p.value, p.ratio) for p in points])
    r = spec.regime
    report = RegimeReport(parameter=r.parameter, unit=r.unit, points=points, crossover=cross, wins=wins,
                          crossover_end=cross_end,
                          headline_value=result.regime_headline_value, paper_value=r.paper_value,
                          paper_source=r.paper_source, statement=r.statement)
    xs = [p.value for p in points]
    series = {f"{head.technique} vs strongest deployable": (xs, [p.ratio for p in points]),
              "parity (1.0)": ([xs[0], xs[-1]], [1.0, 1.0])}
    if cross is not None:
        series["crossover"] = ([cross], [1.0])
    if r.paper_value is not None and head.paper is not None:
        series["paper's claim at its setting"] = ([r.paper_value], [head.paper])
    unit = f" ({r.unit})" if r.unit else ""
    return report, Curve(title=f"regime: {head.metric} ratio vs {r.parameter}", x_label=f"{r.parameter}{unit}",
                         y_label=f"{head.technique} / strongest deployable (>1 wins)", series=series)


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
    present = [v for v in variants if head.metric in variants[v]]
    deployable, oracles = _rivals(spec, present)
    at_metric = {v: variants[v][head.metric] for v in present}
    best = _strongest(deployable or [head.baseline], at_metric, head.better)
    headline.vs_strongest = ratio(Claim(head.metric, best, head.technique, head.better,
                                        statement=f"the strongest deployable baseline of this run on {head.metric}"))
    if oracles:
        top = _strongest(oracles, at_metric, head.better)
        headline.vs_oracle = ratio(Claim(head.metric, top, head.technique, head.better,
                                         statement=f"the best baseline chosen in hindsight on {head.metric}"))
    if spec.mechanism is not None and spec.mechanism.ablation in present:
        headline.mechanism = ratio(Claim(head.metric, spec.mechanism.ablation, head.technique, head.better,
                                         statement=f"only {spec.mechanism.name} removed"))
    curves, regime = list(result.curves), None
    if spec.regime is not None and result.regime:
        if len(result.regime) < 2:
            raise ContractError(f"{spec.name}: a regime needs at least 2 points (got {len(result.regime)})")
        regime, curve = _regime(spec, result)
        curves.append(curve)
    projection = None
    if result.projection is not None:
        pr = result.projection
        if not pr.assumptions:
            raise ContractError(f"{spec.name}: the projection lists no assumptions")
        projection = Ratio(metric=head.metric, baseline=head.baseline, technique=head.technique, better=head.better,
                           kind="modelled", baseline_value=pr.baseline_value, technique_value=pr.technique_value,
                           ratio=oriented_ratio(pr.baseline_value, pr.technique_value, head.better), paper=head.paper,
                           statement=pr.statement or f"at the paper's hardware ({', '.join(spec.hardware)})",
                           assumptions=pr.assumptions)
    kinds = {m: k for m, k in result.kinds.items() if m in metrics}
    return RunReport(system=spec.name, title=spec.title, paper=spec.paper, scale=str(params.get("scale")),
                     run_id=run_id, parameters=params, variants=variants, metric_kinds=kinds,
                     samples=result.samples, assumptions=result.assumptions, headline=headline,
                     ratios=[ratio(c) for c in spec.claims if not c.headline], curves=curves,
                     roles={b: list(r) for b, r in spec.roles.items()}, regime=regime, projection=projection,
                     notes=result.notes, deterministic_metrics=result.deterministic_metrics(variants),
                     environment=environment, wall_time_s=wall_time_s)
