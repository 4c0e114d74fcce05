"""The results catalogue: every paper's claim beside what a run measured.

Two outputs from the same RunReports:

- ``docs/results.md`` (a generated file of ``mlsys-flows generate``): one row per registry system,
  from the committed RunReports in ``benchmarks/results/``;
- a static HTML catalogue (``mlsys-flows report``): the same rows with a thumbnail of each plot, and a
  page per system with its full report and its history across runs. It reads the committed
  reports, their earlier versions in the git history, and the reports a storage block holds
  (``reports/<system>/<run_id>.json``, where every flow publishes its report). Plain files with
  relative links: it opens from ``file://`` with no server and no network.

When ``benchmarks/results/overhead.json`` exists (``{"columns": [...], "rows": [{...}], "notes": [...]}``)
both show it as the orchestration-overhead table.
"""
from __future__ import annotations

import hashlib
import html
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlsys_flows import registry
from mlsys_flows.systems.common.report import v3_cells

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
OVERHEAD = "overhead.json"
OUT = Path("build/catalogue")
SCALE_RANK = {"smoke": 0, "quick": 1, "full": 2}
KIND_TEXT = {"measured": "wall clock", "counted": "exact count", "modelled": "from stated constants",
             "simulated": "a simulator's clock"}


@dataclass
class Found:
    """One RunReport (as JSON) and where it was read."""

    report: dict[str, Any]
    source: str


def is_run_report(obj: Any) -> bool:
    keys = {"system", "run_id", "headline", "environment", "created_at", "variants"}
    return (isinstance(obj, dict) and keys <= obj.keys()
            and {"metric", "technique", "baseline", "ratio", "kind"} <= obj["headline"].keys()
            and "device" in obj["environment"])


# ----- sources ------------------------------------------------------------------------------------
def committed(results: Path | None = None) -> list[Found]:
    """The RunReports in the results folder (other JSON there, e.g. overhead.json, is skipped)."""
    results = Path(results or RESULTS)
    found = []
    for path in sorted(results.glob("*.json")):
        try:
            obj = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if is_run_report(obj):
            found.append(Found(obj, f"benchmarks/results/{path.name}"))
    return found


def git_history(results: Path | None = None) -> list[Found]:
    """Every version of the committed RunReports in the repository's history (none without git)."""
    results = Path(results or RESULTS)

    def git(*args: str, stdin: bytes | None = None) -> bytes:
        return subprocess.run(["git", "-C", str(results), *args], input=stdin, capture_output=True,
                              check=True, timeout=60).stdout

    try:
        log = git("log", "--format=@%H", "--name-only", "--", ".").decode()
        specs = []
        commit = ""
        for line in log.splitlines():
            if line.startswith("@"):
                commit = line[1:]
            elif line.endswith(".json") and commit:
                specs.append(f"{commit}:{line}")  # log names paths from the top of the repository
        if not specs:
            return []
        blob = git("cat-file", "--batch", stdin=("\n".join(specs) + "\n").encode())
    except (OSError, subprocess.SubprocessError):
        return []
    found, pos = [], 0
    for spec in specs:
        end = blob.index(b"\n", pos)
        header = blob[pos:end].split()
        pos = end + 1
        if len(header) < 3 or header[1] != b"blob":  # "<spec> missing": deleted in that commit
            continue
        size = int(header[2])
        body, pos = blob[pos:pos + size], pos + size + 1
        try:
            obj = json.loads(body)
        except ValueError:
            continue
        if is_run_report(obj):
            sha, path = spec.split(":", 1)
            found.append(Found(obj, f"git {sha[:8]}:{path}"))
    return found


def from_storage(storage) -> list[Found]:
    """The reports every flow publishes on its storage block: ``reports/<system>/<run_id>.json``."""
    found = []
    for key in storage.list("reports"):
        if key.endswith(".json"):
            obj = storage.read_json(key)
            if is_run_report(obj):
                found.append(Found(obj, f"{storage.root_url}/{key}"))
    return found


