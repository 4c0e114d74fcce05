"""What a system hands the harness (``SystemResult``, its regime samples and projection) and how
the harness turns it into the RunReport (``build_report``): every claim of the spec computed, the
headline against the strongest deployable baseline, its oracle and ablation, the regime's crossover.
The schema itself is ``runreport.py``."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import BaseModel

from .runreport import (Assumption, ComponentReport, ConstraintCheck, ConstraintReport, ContractError, Curve, Environment, Ratio,
                        RegimePoint, RegimeReport, RunReport, Verdict, _ratio_range, oriented_ratio)
from .spec import KINDS, Better, Claim, Constraint, Kind, SystemSpec
from .verdict import MIN_PAIRS, against_strongest, judge

__all__ = ["Assumption", "ContractError", "Curve", "Projection", "RegimeSample", "SystemResult", "build_report",
           "claim_key", "crossover", "oriented_ratio", "param_assumptions", "undecided"]


def claim_key(technique: str, baseline: str) -> str:
    """The key of a comparison in ``SystemResult.undecidable``."""
    return f"{technique} vs {baseline}"


def undecided(r: "Ratio", why: str) -> "Ratio":
    """``r`` with the verdict of a comparison that decides nothing in this run (``why``): outcome ties,
    no ratio, and a ``why`` starting 'undecidable: ' (its label reads 'no verdict (...)')."""
    r.statement = f"undecidable: {why} ({r.statement})" if r.statement else f"undecidable: {why}"
    r.verdict = Verdict(outcome="ties", ratio=None, pairs=r.verdict.pairs if r.verdict else 0,
                        why=f"undecidable: {why}")
    return r


def param_assumptions(params: BaseModel, *names: str) -> dict[str, Assumption]:
    """Parameters that act as constants of a model, each with its description as the source."""
    fields = type(params).model_fields
    return {n: Assumption(value=getattr(params, n), source=f"parameter {n}: {fields[n].description}") for n in names}



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


@dataclass
class SystemResult:
    """What a system's pure package assembled from its tasks' outputs. ``variants`` maps each variant
    (technique and baselines) to its metrics; the spec declares what every metric is (``kinds`` here
    overrides a metric whose kind this run's parameters decide). A metric in ``samples`` was repeated
    (variants interleaved): the report keeps each sample and uses the median as the variant's value."""

    variants: dict[str, dict[str, float]]
    kinds: dict[str, Kind] = field(default_factory=dict)
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
    # Contract v4: the metrics (and "regime" for the regime's points) whose values this run took over
    # an injected cost (a sleep, a replayed delay) -> what it emulates. Such a value is never measured.
    emulated: dict[str, str] = field(default_factory=dict)
    # Contract v4: ``AdaptiveRepeats.summary()`` when the repeats adapted (systems/common/repeats.py);
    # every sampled verdict is then judged at the level of its planned looks.
    repeats: dict[str, Any] | None = None
    # Issue 50: the comparisons of the run that decide nothing: ``claim_key(technique, baseline)`` -> why it decides nothing
    # here (e.g. both sides at or below the floor a random agent reaches, so a 0-vs-0 "tie" measures
    # nothing). Each such ratio (a claim, the headline, its strongest baseline, the mechanism) keeps its
    # value with the undecided verdict (``undecided``), never a win, a loss or a tie counted as a result.
    undecidable: dict[str, str] = field(default_factory=dict)

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
    # Contract v4: whether the technique and the baseline it is compared with both met their declared
    # constraint here (accuracy target, error bound, SLO attainment); ``invalid`` says who broke which.
    valid: bool = True
    invalid: str = ""
    # Contract v4: what this point's values took as an injected cost (a sleep, a replayed delay);
    # such a point is never ``measured``. Empty: none.
    emulated: str = ""
    # Why this point decides nothing (e.g. fixed costs swamp the effect being measured): its verdict is
    # 'no verdict (...)', never a win, a loss or a tie counted as a result, and it stays out of the crossover.
    # Empty: it decides as its samples say.
    undecidable: str = ""


@dataclass
class Projection:
    """The headline metric of the baseline and the technique at the paper's hardware constants,
    computed from this run's measured and counted quantities (kind ``modelled``)."""

    baseline_value: float
    technique_value: float
    assumptions: dict[str, Assumption]
    statement: str = ""


INVALID_SERIES = "a side broke its constraint (not in the crossover)"


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


def _constraint_check(spec: SystemSpec, c: Constraint, bound: float | None, tolerance: float, variant: str,
                      other: str, variants: dict[str, dict[str, float]],
                      samples: dict[str, dict[str, list[float]]], *, baseline: bool) -> ConstraintCheck:
    """Whether ``variant`` met constraint ``c``: held to the absolute ``bound``, or (``bound`` None, a
    relative constraint) to ``other``'s value, within ``tolerance``. Judged on the medians and, where
    the constraint's metric was sampled per repeat or seed (against ``other``'s samples of the same
    length where relative), per pair. The doubt goes against the technique: a ``baseline`` broke it
    only on an established shortfall (its median misses AND most of its pairs miss: one noisy pair or a
    median at the edge does not drop an equal baseline); the technique met it only where its median does
    and most of its pairs do."""
    try:
        value = float(variants[variant][c.metric])
        reference = float(bound if bound is not None else variants[other][c.metric])
    except KeyError as exc:
        raise ContractError(f"{spec.name}: the declared constraint's metric {c.metric!r} is missing for {exc}: "
                            "every compared variant must report it") from None
    xs = samples.get(variant, {}).get(c.metric) or []
    if bound is not None:
        refs = [bound] * len(xs)
    else:  # pair i of the variant with pair i of the other side
        ys = samples.get(other, {}).get(c.metric) or []
        refs = list(ys) if len(ys) == len(xs) else []
    refs = refs if len(xs) >= 2 else []
    pairs = len(refs)
    pairs_met = sum(c.meets(x, r, tolerance) for x, r in zip(xs, refs))
    median_met = c.meets(value, reference, tolerance)
    most_missed = bool(pairs) and 2 * (pairs - pairs_met) > pairs
    most_met = not pairs or 2 * pairs_met > pairs
    met = (median_met or (bool(pairs) and not most_missed)) if baseline else (median_met and most_met)
    why = ""
    against = f"the bound {reference:.4g}" if bound is not None else f"{other}'s {reference:.4g}"
    if not met and not median_met:
        why = (f"{c.metric} {value:.4g} {'below' if c.better == 'higher' else 'above'} {against}"
               + (f" by more than the tolerance {tolerance:g}" if tolerance else "")
               + (f"; met in {pairs_met} of {pairs} pairs" if pairs else ""))
    elif not met:
        why = (f"{c.metric} {value:.4g} (median) meets {against}" + (" within the tolerance" if tolerance else "")
               + f", but only {pairs_met} of {pairs} pairs do")
    return ConstraintCheck(variant=variant, value=value, reference=reference, met=met, pairs=pairs,
                           pairs_met=pairs_met, why=why)


def _standing(c: Constraint, bound: float | None, tolerance: float, claim: Claim,
              samples: dict[str, dict[str, list[float]]]) -> tuple[list[int], int, int] | None:
    """The pairs (repeat or seed indices) of ``claim``'s technique against its baseline that count at
    the constraint: those where BOTH met it (against the bound, or, relative, each within the tolerance
    of the other's value in that pair), and those where the baseline met it and the technique broke it
    yet was behind on the claim's metric too (behind on both: a loss, never a win). A pair where the
    technique broke it and was ahead, or where the baseline broke it, is dropped. Returns (the pairs
    counted, how many pairs there were, how many of them both sides met); None where the constraint's
    metric was not sampled per pair on both sides (then only the medians are judged)."""
    xs = samples.get(claim.technique, {}).get(c.metric) or []
    ys = samples.get(claim.baseline, {}).get(c.metric) or []
    if len(xs) != len(ys) or len(xs) < 2:
        return None
    ts = samples.get(claim.technique, {}).get(claim.metric) or []
    bs = samples.get(claim.baseline, {}).get(claim.metric) or []
    keep, both = [], 0
    for i, (x, y) in enumerate(zip(xs, ys)):
        tech_met = c.meets(x, bound if bound is not None else y, tolerance)
        base_met = c.meets(y, bound if bound is not None else x, tolerance)
        if tech_met and base_met:
            keep.append(i)
            both += 1
        elif base_met and len(ts) == len(bs) == len(xs) and oriented_ratio(bs[i], ts[i], claim.better) < 1:
            keep.append(i)
    return keep, len(xs), both


def _only(samples: dict[str, dict[str, list[float]]], keep: list[int], n: int) -> dict[str, dict[str, list[float]]]:
    """``samples`` with every list of the paired length ``n`` cut to the pairs ``keep`` (they stay aligned)."""
    return {v: {m: [xs[i] for i in keep] if len(xs) == n else list(xs) for m, xs in ms.items()}
            for v, ms in samples.items()}


def _stood(verdict: Verdict, keep: list[int], n: int, both: int) -> Verdict:
    """``verdict`` over the pairs counted at the constraint only, saying how many stood; fewer than the
    minimum decide nothing."""
    said = f"{both} of {n} pairs stand at the constraint (both sides met it)" + (
        f", {len(keep) - both} more counted where the technique broke it and was behind (losses)"
        if len(keep) > both else "")
    if len(keep) == n and both == n:
        return verdict
    if not keep:  # short: the label is a table cell the UI never wraps (the counts are in the constraint)
        return Verdict(outcome="ties", ratio=None, pairs=0, why=f"no pair of {n} met the constraint")
    if len(keep) < MIN_PAIRS and not verdict.exact:
        return verdict.model_copy(update={"outcome": "ties", "pairs": len(keep),
                                          "why": f"{said}: fewer than {MIN_PAIRS}, a tie"})
    return verdict.model_copy(update={"why": f"{verdict.why}; {said}" if verdict.why else said})


def _held(verdict: Verdict, baseline_broke: str, technique_broke: str) -> Verdict:
    """``verdict`` where a side of its comparison broke the declared constraint (each: who and how, ''
    where it met it). A side that broke it gains nothing from the comparison (REVIEW.md 3): a baseline
    that broke it (the fallback) decides nothing, a tie whatever the samples say; the technique breaking
    it turns a win into a tie and leaves a loss a loss (it is behind on both). The outcome the samples
    gave is kept in ``why``."""
    broke = [b for b in (baseline_broke, technique_broke) if b]
    if not broke:
        return verdict
    tie = bool(baseline_broke) or verdict.outcome == "wins"
    said = f"the samples say {verdict.outcome}" + (f" ({verdict.why})" if verdict.why else "")
    outcome = "ties" if tie else verdict.outcome
    return verdict.model_copy(update={"outcome": outcome,
                                      "why": f"{said}, but {' and '.join(broke)}" +
                                             (": behind on both, a loss" if outcome == "loses" else
                                              ": not a comparison at the constraint")})


def _regime(spec: SystemSpec, result: SystemResult, deterministic: set[str]) -> tuple[RegimeReport, Curve]:
    head = spec.headline
    independent = spec.pairing != "turns"
    looks = (result.repeats or {}).get("looks", 1)  # a point may reuse the headline's adaptive samples
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
        verdict = against_strongest({b: sample.samples[b] for b in deployable}, best, ts, head.better,
                                    deterministic=head.metric in deterministic, independent=independent, looks=looks)
        if sample.undecidable:  # the run says this point decides nothing: no verdict, whatever the samples say
            verdict = Verdict(outcome="ties", ratio=None, pairs=verdict.pairs,
                              why=f"undecidable: {sample.undecidable} (the samples say {verdict.label()})")
        points.append(RegimePoint(value=sample.value, ratio=oriented_ratio(med[best], med[head.technique], head.better),
                                  range=_ratio_range(bs, ts, head.better), kind=sample.kind, baseline=best,
                                  repeats=min(len(bs), len(ts)), valid=sample.valid, invalid=sample.invalid,
                                  verdict=verdict))
    valid = [p for p in points if p.valid]
    # the crossover rests on points whose verdict decides: a tie says nothing about which side of 1 the
    # ratio is on, and one decided point says nothing about where it crosses
    decided = [p for p in valid if p.verdict is not None and p.verdict.outcome != "ties"]
    if len(decided) >= 2:
        cross, wins, cross_end = crossover([(p.value, p.ratio) for p in decided])
    else:
        cross, wins, cross_end = None, "undecided", None
    r = spec.regime
    at_paper = r.paper_value is None or (result.regime_headline_value is not None and math.isclose(
        result.regime_headline_value, r.paper_value, rel_tol=1e-6, abs_tol=1e-12))
    if not at_paper and not r.operating_point_reason:
        raise ContractError(f"{spec.name}: the headline is measured at {r.parameter} = {result.regime_headline_value}, "
                            f"not at the paper's {r.paper_value:g}; the spec's regime must say why "
                            "(operating_point_reason) and which reachable point stands in")
    # a point measured (or counted) at the paper's value shows it is reachable; a modelled or simulated
    # one does not (it may stand in for hardware this machine lacks)
    if not at_paper and any(math.isclose(p.value, r.paper_value, rel_tol=1e-6, abs_tol=1e-12)
                            and p.kind in ("measured", "counted") for p in points):
        raise ContractError(f"{spec.name}: the paper's {r.parameter} = {r.paper_value:g} is reachable (a regime point "
                            "was measured there): measure the headline there")
    report = RegimeReport(parameter=r.parameter, unit=r.unit, points=points, crossover=cross, wins=wins,
                          crossover_end=cross_end,
                          headline_value=result.regime_headline_value, paper_value=r.paper_value,
                          paper_source=r.paper_source, statement=r.statement,
                          operating_point_reason=""
                          if at_paper and r.paper_value is not None else r.operating_point_reason)
    xs = [p.value for p in points]
    series = {f"{head.technique} vs strongest deployable": ([p.value for p in valid], [p.ratio for p in valid]),
              "parity (1.0)": ([xs[0], xs[-1]], [1.0, 1.0])}
    hollow = []
    if len(valid) < len(points):
        broken = [p for p in points if not p.valid]
        series[INVALID_SERIES] = ([p.value for p in broken], [p.ratio for p in broken])
        hollow.append(INVALID_SERIES)
    if cross is not None:
        series["crossover"] = ([cross], [1.0])
    if r.paper_value is not None and head.paper is not None:
        series["paper's claim at its setting"] = ([r.paper_value], [head.paper])
    unit = f" ({r.unit})" if r.unit else ""
    return report, Curve(title=f"regime: {head.metric} ratio vs {r.parameter}", x_label=f"{r.parameter}{unit}",
                         y_label=f"{head.technique} / strongest deployable (>1 wins)", series=series, hollow=hollow)


def _check_emulated(spec: SystemSpec, result: SystemResult) -> None:
    """A value taken over an injected cost is ``emulated`` (or modelled/simulated on top), never measured."""
    def measured(m: str) -> bool:
        if m == "regime":
            return any(p.kind == "measured" for p in result.regime)
        return result.kinds.get(m) == "measured"

    wrong = sorted(m for m in result.emulated if measured(m))
    points = [p for p in result.regime if p.emulated and p.kind == "measured"]
    if points:
        raise ContractError(f"{spec.name}: regime point(s) {', '.join(f'{p.value:g}' for p in points)} took an "
                            f"injected cost ({points[0].emulated}) and are labelled measured; label them emulated")
    if wrong:
        raise ContractError(f"{spec.name}: {', '.join(wrong)} took an injected cost ("
                            + "; ".join(result.emulated[m] for m in wrong) + ") and are labelled measured; "
                            "label them emulated")


def build_report(spec: SystemSpec, *, params: dict[str, Any], result: SystemResult, run_id: str,
                 environment: Environment, wall_time_s: float) -> RunReport:
    """The RunReport of one run: every claim of ``spec`` computed from ``result``, the headline with
    its ratio against the strongest baseline present. Raises ContractError on an unlabelled metric."""
    variants = result.medians()
    metrics = {m for ms in variants.values() for m in ms}
    # a run may make a declared kind weaker (a replayed model is emulated), never measured or counted:
    # those would let an injected cost pass as work done, or a timing as deterministic
    upgraded = sorted(m for m, k in result.kinds.items()
                      if m in spec.kinds and k != spec.kinds[m] and k in ("measured", "counted"))
    if upgraded:
        raise ContractError(f"{spec.name}: the result relabels {', '.join(upgraded)} {result.kinds[upgraded[0]]} "
                            f"(the spec declares {spec.kinds[upgraded[0]]}); a run may only weaken a kind")
    unknown = sorted(set(result.emulated) - metrics - {"regime"})
    if unknown:
        raise ContractError(f"{spec.name}: emulated names no metric of this run: {', '.join(unknown)}")
    result = replace(result, kinds={**spec.kinds, **result.kinds})
    unlabelled = sorted(metrics - set(result.kinds))
    if unlabelled:
        raise ContractError(f"{spec.name}: metrics without a kind: {', '.join(unlabelled)}")
    bad = {m: k for m, k in result.kinds.items() if k not in KINDS}
    if bad:
        raise ContractError(f"{spec.name}: unknown kinds {bad}; use one of {', '.join(KINDS)}")
    _check_emulated(spec, result)

    deterministic = set(result.deterministic_metrics(variants))

    def ratio(claim: Claim) -> Ratio:
        r = Ratio.of(variants, claim, result.kinds, result.samples, result.assumptions,
                     deterministic=claim.metric in deterministic, independent=spec.pairing != "turns",
                     looks=(result.repeats or {}).get("looks", 1))
        why = result.undecidable.get(claim_key(claim.technique, claim.baseline))
        return undecided(r, why) if why else r

    head = spec.headline
    c = spec.constraint  # contract v4 (issue 47): the declared constraint (None: none)
    bound = tol = None
    if c is not None:
        try:
            bound, tol = c.resolve(params, spec.params)
        except ValueError as exc:
            raise ContractError(f"{spec.name}: {exc}") from None

    def held_ratio(claim: Claim) -> tuple[Ratio, tuple[list[int], int, int] | None]:
        """The claim's ratio; where a constraint is declared and sampled per pair on both sides, its
        range, repeats and verdict over only the pairs counted at it (``_standing``: a pair where the
        technique broke it never counts as a win)."""
        st = _standing(c, bound, tol, claim, result.samples) if c is not None else None
        if st is None:
            return ratio(claim), None
        keep, n, both = st
        r = Ratio.of(variants, claim, result.kinds, _only(result.samples, keep, n) if keep else {},
                     result.assumptions, deterministic=claim.metric in deterministic,
                     independent=spec.pairing != "turns", looks=(result.repeats or {}).get("looks", 1))
        r.verdict = _stood(r.verdict, keep, n, both) if r.verdict is not None else None
        why = result.undecidable.get(claim_key(claim.technique, claim.baseline))
        return (undecided(r, why) if why else r), st

    headline, _ = held_ratio(head)
    present = [v for v in variants if head.metric in variants[v]]
    deployable, oracles = _rivals(spec, present)
    at_metric = {v: variants[v][head.metric] for v in present}
    rivals = deployable or [head.baseline]
    constraint = None
    baseline_broke = technique_broke = ""
    checks: list[ConstraintCheck] = []
    excluded: list[str] = []
    fallback = ""
    if c is not None:  # the strongest among the baselines that met the constraint
        checks = [_constraint_check(spec, c, bound, tol, b, head.technique, variants, result.samples, baseline=True)
                  for b in rivals]
        excluded = [k.variant for k in checks if not k.met]
        rivals = [k.variant for k in checks if k.met]
        if not rivals:
            rivals = [head.baseline]
            k = next((k for k in checks if k.variant == head.baseline), None) or \
                _constraint_check(spec, c, bound, tol, head.baseline, head.technique, variants, result.samples,
                                  baseline=True)
            fallback = (f"Every deployable baseline broke the constraint: the strongest falls back to the headline's "
                        f"baseline, {head.baseline}" + (f", which broke it ({k.why}), and its verdict decides "
                                                        "nothing at the constraint" if not k.met else "") + ".")
            if not k.met:
                baseline_broke = f"{head.baseline} broke the constraint ({k.why})"
    best = _strongest(rivals, at_metric, head.better)
    what = " that met the constraint" if c is not None and not fallback else ""
    strongest_claim = Claim(head.metric, best, head.technique, head.better,
                            statement=f"the strongest deployable baseline{what} of this run on {head.metric}")
    headline.vs_strongest, st = held_ratio(strongest_claim)
    keep, n, both = st if st is not None else (None, 0, 0)
    if len(rivals) > 1:  # chosen as the best of several on this run's data: judged as such
        pool = _only(result.samples, keep, n) if keep else result.samples

        def samples_of(v: str) -> list[float]:
            return pool.get(v, {}).get(head.metric) or [variants[v][head.metric]]

        if keep is None or keep:
            headline.vs_strongest.verdict = against_strongest(
                {b: samples_of(b) for b in rivals}, best, samples_of(head.technique), head.better,
                deterministic=head.metric in deterministic, independent=spec.pairing != "turns",
                looks=(result.repeats or {}).get("looks", 1))
        if keep is not None:
            headline.vs_strongest.verdict = _stood(headline.vs_strongest.verdict, keep, n, both)
        why = result.undecidable.get(claim_key(head.technique, best))
        if why:
            undecided(headline.vs_strongest, why)
    if c is not None:
        tech = _constraint_check(spec, c, bound, tol, head.technique, best, variants, result.samples, baseline=False)
        if not tech.met:
            technique_broke = f"{head.technique} broke the constraint ({tech.why})"
        chosen = next((k for k in checks if k.variant == best), None) or \
            _constraint_check(spec, c, bound, tol, best, head.technique, variants, result.samples, baseline=True)
        constraint = ConstraintReport(metric=c.metric, better=c.better, bound=bound, tolerance=tol,
                                      statement=c.statement, technique=tech, baselines=checks, excluded=excluded,
                                      fallback=fallback, baseline=best, baseline_check=chosen,
                                      pairs=n if keep is not None else None,
                                      pairs_standing=both if keep is not None else None,
                                      pairs_counted=len(keep) if keep is not None else None)
    if headline.vs_strongest.verdict is not None:
        headline.vs_strongest.verdict = _held(headline.vs_strongest.verdict, baseline_broke, technique_broke)
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
        regime, curve = _regime(spec, result, deterministic)
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
                     run_id=run_id, parameters=params, variants=variants, metric_kinds=kinds, repeats=result.repeats,
                     samples=result.samples, assumptions=result.assumptions, headline=headline,
                     ratios=[ratio(c) for c in spec.claims if not c.headline], curves=curves,
                     roles={b: list(r) for b, r in spec.roles.items()}, regime=regime, projection=projection,
                     notes=result.notes, constraint=constraint,
                     components=[ComponentReport(name=c.name, provenance=c.provenance, statement=c.statement)
                                 for c in spec.components],
                     deterministic_metrics=result.deterministic_metrics(variants),
                     environment=environment, wall_time_s=wall_time_s)
