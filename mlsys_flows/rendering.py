"""A RunReport (or its JSON) as people read it: markdown for the Prefect artifacts, the rows of the
table artifact, the CLI's lines and the catalogue's cells. Pure: the schema is
``systems/common/runreport.py``; nothing here computes a number (a report made before contract v4
has its verdict judged by ``systems/common/verdict.py``, the rule a new report records)."""
from __future__ import annotations

from mlsys_flows.systems.common import formatting as fmt
from mlsys_flows.systems.common.runreport import ConstraintReport, Ratio, RunReport

SMOKE_NOTE = ("Smoke run: a pipeline check on a tiny workload. Its ratios are not "
              "measurements of the technique; run at scale quick or full for those.")


def verdict_of(report: dict, ratio: dict | None = None):
    """The verdict of one comparison of a report (both as JSON; by default the headline against the
    strongest deployable baseline, contract v4): recorded, or judged by the same rules for a report
    made before it (``verdict.of_ratio``)."""
    from mlsys_flows import registry
    from mlsys_flows.systems.common.verdict import of_ratio

    h = report["headline"]
    ratio = ratio or h.get("vs_strongest") or h
    if ratio.get("verdict") is None and ratio == report.get("projection"):
        # a projection is modelled from the run's constants: no samples of its own, and judging it by the
        # headline's samples (same metric and variants) would print the measured verdict beside it
        from mlsys_flows.systems.common.runreport import Verdict
        return Verdict(outcome="ties", ratio=None, pairs=0,
                       why="undecidable: modelled from constants, no samples of its own")
    if ratio.get("verdict"):  # recorded: no need for the system's spec
        return of_ratio(report, ratio)
    name = report.get("system")
    pairing = registry.get(name).pairing if name in registry.names() else "repeats"
    return of_ratio(report, ratio, independent=pairing != "turns")


def verdict_text(report: dict) -> str:
    """``ties 1.04x (3 pairs: fewer than 6) vs hybrid``: what a reader sees first."""
    vs = report["headline"].get("vs_strongest") or report["headline"]
    return f"{verdict_of(report).label()} vs {vs['baseline']}"


def diagnostic_text(report: dict) -> str:
    """The report's diagnostic comparisons (a claim whose statement starts with ``spec.DIAGNOSTIC``: a variant
    no user could deploy), each with its verdict, e.g. 'diagnostic, not deployable: x_epochs wins 1.10x
    (1.02-1.20x, 7 pairs) vs y'; '' where it has none. Printed beside the headline's verdict, never as it."""
    from mlsys_flows.systems.common.spec import DIAGNOSTIC

    return "; ".join(f"{DIAGNOSTIC}: {r['technique']} {verdict_of(report, r).label()} vs {r['baseline']}"
                     for r in report.get("ratios", []) if str(r.get("statement", "")).startswith(DIAGNOSTIC))


def constraint_text(report: dict) -> str:
    """The constraint the verdict's comparison is held to and who broke it (a report as JSON; issue 47):
    the deployable baselines left out of the strongest, a fallback, the technique breaking it; '' where
    the report records no constraint."""
    c = report.get("constraint")
    return ConstraintReport.model_validate(c).sentence() if c else ""


def ratio_label(r: Ratio) -> str:
    """A ratio in words: value, kind and its spread over the repeats."""
    spread = f", {fmt.ratio_range(r.range).rstrip('x')} over {r.repeats}" if r.range else ""
    return f"{fmt.ratio(r.ratio)} {r.kind}{spread}"


