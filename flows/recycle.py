"""ReCycle flow: calibrate a transformer stage with torch, simulate ReCycle, Oobleck-style and Bamboo-style
training of D pipelines x S stages at 0, 1, 2 and 4 failures, and check the simulator against the real
decoupled schedule of one stage pair on two gloo processes."""
from __future__ import annotations

import statistics
import time

from mlsys_flows.blocks import CheckpointStore
from mlsys_flows.flows.common import RunContext, SystemResult, system_flow
from mlsys_flows.systems.common.distributed import gloo_available
from mlsys_flows.systems.common.report import Assumption, Curve, RegimeSample, param_assumptions
from mlsys_flows.systems.recycle import FAILURES, HEADLINE_FAILURES
from mlsys_flows.systems.recycle.experiment import regime_samples
from mlsys_flows.systems.recycle.failover import PIPELINES, STAGES, VICTIM, FailoverConfig, summarize
from mlsys_flows.systems.recycle.gantt import focus_rows, square_waves, window_of
from mlsys_flows.tasks import recycle as t
from mlsys_flows.platform.ranks import RanksFailed

SIMULATED = ("throughput", "steady_throughput", "iteration_ms", "compute_utilization", "stall_ms")
# ReCycle's ranks compute on the CPU (one core per stage worker, as calibrated): gloo even where workers have GPUs
CPU_RANKS = "gloo"
CALIBRATED = {"forward_ms": "forward", "backward_input_ms": "backward_input", "backward_weight_ms": "backward_weight",
              "backward_fused_ms": "backward_fused", "optimizer_ms": "optimizer"}


