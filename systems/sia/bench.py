"""One workload's measurement: every (retraining scheme, placement, mix) served on the same loaded index,
repeats interleaved (pure: the board's ``run_async`` is passed in)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from mlsys_flows.systems.common.repeats import AdaptiveRepeats

from . import SPEC, baselines, train
from .index import CompiledServer, LearnedIndex, Submit, inline_submit
from .shared import SharedSubmit
from .workload import make_keys, op_stream

LATENCY_QUANTILES = [0.5, 1, 2, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 98, 99, 99.5, 99.9]


@dataclass(frozen=True)
class Run:
    variant: str     # report variant name
    scheme: str      # full_retrain | sia | sia_nomemo (the learned index), or a baseline index (baselines.INDEXES)
    offload: bool    # retrain on the board (True) or inline on the host
    mix: str         # "write" (the headline mix) | "read" (read-heavy)

    @property
    def learned(self) -> bool:
        return self.scheme not in baselines.INDEXES


def runs_for(workload: str, inline: bool) -> list[Run]:
    """The runs of one workload: both schemes offloaded and the baseline indexes at both mixes, and
    (``inline``) both schemes retraining on the host at the write-heavy mix; on the YCSB-style keys
    also the mechanism's ablation ``sia_nomemo`` (offloaded, write-heavy)."""
    sfx = "" if workload == "ycsb" else f"_{workload}"
    out = [Run(f"{s}{sfx}", s, True, "write") for s in ("full_retrain", "sia")]
    if workload == "ycsb":
        out.append(Run("sia_nomemo", "sia_nomemo", True, "write"))
    out += [Run(f"{s}{sfx}_readheavy", s, True, "read") for s in ("full_retrain", "sia")]
    if inline:
        out += [Run(f"{s}{sfx}_inline", s, False, "write") for s in ("full_retrain", "sia")]
    out += [Run(f"{b}{sfx}", b, False, "write") for b in baselines.INDEXES]
    out += [Run(f"{b}{sfx}_readheavy", b, False, "read") for b in baselines.INDEXES]
    return out


# the variants the regime sweep serves at each insert share (the technique and the deployable
# baselines): (regime variant, scheme, offloaded)
REGIME = (("sia", "sia", True), ("full_retrain", "full_retrain", True), ("full_retrain_inline", "full_retrain", False),
          *((b, b, False) for b in baselines.INDEXES))


def regime_plan(p, shares, inline: bool) -> dict[float, dict[str, tuple[str, bool] | str]]:
    """For each insert share of the regime: {regime variant: the main run's variant whose samples it
    reuses (the headline and read-heavy mixes are measured anyway), or (scheme, offload) to run once}."""
    named = {p.insert_share: "", p.read_heavy_insert_share: "_readheavy"}
    out = {}
    for share in shares:
        plan = {}
        for name, scheme, offload in REGIME:
            inline_run = not offload and scheme not in baselines.INDEXES
            if inline_run and not inline:
                continue
            if share in named and (not inline_run or share == p.insert_share):
                plan[name] = scheme + named[share] + ("_inline" if inline_run else "")
            else:
                plan[name] = (scheme, offload)
        out[float(share)] = plan
    return out


def clone(index: LearnedIndex) -> LearnedIndex:
    """A fresh copy of the built index (arrays copied, models shared read-only)."""
    new = object.__new__(LearnedIndex)
    new.dtype, new.n_feat, new.ridge, new.pivots = index.dtype, index.n_feat, index.ridge, list(index.pivots)
    new.groups = []
    for g in index.groups:
        c = type(g)(pivot=g.pivot, offset=g.offset, lam=g.lam, nf=g.nf, arr=g.arr.copy(), varr=g.varr.copy(), w=g.w,
                    err=0, r=g.r)
        c.set_model(g.w, g.err - 1, g.r)
        new.groups.append(c)
    return new


def check_lookups(index: LearnedIndex, present: list, present_vals: list, absent: list) -> int:
    """Lookups that disagree with the ground truth (a sorted array of every key and its value)."""
    truth = dict(zip(present, present_vals))
    wrong = sum(index.lookup(k) != truth[k] for k in present)
    return wrong + sum(index.lookup(k) is not None for k in absent)


