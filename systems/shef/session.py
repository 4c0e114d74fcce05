"""One ShEF session on a board, the host and remote user's side (pure: takes any ``FpgaBoard``).

Boot and attest (the user verifies the report and provisions the data key), seal and upload each
variant's regions, run the workloads with the variants interleaved, then open the accelerator's
results (sealed under the data key) and check every variant computed the same as the plaintext
reference. :func:`calibrate` tunes uniform_tuned's chunk the same way on the calibration seed's
workload. ``configs`` is the run's ``workload.variant_configs(p, tuned)``.
"""
from __future__ import annotations

import hashlib
import os
import statistics
import time
from typing import Callable

from mlsys_flows.devices.fpga import FpgaBoard, trusted_root_public_key
from mlsys_flows.errors import MlsysError

from .accel import NONCE, open_results, verify_versions
from .attest import AttestationError, RemoteUser
from .shield import open_sealed, seal
from .workload import (REGIONS, calibration_configs, calibration_params, expected, held_data, image, plaintexts,
                       regions)

ACCEL = "mlsys_flows.systems.shef.accel:"


class OutputsDiffer(MlsysError, RuntimeError):
    """A variant's results differ from the plaintext reference (the Shield is not transparent)."""


def trusted_measurement(p, configs: dict) -> bytes:
    """The user's side: the measurement of the (production) image the user builds from ``p`` itself."""
    return hashlib.sha256(image(p, configs)).digest()


def user_trust_anchor() -> list[bytes]:
    """The user's trusted manufacturer roots, read once on the user's side before any board is used:
    the key pinned in ``$MLSYS_FPGA_TRUSTED_ROOT``, else the software manufacturer's root read now
    (``fpga.trusted_root_public_key``). Pass the value to :func:`boot` (and what calls it)."""
    return [trusted_root_public_key()]


def boot(board: FpgaBoard, p, configs: dict, trusted_roots: list[bytes] | None = None,
         expected_measurement: bytes | None = None, host_image: bytes | None = None) -> tuple[bytes, dict]:
    """The host loads its copy of the image (``host_image``, default built from ``p`` and ``configs``),
    then the user attests, verifies and provisions; returns (data key, timings). The user trusts
    ``trusted_roots``, the manufacturer root public keys it pinned (required: read once on the user's
    side, ``fpga.trusted_root_public_key()``, never from the host's state directory at verify time)
    and ``expected_measurement``, the measurement of its own build (default: :func:`trusted_measurement`),
    never the host's copy: the board measures what the host loaded, so a changed copy fails."""
    if not trusted_roots:
        raise AttestationError("boot: trusted_roots is required: the manufacturer root public keys the user "
                               "pinned (fpga.trusted_root_public_key(), read once on the user's side)")
    trusted = expected_measurement or trusted_measurement(p, configs)
    img = image(p, configs) if host_image is None else host_image
    t0 = time.perf_counter()
    measurement = board.load_image(img)
    t1 = time.perf_counter()
    user = RemoteUser(trusted_roots, trusted)
    nonce, pub = user.challenge()
    session_key = user.verify(board.attest(nonce, pub))
    data_key = os.urandom(16)
    board.run(ACCEL + "configure", img, user.wrap_data_key(session_key, data_key, measurement))
    return data_key, {"load_s": t1 - t0, "attest_s": time.perf_counter() - t1}


def upload(board: FpgaBoard, p, configs: dict, data_key: bytes, plain: dict[str, bytes]) -> float:
    """Seal every variant's regions (user side) and write them to board DRAM; returns seconds. A
    region without a Shield gets public filler, never the user's ``plain`` (:func:`~.workload.held_data`)."""
    t0 = time.perf_counter()
    for v, cfgs in configs.items():
        held = held_data(p, cfgs, plain)
        for r in REGIONS:
            name = f"{v}/{r}"
            ct, tags = seal(data_key, name, cfgs[r], held[r])
            board.alloc(name, len(ct))
            board.write(name, 0, ct)
            if cfgs[r].secure:
                board.alloc(name + "#tags", len(tags))
                board.write(name + "#tags", 0, tags)
        board.run(ACCEL + "attach", v)
    return time.perf_counter() - t0