def regime_phrase(regime: dict | None) -> str:
    """A regime (a report's ``regime``, as JSON) in a few words: where the ratio against the strongest
    deployable baseline is above 1, over the points where both sides met their constraint, and how many
    of those points a verdict decided (contract v4: a ratio above 1 is not yet a win)."""
    if not regime:
        return ""
    unit = f" {regime['unit']}" if regime.get("unit") else ""
    param, points = regime["parameter"], regime["points"]
    valid = sorted((p for p in points if p.get("valid", True)), key=lambda p: p["value"])
    broke = len(points) - len(valid)
    left_out = f"; {broke} of {len(points)} points left out: a side broke its constraint" if broke else ""
    wins = regime["wins"]
    if wins == "undecided" or len(valid) < 2:
        if len(valid) < 2:
            return f"undecided over {param}: fewer than 2 points where both sides met their constraint{left_out}"
        verdicts = [p.get("verdict") or {} for p in valid]
        decided = sum(v.get("outcome", "ties") != "ties" for v in verdicts)
        lo, hi = valid[0]["value"], valid[-1]["value"]
        how = f"{_outcomes(verdicts)}; " if decided else ""
        return (f"undecided over {param} {fmt.number(lo)}-{fmt.number(hi)}{unit}: {decided} of {len(valid)} points "
                f"decided{_no_verdict(verdicts)} ({how}a crossover needs 2; the ratios are on the curve){left_out}")
    if wins in ("everywhere", "nowhere"):
        # the span of the decided points: "everywhere" and "nowhere" rest on them alone (a tie at the end of
        # the sweep says nothing of the ratio's side there)
        decided = [p for p in valid if (p.get("verdict") or {}).get("outcome", "ties") != "ties"] or valid
        lo, hi = decided[0]["value"], decided[-1]["value"]
        span = f"{param} {fmt.number(lo)}-{fmt.number(hi)}{unit}"
        core = f"ratio > 1 over all of {span}" if wins == "everywhere" else f"ratio > 1 nowhere over {span}"
    elif wins in ("between", "outside", "mixed"):
        lo, hi = fmt.number(regime["crossover"], 3), fmt.number(regime["crossover_end"], 3)
        where = "ratio crosses 1 several times between" if wins == "mixed" else f"ratio > 1 {wins}"
        core = f"{where} {param} = {lo} and {hi}{unit}"
    else:
        core = f"ratio > 1 {wins} {param} = {fmt.number(regime['crossover'], 3)}{unit}"
    verdicts = [p["verdict"] for p in valid if p.get("verdict")]
    if verdicts and len(verdicts) == len(valid):
        decided = sum(v["outcome"] != "ties" for v in verdicts)
        nv = _no_verdict(verdicts)
        core += (f" ({decided} of {len(valid)} points decided: {_outcomes(verdicts)}{nv})" if decided else
                 f" (no point decided{nv})" if nv else " (every point a tie)")
    return core + left_out


def _no_verdict(verdicts: list[dict]) -> str:
    """', 2 with no verdict' where the run marked points as deciding nothing (e.g. fixed-cost dominated), else ''."""
    n = sum(str(v.get("why", "")).startswith("undecidable: ") for v in verdicts)
    return f", {n} with no verdict" if n else ""


def _outcomes(verdicts: list[dict]) -> str:
    """How the decided points fell, e.g. '1 win, 2 losses' (a ratio above or below 1 is not yet either)."""
    wins = sum(v.get("outcome") == "wins" for v in verdicts)
    losses = sum(v.get("outcome") == "loses" for v in verdicts)
    return ", ".join(f"{n} {word if n == 1 else plural}" for n, word, plural in
                     ((wins, "win", "wins"), (losses, "loss", "losses")) if n)


def v3_cells(report: dict) -> dict[str, str]:
    """Contract v3 of a report (as JSON), formatted for tables: the mechanism's ablation, the oracle,
    the regime and the projection ('' where the report has none)."""
    h = report["headline"]

    def vs(r):  # contract v4: the verdict, not the bare ratio
        return f"{verdict_of(report, r).label()} vs {r['baseline']}" if r else ""
    p = report.get("projection")
    return {"mechanism": vs(h.get("mechanism")), "oracle": vs(h.get("vs_oracle")),
            "regime": regime_phrase(report.get("regime")),
            "projection": f"{fmt.ratio(p['ratio'])} modelled" if p else ""}



# How each comparison of a report (as JSON) is named: (where it is, words after the baseline, words in brackets)
# each role: where it is in a report, what follows its name, its label in words, its short tag (the
# table artifact, whose columns the UI never wraps)
_ROLES = ((lambda r: r["headline"], "", "headline", "headline"),
          (lambda r: r["headline"].get("vs_strongest"), ", the strongest deployable baseline", "", "strongest"),
          (lambda r: r["headline"].get("mechanism"), ", its ablation", "the mechanism alone", "ablation"),
          (lambda r: r["headline"].get("vs_oracle"), ", the hindsight oracle", "an upper bound", "oracle"),
          (lambda r: r.get("projection"), "", "projected at the paper's hardware", "projected"))