def check_weights(index: LearnedIndex) -> tuple[float, float]:
    """Every group's weights against a full QR retrain on its current keys: (largest relative
    difference, largest difference over its conditioning-derived tolerance)."""
    worst, worst_ratio = 0.0, 0.0
    for g in index.groups:
        c = train.check_equal_weights(g.w, g.uint8(), g.offset, g.nf, g.lam)
        worst, worst_ratio = max(worst, c["rel_diff"]), max(worst_ratio, c["rel_diff"] / c["bound"])
    return worst, worst_ratio


BASELINE_METRICS = ("ops_per_s", "lookup_p50_us", "lookup_p99_us", "misses")


def measure_workload(p, workload: str, board_submit: Submit, inline: bool,
                     log: Callable[[str], None] = lambda s: None, regime: tuple[float, ...] = ()) -> dict:
    """Generate ``workload``'s keys, build the index, then serve each run's operations ``p.repeats``
    times, rotating the order of the runs each repeat. Returns per-variant samples and counts, and
    (``regime``: insert shares) the regime sweep's ops/s per share and variant. Offloaded retrains
    pass their arrays to the board through shared memory; every segment is unlinked on return."""
    with train.one_blas_thread(), SharedSubmit(board_submit) as shared:  # the host serves on one core
        return _measure(p, workload, shared, inline, log, regime)


def _serve(p, base: LearnedIndex, keys: np.ndarray, key_list: list, scheme: str, offload: bool,
           board: Submit, stream: tuple) -> tuple[dict, object, object]:
    """One timed pass of ``stream`` (insert flags and targets as lists, then as arrays): (summary, the
    index after it, its stats). The learned index serves on the compiled path (:class:`CompiledServer`;
    compiled by :func:`.compiled.warm_up` before any clock), the baselines through their packages."""
    if scheme in baselines.INDEXES:
        index = baselines.build(scheme, keys[: p.loaded_keys], np.arange(p.loaded_keys), p.pgm_buffer)
        st = baselines.serve(index, key_list, stream[0], stream[1])
        summ = {m: v for m, v in st.summary().items() if m in BASELINE_METRICS}
        if scheme == "pgm":
            summ["rebuilds"] = float(index.rebuilds - 1)  # the build before the clock is not one
        return summ, index, st
    index = clone(base)
    rows = keys.view(np.uint8).reshape(len(keys), keys.dtype.itemsize)
    server = CompiledServer(index, scheme, board if offload else inline_submit, p.threshold, p.buffer_cap)
    st = server.run(rows, stream[2], stream[3])
    return st.summary(), index, st


