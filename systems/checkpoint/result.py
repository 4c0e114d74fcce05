"""The checkpoint system's SystemResult from its tasks' outputs (pure): the interleaved bench's runs,
the resumable training run and the state-size regime."""
from __future__ import annotations

import statistics
from typing import Any

from mlsys_flows.systems.checkpoint import CHECKPOINTED, SWEPT
from mlsys_flows.systems.checkpoint.bench import overheads
from mlsys_flows.systems.checkpoint.train import digest_number, state_bytes
from mlsys_flows.systems.common.report import Curve, RegimeSample, SystemResult
from mlsys_flows.systems.common.repeats import repeats_note


def build_result(p: Any, trained: dict, measured: dict, swept: dict, *, storage_url: str,
                 run_key: str | None) -> SystemResult:
    """``trained``: the resumable run; ``measured``: the bench (runs per variant, each mode's last checkpoint
    against the synchronous one); ``swept``: width -> variant -> the regime's run; ``storage_url``: where the
    checkpoints went; ``run_key``: the flow's run key the resumable run is keyed by (None: private)."""
    runs, equal = measured["runs"], measured["equal_to_sync"]
    over = overheads(runs)
    variants: dict[str, dict[str, float]] = {}
    samples: dict[str, dict[str, list[float]]] = {}
    digests = {v: {r["digest"] for r in rs} for v, rs in runs.items()}
    for v, rs in runs.items():
        variants[v] = {"weights_digest": digest_number(rs[0]["digest"]), "final_loss": rs[0]["last_loss"],
                       "checkpoints_per_run": float(rs[0]["checkpoints"])}
        samples[v] = {"iter_time_s": [r["iter_time_s"] for r in rs],
                      "loop_iter_time_s": [r["loop_iter_time_s"] for r in rs],
                      "stall_s_per_iter": [r["stall_s_per_iter"] for r in rs],
                      "stall_s_per_checkpoint": [r["stall_s_per_checkpoint"] for r in rs],
                      "drain_s": [r["drain_s"] for r in rs], "drain_share": [r["drain_share"] for r in rs]}
        if v in CHECKPOINTED:
            variants[v]["checkpoint_mb"] = rs[0]["checkpoint_bytes"] / 1e6
            variants[v]["checkpoint_equals_sync"] = equal[v]
            samples[v]["overhead_s_per_iter"] = over[v]
            samples[v]["flush_mb_s"] = [r["flush_mb_s"] for r in rs]
            if v != "sync":
                samples[v]["copy_gb_s"] = [r["copy_gb_s"] for r in rs]
    variants["training_run"] = {"weights_digest": digest_number(trained["digest"]), "final_loss": trained["last_loss"]}

    mb = {w: state_bytes(w, p.depth) / 1e6 for w in p.regime_widths}
    swept_variants = [v for v in SWEPT if v in runs]  # dcp_async is absent on a non-local storage root
    # the regime on the headline metric: iteration time, final drain included, at the bench's run length
    regime = [RegimeSample(value=mb[w], kind="measured",
                           samples={v: [r["iter_time_s"] for r in runs[v]] if w == p.width
                                    else [swept[w][v]["iter_time_s"]] for v in swept_variants})
              for w in p.regime_widths]
    curves = [Curve(title="wall time of each training step (first repeat)", x_label="step", y_label="seconds",
                    series={v: (list(range(1, len(rs[0]["step_s"]) + 1)), rs[0]["step_s"]) for v, rs in runs.items()})]
    med = {v: {m: statistics.median(xs) for m, xs in ms.items()} for v, ms in samples.items()}
    same = len(set().union(*digests.values()) | {trained["digest"]}) == 1
    flushes = trained["flushes"]
    asyncs = [v for v in ("async_eager", "dcp_async", "dcp_async_lazy", "async_serialize", "async") if v in med]

    def each(metric: str, fmt: str, names=None) -> str:
        return ", ".join(f"{v} {med[v][metric]:{fmt}}" for v in (names or [v for v in CHECKPOINTED if v in med]))

    dcp = ("dcp_async (torch.distributed.checkpoint.async_save, no_dist, one long-lived DefaultStager whose cached "
           "host copies are reused, FileSystemWriter with sync_files, the previous save's upload waited for before "
           "the next) stages (copies) the state at save time and writes on DCP's background thread; dcp_async_lazy "
           "is the same with DCP's default asynchronous staging (use_async_staging): the copy runs on the stager's "
           "thread during the next forward and backward pass and its staging_completion is waited for right before "
           "the next optimizer step (a lazy copy with a barrier, as DataStates-LLM's and CheckFreq's); "
           if "dcp_async" in runs else "dcp_async was not run (it writes through DCP's FileSystemWriter, which needs a local storage "
           "root); ")
    notes = [
        f"Workload: an MLP of {p.depth} layers of {p.width} x {p.width} trained with Adam (fp32 weights and both "
        f"moments: {p.state_mb:.0f} MB of tensors, {variants['sync']['checkpoint_mb']:.0f} MB per torch.save blob) on "
        f"{p.train_threads} torch thread(s), batch {p.batch_size}, {p.steps} steps from the same seed in every run, a "
        f"checkpoint after every {p.every}-th optimizer step in every checkpointed variant, to {storage_url} (each "
        "blob written atomically and fsynced, then the manifest). Variants interleaved over "
        f"{len(runs['sync'])} repeat(s), rotating order, after a warm-up run.",
        "none trains without checkpoints; sync calls CheckpointStore.write (torch.save, sha256, write, manifest) in "
        "the loop; async_eager copies the state into reused host buffers at save time and flushes on a background "
        "thread; " + dcp + "async (DataStates-LLM) starts the copy on the background thread and lets the next "
        "forward and backward pass run meanwhile, blocking only right before the next optimizer step if the copy is "
        "not done. Every asynchronous mode keeps at most one flush in flight (the next snapshot waits) and waits for "
        "the last one before the run ends (counted in its time). async_serialize, the mechanism's ablation, keeps "
        "the background write but has no in-memory snapshot: the training thread serialises the live state "
        "(torch.save) in save and only the checksum, write and manifest run in the background.",
        f"iter_time_s (the headline, and the comparison against the strongest deployable baseline) is the wall time "
        f"of the whole run per iteration, the final drain included: none {med['none']['iter_time_s']:.4f} s, "
        + each("iter_time_s", ".4f") + " s. "
        f"With the final drain left out (loop_iter_time_s, the limit of a longer run): "
        + each("loop_iter_time_s", ".4f") + " s. "
        f"The final drain after the last step (drain_s, waiting for the last flush, which overlapped "
        f"{p.steps % p.every} training step(s) after the last checkpoint at step {p.steps // p.every * p.every}): "
        + each("drain_s", ".3f", asyncs) + " s per run of " + f"{p.steps} steps, a share of the run's wall time "
        "(drain_s / wall) of " + each("drain_share", ".1%", asyncs) + ". Before each timed run every dirty page is "
        "written back (os.sync, untimed), so no run's drain pays for the writeback of the runs before it.",
        "stall_s_per_checkpoint (a further claim) is the stall inside the loop (save and before_update) per "
        "checkpoint taken: " + each("stall_s_per_checkpoint", ".4f") + " s. "
        "overhead_s_per_iter is the whole slowdown against none in the same repeat (the background flush competes "
        "with training for the 2 cores and memory bandwidth here, which the stall does not show): "
        + each("overhead_s_per_iter", ".4f") + " s per iteration.",
        f"Flush bandwidth (serialize + checksum + write + manifest, per checkpoint): "
        + each("flush_mb_s", ".0f") + " MB/s (sync in the loop, the others in the background); snapshot copy "
        + each("copy_gb_s", ".2f", [v for v in asyncs if v != "async_serialize"]) + " GB/s.",
        f"Checkpointing changed no training result: the final weights and optimizer state of every run of every "
        f"variant and of the resumable run have {'one digest' if same else 'DIFFERENT digests'} "
        f"({'equal' if same else 'NOT equal'}); the last checkpoint of each mode is tensor-for-tensor equal to the "
        f"synchronous one: {', '.join(f'{v} {bool(x)}' for v, x in equal.items())}.",
        f"training_run: {p.steps} steps with lazy asynchronous checkpoints under run key "
        f"{run_key or '(none: private to this run)'}; it " + (
            f"resumed after step {trained['start_step']}" if trained["start_step"] else "started from scratch")
        + f" and flushed {len(flushes)} checkpoint(s).",
    ]
    notes.append(
        f"Regime: state size swept over widths {', '.join(map(str, p.regime_widths))} ("
        + ", ".join(f"{mb[w]:.0f} MB" for w in p.regime_widths) + f", depth {p.depth}); at the headline width "
        f"{p.width} the bench's {len(runs['sync'])} repeat(s), at the others one run of {p.steps} steps per variant "
        "(measured, one repeat: a tie by construction, the ratio shown on the curve). Per size, async against the "
        "strongest deployable baseline on iteration time, the final drain included.")
    reps = measured.get("repeats")
    if reps and reps["maximum"] > reps["minimum"]:
        notes.append(repeats_note(reps, "the bench's rounds of every variant"))
    notes.append(_power_note(p, runs, reps))
    return SystemResult(variants=variants, samples=samples, curves=curves, notes=notes,
                        regime=regime, regime_headline_value=p.state_mb, repeats=reps)


