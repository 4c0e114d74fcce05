"""Prefect task of the RadixAttention flow: serve one workload with every variant, repeats interleaved."""
from __future__ import annotations

from prefect import get_run_logger, task

from mlsys_flows.systems.radix import Params


@task(name="radix-serve-workload")
def serve_workload(p: Params, workload: str) -> dict:
    """Build the workload's requests from the seed, serve them with each of the workload's variants
    (``run.variants_of``: no cache, the radix cache, the block-hash cache, the admission ablations),
    timing each pass; returns rates and counts."""
    from mlsys_flows.systems.radix.run import measure

    log = get_run_logger()
    result = measure(p, workload, log=log.info)
    log.info("%s done: %s", workload, {v: round(sorted(r)[len(r) // 2], 2) for v, r in result["rates"].items()})
    return result


@task(name="radix-regime")
def regime(p: Params) -> dict[float, dict[str, list[float]]]:
    """Requests/s without a cache, with the radix cache and with the block-hash cache at every
    shared-prefix share of the sweep."""
    from mlsys_flows.systems.radix.run import measure_regime

    return measure_regime(p, log=get_run_logger().info)
