"""Device placement of DNN operators (Tarnawski et al., NeurIPS 2020): the exact DP over downsets for
contiguous splits, the integer program for non-contiguous ones, and PipeDream-style, greedy,
local-search and one-accelerator baselines, on torch.fx models the project builds itself (the default:
``fx_resnet50``, ResNet-50 inference on 6 accelerators) or, opt-in through $MLSYS_PLACEMENT_GRAPHS, the
authors' published graphs."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from pydantic import Field, field_validator

from mlsys_flows.systems.common.lazy import lazy_exports
from mlsys_flows.systems.common.params import SystemParams
from mlsys_flows.systems.common.spec import Claim, Mechanism, Regime, SystemSpec

from .sources import FX_MODELS, GRAPHS_ENV, SHIPPED, GraphError, published_available, published_path

# the graphs, the solvers and the experiment (numpy, torch.fx) load on first use, not with the spec
lazy_exports(__name__, {
    ".graph": ("Graph", "load", "score"),
    ".experiment": ("contiguous_splits", "solve_graph", "infeasible", "sweep_accelerators"),
})

VARIANTS = ("dp", "ip", "dp_chain", "pipedream", "greedy", "local_search", "one_accelerator")
# The contiguous variants the accelerator sweep (the regime) places at every k; the IP is left out.
SWEPT = ("dp", "dp_chain", "pipedream", "greedy", "local_search", "one_accelerator")
DEFAULT_GRAPH = "fx_resnet50"


def _check_graph(value: str) -> str:
    if value in FX_MODELS:
        return value
    if value in SHIPPED:
        try:
            published_path(value)
        except GraphError as exc:
            raise ValueError(exc.problem) from None
        return value
    if not Path(value).is_file():
        raise ValueError(f"{value!r} is neither a built-in graph ({', '.join([*FX_MODELS, *SHIPPED])}) nor an "
                         "existing JSON file in the authors' format")
    return str(Path(value).resolve())  # the flow reads it where it runs, not where a worker's cwd is


class PresetGraphs(list):
    """The ``graphs`` of the quick and full presets: the published graphs present in $MLSYS_PLACEMENT_GRAPHS
    (none when it is unset), then the fx models other than the default. Its printed form names the rule,
    not the environment's outcome, so the generated parameter docs and the UI's preset text are the same
    with and without the variable."""

    def __init__(self):
        super().__init__([*published_available(), *(m for m in FX_MODELS if m != DEFAULT_GRAPH)])

    def __repr__(self) -> str:
        return (f"[published graphs in ${GRAPHS_ENV}, if set] + "
                f"{[m for m in FX_MODELS if m != DEFAULT_GRAPH]!r}")

    __str__ = __repr__


class _Presets(Mapping):
    """PRESETS, read afresh on every access: the quick and full graph lists follow $MLSYS_PLACEMENT_GRAPHS
    as it is when the parameters are made, so every preset validates with or without the variable."""

    _BASE = {
        "smoke": dict(graphs=[], ip_time_limit_s=1.0, local_search_s=0.5, regime_accelerators=[2, 6]),
        "quick": dict(ip_time_limit_s=5.0, local_search_s=2.0),
        "full": dict(ip_time_limit_s=120.0, local_search_s=30.0),
    }

    def __getitem__(self, scale: str) -> dict:
        values = dict(self._BASE[scale])
        if scale != "smoke":
            values["graphs"] = PresetGraphs()
        return values

    def __iter__(self):
        return iter(self._BASE)

    def __len__(self) -> int:
        return len(self._BASE)


class Params(SystemParams):
    SYSTEM: ClassVar[str] = "placement"
    PRESETS: ClassVar[Mapping] = _Presets()

    graph: str = Field(DEFAULT_GRAPH, min_length=1, max_length=1000,
                       description="Graph of the headline: a torch.fx model built by the project ("
                                   + ", ".join(FX_MODELS) + "; the default fx_resnet50 is ResNet-50 inference on 6 accelerators, the paper's "
                                   "headline setting, costed with a roofline model), a published graph of the authors ("
                                   + ", ".join(SHIPPED) + "; needs $" + GRAPHS_ENV + " set to the folder holding them) "
                                   "or a path to a JSON file in the authors' format.")
    graphs: list[str] = Field(default_factory=list, max_length=32,
                              description="Further graphs placed in the same run (same names as graph); their results "
                                          "are variants named '<variant>@<graph>'. The quick and full presets list the "
                                          "published graphs only when $" + GRAPHS_ENV + " names a folder holding them "
                                          "(otherwise none), then the other fx models.")
    accelerators: int | None = Field(None, ge=1, le=64, description="Accelerators k (None: the graph file's maxFPGAs).")
    cpus: int | None = Field(None, ge=0, le=16, description="CPU cores l (None: the graph file's maxCPUs).")
    memory_per_accelerator: float | None = Field(None, gt=0, le=1e15,
                                                 description="Bytes per accelerator (None: the graph file's maxSizePerFPGA).")
    regime_accelerators: list[int] = Field([1, 2, 3, 4, 6, 8, 12], min_length=2, max_length=16,
                                           description="Accelerator counts k of the regime sweep: the headline graph "
                                                       "placed by every contiguous variant at each k (same CPUs and "
                                                       "memory), the DP's gain over the strongest baseline per k.")
    ip_time_limit_s: float = Field(6.0, ge=0.1, le=3600.0, description="HiGHS time limit of the integer program, per graph.")
    local_search_s: float = Field(2.0, ge=0.05, le=3600.0, description="Time budget of the local-search baseline, per graph.")
    max_ideals: int = Field(60_000, ge=10, le=2_000_000,
                            description="Cap on downsets of the contracted graph; above it the DP stops with an error.")

    @field_validator("regime_accelerators")
    @classmethod
    def _ks(cls, v):
        if any(not 1 <= k <= 64 for k in v) or len(set(v)) != len(v):
            raise ValueError("accelerator counts must be distinct, each from 1 to 64")
        return sorted(v)

    @field_validator("graph")
    @classmethod
    def _graph(cls, v):
        return _check_graph(v)

    @field_validator("graphs")
    @classmethod
    def _graphs(cls, v):
        for g in v:
            _check_graph(g)
        if len(set(v)) != len(v):
            raise ValueError("graphs lists a graph twice")
        return v


def graph_label(name: str) -> str:
    return Path(name).stem if name not in SHIPPED and name not in FX_MODELS else name


SPEC = SystemSpec(
    name="placement", title="Optimal device placement by DP over downsets", paper="Tarnawski et al., NeurIPS 2020",
    family="parallelism", params=Params,
    kinds={"max_load": "modelled", "ip_bound": "modelled", "ip_gap": "modelled", "ideals": "counted",
           "ideal_pairs": "counted"},
    baselines=("pipedream", "greedy", "local_search", "one_accelerator"),
    # every baseline sees only the graph it places: nothing is tuned on an evaluated workload
    roles={"pipedream": ("paper", "deployable"), "greedy": ("deployable",), "local_search": ("deployable",),
           "one_accelerator": ("deployable",)},
    mechanism=Mechanism("the DP over every downset of the operator DAG",
                        "dp_chain",
                        "dp_chain is the same exact DP and cost model over the prefixes of one topological order "
                        "(the DAG linearised into a chain, no node fusion): it keeps everything but the search over "
                        "the DAG's downsets, which is what lets a split follow the graph's branches"),
    regime=Regime("accelerators", unit="devices", paper_value=6,
                  paper_source="Tarnawski et al., NeurIPS 2020, experimental section: ResNet-50 inference on 6 "
                               "accelerators",
                  statement="with one accelerator there is nothing to split; the more stages, the more a split "
                            "that follows the DAG's branches (not a chain through it) can balance"),
    claims=(
        Claim("max_load", "pipedream", "dp", "lower", 1.17,
              "the optimal contiguous split's max-load is 1.17x lower than PipeDream's on ResNet-50 inference "
              "with 6 accelerators (1.3x lower than a human expert's), on the authors' profiled graph; measured by "
              "default on fx_resnet50 (ResNet-50 traced with torch.fx, roofline costs; the authors' graph: "
              "graph=resnet50_inference with $" + GRAPHS_ENV + ")",
              headline=True),
        Claim("max_load", "greedy", "dp", "lower", statement="against greedy contiguous filling"),
        Claim("max_load", "local_search", "dp", "lower", statement="against local search over contiguous splits"),
        Claim("max_load", "one_accelerator", "dp", "lower",
              statement="against no model parallelism (one accelerator and the CPU cores)"),
        Claim("max_load", "dp", "ip", "lower",
              statement="what non-contiguous splits (the IP, time-limited) gain over the best contiguous split"),
    ),
)

__all__ = ["Params", "SPEC", "VARIANTS", "SWEPT", "sweep_accelerators", "DEFAULT_GRAPH", "Graph", "GraphError", "load", "score", "solve_graph", "graph_label"]
