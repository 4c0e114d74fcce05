"""Operator graphs in the published JSON format of Tarnawski et al. (NeurIPS 2020), the paper's cost
model, and an independent scorer of any split (feasibility, contiguity, per-device load).

Cost model (the paper's; the authors' code): a device's load is the compute of its nodes (``fpgaLatency``
on an accelerator, ``cpuLatency`` on a CPU core) plus, on accelerators only, communication: a node whose
output leaves its device pays its output ``cost`` once on its own device and once on every distinct
device that receives it (not once per edge). Memory: the ``size`` of the nodes on an accelerator must fit
``memory``. Nodes of one ``colorClass`` share a device; ``supportedOnFpga=0`` nodes must go to a CPU.
Devices ``0..k-1`` are accelerators, ``k..k+l-1`` CPU cores.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mlsys_flows.systems.common.graphs import is_acyclic

from .sources import (FX_MODELS, GRAPHS_ENV, SHIPPED, GraphError, graphs_dir,  # noqa: F401 (re-exported)
                      published_available, published_path)

@dataclass
class Graph:
    """A DAG of operators (nodes indexed 0..n-1) with the paper's per-node costs and the file's settings."""

    name: str
    ids: list                      # original node ids
    fpga: np.ndarray               # compute time on an accelerator
    cpu: np.ndarray                # compute time on a CPU core
    size: np.ndarray               # bytes on an accelerator
    supported: np.ndarray          # bool: may run on an accelerator
    backward: np.ndarray           # bool: backward-pass node (training graphs)
    color: np.ndarray              # colocation class (int); nodes without one get a class of their own
    out_cost: np.ndarray           # cost of moving the node's output to another device
    edges: list                    # (src, dst) index pairs
    accelerators: int = 6
    cpus: int = 1
    memory: float = math.inf
    succ: list = field(default_factory=list)
    pred: list = field(default_factory=list)

    def __post_init__(self):
        n = len(self.ids)
        self.succ = [[] for _ in range(n)]
        self.pred = [[] for _ in range(n)]
        for s, d in self.edges:
            self.succ[s].append(d)
            self.pred[d].append(s)

    @property
    def n(self) -> int:
        return len(self.ids)

    @property
    def training(self) -> bool:
        return bool(self.backward.any())

    def with_settings(self, accelerators=None, cpus=None, memory=None) -> "Graph":
        g = Graph(self.name, self.ids, self.fpga, self.cpu, self.size, self.supported, self.backward, self.color,
                  self.out_cost, self.edges, self.accelerators if accelerators is None else int(accelerators),
                  self.cpus if cpus is None else int(cpus), self.memory if memory is None else float(memory))
        return g

    def to_json(self) -> dict:
        return {"maxSizePerFPGA": self.memory if math.isfinite(self.memory) else 1e30,
                "maxFPGAs": self.accelerators, "maxCPUs": self.cpus,
                "nodes": [{"id": self.ids[i], "fpgaLatency": float(self.fpga[i]), "cpuLatency": float(self.cpu[i]),
                           "size": float(self.size[i]), "supportedOnFpga": int(self.supported[i]),
                           "isBackwardNode": int(self.backward[i]), "colorClass": int(self.color[i])}
                          for i in range(self.n)],
                "edges": [{"sourceId": self.ids[s], "destId": self.ids[d], "cost": float(self.out_cost[s])}
                          for s, d in self.edges]}


def from_json(doc: dict, name: str = "graph") -> Graph:
    """A Graph from the authors' JSON format; raises GraphError on a malformed document."""
    for key in ("nodes", "edges"):
        if key not in doc or not isinstance(doc[key], list):
            raise GraphError(key, f"graph {name!r} has no list {key!r}")
    nodes = doc["nodes"]
    if not nodes:
        raise GraphError("nodes", f"graph {name!r} has no nodes")
    idx, ids = {}, []
    for nd in nodes:
        for key in ("id", "fpgaLatency", "cpuLatency"):
            if key not in nd:
                raise GraphError(f"nodes.{key}", f"graph {name!r}: a node lacks {key!r}")
        if nd["id"] in idx:
            raise GraphError("nodes.id", f"graph {name!r}: duplicate node id {nd['id']}")
        idx[nd["id"]] = len(ids)
        ids.append(nd["id"])
    n = len(ids)
    fpga = np.array([float(nd["fpgaLatency"]) for nd in nodes])
    cpu = np.array([float(nd["cpuLatency"]) for nd in nodes])
    size = np.array([float(nd.get("size", 0.0)) for nd in nodes])
    if (fpga < 0).any() or (cpu < 0).any() or (size < 0).any() or not np.isfinite(np.r_[fpga, cpu, size]).all():
        raise GraphError("nodes", f"graph {name!r}: latencies and sizes must be finite and >= 0")
    supported = np.array([bool(nd.get("supportedOnFpga", 1)) for nd in nodes])
    backward = np.array([bool(nd.get("isBackwardNode", 0)) for nd in nodes])
    colors, color = {}, np.empty(n, dtype=np.int64)
    for i, nd in enumerate(nodes):
        key = ("c", nd["colorClass"]) if nd.get("colorClass") is not None else ("n", i)
        color[i] = colors.setdefault(key, len(colors))
    out_cost = np.zeros(n)
    seen_cost = {}
    edges = set()
    for e in doc["edges"]:
        try:
            s, d = idx[e["sourceId"]], idx[e["destId"]]
        except KeyError as exc:
            raise GraphError("edges", f"graph {name!r}: edge names unknown node {exc}") from None
        if s == d:
            raise GraphError("edges", f"graph {name!r}: self-loop on node {ids[s]}")
        c = float(e.get("cost", 0.0))
        if not (c >= 0 and math.isfinite(c)):
            raise GraphError("edges.cost", f"graph {name!r}: edge cost must be finite and >= 0")
        if s in seen_cost and abs(seen_cost[s] - c) > 1e-6 * max(1.0, c):
            raise GraphError("edges.cost", f"graph {name!r}: node {ids[s]} has two different outgoing costs "
                                           "(the model charges one cost per source node)")
        seen_cost[s] = c
        out_cost[s] = c
        edges.add((s, d))
    g = Graph(name, ids, fpga, cpu, size, supported, backward, color, out_cost, sorted(edges),
              int(doc.get("maxFPGAs", 6)), int(doc.get("maxCPUs", 1)), float(doc.get("maxSizePerFPGA", math.inf)))
    _check_dag(g)
    return g


