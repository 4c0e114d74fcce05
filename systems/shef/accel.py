"""The accelerator: kernels that run on the FPGA board's process, reading and writing its memory
only through the Shield (device side; called with ``board.run("mlsys_flows.systems.shef.accel:...")``).

State that the real design keeps on chip (the data key, the Shield configurations from the
measured image, the freshness counters) lives in the board's on-chip store (``board_store()``),
which the board empties on every ``load_image``; the host never sees it. DRAM is the board's memory
regions, which the host can read and overwrite.

Nothing a kernel here returns is plaintext, and none takes plaintext from the host: the workload's
results leave sealed under the data key (:func:`open_results`, user side), the spot checks
(:func:`verify_range`, :func:`refresh_range`) say only whether a range authenticates. Kernels that
read or write plaintext through the Shield live in :mod:`.debug`, which only the debug image declares.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import time

import numpy as np

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from mlsys_flows.devices.fpga import (FpgaError, board_measurement, board_memory, board_session_key, board_store,
                                      device_kernel, read_image)

from .attest import unwrap_data_key
from .shield import EngineConfig, Shield, ShieldError, Traffic, region_keys
from .workload import block_order, lookup_indices, stream_digest, table_digest


@device_kernel
def configure(image: bytes, wrapped_key: bytes) -> dict:
    """Take the Shield configurations from ``image`` (which must be the measured one) and unwrap the
    data key with the attested session key. Once per image load: configuring again (the host
    replaying the wrapped key) would start the Shields' freshness counters over, letting old chunks
    verify again and reusing nonces under the same key."""
    measurement = board_measurement()
    state = board_store()
    if "doc" in state:
        raise ShieldError("configure: the accelerator is already configured for this image load (load the image "
                          "again to start over, with a new attestation and data key)")
    if hashlib.sha256(image).digest() != measurement:
        raise ShieldError("configure: the image handed to the accelerator is not the loaded (measured) one")
    doc = json.loads(read_image(image).payload)
    data_key = unwrap_data_key(board_session_key(), wrapped_key, measurement)
    state.update(doc=doc, measurement=measurement, shields={}, data_key=data_key)
    return {"variants": sorted(doc["variants"]), "regions": sorted(doc["regions"])}


def _state() -> dict:
    # on-chip state belongs to the image that configured it: the board empties the store on every
    # load_image, so another image (or the same one loaded again) finds the accelerator unconfigured
    state = board_store()
    if "doc" not in state or state["measurement"] != board_measurement():
        raise FpgaError("the accelerator is not configured for the loaded image "
                        "(attest, then run configure)")
    return state


def _shield(variant: str, region: str) -> Shield:
    try:
        return _state()["shields"][variant][region]
    except KeyError:
        raise FpgaError(f"no Shield attached for {variant}/{region} (run attach)") from None


@device_kernel
def attach(variant: str) -> None:
    """Put a Shield in front of each of the variant's regions (the host has written them). Once per
    variant: attaching again would reset its chunks' versions (replayed chunks would verify again,
    and nonces repeat under the same key)."""
    state, mem = _state(), board_memory()
    if variant not in state["doc"]["variants"]:
        raise FpgaError(f"attach: the image configures no variant {variant!r}")
    if variant in state["shields"]:
        raise ShieldError(f"attach: {variant!r} is already attached; its freshness counters are not reset")
    for r, cfg in state["doc"]["variants"][variant].items():
        # sizes come from the measured image, never from the regions the host allocated: a shorter
        # region would have the accelerator digest (and seal as authentic) part of the user's input
        size, name = state["doc"]["regions"][r]["size"], f"{variant}/{r}"
        if mem.size(name) != size:
            raise ShieldError(f"attach: region {name!r} holds {mem.size(name)} bytes; the image says {size}")
        config = EngineConfig(**cfg)
        if config.secure and mem.size(name + "#tags") != config.tag_bytes(size):
            raise ShieldError(f"attach: region {name + '#tags'!r} holds {mem.size(name + '#tags')} bytes; the "
                              f"image's {size}-byte region has {config.tag_bytes(size)} bytes of tags")
    state["shields"][variant] = {
        r: Shield(mem, f"{variant}/{r}", EngineConfig(**cfg), state["data_key"])
        for r, cfg in state["doc"]["variants"][variant].items()}


@device_kernel
def run_workload(variant: str, rep: int) -> dict:
    """One pass of the three workloads through the variant's Shields, each timed on the device. The
    results (digests of the user's data) leave sealed under the data key: ``sealed`` is for
    :func:`open_results`; only the timings and the counted traffic are in the clear."""
    state = _state()
    doc = state["doc"]
    sh = {r: _shield(variant, r) for r in doc["regions"]}
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
    results = json.dumps({"stream_digest": total % (1 << 64), "table_digest": table}).encode()
    return {"seconds": seconds, "traffic": traffic,
            "sealed": _seal_results(state["data_key"], variant, rep, results)}


def _results_key(data_key: bytes) -> bytes:
    return region_keys(data_key, "#results")[0]


def _seal_results(data_key: bytes, variant: str, rep: int, results: bytes) -> bytes:
    nonce = os.urandom(12)
    return nonce + AESGCM(_results_key(data_key)).encrypt(nonce, results, f"results|{variant}|{rep}".encode())


def open_results(data_key: bytes, variant: str, rep: int, sealed: bytes) -> dict:
    """User side of :func:`run_workload`'s sealed results (its digests)."""
    from cryptography.exceptions import InvalidTag

    try:
        return json.loads(AESGCM(_results_key(data_key)).decrypt(sealed[:12], sealed[12:],
                                                                 f"results|{variant}|{rep}".encode()))
    except InvalidTag:
        raise ShieldError(f"{variant}, repeat {rep}: the accelerator's sealed results failed authentication") from None


NONCE = 16  # bytes of the user's fresh nonce that export_versions binds into its MAC


def _versions_mac(mac_key: bytes, region: str, nonce: bytes, versions: bytes) -> bytes:
    return hmac.digest(mac_key, b"versions|" + region.encode() + b"|" + nonce + b"|" + versions, "sha256")


@device_kernel
def export_versions(variant: str, region: str, nonce: bytes) -> tuple[bytes, bytes]:
    """The region's chunk versions now and a MAC over them and the user's fresh ``nonce`` (region MAC
    key), so the user can open the region's DRAM image and knows the versions are the accelerator's
    current ones: a version list (with the DRAM image it opens) the host saved earlier answers an
    older nonce and fails :func:`verify_versions`."""
    if not isinstance(nonce, (bytes, bytearray)) or len(nonce) != NONCE:
        raise ShieldError(f"export_versions: nonce must be {NONCE} fresh bytes from the user")
    shield = _shield(variant, region)
    versions = shield.versions.astype("<u4").tobytes()
    _, mac_key = region_keys(_state()["data_key"], shield.region)
    return versions, _versions_mac(mac_key, shield.region, bytes(nonce), versions)


def verify_versions(data_key: bytes, region: str, nonce: bytes, versions: bytes, mac: bytes) -> np.ndarray:
    """User side of :func:`export_versions` (``nonce``: the one the user sent for this export)."""
    _, mac_key = region_keys(data_key, region)
    if not hmac.compare_digest(mac, _versions_mac(mac_key, region, nonce, versions)):
        raise ShieldError(f"region {region!r}: the version list failed authentication (altered, or an old "
                          "export answering another nonce)")
    return np.frombuffer(versions, "<u4")


@device_kernel
def verify_range(variant: str, region: str, offset: int, length: int) -> None:
    """Spot check: read ``[offset, offset + length)`` through the Shield and drop it. Returns
    nothing; raises ``IntegrityError`` when a chunk fails authentication, ``BoundsError`` out of bounds."""
    _shield(variant, region).read(offset, length)


@device_kernel
def refresh_range(variant: str, region: str, offset: int, length: int) -> None:
    """The accelerator rewrites ``[offset, offset + length)`` with its own plaintext (each chunk
    re-sealed at a new version): no plaintext crosses, in or out."""
    shield = _shield(variant, region)
    shield.write(offset, shield.read(offset, length))
