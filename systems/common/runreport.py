"""The one RunReport schema every flow produces, and its parts (``report.py`` builds it from a
system's result; ``mlsys_flows.rendering`` turns it into markdown and tables).

Every ratio, the paper's value beside it, is oriented so that a value above 1 means the technique
beats the baseline (baseline time / technique time, technique throughput / baseline throughput).
"""
from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, Field

from mlsys_flows.errors import MlsysError

from .spec import ASSUMED, Better, Claim, Kind, Provenance


def oriented_ratio(baseline: float, technique: float, better: Better) -> float:
    """technique/baseline when higher is better, baseline/technique when lower is better."""
    num, den = (technique, baseline) if better == "higher" else (baseline, technique)
    if den == 0:
        return math.inf if num > 0 else float("nan")
    return num / den


class Assumption(BaseModel):
    """A constant that shapes a modelled, simulated or emulated number: its value and where it comes from."""

    value: float | str
    unit: str = ""
    source: str = Field(description="Where the value comes from: 'measured in this run', a datasheet, the paper.")



Outcome = Literal["wins", "loses", "ties"]


class Verdict(BaseModel):
    """What a comparison decides (contract v4; ``verdict.py`` computes it): ``wins`` or ``loses`` only
    when a 95% interval of the median paired ratio (order statistics) excludes 1 over enough
    independent pairs, or when the result is deterministic (``exact``); otherwise ``ties``."""

    outcome: Outcome
    ratio: float | None = Field(description="Median of the paired ratios (>1: the technique is better); the "
                                            "ratio itself when exact; None when a side is zero.")
    interval: tuple[float, float] | None = Field(None, description="95% interval of that median (the sign "
                                                 "test's, from order statistics); None when exact or when too "
                                                 "few pairs decide nothing.")
    pairs: int = Field(1, description="Independent pairs behind it.")
    exact: bool = Field(False, description="A deterministic result: no sampling error, no interval.")
    why: str = ""
    looks: int = Field(1, description="Planned looks of adaptive repeats: the interval is taken at "
                                      "1 - 0.05 / looks (1: a fixed count of repeats).")

    @property
    def undecidable(self) -> bool:
        """The run marked this comparison as deciding nothing (``report.undecided``: e.g. both sides at the
        floor a random agent reaches): its label reads 'no verdict', never a tie counted as a result."""
        return self.why.startswith("undecidable: ")

    def label(self) -> str:
        """``wins 1.12x (1.05-1.20, 8 pairs)``, ``ties 1.04x (3 pairs: fewer than 6)``, ``wins 1.30x (exact)``."""
        from .formatting import ratio

        if self.undecidable:
            return f"no verdict ({self.why.removeprefix('undecidable: ')})"
        if self.ratio is None:
            return f"{self.outcome} ({self.why})"
        if self.exact:
            return f"{self.outcome} {ratio(self.ratio)} (exact)"
        if self.interval is None:
            return f"{self.outcome} {ratio(self.ratio)} ({self.why})"
        lo, hi = self.interval
        return f"{self.outcome} {ratio(self.ratio)} ({ratio(lo).rstrip('x')}-{ratio(hi)}, {self.pairs} pairs)"

    def short(self) -> str:
        """The label without a free-text reason (``ties 1.04x``; the interval and pairs kept): a table
        cell that must stay narrow whatever the run said; the reason goes in a later column."""
        from .formatting import ratio

        if self.undecidable:
            return "no verdict"
        if self.ratio is None:
            return self.outcome
        if self.exact or self.interval is not None:
            return self.label()
        return f"{self.outcome} {ratio(self.ratio)}"


class Ratio(BaseModel):
    """One comparison of the technique against one baseline on one metric, from this run."""

    metric: str = Field(description="Metric compared, a key of each variant's metrics.")
    baseline: str = Field(description="Variant name of the baseline.")
    technique: str = Field(description="Variant name of the technique.")
    better: Better = Field(description="Which direction of the raw metric is better.")
    kind: Kind = Field(description="measured (wall clock), counted (exact), modelled (from constants), "
                                   "simulated (a simulator's clock) or emulated (injected sleeps, replayed delays).")
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
    verdict: Verdict | None = Field(None, description="What this comparison decides, with its interval (contract "
                                    "v4); None in a report made before it.")

    @classmethod
    def of(cls, variants: dict[str, dict[str, float]], claim: Claim, kinds: dict[str, str],
           samples: dict[str, dict[str, list[float]]] | None = None,
           assumptions: dict[str, dict[str, Assumption]] | None = None, *,
           deterministic: bool = False, independent: bool = True, looks: int = 1) -> "Ratio":
        """The comparison and its verdict: ``deterministic`` when the metric depends only on the
        parameters and seed, ``independent`` when the i-th samples of different i are independent."""
        from .verdict import judge
        metric, base, tech = claim.metric, claim.baseline, claim.technique
        try:
            b, t = float(variants[base][metric]), float(variants[tech][metric])
        except KeyError as exc:
            raise ContractError(f"ratio {metric!r} needs variants {base!r} and {tech!r} with that metric; "
                                f"missing {exc}") from None
        kind = kinds.get(metric)
        if kind is None:
            raise ContractError(f"metric {metric!r} has no kind (measured, counted, modelled, simulated or emulated)")
        used = dict((assumptions or {}).get(metric, {}))
        if kind in ASSUMED and not used:
            raise ContractError(f"{kind} metric {metric!r} lists no assumptions")
        bs = (samples or {}).get(base, {}).get(metric) or [b]
        ts = (samples or {}).get(tech, {}).get(metric) or [t]
        return cls(metric=metric, baseline=base, technique=tech, better=claim.better, kind=kind,
                   baseline_value=b, technique_value=t, ratio=oriented_ratio(b, t, claim.better),
                   range=_ratio_range(bs, ts, claim.better), repeats=min(len(bs), len(ts)),
                   paper=claim.paper, statement=claim.statement, assumptions=used,
                   verdict=judge(bs, ts, claim.better, deterministic=deterministic, independent=independent,
                                 looks=looks))


