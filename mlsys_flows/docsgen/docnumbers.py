"""Numbers in the docs' prose that cannot drift from the committed RunReports.

A system page quotes a number from its committed quick run through an inline span that
``mlsys-flows generate`` fills from ``benchmarks/results/<name>-quick.json``::

    the DP wins by <!-- run:headline.ratio {:.2f}x -->1.13x<!-- /run --> at 6 accelerators

A span may read another committed report of the system instead (a run with other parameters, saved with
``--json benchmarks/results/<stem>.json``) by starting its path with ``@<stem>:``::

    <!-- run:@bagel-minilm:headline.ratio {:.2f}x -->1.21x<!-- /run -->

The path walks the report's JSON: ``a.b`` for keys, ``[2]`` for a list index, ``[key=value,...]`` for
the first list element whose fields match (``ratios[baseline=greedy].ratio``,
``regime.points[value=6].ratio``). The format is a ``str.format`` template (``{}`` when left out),
or ``verdict`` for a recorded verdict printed as its label (``<!-- run:regime.points[value=6].verdict verdict -->``:
outcome, ratio, interval and pairs, or 'no verdict (why)').

:func:`unmarked` finds the prose numbers that do neither: a decimal ratio or percentage (``1.13x``,
``60.2%``), or any number in a sentence that speaks of a run (``in the committed run ...``), outside
generated blocks, spans and code, unless the sentence cites the paper (or sits in a section whose heading names the paper). Rows of a page's history table
that name an earlier run id are records of that run, not of the committed one, and are left alone.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mlsys_flows.errors import MlsysError

SPAN = re.compile(r"<!-- run:(?P<path>\S+)(?: (?P<fmt>(?:(?!-->).)*?))? -->(?P<value>(?:(?!<!--).)*?)<!-- /run -->", re.S)
_STEP = re.compile(r"\.?([A-Za-z_][\w@-]*)|\[([^\]]*)\]")
# a run's number: a decimal ratio or percentage; or any number in a sentence that says it is a run's
_RUN_NUMBER = re.compile(r"(?<![\w.])\d+\.\d+\s?(?:x|%)(?!\w)")
_RUN_WORDS = re.compile(r"\b(?:committed (?:quick )?(?:run|report)|quick run|in this run)\b", re.I)
_PAPER = re.compile(r"paper|authors|abstract|\breports?\b|\bFig\.|\bTable \d|§|\bet al\b", re.I)
_PAPER_HEADING = re.compile(r"paper's claim|paper claims", re.I)
_BLOCKS = re.compile(r"<!-- (\w+):start -->.*?<!-- \1:end -->|```.*?```", re.S)
_CODE = re.compile(r"`[^`\n]*`")
_RUN_ID = re.compile(r"`([0-9a-f]{8})`")


class SpanError(MlsysError, ValueError):
    """A span's path does not resolve in the committed report."""


def resolve(report: dict, path: str) -> Any:
    """The value at ``path`` in ``report`` (see the module's docstring for the syntax)."""
    node: Any = report
    pos = 0
    for m in _STEP.finditer(path):
        if m.start() != pos:
            break
        pos = m.end()
        key, sel = m.group(1), m.group(2)
        try:
            if key is not None:
                node = node[key]
            elif re.fullmatch(r"-?\d+", sel):
                node = node[int(sel)]
            else:
                want = dict(part.split("=", 1) for part in sel.split(","))
                node = next(x for x in node if all(_same(x.get(k), v) for k, v in want.items()))
        except (KeyError, IndexError, TypeError, StopIteration, ValueError):
            raise SpanError(f"{path!r}: nothing at {m.group(0)!r}") from None
    if pos != len(path):
        raise SpanError(f"{path!r}: cannot read {path[pos:]!r}")
    return node


def _same(value: Any, text: str) -> bool:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(text) == float(value)
        except ValueError:
            return False
    return str(value) == text


