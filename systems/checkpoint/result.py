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
                      "stall_s_per_iter": [r["stall_s_per_iter"] for r in rs],
                      "stall_s_per_checkpoint": [r["stall_s_per_checkpoint"] for r in rs],
                      "drain_s": [r["drain_s"] for r in rs]}
        if v in CHECKPOINTED:
            variants[v]["checkpoint_mb"] = rs[0]["checkpoint_bytes"] / 1e6
            variants[v]["checkpoint_equals_sync"] = equal[v]
            samples[v]["overhead_s_per_iter"] = over[v]
            samples[v]["flush_mb_s"] = [r["flush_mb_s"] for r in rs]
            if v != "sync":
                samples[v]["copy_gb_s"] = [r["copy_gb_s"] for r in rs]
    variants["training_run"] = {"weights_digest": digest_number(trained["digest"]), "final_loss": trained["last_loss"]}

    mb = {w: state_bytes(w, p.depth) / 1e6 for w in p.regime_widths}
    regime = [RegimeSample(value=mb[w], kind="measured",
                           samples={v: [r["stall_s_per_checkpoint"] for r in runs[v]] if w == p.width
                                    else [swept[w][v]["stall_s_per_checkpoint"]] for v in SWEPT})
              for w in p.regime_widths]
    curves = [Curve(title="wall time of each training step (first repeat)", x_label="step", y_label="seconds",
                    series={v: (list(range(1, len(rs[0]["step_s"]) + 1)), rs[0]["step_s"]) for v, rs in runs.items()})]
    med = {v: {m: statistics.median(xs) for m, xs in ms.items()} for v, ms in samples.items()}
    same = len(set().union(*digests.values()) | {trained["digest"]}) == 1
    flushes = trained["flushes"]
    notes = [
        f"Workload: an MLP of {p.depth} layers of {p.width} x {p.width} trained with Adam (fp32 weights and both "
        f"moments: {p.state_mb:.0f} MB of tensors, {variants['sync']['checkpoint_mb']:.0f} MB per torch.save blob) on "
        f"{p.train_threads} torch thread(s), batch {p.batch_size}, {p.steps} steps from the same seed in every run, a "
        f"checkpoint after every {p.every}-th optimizer step, to {storage_url} (each blob written "
        "atomically and fsynced, then the manifest). Variants interleaved over "
        f"{len(runs['sync'])} repeat(s), rotating order, after a warm-up run.",
        "none trains without checkpoints; sync calls CheckpointStore.write (torch.save, sha256, write, manifest) in "
        "the loop; async_eager copies the state into reused host buffers at save time and flushes on a background "
        "thread; async (DataStates-LLM) starts the copy on the background thread and lets the next forward and "
        "backward pass run meanwhile, blocking only right before the next optimizer step if the copy is not done. "
        "Both asynchronous modes keep at most one flush in flight (the next snapshot waits) and wait for the last "
        "one before the run ends (counted in its time). async_serialize, the mechanism's ablation, keeps the "
        "background write but has no in-memory snapshot: the training thread serialises the live state "
        "(torch.save) in save and only the checksum, write and manifest run in the background.",
        f"stall_s_per_checkpoint (the headline) is the stall inside the loop (save and before_update) per checkpoint "
        f"taken: sync {med['sync']['stall_s_per_checkpoint']:.4f} s, async_eager "
        f"{med['async_eager']['stall_s_per_checkpoint']:.4f} s, async_serialize "
        f"{med['async_serialize']['stall_s_per_checkpoint']:.4f} s, async {med['async']['stall_s_per_checkpoint']:.4f} "
        f"s; the final drain after the last step (drain_s, waiting for the last flush) is reported apart: "
        f"async_eager {med['async_eager']['drain_s']:.3f} s, async_serialize {med['async_serialize']['drain_s']:.3f} "
        f"s, async {med['async']['drain_s']:.3f} s per run. "
        f"stall_s_per_iter is the time measured inside the saver's calls (save, before_update, the final wait) per "
        f"iteration: sync {med['sync']['stall_s_per_iter']:.4f} s, async_eager "
        f"{med['async_eager']['stall_s_per_iter']:.4f} s, async {med['async']['stall_s_per_iter']:.4f} s. "
        f"overhead_s_per_iter is the whole slowdown against none in the same repeat (the background flush competes "
        f"with training for the 2 cores and memory bandwidth here, which the stall does not show): sync "
        f"{med['sync']['overhead_s_per_iter']:.4f} s, async_eager {med['async_eager']['overhead_s_per_iter']:.4f} s, "
        f"async {med['async']['overhead_s_per_iter']:.4f} s per iteration (none: {med['none']['iter_time_s']:.4f} s).",
        f"Flush bandwidth (serialize + checksum + write + manifest, per blob): sync {med['sync']['flush_mb_s']:.0f} "
        f"MB/s in the loop, async {med['async']['flush_mb_s']:.0f} MB/s in the background; snapshot copy "
        f"{med['async']['copy_gb_s']:.2f} GB/s (async), {med['async_eager']['copy_gb_s']:.2f} GB/s (async_eager).",
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
        f"{p.width} the bench's {len(runs['sync'])} repeat(s), at the others one run of {2 * p.every} steps (two "
        "checkpoints) per variant (measured, fewer repeats: noisier). Per size, async against the stronger of sync "
        "and async_eager on the in-loop stall per checkpoint.")
    reps = measured.get("repeats")
    if reps and reps["maximum"] > reps["minimum"]:
        notes.append(repeats_note(reps, "the bench's rounds of every variant"))
    return SystemResult(variants=variants, samples=samples, curves=curves, notes=notes,
                        regime=regime, regime_headline_value=p.state_mb, repeats=reps)
