"""The catalogue of systems, in one declarative list (Metaflow-style: lazily imported).

An implemented system publishes its spec as ``SPEC`` in ``systems/<name>/__init__.py`` and is
named here by its name; a planned system keeps its spec here, claims included, until it is built.
Listing the catalogue imports the implemented system packages (pure: no prefect, dask or torch).
"""
from __future__ import annotations

import importlib
from functools import cache
from typing import Any

from mlsys_flows.systems.common.spec import Claim, SystemSpec, reduction


def _planned(name, title, paper, family, metric, baseline, technique, better, value, statement) -> SystemSpec:
    return SystemSpec(name, title, paper, family,
                      (Claim(metric, baseline, technique, better, value, statement, headline=True),))


# The catalogue, in the order of SYSTEMS.md. A string names an implemented system's package.
CATALOGUE: tuple[str | SystemSpec, ...] = (
    # Input data pipelines
    "cedar", "recd", "dsi",
    # Recommendation embeddings
    "recshard", "flexshard",
    "fae", "hotline", "slipstream",
    # Mixture of experts
    "swiftmoe", "moetuner",
    # Parallelism, placement, fault tolerance
    "recycle",
    "checkpoint",
    "placement",
    "phaze",
    # LLM serving, caching, retrieval, simulation
    "vcache",
    "radix",
    "metropolis",
    "bagel",
    # Serverless, edge, federated
    "llama",
    "swarm",
    "fluid",
    # Hardware and security
    "shef",
    "sia",
    # Graphs, agents, operations
    "commrand",
    "embodiedbench",
    "era",
    "atlas",

)


@cache
def _specs() -> dict[str, SystemSpec]:
    specs = [e if isinstance(e, SystemSpec) else _implemented(e) for e in CATALOGUE]
    return {s.name: s for s in specs}


def _implemented(name: str) -> SystemSpec:
    spec = importlib.import_module(f"mlsys_flows.systems.{name}").SPEC
    if spec.name != name:
        raise ValueError(f"systems/{name}/ publishes the spec of {spec.name!r}")
    return spec


class UnknownSystem(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return self.args[0]


def names() -> list[str]:
    """Every system's name, without importing any system package."""
    return [e if isinstance(e, str) else e.name for e in CATALOGUE]


def get(name: str) -> SystemSpec:
    if name not in names():
        raise UnknownSystem(f"unknown system {name!r}; known: {', '.join(names())}")
    return _specs()[name]


def all_specs() -> list[SystemSpec]:
    return list(_specs().values())


def implemented() -> list[SystemSpec]:
    return [s for s in all_specs() if s.status == "implemented"]


def markdown_table() -> str:
    """The system table of the README (kept in sync by a test)."""
    lines = ["| system | family | status | paper | headline claim (paper) |", "|---|---|---|---|---|"]
    for s in all_specs():
        doc = f"[{s.name}](docs/{s.name}.md)" if s.status == "implemented" else s.name
        lines.append(f"| {doc} | {s.family} | {s.status} | {s.paper} | {s.headline.statement} |")
    return "\n".join(lines)


def __getattr__(name: str) -> Any:
    if name == "SYSTEMS":  # the whole catalogue, loaded on first use
        return tuple(all_specs())
    raise AttributeError(name)
