"""The results catalogue: every paper's claim beside what a run measured.

Two outputs from the same RunReports:

- ``docs/results.md`` (a generated file of ``mlsys-flows generate``): one row per registry system,
  from the committed RunReports in ``benchmarks/results/``;
- a static HTML catalogue (``mlsys-flows report``, from the Jinja2 templates in
  ``mlsys_flows/docsgen/templates/catalogue/``): the same rows with a thumbnail of each plot, and a page per
  system with its full report and its history across runs. It reads the committed
  reports, their earlier versions in the git history, and the reports a storage block holds
  (``reports/<system>/<run_id>.json``, where every flow publishes its report). Plain files with
  relative links: it opens from ``file://`` with no server and no network.

When ``benchmarks/results/overhead.json`` exists (``{"columns": [...], "rows": [{...}], "notes": [...]}``)
both show it as the orchestration-overhead table.
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from markupsafe import Markup, escape

from mlsys_flows import registry
from mlsys_flows.settings import project_root
from mlsys_flows.systems.common import formatting as fmt
from mlsys_flows.rendering import (SMOKE_NOTE, claim_rows, constraint_text, diagnostic_text, v3_cells, variant_tables, verdict_of,
                                   verdict_text)

REPO = project_root()  # the checkout, or the wheel's copy of benchmarks/results (settings.py)
RESULTS = REPO / "benchmarks" / "results"
OVERHEAD = "overhead.json"
OUT = Path("build/catalogue")
SCALE_RANK = {"smoke": 0, "quick": 1, "full": 2}
OUTCOME_CLASS = {"wins": "win", "loses": "loss", "ties": "tie"}  # a row's colour: its verdict, nothing else
KIND_TEXT = {"measured": "wall clock", "counted": "exact count", "modelled": "from stated constants",
             "simulated": "a simulator's clock", "emulated": "injected sleeps or replayed delays"}


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
def _canonical(obj: dict, path: str) -> bool:
    """A system's committed run at a scale is ``<system>-<scale>.json``; a report saved under another
    name (a run with other parameters, e.g. bagel-minilm.json, quoted by its page) is not its row."""
    return Path(path).name == f"{obj.get('system')}-{obj.get('scale')}.json"


def committed(results: Path | None = None) -> list[Found]:
    """The RunReports in the results folder (other JSON there, e.g. overhead.json, and reports saved
    under another name than ``<system>-<scale>.json`` are skipped)."""
    results = Path(results or RESULTS)
    found = []
    for path in sorted(results.glob("*.json")):
        try:
            obj = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if is_run_report(obj) and _canonical(obj, path.name):
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
        sha, path = spec.split(":", 1)
        if is_run_report(obj) and _canonical(obj, path):
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
def _cell(v) -> str:
    """A cell of the overhead table: a number by magnitude (its unit is a column of the row)."""
    return fmt.number(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else "" if v is None else str(v)


def rows(by: dict[str, list[Found]]) -> list[dict[str, str]]:
    """One row per registry system, every value formatted (a system without a run says so)."""
    out = []
    for spec in registry.all_specs():
        claim = spec.headline
        run = current(by.get(spec.name, []))
        row = {"system": spec.name, "title": spec.title, "family": spec.family,
               "claim": claim.statement, "paper": fmt.ratio(claim.paper),
               "headline": f"{claim.metric}: {claim.technique} vs {claim.baseline}",
               "verdict": "", "outcome": "",
               "kind": "", "ratio": "", "vs_strongest": "", "mechanism": "", "regime": "", "range": "", "scale": "",
               "device": "",
               "commit": "", "date": "", "run_id": "", "runs": str(len(by.get(spec.name, [])))}
        if run is None:
            row["ratio"] = "not run yet"
        else:
            r = run.report
            h, env = r["headline"], r["environment"]
            s = h.get("vs_strongest") or {}
            diag = diagnostic_text(r)
            row.update(verdict=verdict_text(r) + (f" ({diag})" if diag else ""), outcome=OUTCOME_CLASS[verdict_of(r).outcome],
                       headline=f"{h['metric']}: {h['technique']} vs {h['baseline']}", kind=h["kind"],
                       ratio=fmt.ratio(h["ratio"]),
                       vs_strongest=f"{fmt.ratio(s['ratio'])} vs {s['baseline']}" if s else "",
                       mechanism=v3_cells(r)["mechanism"], regime=v3_cells(r)["regime"],
                       range=fmt.ratio_range(h.get("range"), h["kind"]),
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
             f"{len(rs)} systems, {done} with a "
             "committed RunReport. The verdict comes first: the technique against the strongest deployable "
             "baseline of the run wins or loses only when a 95% interval of the median paired ratio "
             "(from order statistics) over at least 6 independent pairs excludes 1, or when the result is exact (deterministic); "
             "otherwise it ties. Ratios above 1 mean the technique did better; the kind says whether a number is "
             "a wall-clock measurement, an exact count, or comes from a model or a simulator (whose constants "
             "the report lists). The range is the min-max of the ratio over the repeats. Rerun every "
             "system and regenerate this page and the catalogue with "
             "`mlsys-flows bench all --scale quick --record`.", "",
             "The same data as a browsable HTML catalogue, with each run's plot and a page per system holding "
             "its full report and its history across runs: `mlsys-flows report` (writes "
             f"`{OUT}/index.html`; opens from a file, no server; `--storage BLOCK` adds the reports on a "
             "storage block).", "", "![The results catalogue](img/results-catalogue.png)", "",
             "| system | verdict vs the strongest deployable baseline | paper's claim | paper | headline (technique vs "
             "baseline) | kind | ratio | range | mechanism alone | regime | scale | device | commit | date |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        name = f"[{r['system']}]({r['system']}.md)" if (REPO / "docs" / f"{r['system']}.md").exists() \
            else r["system"]
        verdict = f"**{r['verdict']}**" if r["run_id"] else r["ratio"]
        commit = f"`{r['commit']}`" if r["commit"] else ""
        lines.append("| " + " | ".join(_md(c) for c in (
            name, verdict, r["claim"], r["paper"], r["headline"], r["kind"], r["ratio"], r["range"],
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


# ----- HTML: Jinja2 templates in mlsys_flows/docsgen/templates/catalogue/ -------------------------------------
TEMPLATES = Path(__file__).resolve().parent / "templates" / "catalogue"


def _breakable(text) -> Markup:
    """Escaped text that may wrap after each '_' or '/' (metric names are long and have no spaces)."""
    return Markup("<wbr>").join(escape(part) for part in re.split(r"(?<=[_/])", str(text)))


def _outcome(text: str) -> str:
    """The CSS class of a ratio's text: win above 1, loss below, tie at 1; '' when not a ratio."""
    try:
        value = float(str(text).rstrip("x"))
    except ValueError:
        return ""
    return "win" if value > 1 else "loss" if value < 1 else "tie"


