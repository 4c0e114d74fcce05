"""The ReCycle run's SystemResult, assembled from its tasks' and rank launches' outputs (pure: the flow only
submits and launches)."""
from __future__ import annotations

import statistics

from mlsys_flows.systems.common.report import Assumption, Curve, RegimeSample, SystemResult, param_assumptions

from . import CALIBRATED, FAILURES, HEADLINE_FAILURES, SIMULATED
from .experiment import regime_samples
from .failover import PIPELINES, STAGES
from .gantt import focus_rows, square_waves, window_of


def shown_schedules() -> tuple[str, ...]:
    """The policies whose schedules at the headline's failure count the report draws."""
    f = HEADLINE_FAILURES
    return (f"recycle_f{f}", f"oobleck_f{f}", f"bamboo_f{f}")


def build_result(p, repeats: int, calib: list[dict], restart: dict | None, sims: list, gantt_key: str,
                 pair: dict | None, failover: dict | None) -> SystemResult:
    """``calib``: one stage calibration per repeat; ``restart``: Oobleck's restart measured on ranks (None: the
    stated constant); ``sims``: per repeat, the simulated policies (the last with its schedules and choices);
    ``pair``: the stage-pair check; ``failover``: the real 2 x 2 failover run (None where it did not run)."""
    f = HEADLINE_FAILURES
    shown = shown_schedules()
    restart_s = statistics.median(restart["seconds"]) if restart else None
    schedules, info = sims[-1][1], sims[-1][2]
    names = list(sims[0][0])
    samples = {v: {m: [s[0][v][m] for s in sims] for m in SIMULATED} for v in names}
    variants = {v: {"live_workers": sims[0][0][v]["live_workers"]} for v in names}
    samples["stage"] = {m: [c[k] * 1e3 for c in calib] for m, k in CALIBRATED.items()}
    variants["stage"] = {"param_bytes": float(calib[0]["param_bytes"]), "activation_bytes": float(calib[0]["activation_bytes"])}

    med = {m: statistics.median(samples["stage"][m]) for m in CALIBRATED}
    calibration = {f"stage_{m}": Assumption(value=round(v, 4), unit="ms", source=(
        f"measured in this run: median over {repeats} calibrations of one {p.layers_per_stage}-layer transformer "
        f"stage (d={p.d_model}, {p.micro_batch}x{p.seq} tokens per micro-batch, 1 torch thread); each repeat's "
        "simulation uses its own calibration")) for m, v in med.items()}
    cluster = param_assumptions(p, "pipelines", "stages", "microbatches", "micro_batch", "p2p_gb_s", "p2p_latency_us",
                                "allreduce_gb_s")
    placement = {f"failures_{k}": Assumption(value=v, source=f"placed by seed {p.seed}: every stage keeps a live "
                                             "worker, no pipeline loses two neighbouring stages")
                 for k, v in info.items() if not k.startswith("oobleck")}
    recovery = param_assumptions(p, "lost_iterations", "window_iterations")
    if restart:
        variants["restart"] = {"restart_shard_bytes": float(restart["shard_bytes"])}
        samples["restart"] = {"restart_ms": [x * 1e3 for x in restart["seconds"]]}
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
    if failover is not None:
        _report_failover(failover, p, variants, samples, assumptions, notes)
        notes.append(error_vs_margin(failover, samples))
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
    return SystemResult(variants=variants, samples=samples, assumptions=assumptions, curves=curves,
                        notes=notes, deterministic={"param_bytes", "activation_bytes"}, regime=regime,
                        regime_headline_value=float(f))