@system_flow("recycle")
def recycle(ctx: RunContext) -> SystemResult:
    p = ctx.params
    f = HEADLINE_FAILURES
    shown = (f"recycle_f{f}", f"oobleck_f{f}", f"bamboo_f{f}")
    if p.failover_run and gloo_available():  # a cluster started elsewhere must have its 4 workers: say so now
        ctx.rank_workers(PIPELINES * STAGES, "failover_run", grow=False)
    # calibrations are timed: one after another, nothing else running
    calib = [t.calibrate.submit(p, r).result() for r in range(ctx.repeats)]
    # Oobleck's restart, measured on the cluster's workers (also alone), else the stated constant
    restart = _measure_restart(ctx) if p.measure_restart and gloo_available() else None
    restart_s = statistics.median(restart["seconds"]) if restart else None
    # the simulations only read the calibrated numbers: side by side
    futures = [t.simulate_policies.submit(p, c, shown if r == ctx.repeats - 1 else (), restart_s)
               for r, c in enumerate(calib)]
    sims = [fu.result() for fu in futures]
    schedules, info = sims[-1][1], sims[-1][2]
    gantt_key = t.gantt.submit(schedules, ctx.storage, ctx.key("gantt.png")).result()
    pair = t.stage_pair.submit(p).result() if p.pair_check else None

    names = list(sims[0][0])
    samples = {v: {m: [s[0][v][m] for s in sims] for m in SIMULATED} for v in names}
    variants = {v: {"live_workers": sims[0][0][v]["live_workers"]} for v in names}
    samples["stage"] = {m: [c[k] * 1e3 for c in calib] for m, k in CALIBRATED.items()}
    variants["stage"] = {"param_bytes": float(calib[0]["param_bytes"]), "activation_bytes": float(calib[0]["activation_bytes"])}
    kinds = dict.fromkeys(SIMULATED, "simulated") | dict.fromkeys(CALIBRATED, "measured") | \
        {"live_workers": "counted", "param_bytes": "counted", "activation_bytes": "counted"}

    med = {m: statistics.median(samples["stage"][m]) for m in CALIBRATED}
    calibration = {f"stage_{m}": Assumption(value=round(v, 4), unit="ms", source=(
        f"measured in this run: median over {ctx.repeats} calibrations of one {p.layers_per_stage}-layer transformer "
        f"stage (d={p.d_model}, {p.micro_batch}x{p.seq} tokens per micro-batch, 1 torch thread); each repeat's "
        "simulation uses its own calibration")) for m, v in med.items() if m != "backward_fused_ms"}
    cluster = param_assumptions(p, "pipelines", "stages", "microbatches", "micro_batch", "p2p_gb_s", "p2p_latency_us",
                                "allreduce_gb_s")
    placement = {f"failures_{k}": Assumption(value=v, source=f"placed by seed {p.seed}: every stage keeps a live "
                                             "worker, no pipeline loses two neighbouring stages")
                 for k, v in info.items() if not k.startswith("oobleck")}
    recovery = param_assumptions(p, "lost_iterations", "window_iterations")
    if restart:
        variants["restart"] = {"restart_shard_bytes": float(restart["shard_bytes"])}
        samples["restart"] = {"restart_ms": [x * 1e3 for x in restart["seconds"]]}
        kinds |= {"restart_ms": "measured", "restart_shard_bytes": "counted"}
        recovery["restart_s"] = Assumption(value=round(restart_s, 4), unit="s", source=(
            f"measured in this run: median of {len(restart['seconds'])} restarts of a {restart['world_size']}-stage "
            "pipeline as torch.distributed ranks on the cluster's workers (new process group, each stage restored "
            "from a sharded checkpoint, layers copied from rank 0, one forward and backward), charged per failure"))
    else:
        recovery |= param_assumptions(p, "restart_iterations")
    base = calibration | cluster | placement
    assumptions = {m: base | (recovery if m in ("throughput", "stall_ms") else {}) for m in SIMULATED}

    curves = [Curve(title="simulated throughput vs failures", x_label="failed workers", y_label="samples/s (window)",
                    series={pol: ([0, *FAILURES], [statistics.median(samples["nofail" if pol == "recycle" and k == 0
                                                                          else f"{pol}_f{k}"]["throughput"])
                                                   for k in (0, *FAILURES)])
                            for pol in ("recycle", "oobleck", "bamboo")})]
    for name in shown[:2]:
        sch = schedules[name]
        t0, t1 = window_of(sch)
        rows = focus_rows(sch["workers"])
        # the title names no rows: which pipelines Oobleck keeps follows a timed choice (below)
        curves.append(Curve(title=f"schedule of {name}: the most damaged pipeline and an intact one",
                            x_label="time in one steady iteration (ms, simulated)", y_label="worker row (busy = raised)",
                            series=square_waves(sch, t0, t1, rows)))

    plain_ms = statistics.median(samples["oobleck_f0"]["iteration_ms"])
    restart_text = (f"{restart_s:.3f} s measured in this run, {restart_s * 1e3 / plain_ms:.1f} fault-free Oobleck "
                    f"iterations of {plain_ms:.1f} ms (restore {restart['phases']['restore_s'] * 1e3:.0f} ms, layer "
                    f"copy {restart['phases']['copy_s'] * 1e3:.0f} ms, first step "
                    f"{restart['phases']['first_step_s'] * 1e3:.0f} ms on the slowest rank, the rest scheduling, "
                    f"rendezvous and group setup; {restart['shard_bytes'] / 1e6:.1f} MB per stage's shard)"
                    if restart else f"{p.restart_iterations:g} fault-free iterations, an assumed constant "
                                    "(restart_iterations; measure_restart is off or gloo is missing)")
    notes = [
        f"Throughputs are simulated: a discrete-event list scheduler of {p.pipelines} pipelines x {p.stages} stages x "
        f"{p.microbatches} micro-batches (1F1B; forward, backward-input and backward-weight per micro-batch; ring "
        f"all-reduce + Adam per stage) driven by per-stage times measured in this run with torch on this CPU "
        f"(F {med['forward_ms']:.2f} ms, B_input {med['backward_input_ms']:.2f} ms, B_weight "
        f"{med['backward_weight_ms']:.2f} ms, fused backward {med['backward_fused_ms']:.2f} ms, optimizer "
        f"{med['optimizer_ms']:.2f} ms per stage). Links are assumed ({p.p2p_gb_s} GB/s p2p, {p.allreduce_gb_s} GB/s "
        "all-reduce), not measured: this machine has no interconnect.",
        f"Headline at {f} failure: failures are rare and arrive one at a time, so one failed worker is the state a "
        "large job spends most of its degraded time in. Throughput averages a window of "
        f"{p.window_iterations} iterations per failure that pays the stall (ReCycle and Oobleck redo "
        f"{p.lost_iterations:g} iteration(s) per failure, Oobleck also restarts: {restart_text}; Bamboo recovers "
        "in place); steady_throughput leaves the stall out.",
        "Oobleck-style chose: " + "; ".join(f"{k.rsplit('_f', 1)[1]} failure(s){' (decoupled)' if 'decoupled' in k else ''}: "
                                            f"{v}" for k, v in info.items() if k.startswith("oobleck"))
        + ". Bamboo-style runs every worker's successor stage forward redundantly (in bubbles) and lets the "
        "predecessor run a failed stage. " + "; ".join(v for k, v in info.items() if not k.startswith("oobleck")) + ".",
        f"Gantt chart of one steady iteration of {', '.join(shown)}: storage key {gantt_key} (the report's schedule "
        "panels draw the most damaged pipeline and one intact one, each worker as a line raised while it runs F/Bi/Bw/B/RF/sync).",
    ]
    if pair is not None:
        variants["pair"] = {"pair_predicted_ms": pair["predicted_step_s"] * 1e3}
        samples["pair"] = {"pair_step_ms": [s * 1e3 for s in pair["measured_steps_s"]]}
        kinds |= {"pair_step_ms": "measured", "pair_predicted_ms": "simulated"}
        err = pair["measured_step_s"] / pair["predicted_step_s"] - 1
        assumptions["pair_predicted_ms"] = {
            f"rank{r}_{k}": Assumption(value=round(v * 1e3, 4), unit="ms", source="measured in the stage-pair run by "
                                       f"rank {r} before the timed steps") for r, tm in enumerate(pair["times"])
            for k, v in tm.items()} | {"p2p": Assumption(value=round(pair["p2p_s"] * 1e3, 4), unit="ms",
                                                         source="measured: half the median gloo ping-pong")}
        notes.append(f"Simulator check: the real decoupled schedule of one stage pair (two processes, gloo on "
                     f"127.0.0.1, {p.pair_microbatches} micro-batches, Bw deferred as planned) took "
                     f"{pair['measured_step_s'] * 1e3:.1f} ms per step (median of {len(pair['measured_steps_s'])}); "
                     f"the simulator predicted {pair['predicted_step_s'] * 1e3:.1f} ms from times the two processes "
                     f"measured just before ({err:+.1%}).")
    failover = _failover(ctx) if p.failover_run and gloo_available() else None
    if failover is not None:
        _report_failover(failover, p, variants, samples, kinds, assumptions, notes)
    per_repeat = [regime_samples(s[0], p.regime_failures, f) for s in sims]
    regime = [RegimeSample(value=float(k), samples={pol: [r[k][pol] for r in per_repeat] for pol in per_repeat[0][k]},
                           kind="simulated") for k in p.regime_failures]
    notes.append(
        f"Mechanism: oobleck_decoupled_f{f} is Oobleck-style reconfiguration with ReCycle's decoupled backward and "
        "staggered optimizer (each group of workers that share layers steps when done): only the rerouting differs "
        "from ReCycle. Regime: window throughput at " + ", ".join(map(str, p.regime_failures)) + " failures per "
        f"{p.window_iterations}-iteration window (each failed worker stays failed; every failure costs ReCycle and "
        f"Oobleck {p.lost_iterations:g} lost iteration(s), Oobleck also the restart: {restart_text}); ReCycle "
        "against the strongest of Oobleck, decoupled Oobleck and Bamboo at each count.")
    # live_workers is an exact count, but not the same in every run: Oobleck's choice between shrunk
    # pipelines and dropping the damaged ones compares simulated iterations built on this run's timed
    # calibration, and a near tie can go either way
    return SystemResult(variants=variants, kinds=kinds, samples=samples, assumptions=assumptions, curves=curves,
                        notes=notes, deterministic={"param_bytes", "activation_bytes"}, regime=regime,
                        regime_headline_value=float(f))