def _short(text: str, n: int = 140) -> str:
    """The start of a long claim (the whole one is the cell's tooltip and on the system's page)."""
    return text if len(text) <= n else text[:n].rsplit(" ", 1)[0] + " \u2026"


@functools.cache
def _templates():
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(breakable=_breakable, outcome=_outcome, short=_short)
    env.globals.update(KIND_TEXT=KIND_TEXT, SMOKE_NOTE=SMOKE_NOTE)
    return env


def _render(template: str, **context: Any) -> str:
    return _templates().get_template(template).render(**context) + "\n"


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
    table = overhead(results)
    if table:
        table["cells"] = [[_cell(row.get(c)) for c in table["columns"]] for row in table["rows"]]
        table["numeric"] = [i for i, c in enumerate(table["columns"])
                            if any(isinstance(row.get(c), (int, float)) for row in table["rows"])]
    index_rows = [{**r, "link": f"systems/{r['system']}.html",
                   "thumb": image_names(r["system"], by.get(r["system"], [])).get("thumb")} for r in rs]
    pages = {"index.html": _render("index.html", title="mlsys-flows results catalogue", rows=index_rows,
                                   sources=sources, overhead=table,
                                   with_run=sum(bool(r["run_id"]) for r in rs))}
    for r in rs:
        pages[f"systems/{r['system']}.html"] = _system_page(r, by.get(r["system"], []))
    return pages


def _system_page(row: dict[str, str], runs: list[Found]) -> str:
    spec = registry.get(row["system"])
    paper_claims = [[c.metric + (" (headline)" if c.headline else ""), f"{c.technique} vs {c.baseline}", c.better,
                     fmt.ratio(c.paper), c.statement] for c in spec.claims]
    run = current(runs)
    return _render("system.html", title=f"{spec.name}: {spec.title}", spec=spec, paper_claims=paper_claims,
                   run=_run_context(run) if run else None, images=image_names(spec.name, runs),
                   history=_history_rows(runs))


