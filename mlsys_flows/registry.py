"""The catalogue of systems: one declarative list of names, each imported when it is asked for.

Each system publishes its spec as ``SPEC`` in ``systems/<name>/__init__.py`` and is named here by
its package's name (as Metaflow lists its plugins by import path), in the order of the README's
system table. :func:`get` imports that one package, so a flow, a task on a Dask worker or ``run``
loads no other system; :func:`all_specs` (``mlsys-flows list``, docs generation) imports them all.
A system's package holds only its Params and SPEC at import (pydantic and dataclasses; its engine
loads on first use, see ``systems/common/lazy.py``): reading a spec starts no prefect, dask, numpy
or torch (``tests/unit/test_registry_imports.py``).
"""
from __future__ import annotations

import importlib
from functools import cache
from typing import Any

from mlsys_flows.errors import MlsysError
from mlsys_flows.systems.common.spec import SystemSpec

# The catalogue, in the order of the README's system table: each entry names a system's package.
CATALOGUE: tuple[str, ...] = (
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
def _load(name: str) -> SystemSpec:
    spec = importlib.import_module(f"mlsys_flows.systems.{name}").SPEC
    if spec.name != name:
        raise ValueError(f"systems/{name}/ publishes the spec of {spec.name!r}")
    return spec


class UnknownSystem(MlsysError, KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return self.args[0]


def names() -> list[str]:
    """Every system's name, without importing any system package."""
    return list(CATALOGUE)


def get(name: str) -> SystemSpec:
    """The spec of ``name``; imports that system's package alone."""
    if name not in CATALOGUE:
        raise UnknownSystem(f"unknown system {name!r}; known: {', '.join(names())}")
    return _load(name)


def all_specs() -> list[SystemSpec]:
    """Every system's spec, in catalogue order (imports every system's package)."""
    return [_load(name) for name in CATALOGUE]


def markdown_table() -> str:
    """The system table of the README (kept in sync by a test)."""
    lines = ["| system | family | paper | headline claim (paper) |", "|---|---|---|---|"]
    for s in all_specs():
        lines.append(f"| [{s.name}](docs/{s.name}.md) | {s.family} | {s.paper} | {s.headline.statement} |")
    return "\n".join(lines)


def __getattr__(name: str) -> Any:
    if name == "SYSTEMS":  # the whole catalogue, loaded on first use
        return tuple(all_specs())
    raise AttributeError(name)
