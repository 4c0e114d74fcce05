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
    _planned("shef", "ShEF: shielded enclaves for cloud FPGAs", "arXiv:2103.03500", "hardware-security",
       "throughput_mb_s", "uniform_shield", "custom_shield", "higher", None,
       "security at minimum overhead through per-region customized Shield engines"),
    _planned("sia", "SIA: incremental-QR learned string index on FPGA", "SIA (VLDB 2024)", "hardware-security",
       "ops_per_s", "full_retrain", "sia", "higher", 2.6, "2.6x and 3.4x throughput vs ALEX, LIPP, SIndex"),
    # Graphs, agents, operations
    _planned("commrand", "COMM-RAND: community-aware GNN mini-batching", "COMM-RAND", "graphs-agents-ops",
       "epoch_time_s", "random", "comm_rand", "lower", 1.8,
       "up to 2.76x (1.8x average) faster training within 1.79 (0.42 average) points of accuracy"),
    _planned("embodiedbench", "EmbodiedBench: embodied agent benchmark", "arXiv:2502.09560", "graphs-agents-ops",
       "success_rate", "no_feedback", "with_feedback", "higher", None,
       "best model averages 28.9%; high-level tasks easier than low-level manipulation"),
    _planned("era", "ERA: embodied prior learning + online RL", "ERA", "graphs-agents-ops",
       "success_rate", "rl_scratch", "prior_rl", "higher", None,
       "a 3B model beats GPT-4o by 8.4 (high level) and 19.4 (low level) points"),
    _planned("atlas", "Atlas: LLM-synthesized causal graphs for root-cause analysis", "Atlas", "graphs-agents-ops",
       "top1_accuracy", "pc_algorithm", "atlas", "higher", None,
       "far better than data-driven causal discovery, close to the true graph"),

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