def _run_context(run: Found) -> dict[str, Any]:
    """What the system page shows of its current run, every number formatted."""
    r = run.report
    env = r["environment"]
    claims = []
    for name, x in claim_rows(r):
        base, tech = fmt.column(x["metric"], [x["baseline_value"], x["technique_value"]])
        claims.append({"name": name, "verdict": verdict_of(r, x).label(), "kind": x["kind"], "baseline": base,
                       "technique": tech,
                       "ratio": fmt.ratio(x["ratio"]), "range": fmt.ratio_range(x.get("range"), x["kind"]),
                       "repeats": x.get("repeats", ""), "paper": fmt.ratio(x.get("paper"))})
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
    if r.get("constraint"):
        facts.insert(0, ("constraint", constraint_text(r)))
    return {"id": r["run_id"], "scale": r.get("scale", ""), "date": r["created_at"][:10], "claims": claims,
            "verdict": verdict_text(r),
            "variants": variant_tables(r),
            "assumptions": [[m, k, f"{fmt.exact(a.get('value'))} {a.get('unit', '')}".strip(), a.get("source", "")]
                            for m, consts in r.get("assumptions", {}).items() for k, a in consts.items()],
            "notes": r.get("notes", []),
            "parameters": [[k, fmt.exact(v)] for k, v in r.get("parameters", {}).items()], "facts": facts}


def _history_rows(runs: list[Found]) -> list[list[str]]:
    body = []
    for f in reversed(runs):
        r, env = f.report, f.report["environment"]
        h = r["headline"]
        s = h.get("vs_strongest") or {}
        body.append([r["created_at"][:19].replace("T", " "), env.get("git_sha", "")[:8], r.get("scale", ""),
                     env["device"], f"{h['metric']}: {h['technique']} vs {h['baseline']}", fmt.ratio(h["ratio"]),
                     fmt.ratio_range(h.get("range"), h["kind"]),
                     f"{fmt.ratio(s['ratio'])} vs {s['baseline']}" if s else "", env.get("code_hash", "")[:8], f.source])
    return body


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
    # tick labels by magnitude with a scaled unit (234.9 MB, 150 ms), not matplotlib's "1e8" offset
    # above the axis; a fixed unit (samples/s) is left to the title
    from matplotlib.ticker import FuncFormatter

    unit = fmt.unit_of(h["metric"])
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt.metric(h["metric"], v).removesuffix(f" {unit.label}")
                                               if unit.family == "fixed" else fmt.metric(h["metric"], v)))


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
        from mlsys_flows.systems.common.runreport import RunReport

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
    cache = image_cache()
    for system, runs in by.items():
        if system not in registry.names():
            continue
        imgs = image_names(system, runs)
        run = current(runs).report
        for key, make in (("plot", lambda: plot_png(run)), ("thumb", lambda: thumbnail_png(run)),
                          ("history", lambda: history_png(runs))):
            target = out / imgs[key]
            if not target.exists():
                target.write_bytes(_cached(cache, target.name, make))
    return out / "index.html"


# The rendering code: an image cached under one digest of it was drawn by exactly this code.
_RENDERERS = (__name__, "mlsys_flows.systems.common.plotting", "mlsys_flows.systems.common.formatting")


def image_cache() -> Path | None:
    """Where rendered images are kept across catalogues (``$XDG_CACHE_HOME/mlsys-flows``, else
    ``~/.cache/mlsys-flows``), under a digest of the rendering code; None when it cannot be made.
    Drawing the 81 images of the committed reports takes about 20 s on 2 cores; a second catalogue in
    another folder copies them."""
    import importlib.util
    import os

    digest = hashlib.sha256()
    for module in _RENDERERS:
        digest.update(Path(importlib.util.find_spec(module).origin).read_bytes())
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mlsys-flows" / "catalogue-img"
    try:
        folder = base / digest.hexdigest()[:16]
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    except OSError:
        return None


def _cached(cache: Path | None, name: str, make) -> bytes:
    """The image ``name`` from the cache, or drawn by ``make`` and kept there (written whole: a
    temporary file renamed into place, so a reader never sees half an image)."""
    import os
    import uuid

    kept = cache / name if cache is not None else None
    if kept is not None and kept.exists():
        return kept.read_bytes()
    data = make()
    if kept is not None:
        tmp = kept.with_name(f".{name}.{uuid.uuid4().hex}")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, kept)
        except OSError:
            tmp.unlink(missing_ok=True)
    return data
