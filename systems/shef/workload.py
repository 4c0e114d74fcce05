"""The accelerator's memory regions, the Shield variants, the image, and the reference results (pure).

Three regions shaped like the paper's accelerators (paper, Sec. 7: streaming, random-access and
read-write accelerators):

- ``stream``: read once, sequentially, in bursts (weights or an input stream); written only by the
  user when provisioning.
- ``table``: random small reads of fixed-size records (a lookup table / index); read-only.
- ``scratch``: read-modify-write of blocks in random order, several passes (intermediate state).

Variants: ``no_shield`` (no protection: the upper bound), ``uniform_shield`` (one fine-grained
configuration everywhere: ``uniform_chunk``-byte chunks with freshness counters, the paper's
baseline shape), ``uniform_tuned`` (one configuration everywhere, its chunk the fastest of
``tune_chunks`` on the calibration seed's workload, with counters: the single knob a careful user
would tune) and ``custom_shield`` (ShEF: per region, chunk = the region's access granularity,
counters only where the accelerator writes). The configurations of a run depend on the tuned
chunk, so they travel as one dict (:func:`variant_configs`) into the image and the session.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from mlsys_flows.devices.fpga import build_image

from .shield import EngineConfig

VARIANTS = ("no_shield", "uniform_shield", "uniform_tuned", "custom_shield")
REGIONS = ("stream", "table", "scratch")


@dataclass(frozen=True)
class RegionSpec:
    name: str
    size: int  # bytes
    access: int  # bytes one access reads or writes
    writes: bool  # the accelerator writes it


def regions(p) -> dict[str, RegionSpec]:
    return {"stream": RegionSpec("stream", p.stream_kb * 1024, p.stream_burst, False),
            "table": RegionSpec("table", p.table_kb * 1024, p.record, False),
            "scratch": RegionSpec("scratch", p.scratch_kb * 1024, p.scratch_block, True)}


def tailor(spec: RegionSpec, engine: str) -> EngineConfig:
    """ShEF's per-region choice: authenticate at the region's access granularity (no read
    amplification, fewest tags), freshness counters only for regions the accelerator writes
    (a write-once region has a single version, so there is nothing to replay)."""
    return EngineConfig(engine, chunk=spec.access, counters=spec.writes)


def uniform(p, chunk: int) -> dict[str, EngineConfig]:
    """One configuration for every region: ``chunk``-byte chunks with freshness counters."""
    return {r: EngineConfig(p.engine, chunk=chunk, counters=True) for r in REGIONS}


def variant_configs(p, tuned: int) -> dict[str, dict[str, EngineConfig]]:
    """Every variant's configuration per region; ``tuned``: uniform_tuned's chunk (from the calibration)."""
    specs = regions(p)
    return {
        "no_shield": {r: EngineConfig("none", chunk=16, counters=False) for r in specs},
        "uniform_shield": uniform(p, p.uniform_chunk),
        "uniform_tuned": uniform(p, tuned),
        "custom_shield": {r: tailor(s, p.engine) for r, s in specs.items()},
    }


def calibration_params(p):
    """``p`` with the calibration seed as its seed: the workload the uniform chunk is tuned on (other
    data, lookups and block orders than the evaluated run's, the same shape)."""
    return p.model_copy(update={"seed": p.calibration_seed})


def calibration_configs(p) -> dict[str, dict[str, EngineConfig]]:
    """The calibration's candidates: ``uniform_<chunk>`` for every chunk of ``tune_chunks``."""
    return {f"uniform_{c}": uniform(p, c) for c in p.tune_chunks}


def metadata_bytes(p, configs: dict[str, dict[str, EngineConfig]]) -> dict[str, dict[str, int]]:
    """Per variant: tag bytes in DRAM and counter bytes on chip (counted from the configurations)."""
    specs, out = regions(p), {}
    for v, cfgs in configs.items():
        out[v] = {"tag_bytes": sum(cfgs[r].tag_bytes(s.size) for r, s in specs.items()),
                  "counter_bytes": sum(cfgs[r].counter_bytes(s.size) for r, s in specs.items())}
    return out


_CODE = ("accel.py", "shield.py", "attest.py", "workload.py")
# the accelerator's entry points, declared in the image's manifest: the board runs nothing else.
# None returns plaintext or takes it from the host (accel.py's docstring).
KERNELS = tuple(f"mlsys_flows.systems.shef.accel:{k}" for k in (
    "configure", "attach", "run_workload", "export_versions", "verify_range", "refresh_range"))
# the debug kernels (plaintext out of and into the Shield): only in the debug image
DEBUG_KERNELS = tuple(f"mlsys_flows.systems.shef.debug:{k}" for k in ("shield_read", "shield_write"))


def image(p, configs: dict[str, dict[str, EngineConfig]], debug: bool = False) -> bytes:
    """The accelerator image: the manifest of its kernels (with their code hashes), then its code
    (the modules the device runs) and every Shield configuration (``configs``) and workload shape,
    canonically encoded. Its sha256 is the measurement the user expects. ``debug``: the debug image,
    which adds :data:`DEBUG_KERNELS` (its own measurement; its reports say debug, and
    ``RemoteUser.verify`` refuses them)."""
    here = Path(__file__).parent
    code = {f: hashlib.sha256((here / f).read_bytes()).hexdigest() for f in _CODE}
    doc = {"accelerator": "shef-bench-v1-debug" if debug else "shef-bench-v1", "code": code,
           "regions": {r: asdict(s) for r, s in regions(p).items()},
           "variants": {v: {r: c.as_dict() for r, c in cfgs.items()} for v, cfgs in configs.items()},
           "workload": {"lookups": p.lookups, "scratch_passes": p.scratch_passes, "seed": p.seed}}
    return build_image(KERNELS + (DEBUG_KERNELS if debug else ()),
                       json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())


def debug_image(p, configs: dict[str, dict[str, EngineConfig]]) -> bytes:
    """The debug image of the same accelerator (see :func:`image`)."""
    return image(p, configs, debug=True)


def plaintexts(p) -> dict[str, bytes]:
    """The user's data: what the Shielded regions hold (sealed)."""
    rng = np.random.default_rng([p.seed, 7])
    return {r: rng.integers(0, 256, s.size, dtype=np.uint8).tobytes() for r, s in regions(p).items()}


def public_plaintexts(p) -> dict[str, bytes]:
    """Public filler of the same shape from its own seed: what a region without a Shield (``no_shield``)
    holds instead of the user's data, which it would hand the host in the clear."""
    rng = np.random.default_rng([p.seed, 17])
    return {r: rng.integers(0, 256, s.size, dtype=np.uint8).tobytes() for r, s in regions(p).items()}


def held_data(p, cfgs: dict[str, EngineConfig], plain: dict[str, bytes]) -> dict[str, bytes]:
    """What one variant's regions hold (``cfgs``: its configuration per region): the user's data
    (``plain``) behind a Shield, :func:`public_plaintexts` in a region with none, so the user's data
    never sits unprotected in device DRAM. Its reference results are :func:`expected` of this."""
    public = None
    out = {}
    for r in REGIONS:
        if cfgs[r].secure:
            out[r] = plain[r]
        else:
            public = public or public_plaintexts(p)
            out[r] = public[r]
    return out


def lookup_indices(n_records: int, lookups: int, seed: int, rep: int) -> np.ndarray:
    return np.random.default_rng([seed, 11, rep]).integers(0, n_records, lookups)


def block_order(n_blocks: int, seed: int, rep: int, pass_: int) -> np.ndarray:
    return np.random.default_rng([seed, 13, rep, pass_]).permutation(n_blocks)


def stream_digest(data: bytes) -> int:
    return int(np.frombuffer(data, "<u4").sum(dtype=np.uint64))


def table_digest(table: bytes, record: int, idx: np.ndarray) -> int:
    recs = np.frombuffer(table, "<u8").reshape(-1, record // 8)[idx, 0]
    return int(np.bitwise_xor.reduce(recs)) if len(recs) else 0


def expected(p, plain: dict[str, bytes], repeats: int) -> dict:
    """What every variant must compute: stream and table digests per repeat, the final scratch."""
    n_rec = len(plain["table"]) // p.record
    scratch = (np.frombuffer(plain["scratch"], np.uint8) + repeats * p.scratch_passes).astype(np.uint8)
    return {"stream": stream_digest(plain["stream"]),
            "table": [table_digest(plain["table"], p.record, lookup_indices(n_rec, p.lookups, p.seed, r))
                      for r in range(repeats)],
            "scratch_sha256": hashlib.sha256(scratch.tobytes()).hexdigest()}