def _report_failover(r: dict, p, variants: dict, samples: dict, assumptions: dict, notes: list) -> None:
    """The failover run's variants (measured throughput per step and time to recover; the simulator's
    prediction beside each) and its note."""
    per_step = r["samples_per_step"]
    phases = {"failover_before": ("before_steps_s", "healthy"), "failover_recycle": ("rerouted_steps_s", "rerouted"),
              "failover_restart": ("restart_steps_s", "restart"),
              "failover_restart_decoupled": ("restart_decoupled_steps_s", "restart_decoupled")}
    for name, (steps, plan) in phases.items():
        samples[name] = {"real_samples_s": [per_step / s for s in r[steps]]}
        variants[name] = {"real_predicted_samples_s": per_step / r["predicted_step_s"][plan],
                          "real_step_prediction_error": r["prediction_error"][plan]}
    samples["failover_recycle"]["real_recover_s"] = [r["recycle_recover_s"]]
    samples["failover_restart"]["real_recover_s"] = [r["restart_recover_s"]]
    samples["failover_before"]["real_detection_s"] = [r["detection_s"]]
    source = ("measured in the failover run before the failure, while all 4 ranks ran: {}; the plans were then "
              "simulated one step from a standing start (the run separates steps by a membership barrier)")
    assumptions["real_predicted_samples_s"] = {
        f"stage_{op}_ms": Assumption(value=round(v, 4), unit="ms", source=source.format(
            "each rank timed its stage, median of the ranks")) for op, v in r["stage_ms"].items()} | {
        "p2p_ms": Assumption(value=round(r["p2p_s"] * 1e3, 4), unit="ms", source=source.format(
            "one activation one way, half the median gloo ping-pong")),
        "allreduce_ms": Assumption(value=round(r["allreduce_s"] * 1e3, 4), unit="ms", source=source.format(
            "a 2-rank gloo all-reduce of one stage's gradients"))}
    for name, plan in (("failover_restart", "restart"), ("failover_restart_decoupled", "restart_decoupled")):
        variants[name]["real_ratio_prediction_error"] = r["ratio_prediction_error"][plan]
    err, rat = r["prediction_error"], r["ratio_prediction_error"]
    notes.append(failover_note(r, p) + (
        f" Simulator error on the step time (real_step_prediction_error, measured step / predicted step - 1; "
        f"positive: slower than predicted): fault-free {err['healthy']:+.0%}, rerouted {err['rerouted']:+.0%}, "
        f"restarted {err['restart']:+.0%}, restarted with the decoupled backward {err['restart_decoupled']:+.0%}; on "
        f"the ratio between the policies (real_ratio_prediction_error: ReCycle's steady throughput over the "
        f"baseline's, measured over predicted - 1): vs the restart (Oobleck) {r['ratio_measured']['restart']:.3f} "
        f"measured, {r['ratio_predicted']['restart']:.3f} predicted ({rat['restart']:+.1%}); vs the restart with "
        f"the decoupled backward (decoupled Oobleck) {r['ratio_measured']['restart_decoupled']:.3f} measured, "
        f"{r['ratio_predicted']['restart_decoupled']:.3f} predicted ({rat['restart_decoupled']:+.1%}). The "
        f"simulator gives every worker a core of its own, here {PIPELINES * STAGES} ranks share the machine's "
        "cores."))


def _rank(rank: int) -> str:
    return f"rank {rank} (pipeline {rank // STAGES}, stage {rank % STAGES})"


def failover_note(r: dict, p) -> str:
    """What happened in the failover run, written from its record: which ranks the launcher lost, after
    how many steps, which survivors ran their micro-batches, what the restart rebuilt."""
    lost = ", ".join(_rank(v) for v in r["lost_ranks"])
    went = []
    for v in r["victims"]:
        takers = r["rerouted_to"].get(v) or {}
        went.append(f"{_rank(v)}'s micro-batches ran stage {v % STAGES} on " + (
            ", ".join(f"rank {t} ({n} per step)" for t, n in sorted(takers.items())) if takers else "no survivor"))
    layers = r.get("restart_layers") or {}
    rebuilt = "; ".join(f"its rank {w} layers {a}..{a + n - 1}" for w, (a, n) in sorted(layers.items()))
    return (
        f"Failover run, for real (measured): 2 pipelines x 2 stages as 4 torch.distributed ranks (gloo) on 4 Dask "
        f"worker processes sharing this machine's cores, {p.failover_microbatches} micro-batches of "
        f"{p.micro_batch}x{p.seq} tokens per pipeline per step. Fault-free {r['before_samples_s']:.1f} samples/s "
        f"over steps 1..{r['checkpoint_step']}; after step {r['checkpoint_step']} (a sharded checkpoint, "
        f"{r['checkpoint_s'] * 1e3:.0f} ms to write the slowest shard) the worker of {lost} was SIGKILLed, and "
        f"the launcher saw ranks {r['lost_ranks']} lost; survivors {r['survivors']} saw it gone after "
        f"{r['detection_s'] * 1e3:.0f} ms (its worker left the cluster). ReCycle rerouted: " + "; ".join(went) +
        f"; {r['rerouted_samples_s']:.1f} samples/s, back to work {r['recycle_recover_s']:.2f} s after the kill. "
        f"The restart baseline (new process group, Oobleck's {r['restart_choice']}"
        + (f": {rebuilt}" if rebuilt else "") +
        f", restored from the checkpoint in {r['restart_restore_s'] * 1e3:.0f} ms, relaunch "
        f"{r['restart_relaunch_s'] * 1e3:.0f} ms) ran {r['restart_samples_s']:.1f} samples/s, back to work "
        f"{r['restart_recover_s']:.2f} s after the kill, then {r['restart_decoupled_samples_s']:.1f} samples/s on "
        "the same workers with ReCycle's decoupled backward and staggered step (decoupled Oobleck). The checkpoint "
        "was the step before the failure, so the restart redid no work (its best case).")


