"""Prefect task of the placement flow: place one graph with every solver and save the splits."""
from __future__ import annotations

import json

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.placement import Params, load, solve_graph


@task(name="placement-solve")
def solve(p: Params, storage: ObjectStorage, graph: str, key: str) -> dict:
    """DP, IP and the baselines on ``graph``; the node -> device splits go to ``key`` (JSON); returns the
    metrics without the splits."""
    log = get_run_logger()
    g = load(graph)
    log.info("graph %s: %d nodes, %d edges", g.name, g.n, len(g.edges))
    res = solve_graph(g, p, log=log.info)
    placements = {v: dict(zip(res["ids"], r["device"])) for v, r in res["results"].items()}
    storage.write_bytes(key, json.dumps({"graph": graph, "accelerators": res["accelerators"], "cpus": res["cpus"],
                                         "device_numbering": "0..k-1 accelerators, k..k+l-1 CPU cores",
                                         "placements": placements}).encode())
    for r in res["results"].values():
        del r["device"]
    del res["ids"]
    res["key"] = key
    return res
