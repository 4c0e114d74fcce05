"""cedar: a CPU-heavy stage offloaded to worker processes vs run inline, measured (the timing half of
tests/unit/test_cedar_offload.py, which tests only the decision and the outputs).

    .venv/bin/python -m benchmarks.cedar_offload                  # 240 samples, 2 workers, 5 repeats
    .venv/bin/python -m benchmarks.cedar_offload --repeats 9 --items 480

The pipeline is the test's: ``--items`` samples, one map of about 3 ms of pure-Python work per sample
(it holds the GIL, so only processes run it in parallel), ``batch(8)``. Per repeat, interleaved:

- ``inline``: one epoch of the pipeline as written (the main process does the work);
- ``offloaded``: one epoch of the same pipeline with the stage on ``--workers`` worker processes (the
  optimizer's plan with every rewrite applied, ``mode="always"``, less its prefetch thread), on a pool
  started and warmed up before the first timed epoch (its first epoch, with the pool's start, is
  reported apart: ``offloaded_first_epoch_s``);
- the optimizer's own decision: ``optimize(workers=...)`` afresh (``mode="cost"``), whose measured
  trial decides whether to offload; recorded with the trial's numbers and the time optimizing took.

Both variants' outputs are checked equal (multisets of samples) before timing. Every number is
``measured`` (wall clock in this run). Writes benchmarks/results/cedar-offload.json with the machine
(cores, load average before, after and at each repeat, versions, git sha, cedar's code hash).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import statistics
import time
from pathlib import Path

from mlsys_flows.systems.cedar import Pipeline
from mlsys_flows.systems.cedar.workloads import multiset
from mlsys_flows.systems.common.environment import capture, load_average

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "cedar-offload.json"


def cpu_heavy(s):
    """About 3 ms of pure-Python work (the unit test's stage)."""
    t = 0
    for i in range(60_000):
        t += i * i
    return s | {"h": t + s["a"]}


def build(items: int) -> Pipeline:
    return Pipeline.from_list([{"a": i} for i in range(items)], seed=0).map(cpu_heavy, name="heavy").batch(8)


def epoch_s(pipe: Pipeline) -> float:
    t0 = time.perf_counter()
    for _ in pipe.iterate(0):
        pass
    return time.perf_counter() - t0


def summary(samples: list[float], unit: str, what: str) -> dict:
    return {"kind": "measured", "unit": unit, "what": what, "median": statistics.median(samples),
            "min": min(samples), "max": max(samples), "n": len(samples), "samples": samples}


def run(items: int, repeats: int, workers: int) -> dict:
    env = capture("cedar")
    p = build(items)
    with p.optimize(workers=workers, mode="always") as always:
        plan = dataclasses.replace(always.plan, prefetch=0, decisions=())
    offloaded = Pipeline(p.source, p.ops, p.seed, plan=plan)
    try:
        assert plan.steps[0].cold == "process", plan
        ref = multiset(p.iterate(0))
        t0 = time.perf_counter()
        got = multiset(offloaded.iterate(0))  # starts the pool: the first epoch, reported apart
        first = time.perf_counter() - t0
        if got != ref:
            raise RuntimeError("the offloaded plan's outputs differ from the pipeline as written")
        inline, off, load, optimize_s, decisions = [], [], [], [], []
        for r in range(repeats):
            load.append(load_average())
            inline.append(epoch_s(p))
            off.append(epoch_s(offloaded))
            t0 = time.perf_counter()
            with build(items).optimize(workers=workers) as opt:
                optimize_s.append(time.perf_counter() - t0)
                d = next(d for d in opt.plan.decisions if d.rule == "offload" and d.detail.startswith("cold"))
                decisions.append({"repeat": r, "offloaded": opt.plan.steps[0].cold == "process",
                                  "detail": d.detail})
            print(f"repeat {r + 1}/{repeats}: inline {inline[-1]:.3f} s, offloaded {off[-1]:.3f} s "
                  f"({inline[-1] / off[-1]:.2f}x); optimizer {'offloads' if decisions[-1]['offloaded'] else 'stays inline'}"
                  f"; load {load[-1]}", flush=True)
    finally:
        offloaded.close()
        p.close()
    environment = env.model_dump() | {"load_after": load_average()}
    return {
        "benchmark": "cedar-offload",
        "what": "cedar: one epoch of a CPU-heavy stage (pure Python, ~3 ms per sample) inline vs offloaded to "
                f"{workers} worker processes; and the decision cedar's optimizer takes on this machine",
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m benchmarks.cedar_offload " + f"--items {items} --repeats {repeats} --workers {workers}",
        "parameters": {"items": items, "repeats": repeats, "workers": workers, "chunk": plan.chunk,
                       "batch": 8, "usable_cores": len(os.sched_getaffinity(0))},
        "metrics": {
            "inline_epoch_s": summary(inline, "s", "one epoch of the pipeline as written"),
            "offloaded_epoch_s": summary(off, "s", f"one epoch with the stage on {workers} warm worker processes"),
            "speedup": summary([a / b for a, b in zip(inline, off)], "x",
                               "inline / offloaded epoch time, per repeat (> 1: offloading is faster)"),
            "offloaded_first_epoch_s": summary([first], "s", "the offloaded plan's first epoch, starting its pool"),
            "optimize_s": summary(optimize_s, "s", "optimize(): profiling, the model and the measured trial"),
        },
        "optimizer_offloaded": f"{sum(d['offloaded'] for d in decisions)} of {len(decisions)} repeats",
        "optimizer_decisions": decisions,
        "load_at_each_repeat": load,
        "outputs_equal": True,
        "environment": environment,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=240)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    result = run(a.items, a.repeats, a.workers)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    m = result["metrics"]
    print(f"inline {m['inline_epoch_s']['median']:.3f} s, offloaded {m['offloaded_epoch_s']['median']:.3f} s, "
          f"speedup {m['speedup']['median']:.2f}x ({m['speedup']['min']:.2f}-{m['speedup']['max']:.2f}), measured; "
          f"optimizer offloaded in {result['optimizer_offloaded']}; wrote {a.out}")


if __name__ == "__main__":
    main()
