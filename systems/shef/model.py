"""Counted Shield traffic without running the Shield, and a modelled FPGA Shield (pure: numpy only).

``count`` gives, for one variant's configurations, exactly what ``shield.Shield`` counts when the
accelerator's workload (``accel.run_workload``) runs through it: chunk operations and DRAM bytes
(ciphertext and tags) per region; the flow checks it against the run's own counts. ``seconds``
turns such counts into the time of a hardware Shield from stated constants (an AES engine and DRAM
on an FPGA card): every chunk costs a fixed engine overhead (tag fetch and finalisation, not
overlapped across chunks) and every DRAM byte passes the slower of the engine and the DRAM. The
regime sweep (access size) and the projection use it; on the card, uniform_tuned's chunk is tuned
the same way as in the measured run (:func:`tune_chunk`: the fastest of ``tune_chunks`` on the
calibration seed's workload), only by this model.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .workload import VARIANTS, block_order, calibration_params, lookup_indices, regions, uniform, variant_configs

TAG = 16  # bytes of one chunk's tag (shield.TAG; checked equal by a test)


@dataclass(frozen=True)
class FpgaShield:
    """Constants of a hardware Shield on a cloud FPGA card (each listed with its source in the report)."""

    clock_mhz: float = 250.0          # the AWS F1 shell's main clock
    engine_bytes_per_cycle: float = 16.0  # one fully pipelined AES-128 core: one 16-byte block per cycle
    chunk_overhead_cycles: float = 16.0   # per chunk: tag fetch as its own DRAM burst + GHASH/tag check
    dram_gb_s: float = 16.0           # one DDR4-2133 x64 channel of an F1 card (~17 GB/s peak)

    @property
    def engine_gb_s(self) -> float:
        return self.clock_mhz * 1e6 * self.engine_bytes_per_cycle / 1e9


def _reads(offsets: np.ndarray, length: int, chunk: int) -> int:
    """Chunk operations of reading ``length`` bytes at each offset (every touched chunk is opened)."""
    first, last = offsets // chunk, (offsets + length - 1) // chunk
    return int((last - first + 1).sum())


def _writes(offsets: np.ndarray, length: int, chunk: int) -> tuple[int, int]:
    """(seal operations, partial chunks read back first) of writing ``length`` bytes at each offset."""
    end = offsets + length
    first, last = offsets // chunk, (end - 1) // chunk
    seals = int((last - first + 1).sum())
    head = (offsets % chunk != 0) | ((first == last) & (end % chunk != 0))
    tail = (first != last) & (end % chunk != 0)
    return seals, int(head.sum() + tail.sum())


def count(p, configs: dict, rep: int = 0) -> dict[str, dict[str, int]]:
    """Per region: plain_read, plain_written, dram_read, dram_written, chunk_ops of one pass of the
    workload through Shields with ``configs`` ({region: EngineConfig}), as ``shield.Shield`` counts them."""
    specs, out = regions(p), {}
    for r, spec in specs.items():
        cfg = configs[r]
        if r == "stream":
            reads, length, writes = [np.arange(0, spec.size, spec.access, dtype=np.int64)], spec.access, []
        elif r == "table":
            idx = lookup_indices(spec.size // spec.access, p.lookups, p.seed, rep).astype(np.int64)
            reads, length, writes = [idx * spec.access], spec.access, []
        else:
            n = spec.size // spec.access
            reads = [block_order(n, p.seed, rep, k).astype(np.int64) * spec.access for k in range(p.scratch_passes)]
            length, writes = spec.access, reads
        plain_r = sum(len(o) for o in reads) * length
        plain_w = sum(len(o) for o in writes) * length
        t = {"plain_read": plain_r, "plain_written": plain_w}
        if not cfg.secure:
            t |= {"dram_read": plain_r, "dram_written": plain_w, "chunk_ops": 0}
        else:
            ops = sum(_reads(o, length, cfg.chunk) for o in reads)
            seals, partial = (sum(x) for x in zip(*[_writes(o, length, cfg.chunk) for o in writes])) if writes else (0, 0)
            t |= {"dram_read": (ops + partial) * (cfg.chunk + TAG), "dram_written": seals * (cfg.chunk + TAG),
                  "chunk_ops": ops + partial + seals}
        out[r] = t
    return out


def seconds(traffic: dict[str, dict[str, int]], secure: bool, hw: FpgaShield) -> float:
    """Modelled time of one pass on the hardware Shield: per chunk operation a fixed overhead, every
    DRAM byte at the slower of the engine and the DRAM (no Shield: DRAM bandwidth alone)."""
    dram = sum(t["dram_read"] + t["dram_written"] for t in traffic.values())
    if not secure:
        return dram / (hw.dram_gb_s * 1e9)
    ops = sum(t["chunk_ops"] for t in traffic.values())
    return ops * hw.chunk_overhead_cycles / (hw.clock_mhz * 1e6) + dram / (min(hw.engine_gb_s, hw.dram_gb_s) * 1e9)


def throughput_mb_s(traffic: dict[str, dict[str, int]], secure: bool, hw: FpgaShield) -> float:
    """Useful bytes (plaintext read or written) per modelled second, MB/s: the headline metric on the card."""
    useful = sum(t["plain_read"] + t["plain_written"] for t in traffic.values())
    return useful / 1e6 / seconds(traffic, secure, hw)


def tune_chunk(p, hw: FpgaShield) -> tuple[int, dict[int, float]]:
    """uniform_tuned on the modelled card: every chunk of ``p.tune_chunks`` as the one configuration of
    every region, modelled on the calibration seed's workload (never the evaluated seed); returns the
    fastest chunk (the smaller one on a tie) and each candidate's modelled MB/s."""
    cal = calibration_params(p)
    tp = {c: throughput_mb_s(count(cal, uniform(cal, c)), True, hw) for c in sorted(p.tune_chunks)}
    return max(tp, key=lambda c: (tp[c], -c)), tp


def modelled(p, hw: FpgaShield, variants=VARIANTS) -> dict[str, float]:
    """Every variant's modelled throughput for the workload of ``p``, uniform_tuned tuned on the card."""
    cfgs = variant_configs(p, tune_chunk(p, hw)[0])
    return {v: throughput_mb_s(count(p, cfgs[v]), cfgs[v]["stream"].secure, hw) for v in variants}


def sweep_access(p, sizes, hw: FpgaShield) -> dict[int, dict[str, float]]:
    """The regime: the table region's access size (record bytes) swept, everything else as in ``p``;
    every variant's modelled throughput at each size (custom_shield's table chunk follows the record;
    uniform_tuned is tuned again at each size, on the calibration seed, as a user would)."""
    return {size: modelled(replace_record(p, size), hw) for size in sizes}


def replace_record(p, record: int):
    """``p`` with another table record size (validated like any parameter)."""
    return type(p).model_validate({**p.model_dump(), "record": record})


__all__ = ["FpgaShield", "count", "seconds", "throughput_mb_s", "tune_chunk", "modelled", "sweep_access",
           "replace_record"]
