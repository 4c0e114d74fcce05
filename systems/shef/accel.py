"""The accelerator: kernels that run on the FPGA board's process, reading and writing its memory
only through the Shield (device side; called with ``board.run("mlsys_flows.systems.shef.accel:...")``).

State that the real design keeps on chip (the data key, the Shield configurations from the
measured image, the freshness counters) lives in this module's globals inside the board's process;
the host never sees it. DRAM is the board's memory regions, which the host can read and overwrite.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import time

import numpy as np

from mlsys_flows.devices.fpga import (FpgaError, board_measurement, board_memory, board_session_key, device_kernel,
                                      read_image)

from .attest import unwrap_data_key
from .shield import EngineConfig, Shield, ShieldError, Traffic, region_keys
from .workload import block_order, lookup_indices, stream_digest, table_digest

_STATE: dict = {}


@device_kernel
def configure(image: bytes, wrapped_key: bytes) -> dict:
    """Take the Shield configurations from ``image`` (which must be the measured one) and unwrap the
    data key with the attested session key."""
    measurement = board_measurement()
    if hashlib.sha256(image).digest() != measurement:
        raise ShieldError("configure: the image handed to the accelerator is not the loaded (measured) one")
    doc = json.loads(read_image(image).payload)
    _STATE.clear()
    _STATE.update(doc=doc, measurement=measurement, shields={},
                  data_key=unwrap_data_key(board_session_key(), wrapped_key, measurement))
    return {"variants": sorted(doc["variants"]), "regions": sorted(doc["regions"])}


def _doc() -> dict:
    # on-chip state belongs to the image that configured it: another image loaded since cannot use it
    if "doc" not in _STATE or _STATE["measurement"] != board_measurement():
        raise FpgaError("the accelerator is not configured for the loaded image "
                        "(attest, then run configure)")
    return _STATE["doc"]


def _shield(variant: str, region: str) -> Shield:
    _doc()
    return _STATE["shields"][variant][region]


@device_kernel
def attach(variant: str) -> None:
    """Put a Shield in front of each of the variant's regions (the host has written them)."""
    doc, mem = _doc(), board_memory()
    _STATE["shields"][variant] = {
        r: Shield(mem, f"{variant}/{r}", EngineConfig(**cfg), _STATE["data_key"])
        for r, cfg in doc["variants"][variant].items()}


@device_kernel
def run_workload(variant: str, rep: int) -> dict:
    """One pass of the three workloads through the variant's Shields, each timed on the device."""
    doc = _doc()
    sh = _STATE["shields"][variant]
    regions, work = doc["regions"], doc["workload"]
    before = {r: Traffic(**s.traffic.as_dict()) for r, s in sh.items()}
    seconds = {}

    t0 = time.perf_counter()
    s, burst, total = sh["stream"], regions["stream"]["access"], 0
    for off in range(0, s.size, burst):
        total += stream_digest(s.read(off, burst))
    seconds["stream"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    s, rec = sh["table"], regions["table"]["access"]
    idx = lookup_indices(s.size // rec, work["lookups"], work["seed"], rep)
    records = b"".join(s.read(int(i) * rec, rec) for i in idx)
    table = table_digest(records, rec, np.arange(len(idx)))
    seconds["table"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    s, block = sh["scratch"], regions["scratch"]["access"]
    for pass_ in range(work["scratch_passes"]):
        for b in block_order(s.size // block, work["seed"], rep, pass_):
            off = int(b) * block
            data = np.frombuffer(s.read(off, block), np.uint8) + np.uint8(1)
            s.write(off, data.tobytes())
    seconds["scratch"] = time.perf_counter() - t0

    traffic = {}
    for r, sd in sh.items():
        t = sd.traffic.as_dict()
        traffic[r] = {k: t[k] - getattr(before[r], k) for k in t}
    return {"seconds": seconds, "traffic": traffic, "stream_digest": total % (1 << 64), "table_digest": table}


@device_kernel
def export_versions(variant: str, region: str) -> tuple[bytes, bytes]:
    """The region's chunk versions and a MAC over them (region MAC key), so the user can open the
    region's DRAM image and knows the versions are the accelerator's, not an old set."""
    shield = _shield(variant, region)
    versions = shield.versions.astype("<u4").tobytes()
    _, mac_key = region_keys(_STATE["data_key"], shield.region)
    return versions, hmac.digest(mac_key, b"versions|" + shield.region.encode() + b"|" + versions, "sha256")


def verify_versions(data_key: bytes, region: str, versions: bytes, mac: bytes) -> np.ndarray:
    """User side of :func:`export_versions`."""
    _, mac_key = region_keys(data_key, region)
    if not hmac.compare_digest(mac, hmac.digest(mac_key, b"versions|" + region.encode() + b"|" + versions, "sha256")):
        raise ShieldError(f"region {region!r}: the version list failed authentication")
    return np.frombuffer(versions, "<u4")


@device_kernel
def shield_read(variant: str, region: str, offset: int, length: int) -> bytes:
    """One read through the Shield (for tests and spot checks)."""
    return _shield(variant, region).read(offset, length)


@device_kernel
def shield_write(variant: str, region: str, offset: int, data: bytes) -> None:
    """One write through the Shield (for tests and spot checks)."""
    _shield(variant, region).write(offset, data)