def read_back(board: FpgaBoard, p, configs: dict, data_key: bytes, variant: str, region: str) -> bytes:
    """The user opens a region the accelerator wrote, with the versions it reports (authenticated)."""
    cfg = configs[variant][region]
    name = f"{variant}/{region}"
    size = regions(p)[region].size
    ct = board.read(name, 0, size)
    if not cfg.secure:
        return ct
    tags = board.read(name + "#tags", 0, cfg.tag_bytes(size))
    versions = None
    if cfg.counters:  # the versions now, for a fresh nonce: a saved (older) DRAM image fails to open
        nonce = os.urandom(NONCE)
        versions = verify_versions(data_key, name, nonce, *board.run(ACCEL + "export_versions", variant, region, nonce))
    return open_sealed(data_key, name, cfg, ct, tags, versions)


def _check(p, want: dict, data_key: bytes, variant: str, rep: int, result: dict) -> None:
    got = open_results(data_key, variant, rep, result["sealed"])
    if got["stream_digest"] != want["stream"] % (1 << 64) or got["table_digest"] != want["table"][rep]:
        raise OutputsDiffer(f"{variant}, repeat {rep}: stream or table digest differs from the plaintext reference")


def run(board: FpgaBoard, p, configs: dict, repeats: int, log: Callable[[str], None] = lambda _: None,
        trusted_roots: list[bytes] | None = None, expected_measurement: bytes | None = None) -> dict:
    """The whole session; returns per-variant samples of each repeat, the counted traffic, and the
    user's data key (``data_key``: the caller keeps it, e.g. for :func:`attacks`).
    ``expected_measurement``: the measurement of the user's build (see :func:`boot`)."""
    variants = list(configs)
    data_key, boot_t = boot(board, p, configs, trusted_roots, expected_measurement)
    log(f"attested {board.device}: image measured and verified, data key provisioned "
        f"(load {boot_t['load_s']:.3f} s, attest+provision {boot_t['attest_s']:.3f} s)")
    plain = plaintexts(p)
    upload_s = upload(board, p, configs, data_key, plain)
    log(f"sealed and uploaded {len(variants)} variants x {len(REGIONS)} regions in {upload_s:.1f} s")
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for rep in range(repeats):
        order = variants[rep % len(variants):] + variants[:rep % len(variants)]
        for v in order:
            runs[v].append(board.run(ACCEL + "run_workload", v, rep))
        log(f"repeat {rep + 1}/{repeats}: " + ", ".join(
            f"{v} {sum(runs[v][-1]['seconds'].values()):.3f} s" for v in variants))
    for v in variants:
        want = expected(p, held_data(p, configs[v], plain), repeats)
        for rep, r in enumerate(runs[v]):
            _check(p, want, data_key, v, rep, r)
            r.pop("sealed")
        got = hashlib.sha256(read_back(board, p, configs, data_key, v, "scratch")).hexdigest()
        if got != want["scratch_sha256"]:
            raise OutputsDiffer(f"{v}: the scratch region read back differs from the plaintext reference")
    return {"runs": runs, "boot": boot_t, "upload_s": upload_s, "device": board.device,
            "board_pid": getattr(board, "pid", None), "data_key": data_key}


def useful_mb_s(result: dict) -> float:
    """One run_workload pass's throughput: plaintext bytes read or written over its device seconds."""
    useful = sum(t["plain_read"] + t["plain_written"] for t in result["traffic"].values())
    return useful / 1e6 / max(sum(result["seconds"].values()), 1e-9)