def _measure_restart(ctx: RunContext) -> dict:
    """Oobleck's restart on the run's cluster: 2 stage workers checkpoint their stages (sharded), then,
    ``ctx.repeats`` times, a fresh launch of 2 ranks restores them, copies layers and takes one step
    (``systems.recycle.restart``); the launches' wall seconds and the slowest rank's phases."""
    p = ctx.params
    store = CheckpointStore(storage=ctx.storage, prefix=ctx.key("restart"), keep_last=1)
    try:
        shard_bytes = ctx.ranks(t.checkpoint_stage_rank, 2, store, "stages", p, backend=CPU_RANKS).results[0]
        launches = [ctx.ranks(t.restart_stage_rank, 2, store, "stages", p, backend=CPU_RANKS)
                    for _ in range(ctx.repeats)]
    finally:
        ctx.storage.delete(ctx.key("restart"))
    seconds = [run.seconds for run in launches]
    middle = launches[sorted(range(len(seconds)), key=seconds.__getitem__)[len(seconds) // 2]]
    phases = {k: max(r[k] for r in middle.results) for k in ("restore_s", "copy_s", "first_step_s")}
    return {"seconds": seconds, "phases": phases, "shard_bytes": shard_bytes, "world_size": 2}


def _failover(ctx: RunContext) -> dict:
    """ReCycle for real (``systems.recycle.failover``): 4 ranks, the last one's worker SIGKILLed after a
    sharded checkpoint, the survivors rerouting; then the restart baseline on the 3 surviving workers,
    restored from that checkpoint. Run last and alone: everything in it is timed."""
    p = ctx.params
    cfg = FailoverConfig(d_model=p.d_model, heads=p.heads, layers_per_stage=p.layers_per_stage,
                         micro_batch=p.micro_batch, seq=p.seq, microbatches=p.failover_microbatches,
                         steps=p.failover_steps, calibration_reps=min(p.calibration_reps, 5), seed=p.seed)
    workers = ctx.rank_workers(PIPELINES * STAGES, "failover_run")
    ctx.keep_down(workers[VICTIM])
    store = CheckpointStore(storage=ctx.storage, prefix=ctx.key("failover"), keep_last=1)
    try:
        try:
            ctx.ranks(t.failover_recycle_rank, len(workers), store, "stages", cfg, workers=workers, backend=CPU_RANKS)
            raise RuntimeError("the failover run's victim rank did not fail")
        except RanksFailed as exc:
            if set(exc.lost) != {VICTIM} or exc.failed:
                raise
            recycle = [exc.results[r] for r in sorted(exc.results)]
        # Oobleck's choice (from the measured times) is shrunk pipelines on every survivor or only the
        # intact pipelines: its workers are the first survivors, in rank order
        survivors = [w for r, w in enumerate(workers) if r != VICTIM][:recycle[0]["restart_workers"]]
        measured = {k: recycle[0][k] for k in ("times", "p2p_s", "allreduce_s")}
        launched = time.time()
        restart = ctx.ranks(t.failover_restart_rank, len(survivors), store, "stages", cfg, launched, measured,
                            workers=survivors, backend=CPU_RANKS).results
    finally:
        ctx.storage.delete(ctx.key("failover"))
    return summarize(recycle, restart, cfg)


def _report_failover(r: dict, p, variants: dict, samples: dict, kinds: dict, assumptions: dict, notes: list) -> None:
    """The failover run's variants (measured throughput per step and time to recover; the simulator's
    prediction beside each) and its note."""
    per_step = r["samples_per_step"]
    phases = {"failover_before": ("before_steps_s", "healthy"), "failover_recycle": ("rerouted_steps_s", "rerouted"),
              "failover_restart": ("restart_steps_s", "restart")}
    for name, (steps, plan) in phases.items():
        samples[name] = {"real_samples_s": [per_step / s for s in r[steps]]}
        variants[name] = {"real_predicted_samples_s": per_step / r["predicted_step_s"][plan],
                          "real_step_prediction_error": r["prediction_error"][plan]}
    samples["failover_recycle"]["real_recover_s"] = [r["recycle_recover_s"]]
    samples["failover_restart"]["real_recover_s"] = [r["restart_recover_s"]]
    samples["failover_before"]["real_detection_s"] = [r["detection_s"]]
    kinds |= {"real_samples_s": "measured", "real_recover_s": "measured", "real_detection_s": "measured",
              "real_predicted_samples_s": "simulated", "real_step_prediction_error": "measured"}
    source = ("measured in the failover run before the failure, while all 4 ranks ran: {}; the plans were then "
              "simulated one step from a standing start (the run separates steps by a membership barrier)")
    assumptions["real_predicted_samples_s"] = {
        f"stage_{op}_ms": Assumption(value=round(v, 4), unit="ms", source=source.format(
            "each rank timed its stage, median of the ranks")) for op, v in r["stage_ms"].items()} | {
        "p2p_ms": Assumption(value=round(r["p2p_s"] * 1e3, 4), unit="ms", source=source.format(
            "one activation one way, half the median gloo ping-pong")),
        "allreduce_ms": Assumption(value=round(r["allreduce_s"] * 1e3, 4), unit="ms", source=source.format(
            "a 2-rank gloo all-reduce of one stage's gradients"))}
    err = r["prediction_error"]
    notes.append(
        f"Failover run, for real (measured): 2 pipelines x 2 stages as 4 torch.distributed ranks (gloo) on 4 Dask "
        f"worker processes sharing this machine's cores, {p.failover_microbatches} micro-batches of "
        f"{p.micro_batch}x{p.seq} tokens per pipeline per step. Fault-free {r['before_samples_s']:.1f} samples/s; "
        f"rank 3's worker SIGKILLed after a sharded checkpoint ({r['checkpoint_s'] * 1e3:.0f} ms to write its shard); "
        f"the survivors saw it gone after {r['detection_s'] * 1e3:.0f} ms (its worker left the cluster). ReCycle "
        f"rerouted pipeline 1's second stage to rank 1 and ran {r['rerouted_samples_s']:.1f} samples/s, back to "
        f"work {r['recycle_recover_s']:.2f} s after the kill; the restart baseline (new process group, Oobleck's "
        f"{r['restart_choice']}, stages restored from the checkpoint in {r['restart_restore_s'] * 1e3:.0f} ms, "
        f"relaunch {r['restart_relaunch_s'] * 1e3:.0f} ms) ran {r['restart_samples_s']:.1f} samples/s, back to work "
        f"{r['restart_recover_s']:.2f} s after the kill. The checkpoint was the step before the failure, so the "
        f"restart redid no work (its best case). Simulator error on the step time (real_step_prediction_error, "
        f"measured step / predicted step - 1; positive: slower than predicted): fault-free "
        f"{err['healthy']:+.0%}, rerouted {err['rerouted']:+.0%}, restarted {err['restart']:+.0%}; the simulator "
        f"gives every worker a core of its own, here {PIPELINES * STAGES} ranks share the machine's cores.")
