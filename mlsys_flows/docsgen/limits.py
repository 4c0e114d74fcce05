"""Each system's documented parameter limits, read from its ``Params`` model (pure: no prefect).

The pydantic field constraints (``ge``/``gt``/``le``/``lt``, ``Literal`` choices) ARE the documented
limits: ``mlsys-flows generate`` renders them for every
system, a test checks that the page matches the models, and the reliability tests derive invalid
values from the same limits (``bad_override``).
"""
from __future__ import annotations

import functools
import math
import string
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types as at

from mlsys_flows import registry
from mlsys_flows.systems.common.params import SCALES, SystemParams

# Overrides the CLI and flows reject for every field: the scale is chosen by its own argument.
NOT_OVERRIDABLE = {"scale"}


@dataclass(frozen=True)
class FieldLimit:
    name: str
    kind: str  # int | float | bool | str | choice | other
    optional: bool
    lower: float | None
    lower_strict: bool
    upper: float | None
    upper_strict: bool
    choices: tuple[Any, ...]
    description: str
    presets: dict[str, Any]

    @property
    def range_text(self) -> str:
        if self.kind == "choice":
            return " \\| ".join(map(str, self.choices))
        if self.kind == "bool":
            return "true \\| false"
        lo = "" if self.lower is None else f"{_num(self.lower)} {'<' if self.lower_strict else '<='} "
        hi = "" if self.upper is None else f" {'<' if self.upper_strict else '<='} {_num(self.upper)}"
        return f"{lo}{self.name}{hi}" if (lo or hi) else "any " + self.kind


def _num(v: float) -> str:
    return f"{v:g}" if isinstance(v, float) else f"{v:,}".replace(",", "_")


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """(inner type, optional) of ``X | None`` / ``Optional[X]``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], len(args) < len(typing.get_args(annotation))
    return annotation, False


def field_limits(model: type[SystemParams]) -> list[FieldLimit]:
    out = []
    for name, f in model.model_fields.items():
        if name in NOT_OVERRIDABLE:
            continue
        inner, optional = _unwrap(f.annotation)
        choices: tuple[Any, ...] = ()
        if typing.get_origin(inner) is Literal:
            kind, choices = "choice", typing.get_args(inner)
        elif inner is bool:
            kind = "bool"
        elif inner in (int, float, str):
            kind = inner.__name__
        else:
            kind = "other"
        lower = upper = None
        lower_strict = upper_strict = False
        for m in f.metadata:
            if isinstance(m, at.Ge):
                lower = m.ge
            elif isinstance(m, at.Gt):
                lower, lower_strict = m.gt, True
            elif isinstance(m, at.Le):
                upper = m.le
            elif isinstance(m, at.Lt):
                upper, upper_strict = m.lt, True
        default = f.get_default(call_default_factory=True)  # a list field's default comes from its factory
        presets = {s: model.preset(s).get(name, default) for s in SCALES}
        out.append(FieldLimit(name, kind, optional, lower, lower_strict, upper, upper_strict, choices,
                              f.description or "", presets))
    return out


def render_markdown(specs: list | None = None) -> str:
    specs = registry.all_specs() if specs is None else specs
    lines = ["# Parameter limits", "",
             "Generated from each system's `Params` model by `mlsys-flows generate`",
             "(`tests/unit/test_bad_inputs.py::test_limits_doc_matches_models` fails when this page drifts).",
             "A value outside its range, of the wrong type, or an unknown key is rejected before any work",
             "starts, with an error that names the parameter (CLI: one line on stderr, exit code 2; flow:",
             "`ParamsError`). `scale` is chosen by `--scale` / the flow's `scale` argument, never as an override;",
             "`run_key` (flow argument) must be 1-128 letters, digits, `.`, `_` or `-`.", ""]
    for spec in specs:
        model = spec.params_model()
        lines += [f"## {spec.name}", "", "| parameter | type | limits | smoke | quick | full | description |",
                  "|---|---|---|---|---|---|---|"]
        for lim in field_limits(model):
            typ = lim.kind + (" or null" if lim.optional else "")
            vals = [str(lim.presets[s]).replace("|", "\\|") for s in SCALES]
            lines.append(f"| `{lim.name}` | {typ} | {lim.range_text} | {' | '.join(vals)} | "
                         f"{lim.description.replace('|', chr(92) + '|')} |")
        lines.append("")
    return "\n".join(lines)


# ----- invalid values (used by the reliability tests; hypothesis is a test dependency) -----------
JUNK = ("not-a-value", [1, 2], {"nested": 1})


def _past(limit: float, step: float) -> float:
    """``limit + step``, but never equal to the limit: near 1e15 a small float step rounds away."""
    value = limit + step
    return value if value != limit else math.nextafter(limit, math.copysign(math.inf, step))


def bad_values(lim: FieldLimit):
    """A hypothesis strategy of values this field must reject."""
    from hypothesis import strategies as st

    options = [st.sampled_from(JUNK if lim.kind != "str" else JUNK[1:])]
    if not lim.optional:
        options.append(st.none())
    if lim.kind in ("int", "float"):
        step = st.integers(1, 10**6) if lim.kind == "int" else st.floats(1e-3, 1e9)
        if lim.lower is not None:  # zero, negative, just below the limit
            low = lim.lower if lim.lower_strict else None
            options.append(step.map(lambda d, lo=lim.lower: _past(lo, -d)))
            if low is not None:
                options.append(st.just(low))
        if lim.upper is not None:  # huge values past the documented limit
            options.append(step.map(lambda d, hi=lim.upper: _past(hi, d)))
            if lim.upper_strict:
                options.append(st.just(lim.upper))
            options.append(st.just(math.inf))
        if lim.kind == "int":
            options.append(st.sampled_from([1.5, "12abc"]))
    elif lim.kind == "bool":
        options.append(st.sampled_from(["maybe", 2, -1]))
    elif lim.kind == "choice":
        options.append(st.text(string.ascii_letters + "-_", min_size=1, max_size=12).filter(lambda s: s not in lim.choices))
    elif lim.kind == "str":
        options.append(st.integers())
    return st.one_of(options)


@functools.lru_cache(maxsize=None)
def bad_override(model: type[SystemParams]):
    """Strategy of (parameter name, overrides dict) with exactly one invalid entry: a field with a
    wrong-typed or out-of-range value, or an unknown key."""
    from hypothesis import strategies as st

    limits = [lim for lim in field_limits(model) if lim.kind != "other"]
    fields = set(model.model_fields)
    unknown = st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True).filter(lambda k: k not in fields)
    cases = [unknown.map(lambda k: (k, {k: 1}))]
    cases += [bad_values(lim).map(lambda v, n=lim.name: (n, {n: v})) for lim in limits]
    return st.one_of(cases)


if __name__ == "__main__":
    print(render_markdown(), end="")