def calibrate(board: FpgaBoard, p, passes: int = 3, log: Callable[[str], None] = lambda _: None,
              trusted_roots: list[bytes] | None = None) -> dict:
    """Tune uniform_tuned's chunk: each chunk of ``p.tune_chunks`` as one configuration for every
    region, on the calibration seed's workload (its own data, lookups and block orders; never the
    evaluated seed's), ``passes`` passes each, measured on the device like the run (its digests
    checked). One attested boot per candidate (every ``load_image`` starts the board blank, so board
    memory holds one candidate at a time). A candidate's MB/s is the median of its passes (one
    noisy pass does not pick the chunk). Returns the fastest chunk, every candidate's MB/s and
    ``edge``: whether the pick is the smallest or largest of ``tune_chunks`` (a chunk beyond the
    range might be faster still)."""
    if passes < 1:
        raise MlsysError(f"calibrate: passes must be >= 1, got {passes}")
    cal = calibration_params(p)
    plain = plaintexts(cal)
    want = expected(cal, plain, passes)
    measured: dict[int, float] = {}
    for name, cfgs in calibration_configs(cal).items():
        chunk = int(name.rsplit("_", 1)[1])
        configs = {name: cfgs}
        data_key, _ = boot(board, cal, configs, trusted_roots)
        upload(board, cal, configs, data_key, plain)
        mb_s = []
        for rep in range(passes):
            r = board.run(ACCEL + "run_workload", name, rep)
            _check(cal, want, data_key, name, rep, r)
            mb_s.append(useful_mb_s(r))
        measured[chunk] = statistics.median(mb_s)
        log(f"calibration (seed {cal.seed}): {chunk}-byte chunks everywhere {measured[chunk]:.1f} MB/s "
            f"(median of {passes} passes)")
    chunk = max(measured, key=lambda c: (measured[c], -c))
    edge = chunk in (min(measured), max(measured))
    if edge:
        log(f"calibration: the pick ({chunk} B) is at the edge of tune_chunks; a chunk beyond it may be faster")
    return {"chunk": chunk, "measured_mb_s": {str(c): v for c, v in sorted(measured.items())},
            "calibration_seed": cal.seed, "passes": passes, "statistic": "median", "edge": edge}


def attacks(board: FpgaBoard, p, configs: dict, data_key: bytes) -> dict[str, dict[str, bool]]:
    """After the benchmark: per variant, does the Shield reject a tampered stream chunk, an old
    scratch chunk replayed after a device write, and an out-of-bounds read? (True: rejected.) The
    host drives them through the production image's spot checks (``verify_range``,
    ``refresh_range``), which return no plaintext and take none."""
    from mlsys_flows.devices.fpga import BoundsError, FpgaError

    from .shield import IntegrityError

    def rejected(kernel: str, *args, error: type) -> bool:
        try:
            board.run(ACCEL + kernel, *args)
        except FpgaError as e:  # KernelError carries the device-side exception as its cause
            return isinstance(e, error) or isinstance(getattr(e, "cause", None), error)
        return False

    out = {}
    sizes = {r: s.size for r, s in regions(p).items()}
    for v, cfgs in configs.items():
        res = {}
        # the host flips one ciphertext bit of the stream region's first chunk in DRAM
        name = f"{v}/stream"
        byte = board.read(name, 0, 1)
        board.write(name, 0, bytes([byte[0] ^ 1]))
        res["tampered_chunk"] = rejected("verify_range", v, "stream", 0, 16, error=IntegrityError)
        board.write(name, 0, byte)
        # the host keeps a scratch chunk (and its tag), the accelerator rewrites it, the host replays the old copy
        name, cfg = f"{v}/scratch", cfgs["scratch"]
        old = board.read(name, 0, cfg.chunk)
        old_tag = board.read(name + "#tags", 0, 16) if cfg.secure else b""
        board.run(ACCEL + "refresh_range", v, "scratch", 0, 16)
        board.write(name, 0, old)
        if cfg.secure:
            board.write(name + "#tags", 0, old_tag)
        res["replayed_chunk"] = rejected("verify_range", v, "scratch", 0, 16, error=IntegrityError)
        res["out_of_bounds"] = rejected("verify_range", v, "table", sizes["table"] - 8, 16, error=BoundsError)
        out[v] = res
    return out
