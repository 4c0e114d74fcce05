"""Prefect task of the placement flow: place one graph with every solver and save the splits."""
from __future__ import annotations

import json

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.placement import Graph, Params, load, solve_graph, sweep_accelerators


@task(name="placement-solve")
def solve(p: Params, storage: ObjectStorage, graph: Graph | str, key: str) -> dict:
    """DP, IP and the baselines on ``graph`` (a graph the flow read, or a built-in model's name); the
    node -> device splits go to ``key`` (JSON); returns the metrics without the splits."""
    log = get_run_logger()
    g = graph if isinstance(graph, Graph) else load(graph)
    log.info("graph %s: %d nodes, %d edges", g.name, g.n, len(g.edges))
    res = solve_graph(g, p, log=log.info)
    placements = {v: dict(zip(res["ids"], r["device"])) for v, r in res["results"].items()}
    storage.write_bytes(key, json.dumps({"graph": g.name, "accelerators": res["accelerators"], "cpus": res["cpus"],
                                         "device_numbering": "0..k-1 accelerators, k..k+l-1 CPU cores",
                                         "placements": placements}).encode())
    for r in res["results"].values():
        del r["device"]
    del res["ids"]
    res["key"] = key
    return res


@task(name="placement-regime")
def regime(p: Params, graph: Graph | str) -> dict[int, dict[str, float]]:
    """The contiguous variants' max-load on ``graph`` at each accelerator count of the regime sweep."""
    log = get_run_logger()
    out = sweep_accelerators(graph if isinstance(graph, Graph) else load(graph), p)
    for k, loads in out.items():
        log.info("k=%d: PipeDream/DP %.3f, dp_chain/DP %.3f", k, loads["pipedream"] / loads["dp"],
                 loads["dp_chain"] / loads["dp"])
    return out