def collect(results: Path | None = None, storage=None, history: bool = True) -> dict[str, list[Found]]:
    """system -> its RunReports (one per run id, oldest first). A run found twice keeps its first
    source: the committed file, then the git history, then the storage block."""
    found = committed(results) + (git_history(results) if history else []) + (from_storage(storage) if storage else [])
    by: dict[str, list[Found]] = {}
    seen: set[tuple[str, str]] = set()
    for f in found:
        key = (f.report["system"], f.report["run_id"])
        if key not in seen:
            seen.add(key)
            by.setdefault(f.report["system"], []).append(f)
    for runs in by.values():
        runs.sort(key=lambda f: f.report["created_at"])
    return by


def current(runs: list[Found]) -> Found | None:
    """The run a row shows: the largest scale, then the newest."""
    return max(runs, key=lambda f: (SCALE_RANK.get(f.report.get("scale"), -1), f.report["created_at"]), default=None)


def overhead(results: Path | None = None) -> dict[str, Any] | None:
    path = Path(results or RESULTS) / OVERHEAD
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    rows = data.get("rows") or []
    columns = data.get("columns") or [k for row in rows[:1] for k in row]
    return {"columns": list(columns), "rows": rows, "notes": list(data.get("notes") or [])}


# ----- rows ---------------------------------------------------------------------------------------
def _x(v) -> str:
    return f"{v:.2f}x" if isinstance(v, (int, float)) else "n/a"


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def rows(by: dict[str, list[Found]]) -> list[dict[str, str]]:
    """One row per registry system, every value formatted (planned systems say so)."""
    out = []
    for spec in registry.all_specs():
        claim = spec.headline
        run = current(by.get(spec.name, []))
        row = {"system": spec.name, "title": spec.title, "status": spec.status, "family": spec.family,
               "claim": claim.statement, "paper": _x(claim.paper),
               "headline": f"{claim.metric}: {claim.technique} vs {claim.baseline}",
               "kind": "", "ratio": "", "vs_strongest": "", "mechanism": "", "regime": "", "range": "", "scale": "",
               "device": "",
               "commit": "", "date": "", "run_id": "", "runs": str(len(by.get(spec.name, [])))}
        if spec.status != "implemented":
            row["ratio"] = "planned"
        elif run is None:
            row["ratio"] = "not run yet"
        else:
            r = run.report
            h, env = r["headline"], r["environment"]
            s = h.get("vs_strongest") or {}
            row.update(headline=f"{h['metric']}: {h['technique']} vs {h['baseline']}", kind=h["kind"],
                       ratio=f"{h['ratio']:.2f}x",
                       vs_strongest=f"{s['ratio']:.2f}x vs {s['baseline']}" if s else "",
                       mechanism=v3_cells(r)["mechanism"], regime=v3_cells(r)["regime"],
                       range=f"{h['range'][0]:.2f}-{h['range'][1]:.2f}" if h.get("range") else "",
                       scale=r.get("scale", ""),
                       device=f"{env['device']}, {env.get('usable_cores') or env['cores']} cores",
                       commit=env.get("git_sha", "")[:8] + ("+dirty" if env.get("git_dirty") else ""),
                       date=r["created_at"][:10], run_id=r["run_id"])
        out.append(row)
    return out