def ratio_error_range(r: dict, plan: str) -> tuple[float, float]:
    """The spread of the simulator's error on ReCycle's ratio to ``plan``: min and max over every pairing
    of a timed rerouted step with a timed step of ``plan`` (the headline error pairs their medians)."""
    predicted = r["ratio_predicted"][plan]
    errs = [b / a / predicted - 1 for a in r["rerouted_steps_s"] for b in r[f"{plan}_steps_s"]]
    return min(errs), max(errs)


def error_vs_margin(r: dict, samples: dict) -> str:
    """A note setting the simulator's measured error on the ratio between policies (2 x 2, real ranks)
    beside the headline's simulated margin over the strongest deployable baseline: which is larger. A
    note only: the verdict is the harness's, from the simulated samples."""
    from . import SPEC

    f = HEADLINE_FAILURES
    med = {v: statistics.median(samples[v]["throughput"]) for v in (f"recycle_f{f}", *SPEC.baselines)}
    deployable = [b for b in SPEC.baselines if "deployable" in SPEC.roles.get(b, ())]
    best = max(deployable, key=lambda b: med[b])
    margin = med[f"recycle_f{f}"] / med[best] - 1
    parts = []
    for plan, name in (("restart", "the restart (Oobleck)"), ("restart_decoupled", "decoupled Oobleck")):
        err = r["ratio_prediction_error"][plan]
        lo, hi = ratio_error_range(r, plan)
        parts.append(f"vs {name} {err:+.1%} (per-step pairings {lo:+.1%} .. {hi:+.1%})")
    worst = max(abs(x) for plan in ("restart", "restart_decoupled")
                for x in (r["ratio_prediction_error"][plan], *ratio_error_range(r, plan)))
    median_worst = max(abs(r["ratio_prediction_error"][k]) for k in ("restart", "restart_decoupled"))
    victims = ", ".join(_rank(v) for v in r["victims"])
    if median_worst > abs(margin):
        verdict = ("the simulator's error on the ratio is LARGER than the headline's margin: the simulated "
                   "margin is inside what the simulator gets wrong on real ranks, so read the headline as "
                   "not resolved by this simulator, whatever its interval says")
    elif worst > abs(margin):
        verdict = ("the median error is smaller than the margin but its per-step range reaches past it: the "
                   "margin is not clearly outside the simulator's error")
    else:
        verdict = ("the margin is larger than the simulator's error on the ratio, its per-step range included")
    return (f"Simulator error vs the headline's margin: the headline's simulated margin over the strongest "
            f"deployable baseline ({best}) is {margin:+.1%} (window throughput at {f} failure, {len(samples[best]['throughput'])} "
            f"repeat(s)); the simulator's error on ReCycle's steady-throughput ratio, measured on the 2 x 2 "
            f"failover run with {victims} killed (real_ratio_prediction_error, measured ratio / simulated ratio "
            f"- 1): " + "; ".join(parts) + f". So {verdict}. At 2 x 2 the simulator predicts ReCycle "
            f"{'slower' if r['ratio_predicted']['restart'] < 1 else 'faster'} than the restart (ratio "
            f"{r['ratio_predicted']['restart']:.3f}): the error is calibrated where "
            f"{'ReCycle loses' if r['ratio_predicted']['restart'] < 1 else 'ReCycle wins'}. This is a note, not a verdict change (the verdict "
            "is the harness's, from the simulated samples); the error is measured at 2 x 2 on one victim, where "
            "the simulator's operating point differs from the headline's cluster.")
