"""Prefect tasks of the COMM-RAND flow: build the community-ordered SBM graph, pick each policy's learning
rate on a calibration graph, then train every mini-batch policy (random, community, comm_rand, comm_fixed)
interleaved, timed one after another in one task; then the community-size regime (rates calibrated per size)."""
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


@task(name="commrand-calibrate")
def calibrate(p: Params) -> dict:
    """Each policy's learning rate from ``p.lr_grid``, chosen on a calibration graph and seed the evaluation never uses."""
    from mlsys_flows.systems.commrand.train import calibrate as run  # torch, on the worker only

    return run(log=get_run_logger().info, **p.calibration_kwargs())


@task(name="commrand-train")
def train(p: Params, storage: ObjectStorage, graph: dict, lrs: dict, k: int | None = None) -> dict:
    """Every policy from the same initialisation, same epochs and seeds, its calibrated rate (and COMM-RAND's
    calibrated k, which comm_fixed inherits); timed interleaved."""
    from mlsys_flows.systems.commrand.train import compare  # torch, on the worker only

    log = get_run_logger()
    g = Graph.from_npz(storage.read_bytes(graph["key"]))
    return compare(g, log=log.info, **p.train_kwargs(lrs, k))


@task(name="commrand-regime")
def regime(p: Params) -> dict:
    """The regime: every policy on a graph at each community size of ``p.regime_community_batches`` (but the
    headline's own, which the result takes from the headline), learning rates calibrated per size."""
    from mlsys_flows.systems.commrand.train import sweep_community_batches  # torch, on the worker only

    return sweep_community_batches(log=get_run_logger().info, **p.regime_kwargs())
