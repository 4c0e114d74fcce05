"""The ShEF run's SystemResult, assembled from the shielded session's output (pure: the flow only submits)."""
from __future__ import annotations

import statistics
from dataclasses import asdict

from mlsys_flows.systems.common.report import Assumption, Curve, Projection, RegimeSample, SystemResult

from .model import FpgaShield, count, sweep_access, throughput_mb_s, tune_chunk
from .workload import REGIONS, VARIANTS, metadata_bytes, regions, uniform, variant_configs


def _mb_s(nbytes: float, seconds: float) -> float:
    return nbytes / 1e6 / max(seconds, 1e-9)


def build_result(p, out: dict, repeats: int, calibration: dict) -> SystemResult:
    """``out``: the shielded session task's output (boot, every variant's timed runs and counted traffic,
    the attacks' outcomes); ``repeats``: the run's repeats per variant; ``calibration``: how
    uniform_tuned's chunk was chosen (``session.calibrate``'s output, or ``{"chunk": p.tuned_chunk}``
    when the parameter fixed it)."""
    tuned = calibration["chunk"]
    cfgs, specs = variant_configs(p, tuned), regions(p)
    meta = metadata_bytes(p, cfgs)
    variants, samples = {}, {}
    for v in VARIANTS:
        runs = out["runs"][v]
        first = runs[0]["traffic"]  # counted traffic is the same in every repeat
        useful = {r: first[r]["plain_read"] + first[r]["plain_written"] for r in REGIONS}
        variants[v] = {"metadata_bytes": meta[v]["tag_bytes"] + meta[v]["counter_bytes"], **meta[v],
                       "dram_bytes": sum(first[r]["dram_read"] + first[r]["dram_written"] for r in REGIONS),
                       "useful_bytes": sum(useful.values()),
                       "chunk_ops": sum(first[r]["chunk_ops"] for r in REGIONS),
                       "attacks_rejected": sum(out["attacks"][v].values())}
        samples[v] = {"throughput_mb_s": [_mb_s(sum(useful.values()), sum(r["seconds"].values())) for r in runs],
                      **{f"{reg}_mb_s": [_mb_s(useful[reg], r["seconds"][reg]) for r in runs] for reg in REGIONS}}
    med = {v: statistics.median(samples[v]["throughput_mb_s"]) for v in VARIANTS}
    curves = [Curve(title="throughput per repeat (device-timed, variants interleaved)", x_label="repeat",
                    y_label="MB/s of accelerator data", series={v: (list(range(1, len(samples[v]["throughput_mb_s"]) + 1)),
                                                               samples[v]["throughput_mb_s"]) for v in VARIANTS})]
    describe = "; ".join(f"{r} ({specs[r].size // 1024} KiB, {specs[r].access}-byte accesses, "
                         f"{'read-write' if specs[r].writes else 'read-only'}): {c.engine}, {c.chunk}-byte chunks, "
                         f"counters {'on' if c.counters else 'off'}" for r, c in cfgs["custom_shield"].items())
    attacks = {v: ", ".join(f"{a} {'rejected' if ok else 'ACCEPTED'}" for a, ok in res.items())
               for v, res in out["attacks"].items()}
    notes = [
        f"One session on board {out['device']} (a separate device process, pid {out['board_pid']}), claimed from the "
        f"FPGA pool: the image (accelerator code hashes + every Shield configuration) was loaded and measured, the "
        f"board's report verified against the software manufacturer's root key, the expected measurement and a fresh "
        f"nonce, and the data key provisioned under an X25519 + HKDF session key (attest + provision "
        f"{out['boot']['attest_s']:.2f} s); the user then sealed and uploaded every variant's regions "
        f"({out['upload_s']:.1f} s, not timed in the throughput).",
        f"Throughput: bytes the accelerator read or wrote through its Shield (useful bytes) over the kernel's time, "
        f"measured on the device, {repeats} repeat(s) with the variant order rotating. Medians: "
        + ", ".join(f"{v} {med[v]:.1f} MB/s" for v in VARIANTS) + ".",
        f"custom_shield, chosen per region from its access pattern: {describe}. uniform_shield: {p.engine}, "
        f"{p.uniform_chunk}-byte chunks with counters everywhere; uniform_tuned: {tuned}-byte chunks with counters "
        "everywhere (a table read decrypts and verifies a whole chunk: read amplification, see dram_bytes), "
        + (f"the fastest of {len(calibration['measured_mb_s'])} chunks measured on the board on the calibration "
           f"workload (seed {calibration['calibration_seed']}, not the evaluated seed {p.seed}; "
           f"{calibration.get('statistic', 'best')} of {calibration['passes']} passes each): " + ", ".join(
               f"{c} B {mb:.1f} MB/s" for c, mb in calibration["measured_mb_s"].items()) + "."
           + (f" The pick ({tuned} B) is at the edge of tune_chunks ({min(p.tune_chunks)}-{max(p.tune_chunks)} B): "
              "a chunk beyond the range might be faster, so uniform_tuned may be under-tuned."
              if calibration.get("edge") else "")
           if "measured_mb_s" in calibration else
           "fixed by the tuned_chunk parameter: NOT tuned in this run (no calibration sweep)."),
        "Every variant's stream and table digests and the scratch region read back and opened by the user equal the "
        "plaintext reference. Attacks after the benchmark (the host flips a ciphertext bit, replays an old scratch "
        "chunk after a device write, reads out of bounds): " + "; ".join(f"{v}: {a}" for v, a in attacks.items()) + ".",
        "The Shield here is software AES (OpenSSL through `cryptography`) driven from Python, one call per chunk: a "
        "64-byte chunk costs a fixed per-call overhead, the analogue of the per-chunk tag traffic and engine latency of "
        "the paper's hardware Shield, but the ratio differs in size from an FPGA's (paper: five accelerators on AWS F1).",
    ]
    # the modelled FPGA Shield: the regime (table access size) and the projection at this run's counts
    hw = FpgaShield()
    exact = all(count(p, cfgs[v]) == out["runs"][v][0]["traffic"] for v in VARIANTS)
    sweep = sweep_access(p, p.regime_records, hw)
    regime = [RegimeSample(value=float(size), samples={v: [tp[v]] for v in VARIANTS if v != "no_shield"},
                           kind="modelled") for size, tp in sweep.items()]
    card = {v: throughput_mb_s(out["runs"][v][0]["traffic"], cfgs[v]["stream"].secure, hw) for v in VARIANTS}
    # on the card, uniform_tuned is tuned for the card: the fastest chunk on the calibration workload, by the model
    card_chunk, card_sweep = tune_chunk(p, hw)
    card["uniform_tuned"] = throughput_mb_s(count(p, uniform(p, card_chunk)), True, hw)
    sources = {"clock_mhz": ("MHz", "the AWS F1 shell's main clock (250 MHz), ShEF's platform"),
               "engine_bytes_per_cycle": ("B/cycle", "assumed: one fully pipelined AES-128 core, one 16-byte block "
                                                     "per cycle"),
               "chunk_overhead_cycles": ("cycles", "assumed: per chunk, the tag fetched as its own DRAM burst and "
                                                   "the GHASH/tag check, not overlapped across chunks"),
               "dram_gb_s": ("GB/s", "one DDR4-2133 x64 channel of an F1 card (~17 GB/s peak), rounded down")}
    assumptions = {k: Assumption(value=val, unit=sources[k][0], source=sources[k][1]) for k, val in asdict(hw).items()}
    projection = Projection(
        baseline_value=card["uniform_tuned"], technique_value=card["custom_shield"], assumptions=assumptions,
        statement="throughput on a hardware Shield of an FPGA card: this run's counted chunk operations and DRAM "
                  "bytes (ciphertext and tags) per variant, each chunk a fixed engine overhead, each byte at the slower "
                  f"of the AES engine and the DRAM; uniform_tuned re-tuned for the card ({card_chunk}-byte chunks, the "
                  "fastest of tune_chunks on the calibration workload in the model)")
    notes += [
        "Projection and regime (modelled FPGA Shield): " + ", ".join(f"{k} {val:g}" for k, val in asdict(hw).items())
        + f" (engine {hw.engine_gb_s:.1f} GB/s); this run's counts give " + ", ".join(
            f"{v} {card[v]:.0f} MB/s" for v in VARIANTS) + f" (uniform_tuned at {card_chunk}-byte chunks, tuned for the "
        f"card on the calibration workload, seed {p.calibration_seed}: " + ", ".join(
            f"{c} B {mb:.0f}" for c, mb in card_sweep.items()) + " MB/s). The counting model (systems/shef/model.py) "
        f"reproduces the Shield's own counted traffic of every variant exactly: {exact}.",
        f"Regime: the table's access size (record bytes) swept over {', '.join(map(str, p.regime_records))} with "
        "everything else as run, every variant's modelled throughput per size (custom_shield's table chunk follows "
        "the record; uniform_tuned is tuned again for the card at each size on the calibration workload).",
    ]
    # counted metrics are exact within the run; uniform_tuned's chunk comes from a measured calibration, so
    # two runs of the same parameters can tune it apart (the fault tests fix tuned_chunk: tests/faultkit.py)
    return SystemResult(variants=variants, samples=samples, curves=curves, notes=notes,
                        regime=regime, regime_headline_value=float(p.record), projection=projection)