def claim_rows(report: dict, short: bool = False) -> list[tuple[str, dict]]:
    """Every comparison of a report (as JSON) once, headline first, each with its name: the headline,
    the strongest deployable baseline, the mechanism's ablation, the oracle, the projection and the
    spec's other claims. A comparison reached twice (the strongest baseline is also a claim, or the
    headline's own baseline) is one row whose name says both. ``short``: the roles as one-word tags."""
    candidates = [(where(report), "" if short else after, tag if short else label)
                  for where, after, label, tag in _ROLES]
    candidates += [(r, "", "") for r in report.get("ratios") or []]
    found: dict[tuple, tuple[dict, list[str], list[str]]] = {}
    for r, after, label in candidates:
        if not r:
            continue
        key = (r["metric"], r["baseline"], r["technique"], r["baseline_value"], r["technique_value"])
        _, afters, labels = found.setdefault(key, (r, [], []))
        afters += [after] if after and after not in afters else []
        labels += [label] if label and label not in labels else []
    broke = set((report.get("constraint") or {}).get("excluded") or [])  # issue 47: baselines that broke it
    mark = "unmet" if short else "baseline broke the constraint: not a comparison at it"  # short: a UI cell never wraps
    return [(f"{r['metric']}: {r['technique']} vs {r['baseline']}" + "".join(afters)
             + (f" ({'; '.join(labels + ([mark] if r['baseline'] in broke else []))})"
                if labels or r["baseline"] in broke else ""), r) for r, afters, labels in found.values()]


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


def summary_markdown(report: RunReport) -> str:
    """The run as markdown: the headline and its comparisons, the variants, assumptions, notes."""
    h, s = report.headline, report.headline.vs_strongest
    lines = [f"# {report.title} ({report.system}, scale `{report.scale}`)", ""]
    if report.scale == "smoke":
        lines += [f"> **{SMOKE_NOTE}**", ""]
    lines.append(f"**Verdict**: {h.technique} **{verdict_text(report.model_dump(mode='json'))}**, the strongest "
                 "deployable baseline of this run (a win or a loss only when a 95% interval over at least 6 "
                 "independent pairs excludes 1, or the result is exact).")
    broke = report.constraint is not None and h.baseline in report.constraint.excluded
    lines.append(f"**Headline** {h.metric}: {h.technique} vs {h.baseline} = **{ratio_label(h)}** (paper: "
                 f"{fmt.ratio(h.paper)}; >1 means the technique wins)"
                 + ("; its baseline broke the declared constraint: not a comparison at it." if broke else "."))
    if s is not None:
        lines.append(f"Against the strongest deployable baseline of this run, **{s.baseline}**: {ratio_label(s)}.")
    if report.constraint is not None:
        lines.append(report.constraint.sentence())
    if h.mechanism is not None:
        v = h.mechanism.verdict
        undecidable = f" **Undecidable**: {v.why.removeprefix('undecidable: ')}." \
            if v is not None and v.why.startswith("undecidable") else ""
        lines.append(f"The paper's mechanism alone (technique vs **{h.mechanism.baseline}**, the ablation): "
                     f"{ratio_label(h.mechanism)}.{undecidable}")
    if h.vs_oracle is not None:
        lines.append(f"Against the hindsight oracle **{h.vs_oracle.baseline}** (an upper bound): {ratio_label(h.vs_oracle)}.")
    if report.regime is not None:
        lines.append(regime_sentence(report))
    if report.projection is not None:
        p = report.projection
        lines.append(f"Projection at the paper's hardware ({p.metric}, {p.technique} vs {p.baseline}): "
                     f"{ratio_label(p)}; constants under Assumptions.")
    lines += ["", "| comparison | kind | baseline | technique | ratio | range | paper |",
              "|---|---|---|---|---|---|---|"]
    for name, r in claim_rows(report.model_dump(mode="json")):
        base, tech = fmt.column(r["metric"], [r["baseline_value"], r["technique_value"]])
        lines.append(f"| {name} | {r['kind']} | {base} | {tech} | {fmt.ratio(r['ratio'])} | "
                     f"{fmt.ratio_range(r.get('range'), r['kind'])} | {fmt.ratio(r.get('paper'))} |")
    lines += ["", *variants_markdown(report)]
    if report.assumptions:
        lines += ["", "**Assumptions** (modelled, simulated and emulated metrics)"]
        for metric, consts in report.assumptions.items():
            lines.append(f"- {metric}: " + "; ".join(f"{k} = {fmt.exact(a.value)}{(' ' + a.unit) if a.unit else ''} "
                                                     f"({a.source})" for k, a in consts.items()))
    if report.notes:
        lines += ["", "**Notes**", *[f"- {n}" for n in report.notes]]
    if report.components:
        lines += ["", "**Components** (learned, packaged, or scripted by this project)",
                  *[f"- {c.name}: {c.provenance}" + (f" ({c.statement})" if c.statement else "")
                    for c in report.components]]
    env = report.environment
    load = f", load {env.load_before[0]:.2f} -> {env.load_after[0]:.2f}" if env.load_before and env.load_after else ""
    lines += ["", f"Run `{report.run_id}` on {env.device}, {env.usable_cores or env.cores} usable cores{load}, "
                  f"git `{env.git_sha[:10]}`{' (dirty)' if env.git_dirty else ''}, code `{env.code_hash[:10]}`, "
                  f"wall time {report.wall_time_s:.1f} s."]
    return "\n".join(lines)