class ContractError(MlsysError, ValueError):
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
    hollow: list[str] = Field(default_factory=list, description="Series drawn as hollow markers without a line "
                                                                "(e.g. regime points where a side broke its constraint).")


class RegimePoint(BaseModel):
    """The headline ratio at one value of the regime parameter, against the strongest deployable
    baseline at that value."""

    value: float
    ratio: float
    range: tuple[float, float] | None = None
    kind: Kind
    baseline: str = Field(description="The strongest deployable baseline at this value (the denominator).")
    repeats: int = 1
    verdict: Verdict | None = Field(None, description="What this point decides (contract v4).")
    valid: bool = Field(True, description="Both sides met their declared constraint here (accuracy target, error "
                                          "bound, SLO attainment); the crossover uses valid points only.")
    invalid: str = Field("", description="Which side broke which constraint, when not valid.")


class RegimeReport(BaseModel):
    parameter: str
    unit: str = ""
    points: list[RegimePoint]
    crossover: float | None = Field(description="Where the ratio crosses 1 (linear between the two points "
                                                "around it): the technique stops (or starts) beating the "
                                                "strongest deployable baseline; None when it never crosses.")
    wins: str = Field(description="'above' or 'below' the crossover; 'between' or 'outside' the crossover and "
                                  "crossover_end; 'everywhere' or 'nowhere' in the range; 'mixed' (more crossings); "
                                  "'undecided' when fewer than 2 points are valid.")
    crossover_end: float | None = Field(None, description="Where the ratio crosses 1 again (wins 'between', "
                                                          "'outside' or 'mixed'); None with one crossing or none.")
    headline_value: float | None = Field(None, description="The parameter's value in the headline's workload.")
    paper_value: float | None = None
    operating_point_reason: str = Field("", description="Why the headline is not measured at the paper's value "
                                        "(contract v4): it is unreachable here, and which reachable point stands in.")
    paper_source: str = ""
    statement: str = ""


class ConstraintCheck(BaseModel):
    """Whether one variant met the headline's declared constraint (contract v4, issue 47)."""

    variant: str
    value: float = Field(description="Its value of the constraint's metric (the median where sampled).")
    reference: float = Field(description="What it was held to: the absolute bound, or (a relative constraint) the "
                                         "technique's value for a baseline, the compared baseline's for the technique.")
    met: bool = Field(description="A deployable baseline: unless its median misses the reference (beyond the "
                                  "tolerance) and, where the metric was sampled per repeat or seed, most of its "
                                  "pairs miss it too (an established shortfall); the technique: its median meets it "
                                  "and so do most of its pairs (the doubt goes against the technique).")
    pairs: int = Field(0, description="Pairs (repeats or seeds) judged one by one; 0: one value only.")
    pairs_met: int = Field(0, description="Of those, the pairs in which it met the reference.")
    why: str = Field("", description="Which way it broke the constraint, in words ('' where met).")