VERDICT = "verdict"  # a span's format that prints a verdict (a report's JSON) as its label


def _verdict_label(value: Any) -> str:
    """``wins 1.12x (1.05-1.20x, 8 pairs)`` or ``no verdict (...)``: a recorded verdict as the report's pages print it."""
    from mlsys_flows.systems.common.runreport import Verdict

    if not isinstance(value, dict):
        raise TypeError(f"not a verdict: {value!r}")
    return Verdict.model_validate(value).label()


def render(text: str, report: dict | None, page: str = "", other=None) -> str:
    """``text`` with every span's value filled in from ``report`` (a page without spans is unchanged);
    ``other(stem)`` loads the report an ``@stem:`` span names."""
    def fill(m: re.Match) -> str:
        path, source = m.group("path"), report
        if path.startswith("@"):
            stem, _, path = path[1:].partition(":")
            source = other(stem) if other is not None else None
            if source is None:
                raise SpanError(f"{page}: a run span ({m.group('path')}) but no committed report {stem}.json")
        elif report is None:
            raise SpanError(f"{page}: a run span ({m.group('path')}) but no committed quick report")
        value = resolve(source, path)
        fmt = m.group("fmt") or "{}"
        try:
            shown = _verdict_label(value) if fmt == VERDICT else fmt.format(value)
        except (ValueError, TypeError) as exc:
            raise SpanError(f"{page}: {m.group('path')!r} = {value!r} does not fit {fmt!r}: {exc}") from None
        head = f"<!-- run:{m.group('path')}" + (f" {m.group('fmt')}" if m.group("fmt") else "") + " -->"
        return f"{head}{shown}<!-- /run -->"

    return SPAN.sub(fill, text)


def render_page(name: str, text: str, results: Path) -> str:
    path = results / f"{name}-quick.json"
    report = json.loads(path.read_text()) if path.exists() else None

    def other(stem: str) -> dict | None:
        if not stem.startswith(name + "-") or "/" in stem:  # a page reads only its own system's reports
            return None
        extra = results / f"{stem}.json"
        return json.loads(extra.read_text()) if extra.exists() else None

    return render(text, report, f"docs/{name}.md", other)


def unmarked(text: str, current_run: str | None = None) -> list[str]:
    """Sentences of ``text`` that quote a run's number outside a generated block or span and do not cite
    the paper. A table row naming a run id other than ``current_run`` (a history row) is exempt."""
    text = _BLOCKS.sub("\n\n", SPAN.sub(" ", text))
    out = []
    for section in re.split(r"(?m)^(?=#{1,6} )", text):
        heading = section.splitlines()[0] if section.startswith("#") else ""
        if _PAPER_HEADING.search(heading):  # "## The paper's claim": the paper's numbers
            continue
        out += _unmarked_in(section, current_run)
    return out


def _unmarked_in(text: str, current_run: str | None) -> list[str]:
    out = []
    for para in re.split(r"\n\s*\n", text):
        if para.lstrip().startswith("|"):  # a table: one row at a time
            units = [row for row in para.splitlines() if not _is_history_row(row, current_run)]
        else:
            flat = re.sub(r"\s+", " ", para)
            units = re.split(r"(?<=[.;])\s+(?=[A-Z(*-])", flat)
        for unit in units:
            ids = set(_RUN_ID.findall(unit))
            bare = _CODE.sub(" ", unit)
            quotes = _RUN_NUMBER.search(bare) or (
                (_RUN_WORDS.search(bare) or (current_run and current_run[:8] in ids))
                and re.search(r"(?<![\w.])\d", bare))
            if quotes and not _PAPER.search(bare):
                out.append(unit.strip()[:240])
    return out


def _is_history_row(row: str, current_run: str | None) -> bool:
    ids = set(_RUN_ID.findall(row))
    return bool(ids) and (current_run is None or current_run[:8] not in ids)