def variants_markdown(report: RunReport) -> list[str]:
    """Every variant's metrics as markdown tables narrow enough for a panel (``variant_tables``)."""
    lines: list[str] = []
    for columns, rows in variant_tables(report.model_dump(mode="json")):
        lines += [""] if lines else []
        lines += ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|",
                  *("| " + " | ".join(row) + " |" for row in rows)]
    return lines


def regime_sentence(report: RunReport) -> str:
    g = report.regime
    pts = ", ".join(f"{fmt.number(p.value)}: {fmt.ratio(p.ratio)}" for p in g.points)
    unit = f" {g.unit}" if g.unit else ""
    paper = f"; the paper's setting: {fmt.number(g.paper_value)}{unit}" if g.paper_value is not None else ""
    return (f"Regime over **{g.parameter}** (ratio against the strongest deployable baseline at each value: "
            f"{pts}): {regime_phrase(g.model_dump())}{paper}.")


def table_rows(report: RunReport) -> list[dict[str, str]]:
    """One row per comparison, headline first, each once (``claim_rows``), every number with its
    unit. The UI shows the table at its widest row's width and scrolls the rest, so what a reader
    needs first comes first and short (the claim with its role as a tag, the verdict, the paper's
    ratio beside this run's, its kind), the spread and the raw values after, and last the verdict's
    reason where its cell leaves it out (a reason is free text: the cell stays narrow whatever the run)."""
    rows = []
    for name, r in claim_rows(report.model_dump(mode="json"), short=True):
        base, tech = fmt.column(r["metric"], [r["baseline_value"], r["technique_value"]])
        verdict = verdict_of(report.model_dump(mode="json"), r)
        short = verdict.short()
        rows.append({"claim": name, "verdict": short,
                     "paper": fmt.ratio(r.get("paper")), "this run": fmt.ratio(r["ratio"]),
                     "kind": r["kind"], "range": fmt.ratio_range(r.get("range"), r["kind"]),
                     "baseline value": base, "technique value": tech,
                     "why": "" if short == verdict.label() else verdict.why})
    return rows


def table_description(report: RunReport) -> str:
    """The table artifact's description: the headline in words; a smoke run says its ratios are
    not measurements."""
    h = report.headline
    text = (f"{report.title}: {h.technique} {verdict_text(report.model_dump(mode='json'))}; headline {h.metric} "
            f"vs {h.baseline} = {ratio_label(h)} (paper {fmt.ratio(h.paper)})")
    return f"{SMOKE_NOTE} {text}" if report.scale == "smoke" else text


def parameters_markdown(report: RunReport) -> str:
    """The run's resolved parameters (preset of its scale plus overrides), as a markdown table."""
    lines = ["| parameter | value |", "|---|---|"]
    lines += [f"| {k} | `{fmt.exact(v)}` |" for k, v in report.parameters.items()]
    return "\n".join(lines)


