"""Prefect tasks of the COMM-RAND flow: build the community-ordered SBM graph, then train every
mini-batch policy (random, community, comm_rand) interleaved, timed one after another in one task."""
from __future__ import annotations

import time

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.commrand import Graph, Params


@task(name="commrand-graph")
def make_graph(p: Params, storage: ObjectStorage, key: str) -> dict:
    """Generate the graph (CSR, features, labels, splits) and store it at ``key``."""
    log = get_run_logger()
    t0 = time.perf_counter()
    g = p.make_graph()
    storage.write_bytes(key, g.to_npz())
    info = {"key": key, "nodes": g.nodes, "edges": g.edges, "communities": g.communities,
            "homophily": g.homophily(), "train": len(g.train), "val": len(g.val), "test": len(g.test),
            "feature_bytes": int(g.features.nbytes), "row_bytes": int(g.features.shape[1] * g.features.itemsize)}
    log.info("commrand graph: %d nodes, %d directed edges (%.3f inside communities), %d communities, features "
             "%.1f MB; splits %d/%d/%d (%.1f s)", g.nodes, g.edges, info["homophily"], g.communities,
             g.features.nbytes / 1e6, info["train"], info["val"], info["test"], time.perf_counter() - t0)
    return info


@task(name="commrand-train")
def train(p: Params, storage: ObjectStorage, graph: dict) -> dict:
    """Every policy from the same initialisation, same epochs, lr and seeds; timed interleaved."""
    from mlsys_flows.systems.commrand.train import compare  # torch, on the worker only

    log = get_run_logger()
    g = Graph.from_npz(storage.read_bytes(graph["key"]))
    return compare(g, log=log.info, **p.train_kwargs())


@task(name="commrand-regime")
def regime(p: Params) -> dict:
    """The regime: every policy on a smaller graph at each label purity of ``p.regime_purity`` (one seed)."""
    from mlsys_flows.systems.commrand.train import sweep_purity  # torch, on the worker only

    return sweep_purity(log=get_run_logger().info, **p.regime_kwargs())