def _check_dag(g: Graph) -> None:
    indeg = [len(p) for p in g.pred]
    stack = [i for i in range(g.n) if indeg[i] == 0]
    seen = 0
    while stack:
        v = stack.pop()
        seen += 1
        for w in g.succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                stack.append(w)
    if seen != g.n:
        raise GraphError("edges", f"graph {g.name!r} is not a DAG")
    for s, d in g.edges:
        if g.backward[s] and not g.backward[d]:
            raise GraphError("edges", f"graph {g.name!r}: edge from backward node {g.ids[s]} to forward node {g.ids[d]}")
    fw_colors = set(g.color[~g.backward].tolist())
    for i in np.flatnonzero(g.backward):
        if g.color[i] not in fw_colors:
            raise GraphError("nodes.colorClass", f"graph {g.name!r}: backward node {g.ids[i]} shares no colorClass "
                                                 "with a forward node")


def load(graph: str) -> Graph:
    """A graph by name: a built-in torch.fx model (``fx_resnet50``, ``fx_transformer``, ``fx_resnet``), a
    published graph (``resnet50_inference``...; needs $MLSYS_PLACEMENT_GRAPHS) or a path to a JSON file in
    the authors' format."""
    if graph in FX_MODELS:
        from .fxgraph import builtin
        return builtin(graph)
    if graph in SHIPPED:
        path = published_path(graph)
        name = graph
    else:
        path = Path(graph)
        if not path.is_file():
            raise GraphError("graph", f"{graph!r} is neither a built-in graph ({', '.join([*SHIPPED, *FX_MODELS])}) "
                                      "nor an existing JSON file")
        name = path.stem
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise GraphError("graph", f"cannot read {path}: {exc}") from None
    return from_json(doc, name)


# ----------------------------------------------------------------------------------------------------
# Independent scorer: written from the cost model above, shares no code with the solvers.

@dataclass
class Score:
    max_load: float
    loads: list            # per device
    feasible: bool
    contiguous: bool
    problems: list


def score(g: Graph, device: np.ndarray | list, k: int | None = None, l: int | None = None,
          memory: float | None = None) -> Score:
    """Loads of the split ``device`` (node index -> device), its feasibility (device range, colocation,
    accelerator support, memory) and whether it is contiguous (the devices can be ordered so that every
    forward edge goes to the same or a later device)."""
    k = g.accelerators if k is None else k
    l = g.cpus if l is None else l
    memory = g.memory if memory is None else memory
    device = [int(x) for x in device]
    problems = []
    if len(device) != g.n:
        return Score(math.inf, [], False, False, [f"{len(device)} assignments for {g.n} nodes"])
    if any(not 0 <= d < k + l for d in device):
        problems.append("device index out of range")
        return Score(math.inf, [], False, False, problems)
    loads = [0.0] * (k + l)
    mem = [0.0] * k
    for v in range(g.n):
        d = device[v]
        if d < k:
            loads[d] += g.fpga[v]
            mem[d] += g.size[v]
            if not g.supported[v]:
                problems.append(f"node {g.ids[v]} is not supported on an accelerator")
        else:
            loads[d] += g.cpu[v]
    for v in range(g.n):
        receivers = {device[w] for w in g.succ[v]} - {device[v]}
        if receivers:
            if device[v] < k:
                loads[device[v]] += g.out_cost[v]
            for d in receivers:
                if d < k:
                    loads[d] += g.out_cost[v]
    for d in range(k):
        if mem[d] > memory * (1 + 1e-12):
            problems.append(f"accelerator {d} holds {mem[d]:.4g} bytes > memory {memory:.4g}")
    by_color = {}
    for v in range(g.n):
        if by_color.setdefault(int(g.color[v]), device[v]) != device[v]:
            problems.append(f"colocation class of node {g.ids[v]} is split")
    # contiguity: the device graph of forward edges must be acyclic
    dedges = {(device[s], device[t]) for s, t in g.edges
              if not g.backward[s] and not g.backward[t] and device[s] != device[t]}
    contiguous = is_acyclic(dedges, k + l)
    return Score(max(loads), loads, not problems, contiguous, problems)
