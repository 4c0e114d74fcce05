"""Where a placement graph comes from (pure: os and pathlib only, so the spec's parameters validate a
graph name without loading numpy): the project's torch.fx models, and the graphs the authors
published, found in $MLSYS_PLACEMENT_GRAPHS when a user sets it."""
from __future__ import annotations

import os
from pathlib import Path

from mlsys_flows.errors import MlsysError

GRAPHS_ENV = "MLSYS_PLACEMENT_GRAPHS"
# The six graphs the authors published with their code (msr-fiddle/dnn-partitioning, MIT licence). They
# are not part of this project: a user opts in by pointing $MLSYS_PLACEMENT_GRAPHS at a folder holding them.
SHIPPED = {
    "bert24_inference": "bert24_inference.layer.json",
    "bert24_training": "bert24_training.layer.json",
    "resnet50_inference": "resnet50_inference.layer.json",
    "resnet50_training": "resnet50_training.layer.json",
    "gnmt_inference": "gnmt_inference.layer.json",
    "bert_l3_inference": "bert_l-3_inference.operator.json",
}
# Graphs built by the project itself (torch.fx, systems/placement/fxgraph.py): always available.
FX_MODELS = ("fx_resnet50", "fx_transformer", "fx_resnet")


class GraphError(MlsysError, ValueError):
    """A graph could not be found or is malformed; ``field`` names the parameter or JSON field."""

    def __init__(self, field: str, problem: str):
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}")


def graphs_dir() -> Path | None:
    """Folder of the published graphs: $MLSYS_PLACEMENT_GRAPHS, or None when it is unset (the published
    graphs are opt-in; nothing is searched for beside the repository)."""
    env = os.environ.get(GRAPHS_ENV)
    return Path(env) if env else None


def published_path(graph: str, field: str = "graph") -> Path:
    """The file of the published graph ``graph``; GraphError naming ``field`` when the variable is unset
    or the file is not in its folder."""
    folder = graphs_dir()
    if folder is None:
        raise GraphError(field, f"published graph {graph!r} needs the authors' data: set ${GRAPHS_ENV} to the "
                                f"folder holding {SHIPPED[graph]} (their placement graphs, msr-fiddle/"
                                f"dnn-partitioning), or use a built-in graph ({', '.join(FX_MODELS)})")
    path = folder / SHIPPED[graph]
    if not path.is_file():
        raise GraphError(field, f"published graph {graph!r} not found at {path}; set ${GRAPHS_ENV} to the folder "
                                "holding the authors' placement graphs")
    return path


def published_available() -> list[str]:
    """The published graphs present in $MLSYS_PLACEMENT_GRAPHS (none when it is unset)."""
    folder = graphs_dir()
    return [] if folder is None else [g for g, f in SHIPPED.items() if (folder / f).is_file()]
