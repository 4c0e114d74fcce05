"""Reproduce a RunReport: rerun its system with the parameters, seed and scale it records, then set
each comparison of the two runs side by side with whether their verdicts agree (as MLPerf's
submission checker checks a submission against its rules, a reader checks a result against a rerun).
Pure except :func:`reproduce`, which runs the flow."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlsys_flows import registry
from mlsys_flows.errors import MlsysError


class ReproduceError(MlsysError, ValueError):
    """The report cannot be reproduced as asked (unreadable, unknown system, other code)."""


@dataclass(frozen=True)
class Row:
    comparison: str
    recorded: str
    rerun: str
    agree: bool


def load(path: str | Path) -> dict[str, Any]:
    """A RunReport as JSON, checked enough to rerun it: one line naming what is wrong otherwise."""
    try:
        report = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ReproduceError(f"{path}: no such file") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReproduceError(f"{path}: not a JSON RunReport ({type(exc).__name__})") from None
    missing = [k for k in ("system", "scale", "parameters", "headline", "environment") if not isinstance(report, dict)
               or k not in report]
    if missing:
        raise ReproduceError(f"{path}: not a RunReport (no {', '.join(missing)})")
    if report["system"] not in registry.names():
        raise ReproduceError(f"{path}: system {report['system']!r} is not one of this checkout's "
                             f"({', '.join(registry.names())})")
    return report


def code_differs(report: dict[str, Any]) -> str | None:
    """Why this checkout's code is not the report's (its system's code hash), or None."""
    from mlsys_flows.systems.common.environment import code_hash

    recorded, here = report["environment"].get("code_hash", ""), code_hash(report["system"])
    if recorded == here:
        return None
    return (f"the report was made by other code than this checkout's {report['system']} "
            f"(code {recorded[:10] or 'not recorded'}, here {here[:10]}): its numbers would not be reproduced by "
            "the same code; pass --other-code to rerun anyway")


def overrides(report: dict[str, Any]) -> dict[str, Any]:
    """The recorded parameters as the run's overrides (the scale is its own argument)."""
    return {k: v for k, v in report["parameters"].items() if k != "scale"}


def _comparisons(report: dict[str, Any]) -> dict[tuple[str, str, str], tuple[str, dict]]:
    from mlsys_flows.rendering import claim_rows

    return {(r["metric"], r["technique"], r["baseline"]): (name, r) for name, r in claim_rows(report)}


def _label(report: dict[str, Any], ratio: dict) -> tuple[str, str]:
    from mlsys_flows.rendering import verdict_of

    v = verdict_of(report, ratio)
    return v.outcome, f"{v.label()} {ratio['kind']}"


def compare(recorded: dict[str, Any], rerun: dict[str, Any]) -> list[Row]:
    """Every comparison of either report, the recorded one's order first: both verdicts and whether
    their outcomes (wins, loses, ties) agree. A comparison one run lacks does not agree."""
    old, new = _comparisons(recorded), _comparisons(rerun)
    rows = []
    for key in list(old) + [k for k in new if k not in old]:
        name = (old.get(key) or new[key])[0]
        a = _label(recorded, old[key][1]) if key in old else ("", "absent")
        b = _label(rerun, new[key][1]) if key in new else ("", "absent")
        rows.append(Row(name, a[1], b[1], bool(a[0]) and a[0] == b[0]))
    return rows


def reproduce(path: str | Path, *, other_code: bool = False, storage=None, cluster=None, devices=None):
    """(recorded report, rerun RunReport, rows): rerun ``path``'s system with its recorded parameters.
    Raises ReproduceError before any work when the file is not a RunReport or, unless
    ``other_code``, when this checkout's code of the system differs from the report's."""
    from mlsys_flows.platform.runner import run_system, validate

    recorded = load(path)
    why = code_differs(recorded)
    if why and not other_code:
        raise ReproduceError(why)
    name, scale, params = recorded["system"], recorded["scale"], overrides(recorded)
    validate(name, scale, params)
    rerun = run_system(name, scale, params, storage=storage, cluster=cluster, devices=devices,
                       tags=("cli", "reproduce"))
    return recorded, rerun, compare(recorded, rerun.model_dump(mode="json"))