def _power_note(p: Any, runs: dict, reps: dict | None) -> str:
    """How many paired repeats fell on each side of async against the strongest deployable baseline (the best
    median iteration time), and how many of n the sign test's interval needs on one side to decide: a tie with
    fewer is a tie for lack of power, not evidence of equality."""
    from math import comb

    from mlsys_flows.systems.checkpoint import SPEC
    from mlsys_flows.systems.common.verdict import CONFIDENCE

    rivals = [b for b in SPEC.baselines if b in runs]
    best = min(rivals, key=lambda b: statistics.median(r["iter_time_s"] for r in runs[b]))
    pairs = list(zip((r["iter_time_s"] for r in runs[best]), (r["iter_time_s"] for r in runs["async"])))
    n, faster = len(pairs), sum(t < b for b, t in pairs)
    looks = (reps or {}).get("looks", 1) if (reps or {}).get("maximum", 0) > (reps or {}).get("minimum", 0) else 1
    alpha = (1 - CONFIDENCE) / looks
    need = next((k for k in range(n // 2 + 1, n + 1) if 2 * sum(comb(n, i) for i in range(k, n + 1)) / 2 ** n <= alpha),
                None)
    return (f"Power: against the strongest deployable baseline by median ({best}), async was faster end to end in "
            f"{faster} of {n} paired repeats; the sign test at level {alpha:.3g} ({looks} planned look(s)) decides "
            + (f"only when at least {need} of {n} fall on one side" if need else f"no {n} pairs at all")
            + ", so a tie with fewer on each side comes from too few repeats as much as from the two being equal.")
