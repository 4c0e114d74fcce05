"""Prefect tasks of the ShEF flow: the calibration of the tuned uniform baseline, then one Shielded
session, each on an FPGA board of the pool."""
from __future__ import annotations

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage, ResourcePool
from mlsys_flows.devices.fpga import open_board
from mlsys_flows.systems.shef import Params


@task(name="shef-calibrate")
def calibrate(p: Params, storage: ObjectStorage, key: str, pool: ResourcePool, trusted_roots: list[bytes]) -> dict:
    """On a claimed board: uniform_tuned's chunk, the fastest of ``p.tune_chunks`` measured on the
    calibration seed's workload (never the evaluated seed's), each boot verified against
    ``trusted_roots`` (the user's pinned trust anchor). Saves the sweep at ``key``."""
    from mlsys_flows.systems.shef import session

    log = get_run_logger()
    with pool.claim() as device:
        with open_board(device) as board:
            cal = session.calibrate(board, p, log=log.info, trusted_roots=trusted_roots)
    log.info("uniform_tuned: %s-byte chunks (calibration seed %s)", cal["chunk"], cal["calibration_seed"])
    storage.write_json(key, cal)
    return cal


@task(name="shef-session")
def shielded_session(p: Params, tuned: int, storage: ObjectStorage, key: str, pool: ResourcePool,
                     expected_measurement: bytes, trusted_roots: list[bytes]) -> dict:
    """On a claimed board: secure boot and attestation against ``expected_measurement`` (the
    user's own build, measured in the flow, not on the host) and ``trusted_roots`` (the user's trust
    anchor, read once in the flow), the four variants' workloads with repeats
    interleaved (timed on the device; uniform_tuned at ``tuned``-byte chunks), the results checked
    against the plaintext reference, then the attacks each variant's Shield must reject. Saves the
    per-repeat runs at ``key``."""
    from mlsys_flows.systems.shef import session
    from mlsys_flows.systems.shef.workload import variant_configs

    log = get_run_logger()
    configs = variant_configs(p, tuned)
    with pool.claim() as device:
        with open_board(device) as board:
            log.info("ShEF session on %s (board process %s)", device, board.pid)
            out = session.run(board, p, configs, p.repeats, log=log.info, expected_measurement=expected_measurement,
                              trusted_roots=trusted_roots)
            data_key = out.pop("data_key")
            out["attacks"] = session.attacks(board, p, configs, data_key)
    log.info("attacks rejected: %s", out["attacks"])
    storage.write_json(key, out)
    return out
