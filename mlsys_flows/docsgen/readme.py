"""Regenerate the generated sections of the README and the system pages: ``python -m mlsys_flows.docsgen.readme``.

- README: the system table, from the registry, and the results table;
- ``docs/<name>.md``: every claim of the system's committed quick RunReport;

both from the RunReports that ``mlsys-flows bench NAME --scale quick --save`` wrote to
``benchmarks/results/`` (no number is typed in).
"""
import json
import math
from pathlib import Path

from mlsys_flows import registry
from mlsys_flows.docsgen import docnumbers
from mlsys_flows.settings import project_root
from mlsys_flows.systems.common import formatting as fmt
from mlsys_flows.rendering import constraint_text, diagnostic_text, v3_cells, verdict_of, verdict_text

SECTIONS = {"systems": registry.markdown_table}
RESULTS = Path("benchmarks/results")  # shown relative; read under the repository (REPO / an absolute path = it)
REPO = project_root()  # the checkout, or the wheel's copy of benchmarks/results (settings.py)


def results_table(results: Path = RESULTS) -> str:
    lines = ["| system | verdict vs the strongest deployable baseline | headline (technique vs baseline) | kind | "
             "ratio (range over repeats) | paper | mechanism alone (vs its ablation) | regime | run | device |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for spec in registry.all_specs():
        path = REPO / results / f"{spec.name}-quick.json"
        if not path.exists():
            continue
        r = json.loads(path.read_text())
        h = r["headline"]
        paper = f"{h['paper']:.2f}x" if h["paper"] else "n/a"
        spread = f" ({_spread(h['range'])})" if h["range"] else ""
        v3 = v3_cells(r)
        diag = diagnostic_text(r)
        lines.append(f"| [{spec.name}](docs/{spec.name}.md) | **{verdict_text(r)}**{f' ({diag})' if diag else ''} | "
                     f"{h['metric']} ({h['technique']} vs {h['baseline']}) | "
                     f"{h['kind']} | {_x(h['ratio'])}{spread} | {paper} | "
                     f"{v3['mechanism'] or '-'} | {v3['regime'] or '-'} | "
                     f"`{r['run_id'][:8]}` | {r['environment']['device']}, {r['environment']['cores']} cores |")
    return "\n".join(lines)


SECTIONS["results"] = results_table


def _x(v, digits: int = 2) -> str:
    """A ratio of a report's JSON: "-" when there is none or it is undefined (NaN: 0 vs 0)."""
    return f"{v:.{digits}f}x" if v is not None and not math.isnan(v) else fmt.UNDEFINED


def _spread(rng) -> str:
    """A ratio's min-max ("0.98-1.03"): "-" when either end is undefined (NaN)."""
    return fmt.ratio_range(rng).rstrip("x")


def system_results(name: str, results: Path = RESULTS) -> str:
    """Every claim of one system's committed quick RunReport, as a markdown table."""
    path = results / f"{name}-quick.json"
    if not (REPO / path).exists():
        return f"No committed result yet: `mlsys-flows bench {name} --scale quick --save`."
    r = json.loads((REPO / path).read_text())
    h, env = r["headline"], r["environment"]
    load = f", load {env['load_before'][0]:.2f} -> {env['load_after'][0]:.2f}" if env.get("load_before") else ""
    lines = [f"**Verdict: {h['technique']} {verdict_text(r)}**, the strongest deployable baseline of this run "
             "(a win or a loss only when a 95% interval over at least 6 independent pairs excludes 1, "
             "or when the result is exact)." + (f" {constraint_text(r)}" if r.get("constraint") else "")
             + (f" Beside it, not the verdict: {diagnostic_text(r)}." if diagnostic_text(r) else ""), "",
             f"Run `{r['run_id'][:8]}` ({r['created_at'][:10]}, `{path}`) on {env['device']}, "
             f"{env.get('usable_cores') or env['cores']} usable cores{load}, headline over {_samples(h)}, "
             f"code `{env['code_hash'][:10]}`. Ratios above 1 mean the technique wins; measured ratios show their "
             "min-max over the repeats.", "",
             "| claim | kind | baseline | technique | verdict | ratio | range | paper |", "|---|---|---|---|---|---|---|---|"]
    s = h["vs_strongest"]
    rows = [(f"**{h['metric']}** (headline)", h), (f"{s['metric']} vs the strongest deployable baseline", s)]
    if h.get("mechanism"):
        rows.append((f"{h['metric']}: the mechanism alone (vs its ablation)", h["mechanism"]))
    if h.get("vs_oracle"):
        rows.append((f"{h['metric']} vs the hindsight oracle (an upper bound)", h["vs_oracle"]))
    if r.get("projection"):
        rows.append((f"{h['metric']} projected at the paper's hardware", r["projection"]))
    rows += [(r_["metric"], r_) for r_ in r["ratios"]]
    for label, x in rows:
        spread = _spread(x["range"]) if x.get("range") else ""
        # the verdict first: a ratio alone reads as a win whether its interval decided it or not
        lines.append(f"| {label} | {x['kind']} | {x['baseline']} | {x['technique']} | **{verdict_of(r, x).short()}** | "
                     f"{_x(x['ratio'])} | {spread} | {_x(x['paper'])} |")
    g = r.get("regime")
    if g:
        unit = f" {g['unit']}" if g.get("unit") else ""
        lines += ["", f"Regime over `{g['parameter']}` (against the strongest deployable baseline): {v3_cells(r)['regime']}"
                  + (f" (the paper's setting: {g['paper_value']:g}{unit}; {g['paper_source']})" if g.get("paper_value")
                     is not None else "") + ".", "",
                  f"| {g['parameter']} | verdict vs the strongest deployable baseline | ratio | kind | that baseline |",
                  "|---|---|---|---|---|",
                  *(f"| {p['value']:g} | {_point_verdict(p)} | {_x(p['ratio'], 3)} | {p['kind']} | {p['baseline']} |"
                    for p in g["points"])]
    if r["notes"]:
        lines += ["", "Notes written by the run:", "", *(f"- {n}" for n in r["notes"])]
    return "\n".join(lines)


def _point_verdict(p: dict) -> str:
    """A regime point's verdict (outcome, interval, pairs; 'no verdict (why)' where the run marked it as
    deciding nothing), '-' for a report made before verdicts."""
    from mlsys_flows.systems.common.runreport import Verdict

    return Verdict.model_validate(p["verdict"]).label() if p.get("verdict") else "-"


def _samples(h: dict) -> str:
    """The headline's own number of samples (a seed or a repeat each), not the ``repeats`` parameter."""
    n = h.get("repeats", 1)
    return f"{n} samples" if n != 1 else "1 sample (no range)"


def _replace(text: str, name: str, body: str) -> str:
    start, end = f"<!-- {name}:start -->\n", f"<!-- {name}:end -->"
    head, rest = text.split(start, 1)
    tail = rest.split(end, 1)[1]
    return f"{head}{start}{body}\n{end}{tail}"


def render(text: str) -> str:
    for name, make in SECTIONS.items():
        text = _replace(text, name, make())
    return text


def render_system(name: str, text: str) -> str:
    """The page with its results block and its inline run spans (``docnumbers``) filled in."""
    text = _replace(text, "results", system_results(name)) if "<!-- results:start -->" in text else text
    return docnumbers.render_page(name, text, REPO / RESULTS)


if __name__ == "__main__":
    from mlsys_flows.docsgen.generate import write

    print("\n".join(write()) or "every generated file is current")