def _measure(p, workload: str, board_submit: Submit, inline: bool, log: Callable[[str], None],
             regime: tuple[float, ...] = ()) -> dict:
    from . import compiled

    jit_s = compiled.warm_up()  # compile (or load from numba's cache) the serving path before any clock
    log(f"{workload}: compiled serving path ready in {jit_s:.2f} s (outside every timed region)")
    rng_seed = p.seed
    total = p.loaded_keys + int(p.ops * max(p.insert_share, p.read_heavy_insert_share, *regime) * 1.2) + 64
    keys = make_keys(workload, total, rng_seed)
    t0 = time.perf_counter()
    base = LearnedIndex(keys[: p.loaded_keys], np.arange(p.loaded_keys), p.group_size, p.n_feat, p.ridge)
    build_s = time.perf_counter() - t0
    log(f"{workload}: {p.loaded_keys} keys in {len(base.groups)} groups, built in {build_s:.2f} s "
        f"(error bounds median {np.median([g.err for g in base.groups]):.0f})")
    key_list = keys.tolist()
    streams = {}
    for mix, share in (("write", p.insert_share), ("read", p.read_heavy_insert_share)):
        s = op_stream(keys, p.loaded_keys, p.ops, 1.0 - share, rng_seed)
        streams[mix] = (s.is_insert.tolist(), s.target.tolist(), s.inserts, s.is_insert, s.target)
    runs = runs_for(workload, inline)
    samples: dict[str, dict[str, list[float]]] = {r.variant: {} for r in runs}
    counts: dict[str, dict[str, float]] = {}
    latency: dict[str, list[float]] = {}
    # the headline's workload repeats until its verdict decides (within max_repeats / the budget)
    reps = p.adaptive_repeats() if workload == "ycsb" else AdaptiveRepeats(p.repeats)
    for rep in reps:
        order = runs[rep % len(runs):] + runs[: rep % len(runs)]
        for run in order:
            ins, tgt, n_ins, ins_a, tgt_a = streams[run.mix]
            summ, index, st = _serve(p, base, keys, key_list, run.scheme, run.offload, board_submit,
                                     (ins, tgt, ins_a, tgt_a))
            for m, v in summ.items():
                samples[run.variant].setdefault(m, []).append(v)
            if run.learned:
                log(f"{workload} {run.variant} repeat {rep}: {summ['ops_per_s']:.0f} ops/s, {st.retrains} retrains "
                    f"(kernel median {summ['retrain_ms']:.2f} ms), stall share {summ['stall_share']:.3f} "
                    f"(submissions {summ['submit_share']:.3f})")
            else:
                log(f"{workload} {run.variant} repeat {rep}: {summ['ops_per_s']:.0f} ops/s")
            if run.variant not in counts:  # exactness and weight checks, once per variant (after the clock)
                present = key_list[: p.loaded_keys + n_ins]
                rng = np.random.default_rng([p.seed, rep, 11])
                pick = rng.choice(len(present), size=min(p.check_keys, len(present)), replace=False)
                absent = key_list[p.loaded_keys + n_ins: p.loaded_keys + n_ins + 64] + \
                    [present[i] + b"~" for i in pick[:64] if len(present[i]) < keys.dtype.itemsize]
                wrong = check_lookups(index, [present[i] for i in pick], [int(i) for i in pick], absent)
                c = {"ops": float(p.ops), "inserts": float(n_ins), "lookup_errors": float(wrong)}
                if run.scheme.startswith("sia"):
                    c["weight_rel_diff_max"], c["weight_diff_over_bound"] = check_weights(index)
                counts[run.variant] = c
                latency[run.variant] = np.percentile(np.asarray(st.lookup_ns) / 1e3, LATENCY_QUANTILES).tolist()
        reps.record_headline(SPEC, {v: m.get(SPEC.headline.metric, []) for v, m in samples.items()})
    if reps.adaptive:
        log(f"{workload}: {reps.done} repeats, stopped: {reps.stopped}")
    # the baselines' Python driver loop on its own: a dict served by the same loop (not a variant)
    ins, tgt = streams["write"][:2]
    floor = baselines.serve(baselines.DictFloor(key_list[: p.loaded_keys], list(range(p.loaded_keys))),
                            key_list, ins, tgt).summary()
    log(f"{workload}: a Python dict through the baselines' loop: {floor['ops_per_s']:.0f} ops/s")
    sweep: dict[float, dict[str, list[float]]] = {}
    for share, plan in regime_plan(p, regime, inline).items():  # one run per new point, after the repeats
        sweep[share] = {}
        stream = None
        for name, how in plan.items():
            if isinstance(how, str):
                sweep[share][name] = list(samples[how]["ops_per_s"])
                continue
            if stream is None:
                s = op_stream(keys, p.loaded_keys, p.ops, 1.0 - share, rng_seed)
                stream = (s.is_insert.tolist(), s.target.tolist(), s.is_insert, s.target)
            summ, _, _ = _serve(p, base, keys, key_list, *how, board_submit, stream)
            sweep[share][name] = [summ["ops_per_s"]]
            log(f"{workload} regime insert share {share:g} {name}: {summ['ops_per_s']:.0f} ops/s, stall share "
                f"{summ.get('stall_share', 0.0):.3f}")
    return {"samples": samples, "counts": counts, "latency": latency, "groups": len(base.groups), "repeats": reps.summary(),
            "build_s": build_s, "jit_s": jit_s, "driver_floor_ops_per_s": floor["ops_per_s"],
            "err_median": float(np.median([g.err for g in base.groups])), "regime": sweep,
            "shared": {"calls": board_submit.calls, "bytes": board_submit.shared_bytes}
            if isinstance(board_submit, SharedSubmit) else {}}
