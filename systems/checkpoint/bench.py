"""The measurement: the same training run with no checkpoints, synchronous saves, eager, PyTorch's (DCP)
and lazy asynchronous saves and the mechanism's ablation, repeated with the variants interleaved (pure: the
savers come from a factory)."""
from __future__ import annotations

import os
from typing import Any, Callable

from mlsys_flows.systems.common.repeats import AdaptiveRepeats

from . import MODES, SPEC, SWEPT, Params
from .train import TrainResult, train


def order(repeat: int, variants: tuple[str, ...] = tuple(MODES)) -> list[str]:
    """Variants of one repeat: rotated by the repeat (each goes first in turn), the rest reversed on
    odd repeats, so none always runs first (after a warm-up) or right after the same neighbour."""
    k = repeat % len(variants)
    out = list(variants[k:] + variants[:k])
    return [out[0], *out[:0:-1]] if repeat % 2 else out


def settle() -> None:
    """Before each timed run, untimed: write back every dirty page (os.sync), so that no run's final drain
    (its last fsync) also pays for the page-cache writeback of the runs before it."""
    if hasattr(os, "sync"):
        os.sync()


def summarize(result: TrainResult, flushes: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's numbers: seconds per iteration (wall and stall), flush bandwidth, copy bandwidth."""
    n = result.iterations
    # iter_time_s (the headline) is the whole run's wall time per iteration, the final drain included;
    # loop_iter_time_s leaves the drain out (what a run long enough to amortise it tends to)
    out: dict[str, Any] = {"iter_time_s": result.wall_s / n, "loop_iter_time_s": (result.wall_s - result.drain_s) / n,
                           "stall_s_per_iter": result.stall_s / n,
                           # the in-loop stall per checkpoint taken, the final drain apart
                           "stall_s_per_checkpoint": result.loop_stall_s / max(1, len(flushes)),
                           "drain_s": result.drain_s, "drain_share": result.drain_s / result.wall_s,
                           "digest": result.digest, "last_loss": result.last_loss, "step_s": result.step_s,
                           "checkpoints": len(flushes)}
    if flushes:
        total = sum(f["bytes"] for f in flushes)
        out["checkpoint_bytes"] = flushes[-1]["bytes"]
        out["flush_mb_s"] = total / 1e6 / sum(f["seconds"] for f in flushes)
        copy_s = sum(f["copy_s"] for f in flushes)
        out["copy_gb_s"] = total / 1e9 / copy_s if copy_s > 0 else None
    return out


def run_bench(p: Params, make_saver: Callable[[str, int], Any], done: Callable[[str, int, Any], None] | None = None,
              log: Callable[[str], None] = lambda _: None,
              reps: AdaptiveRepeats | None = None,
              variants: tuple[str, ...] = tuple(MODES)) -> dict[str, list[dict[str, Any]]]:
    """Rounds of every variant of ``variants`` (default MODES; interleaved), each a full training run of
    ``p.steps`` steps from the same seed, checkpointing every ``p.every`` steps: ``p.repeats`` of them,
    or as many as ``reps`` (adaptive repeats: until the headline's verdict decides) allows.
    ``make_saver(variant, repeat)`` returns a saver (None for "none"); ``done(variant, repeat, saver)``
    runs after each (cleanup). Returns {variant: [run]}."""
    reps = reps or AdaptiveRepeats(p.repeats)
    # warm-up (not recorded): first-touch allocations and code paths of the training loop
    train(p.width, p.depth, p.batch_size, min(2, p.steps), p.seed, threads=p.train_threads)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for r in reps:
        for variant in order(r, variants):
            saver = make_saver(variant, r)
            settle()
            res = train(p.width, p.depth, p.batch_size, p.steps, p.seed, saver=saver,
                        every=p.every if saver is not None else 0, threads=p.train_threads)
            run = summarize(res, list(getattr(saver, "flushes", [])))
            runs[variant].append(run)
            log(f"repeat {r} {variant}: {run['iter_time_s']:.3f} s/iter, stall {run['stall_s_per_iter']:.3f} s/iter"
                + (f", flush {run['flush_mb_s']:.0f} MB/s" if "flush_mb_s" in run else ""))
            if done is not None:
                done(variant, r, saver)
        reps.record_headline(SPEC, {v: [run[SPEC.headline.metric] for run in rs] for v, rs in runs.items()})
    return runs


def sweep_widths(p: Params, make_saver: Callable[[str, int, int], Any],
                 done: Callable[[str, int, Any], None] | None = None, variants: tuple[str, ...] = SWEPT,
                 log: Callable[[str], None] = lambda _: None) -> dict[int, dict[str, dict[str, Any]]]:
    """The regime sweep: at each width of ``p.regime_widths`` other than ``p.width`` (the bench
    measures that one), one run of each of ``variants`` of ``p.steps`` steps (the bench's run length:
    the headline metric, iteration time with the drain, is compared at the same length) from the same
    seed, in the order of ``order``. ``make_saver(variant, width, index)`` returns the saver. Returns
    {width: {variant: run}}."""
    out: dict[int, dict[str, dict[str, Any]]] = {}
    steps = p.steps
    for i, width in enumerate(w for w in p.regime_widths if w != p.width):
        train(width, p.depth, p.batch_size, 1, p.seed, threads=p.train_threads)  # warm-up at this size
        out[width] = {}
        for variant in order(i, variants):
            saver = make_saver(variant, width, i)
            settle()
            res = train(width, p.depth, p.batch_size, steps, p.seed, saver=saver, every=p.every,
                        threads=p.train_threads)
            out[width][variant] = run = summarize(res, list(getattr(saver, "flushes", [])))
            log(f"width {width}: {variant} {run['iter_time_s']:.4f} s/iter, stall "
                f"{run['stall_s_per_checkpoint']:.4f} s/checkpoint, drain {run['drain_s']:.3f} s")
            if done is not None:
                done(variant, i, saver)
    return out


def overheads(runs: dict[str, list[dict[str, Any]]]) -> dict[str, list[float]]:
    """Per repeat: a checkpointed variant's seconds per iteration minus the run without checkpoints."""
    base = [r["iter_time_s"] for r in runs["none"]]
    return {v: [r["iter_time_s"] - b for r, b in zip(runs[v], base)] for v in runs if v != "none"}