class ConstraintReport(BaseModel):
    """The constraint the headline's comparison against the strongest deployable baseline is held to
    (``SystemSpec.constraint``), and who met it: a deployable baseline that broke it is not a candidate
    for ``vs_strongest``; where every one broke it, ``vs_strongest`` is the headline's baseline and
    ``fallback`` says why and the verdict is a tie; the technique breaking it makes a win a tie."""

    metric: str
    better: Better
    bound: float | None = Field(None, description="The absolute bound; None: relative to the technique's value.")
    tolerance: float = 0.0
    statement: str = ""
    technique: ConstraintCheck = Field(description="The technique: against the absolute bound, or (relative) "
                                                   "against the baseline of vs_strongest.")
    baselines: list[ConstraintCheck] = Field(default_factory=list, description="Every deployable baseline present.")
    excluded: list[str] = Field(default_factory=list, description="Deployable baselines that broke the constraint, "
                                                                  "left out of the candidates for vs_strongest.")
    fallback: str = Field("", description="Why vs_strongest is the headline's baseline although it broke the "
                                          "constraint (every deployable baseline did); '' otherwise.")
    baseline: str = Field("", description="The baseline of vs_strongest ('' in a report made before the field).")
    baseline_check: ConstraintCheck | None = Field(None, description="That baseline's check.")
    pairs: int | None = Field(None, description="Pairs of vs_strongest (repeats or seeds); None: the constraint's "
                                                "metric was not sampled per pair on both sides (medians only).")
    pairs_standing: int | None = Field(None, description="Of those, the pairs where both sides met the constraint: "
                                                         "the only ones vs_strongest's verdict (and the headline's "
                                                         "own) is judged over, with those where the technique "
                                                         "broke it and was behind (losses); fewer than 6 counted "
                                                         "decide nothing.")
    pairs_counted: int | None = Field(None, description="The pairs the verdict counted: the standing ones and those "
                                                        "where the technique broke the constraint and was behind.")

    def sentence(self) -> str:
        """The constraint, both compared sides' values and who broke it, in words (the rendered report and docs)."""
        tol = f" (tolerance {self.tolerance:g})" if self.tolerance else ""
        at = "at least" if self.better == "higher" else "at most"
        held = (f"{self.metric} {at} {self.bound:g}{tol}" if self.bound is not None else
                f"{self.metric} {at} the technique's{tol}")
        out = [f"Compared at the constraint {held}"]
        if self.excluded:
            out.append("left out of the strongest deployable baseline, having broken it: " + "; ".join(
                f"{c.variant} ({c.why})" for c in self.baselines if c.variant in self.excluded))
        else:
            out.append("every deployable baseline met it")
        text = ": ".join(out) + "."
        if self.baseline:
            b = self.baseline_check
            text += (f" {self.metric} (median): {self.technique.variant} {self.technique.value:.4g}, "
                     f"{self.baseline} {b.value:.4g}" if b is not None else "") + "."
        if self.pairs is not None:
            extra = (self.pairs_counted or 0) - self.pairs_standing
            text += (f" The verdict is over the {self.pairs_standing} of {self.pairs} pairs where both sides met it"
                     + (f" and {extra} where the technique broke it and was behind (losses)" if extra > 0 else "")
                     + (" (fewer than 6: a tie)" if (self.pairs_counted or self.pairs_standing) < 6 else "") + ".")
        if self.fallback:
            text += f" {self.fallback}"
        if not self.technique.met:
            text += (f" The technique broke it ({self.technique.why}): no win at the constraint (a loss stays a "
                     "loss).")
        return text


class ComponentReport(BaseModel):
    """A component the verdict rests on and where it comes from (the spec's Component)."""
    name: str
    provenance: Provenance = Field(description="learned (trained on data), packaged (a library's implementation) "
                                   "or scripted (written by this project)")
    statement: str = ""


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
    repeats: dict[str, Any] | None = Field(None, description="Adaptive repeats (contract v4): how many ran, the "
                                           "planned looks and why they stopped (decided, maximum, budget); None: "
                                           "a fixed count.")
    metric_kinds: dict[str, Kind] = Field(description="metric -> measured | counted | modelled | simulated | emulated")
    samples: dict[str, dict[str, list[float]]] = Field(default_factory=dict, description="variant -> metric -> "
                                                       "every repeat's value, for repeated (timed) metrics")
    assumptions: dict[str, dict[str, Assumption]] = Field(default_factory=dict, description="modelled, simulated "
                                                          "or emulated metric -> the constants behind it (for emulated: "
                                                          "what the injected delay stands for, and its source)")
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
    constraint: ConstraintReport | None = Field(None, description="The constraint the headline's comparison with "
                                                "the strongest deployable baseline is held to, and who broke it (issue "
                                                "47); None: the spec declares none, or a report made before it.")
    components: list[ComponentReport] = Field(default_factory=list, description="The components the verdict rests "
                                              "on, each learned, packaged or scripted by the project (issue 50); "
                                              "empty: the spec declares none, or a report made before it.")
    deterministic_metrics: list[str] = Field(default_factory=list, description="Metrics that depend only on the "
                                             "parameters and seed, equal in every run with the same parameters.")
    environment: Environment
    wall_time_s: float

    def verdict(self) -> "Verdict | None":
        """The verdict shown first everywhere: the headline's technique against the strongest deployable
        baseline of this run (None in a report made before contract v4)."""
        vs = self.headline.vs_strongest or self.headline
        return vs.verdict

    def metric_names(self) -> list[str]:
        names: list[str] = []
        for metrics in self.variants.values():
            names += [m for m in metrics if m not in names]
        return names