# ----- docs/results.md ----------------------------------------------------------------------------
def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def results_markdown(results: Path | None = None) -> str:
    """docs/results.md: generated by ``mlsys-flows generate`` from the committed RunReports."""
    results = Path(results or RESULTS)
    rs = rows(collect(results, history=False))
    done = sum(r["run_id"] != "" for r in rs)
    lines = ["# Results: each paper's claim beside this repository's runs", "",
             "<!-- generated by `mlsys-flows generate` from benchmarks/results/*.json: do not edit -->", "",
             f"{len(rs)} systems, {sum(r['status'] == 'implemented' for r in rs)} implemented, {done} with a "
             "committed RunReport. Ratios above 1 mean the technique won; the kind says whether a number is "
             "a wall-clock measurement, an exact count, or comes from a model or a simulator (whose constants "
             "the report lists). The range is the min-max of the ratio over the repeats. Rerun every "
             "implemented system and regenerate this page and the catalogue with "
             "`mlsys-flows bench all --scale quick --record`.", "",
             "The same data as a browsable HTML catalogue, with each run's plot and a page per system holding "
             "its full report and its history across runs: `mlsys-flows report` (writes "
             f"`{OUT}/index.html`; opens from a file, no server; `--storage BLOCK` adds the reports on a "
             "storage block).", "", "![The results catalogue](img/results-catalogue.png)", "",
             "| system | paper's claim | paper | headline (technique vs baseline) | kind | ratio | range | "
             "vs strongest deployable baseline | mechanism alone | regime | scale | device | commit | date |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        name = f"[{r['system']}]({r['system']}.md)" if (REPO / "docs" / f"{r['system']}.md").exists() \
            and r["status"] == "implemented" else r["system"]
        ratio = f"**{r['ratio']}**" if r["run_id"] else r["ratio"]
        commit = f"`{r['commit']}`" if r["commit"] else ""
        lines.append("| " + " | ".join(_md(c) for c in (
            name, r["claim"], r["paper"], r["headline"], r["kind"], ratio, r["range"], r["vs_strongest"],
            r["mechanism"], r["regime"], r["scale"], r["device"], commit, r["date"])) + " |")
    table = overhead(results)
    if table:
        lines += ["", "## Orchestration overhead", "", *_md_table(table)]
    return "\n".join(lines) + "\n"


def _md_table(table: dict[str, Any]) -> list[str]:
    cols = table["columns"]
    lines = ["| " + " | ".join(_md(c) for c in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_md(_cell(row.get(c))) for c in cols) + " |" for row in table["rows"]]
    if table["notes"]:
        lines += ["", *(f"- {n}" for n in table["notes"])]
    return lines


# ----- HTML ---------------------------------------------------------------------------------------
CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:24px;color:#1f2328;font-size:14px}
h1{font-size:22px;margin:0 0 6px}h2{font-size:17px;margin:28px 0 8px}
p.lead{color:#57606a;max-width:1100px}
table{border-collapse:collapse;margin:8px 0}
th,td{border-bottom:1px solid #d0d7de;padding:5px 8px;text-align:left;vertical-align:middle}
th{background:#f6f8fa;font-weight:600;position:sticky;top:0}
tr.planned td{color:#8c959f}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.claim{max-width:340px;font-size:12px}
.kind{display:inline-block;padding:1px 6px;border-radius:8px;font-size:12px;color:#fff}
.measured{background:#1a7f37}.counted{background:#0969da}.modelled{background:#9a6700}.simulated{background:#8250df}
.win{font-weight:700;color:#1a7f37}.loss{font-weight:700;color:#cf222e}.tie{font-weight:700}
img.thumb{width:150px;border:1px solid #d0d7de;display:block}
img.plot{max-width:100%;border:1px solid #d0d7de}
code{font-size:12px}a{color:#0969da}
ul.notes li{margin:3px 0;max-width:1100px}
"""


def _e(v) -> str:
    return html.escape(str(v))


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_e(title)}</title>"
            f"<style>{CSS}</style></head>\n<body>\n{body}\n</body></html>\n")


def _table(columns: list[str], body_rows: list[list[str]], raw: bool = False) -> str:
    """A table; cells are escaped unless raw (already HTML)."""
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{c if raw else _e(c)}</td>" for c in row) + "</tr>\n" for row in body_rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>\n{body}</tbody></table>"


def _short(text: str, n: int = 140) -> str:
    """The start of a long claim (the whole one is the cell's tooltip and on the system's page)."""
    return text if len(text) <= n else text[:n].rsplit(" ", 1)[0] + " \u2026"


def _ratio_html(text: str) -> str:
    try:
        value = float(text.rstrip("x"))
    except ValueError:
        return _e(text)
    return f"<span class=\"{'win' if value > 1 else 'loss' if value < 1 else 'tie'}\">{_e(text)}</span>"


def _kind_html(kind: str) -> str:
    return f"<span class=\"kind {_e(kind)}\" title=\"{_e(KIND_TEXT.get(kind, ''))}\">{_e(kind)}</span>" if kind else ""


def image_names(system: str, runs: list[Found]) -> dict[str, str]:
    """Relative paths (under the catalogue) of a system's images, named by their content's inputs."""
    run = current(runs)
    if run is None:
        return {}
    rid = run.report["run_id"][:12]
    points = json.dumps([(f.report["run_id"], f.report["headline"]["ratio"]) for f in runs])
    return {"plot": f"img/{system}-{rid}.png", "thumb": f"img/{system}-{rid}-thumb.png",
            "history": f"img/{system}-history-{hashlib.sha256(points.encode()).hexdigest()[:12]}.png"}


def render_pages(by: dict[str, list[Found]], sources: list[str], results: Path | None = None) -> dict[str, str]:
    """Relative path -> HTML text of every page: index.html and systems/<name>.html (pure, no plots)."""
    rs = rows(by)
    pages = {"index.html": _index(rs, by, sources, overhead(results))}
    for r in rs:
        pages[f"systems/{r['system']}.html"] = _system_page(r, by.get(r["system"], []))
    return pages


def _index(rs: list[dict[str, str]], by, sources: list[str], table: dict | None) -> str:
    body_rows = []
    for r in rs:
        imgs = image_names(r["system"], by.get(r["system"], []))
        link = f"systems/{_e(r['system'])}.html"
        thumb = f"<a href=\"{link}\"><img class=\"thumb\" src=\"{imgs['thumb']}\" alt=\"{_e(r['system'])} plot\"></a>" \
            if imgs else ""
        cls = "" if r["run_id"] else " class=\"planned\""
        body_rows.append(
            f"<tr{cls}><td><a href=\"{link}\"><b>{_e(r['system'])}</b></a><br><small>{_e(r['title'])}</small></td>"
            f"<td class=\"claim\" title=\"{_e(r['claim'])}\">{_e(_short(r['claim']))}</td>"
            f"<td class=\"num\">{_e(r['paper'])}</td>"
            f"<td>{_e(r['headline'])}</td><td>{_kind_html(r['kind'])}</td>"
            f"<td class=\"num\">{_ratio_html(r['ratio']) if r['run_id'] else _e(r['ratio'])}</td>"
            f"<td class=\"num\">{_e(r['range'])}</td><td>{_e(r['vs_strongest'])}</td><td>{_e(r['mechanism'])}</td>"
            f"<td>{_e(r['regime'])}</td><td>{_e(r['scale'])}</td>"
            f"<td>{_e(r['device'])}</td><td><code>{_e(r['commit'])}</code></td><td class=\"num\">{_e(r['date'])}</td>"
            f"<td class=\"num\">{_e(r['runs'])}</td><td>{thumb}</td></tr>\n")
    head = "".join(f"<th>{c}</th>" for c in (
        "system", "paper's claim", "paper", "headline (technique vs baseline)", "kind", "ratio", "range",
        "vs strongest deployable baseline", "mechanism alone", "regime", "scale", "device", "commit", "date", "runs",
        "plot"))
    implemented = sum(r["status"] == "implemented" for r in rs)
    parts = [
        "<h1>mlsys-flows results catalogue</h1>",
        f"<p class=\"lead\">{len(rs)} systems, {implemented} implemented, {sum(bool(r['run_id']) for r in rs)} "
        "with a run. Each row holds the paper's claim beside the newest run of the largest scale found; a ratio "
        "above 1 means the technique won. Kinds: measured (wall clock), counted (exact counts), modelled (from "
        "stated constants), simulated (a simulator's clock). The range is the min-max of the ratio over the "
        "repeats. Click a system for its full report and its history across runs.</p>",
        f"<p class=\"lead\">Sources: {_e('; '.join(sources))}.</p>",
        f"<table><thead><tr>{head}</tr></thead><tbody>\n{''.join(body_rows)}</tbody></table>"]
    if table:
        parts += ["<h2 id=\"overhead\">Orchestration overhead</h2>",
                  _table(table["columns"], [[_cell(row.get(c)) for c in table["columns"]] for row in table["rows"]])]
        if table["notes"]:
            parts.append("<ul class=\"notes\">" + "".join(f"<li>{_e(n)}</li>" for n in table["notes"]) + "</ul>")
    return _page("mlsys-flows results catalogue", "\n".join(parts))


def _system_page(row: dict[str, str], runs: list[Found]) -> str:
    spec = registry.get(row["system"])
    parts = ["<p><a href=\"../index.html\">&larr; all systems</a></p>",
             f"<h1>{_e(spec.title)} <small>({_e(spec.name)})</small></h1>",
             f"<p class=\"lead\">Paper: {_e(spec.paper)}. Family: {_e(spec.family)}. Status: {_e(spec.status)}.</p>",
             "<h2>The paper's claims</h2>",
             _table(["metric", "technique vs baseline", "better", "paper", "statement"],
                    [[c.metric + (" (headline)" if c.headline else ""), f"{c.technique} vs {c.baseline}", c.better,
                      _x(c.paper), c.statement] for c in spec.claims])]
    run = current(runs)
    if spec.status != "implemented":
        parts.append("<p><b>planned</b>: not implemented yet, so nothing was measured.</p>")
    elif run is None:
        parts.append("<p><b>not run yet</b>: no RunReport was found for this system.</p>")
    else:
        imgs = image_names(spec.name, runs)
        top, rest = _report_html(run, imgs)
        parts += top + _history_html(runs, imgs) + rest
    return _page(f"{spec.name}: {spec.title}", "\n".join(parts))


def _report_html(run: Found, imgs: dict[str, str]) -> tuple[list[str], list[str]]:
    """(the claims and the plot, the details: variants, assumptions, notes, parameters, environment)"""
    r = run.report
    h, env = r["headline"], r["environment"]
    s = h.get("vs_strongest") or {}
    claims = []
    for label, x in [("headline", h), ("vs the strongest deployable baseline", s),
                     ("the mechanism alone, vs its ablation", h.get("mechanism")),
                     ("vs the hindsight oracle", h.get("vs_oracle")),
                     ("projected at the paper's hardware", r.get("projection")), *(("", x) for x in r.get("ratios", []))]:
        if x:
            claims.append([f"{x['metric']}" + (f" ({label})" if label else ""), _kind_html(x["kind"]),
                           _e(f"{x['technique']} vs {x['baseline']}"), _e(_cell(float(x["baseline_value"]))),
                           _e(_cell(float(x["technique_value"]))), _ratio_html(f"{x['ratio']:.2f}x"),
                           _e(f"{x['range'][0]:.2f}-{x['range'][1]:.2f}" if x.get("range") else ""),
                           _e(x.get("repeats", "")), _e(_x(x.get("paper")))])
    metrics: list[str] = []
    for ms in r["variants"].values():
        metrics += [m for m in ms if m not in metrics]
    kinds = r.get("metric_kinds", {})
    load = env.get("load_before"), env.get("load_after")
    facts = [("run", r["run_id"]), ("scale", r.get("scale", "")), ("created", r["created_at"]),
             ("source", run.source), ("device", env["device"]),
             ("cores", f"{env.get('usable_cores') or env['cores']} usable of {env['cores']}"),
             ("load (1 min) before -> after", f"{load[0][0]:.2f} -> {load[1][0]:.2f}" if load[0] and load[1] else ""),
             ("platform", env.get("platform", "")),
             ("commit", env.get("git_sha", "") + (" (dirty)" if env.get("git_dirty") else "")),
             ("code hash", env.get("code_hash", "")), ("harness hash", env.get("harness_hash", "")),
             ("versions", ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items())),
             ("wall time", f"{r.get('wall_time_s', 0):.1f} s")]
    parts = [f"<h2>Run <code>{_e(r['run_id'][:8])}</code> ({_e(r.get('scale', ''))}, {_e(r['created_at'][:10])})</h2>",
             _table(["claim", "kind", "technique vs baseline", "baseline", "technique", "ratio", "range", "repeats",
                     "paper"], claims, raw=True),
             f"<p><img class=\"plot\" src=\"../{imgs['plot']}\" alt=\"{_e(r['system'])} plot\"></p>"]
    rest = ["<h2>Variants</h2>",
            _table(["variant", *(f"{m} ({kinds.get(m, '?')})" for m in metrics)],
                   [[v, *(_cell(ms.get(m)) for m in metrics)] for v, ms in r["variants"].items()])]
    if r.get("assumptions"):
        rest += ["<h2>Assumptions (modelled and simulated metrics)</h2>",
                 _table(["metric", "constant", "value", "source"],
                        [[m, k, f"{a.get('value')} {a.get('unit', '')}".strip(), a.get("source", "")]
                         for m, consts in r["assumptions"].items() for k, a in consts.items()])]
    if r.get("notes"):
        rest += ["<h2>Notes written by the run</h2>",
                 "<ul class=\"notes\">" + "".join(f"<li>{_e(n)}</li>" for n in r["notes"]) + "</ul>"]
    rest += ["<h2>Parameters (resolved)</h2>",
             _table(["parameter", "value"], [[k, json.dumps(v)] for k, v in r.get("parameters", {}).items()]),
             "<h2>Environment</h2>", _table(["", ""], [[k, v] for k, v in facts])]
    return parts, rest


def _history_html(runs: list[Found], imgs: dict[str, str]) -> list[str]:
    body = []
    for f in reversed(runs):
        r, env = f.report, f.report["environment"]
        h = r["headline"]
        s = h.get("vs_strongest") or {}
        body.append([r["created_at"][:19].replace("T", " "), env.get("git_sha", "")[:8], r.get("scale", ""),
                     env["device"], f"{h['metric']}: {h['technique']} vs {h['baseline']}", f"{h['ratio']:.2f}x",
                     f"{h['range'][0]:.2f}-{h['range'][1]:.2f}" if h.get("range") else "",
                     f"{s['ratio']:.2f}x vs {s['baseline']}" if s else "", env.get("code_hash", "")[:8], f.source])
    return [f"<h2>History: {len(runs)} run{'s' if len(runs) != 1 else ''}</h2>",
            f"<p><img class=\"plot\" src=\"../{imgs['history']}\" alt=\"{_e(runs[0].report['system'])} history\"></p>",
            _table(["created (UTC)", "commit", "scale", "device", "headline", "ratio", "range", "vs strongest",
                    "code", "source"], body)]


# ----- plots (matplotlib, imported lazily) ----------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=fig.dpi, metadata={"Software": None})
    _plt().close(fig)
    return buf.getvalue()


def _bars(ax, r: dict) -> None:
    h = r["headline"]
    names = [n for n in r["variants"] if h["metric"] in r["variants"][n]]
    best = (h.get("vs_strongest") or {}).get("baseline")
    colors = ["tab:orange" if n == h["technique"] else "tab:blue" if n in (h["baseline"], best) else "tab:gray"
              for n in names]
    ax.bar(range(len(names)), [r["variants"][n][h["metric"]] for n in names], color=colors)
    ax.set_xticks(range(len(names)), names, rotation=25, fontsize=6, ha="right")
    ax.set_title(h["metric"], fontsize=8)


def thumbnail_png(r: dict) -> bytes:
    """A small picture of the run: the first panel of its plot, the headline metric of every variant
    (technique orange, the baseline and the strongest baseline blue)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(2.2, 1.5), dpi=80)
    _bars(ax, r)
    ax.tick_params(axis="y", labelsize=6)
    fig.tight_layout(pad=0.3)
    return _png(fig)


def plot_png(r: dict) -> bytes:
    """The run's full plot: the harness's own rendering (headline bars and every curve)."""
    try:
        from mlsys_flows.systems.common.plotting import render_png
        from mlsys_flows.systems.common.report import RunReport

        return render_png(RunReport.model_validate(r))
    except ValueError:  # a report of an older schema: its headline bars alone
        plt = _plt()
        fig, ax = plt.subplots(figsize=(5.2, 3.8), dpi=110)
        _bars(ax, r)
        fig.tight_layout()
        return _png(fig)


def history_png(runs: list[Found]) -> bytes:
    """The headline ratio of every run, oldest first (x: run date and commit), with its range,
    the paper's value and parity; one colour per device and scale."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(5.0, 0.7 * len(runs) + 3), 3.4), dpi=100)
    groups: dict[str, list[tuple[int, dict]]] = {}
    for i, f in enumerate(runs):
        r = f.report
        groups.setdefault(f"{r['environment']['device']} [{r.get('scale', '?')}]", []).append((i, r["headline"]))
    for label, pts in groups.items():
        xs = [i for i, _ in pts]
        ys = [h["ratio"] for _, h in pts]
        lo = [h["ratio"] - h["range"][0] if h.get("range") else 0 for _, h in pts]
        hi = [h["range"][1] - h["ratio"] if h.get("range") else 0 for _, h in pts]
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o-" if len(pts) > 1 else "o", capsize=3, label=label)
    paper = runs[-1].report["headline"].get("paper")
    ax.axhline(1.0, color="gray", linewidth=0.8, linestyle=":")
    if paper:
        ax.axhline(paper, color="tab:red", linewidth=0.8, linestyle="--", label=f"paper {paper:.2f}x")
    ax.set_xticks(range(len(runs)), [f"{f.report['created_at'][:10]}\n{f.report['environment'].get('git_sha', '')[:7]}"
                                     for f in runs], fontsize=7)
    ax.set_xlim(-0.5, len(runs) - 0.5)
    h = runs[-1].report["headline"]
    ax.set_ylabel(f"{h['metric']} ratio", fontsize=8)
    ax.set_title(f"{runs[-1].report['system']}: {h['technique']} vs {h['baseline']} (>1: technique wins)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)


# ----- build --------------------------------------------------------------------------------------
def sources_text(results: Path | None, storage, history: bool) -> list[str]:
    out = [f"committed RunReports in {'benchmarks/results' if results is None else results}"]
    if history:
        out.append("their earlier versions in the git history")
    if storage is not None:
        out.append(f"reports on storage {storage.root_url}/reports")
    return out


def build(out: Path = OUT, results: Path | None = None, storage=None, history: bool = True) -> Path:
    """Write the catalogue under ``out`` (index.html, systems/*.html, img/*.png); returns index.html.
    Images are named by their inputs, so a rebuild renders only new ones."""
    out = Path(out)
    by = collect(results, storage, history)
    for path, text in render_pages(by, sources_text(results, storage, history), results).items():
        target = out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
    (out / "img").mkdir(parents=True, exist_ok=True)
    for system, runs in by.items():
        if system not in registry.names():
            continue
        imgs = image_names(system, runs)
        run = current(runs).report
        for key, make in (("plot", lambda: plot_png(run)), ("thumb", lambda: thumbnail_png(run)),
                          ("history", lambda: history_png(runs))):
            if not (out / imgs[key]).exists():
                (out / imgs[key]).write_bytes(make())
    return out / "index.html"
