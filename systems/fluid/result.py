"""The fluid SystemResult from its tasks' outputs: per seed and policy the time to the target accuracy
(FedAvg-wait's final accuracy x target_fraction) and the counts around it, the straggler-slowdown regime
from the federations re-run at each slowdown, fedavg_drop's calibration, the clock's assumptions, the
curves and the notes (pure: the flow only submits). A regime point where FLuID or the baseline it is
compared with never reached the target in some seed is invalid: its time is the whole run, not a time
to accuracy."""
from __future__ import annotations

import numpy as np

from mlsys_flows.systems.common.report import Assumption, Curve, RegimeSample, SystemResult, param_assumptions

from . import (COUNTED, POLICIES, REGIME_POLICIES, REGIME_RERUN, SIMULATED, SPEC, Params, drop_count, final_accuracy,
               rescale_stragglers, round_times, time_to_target, tune_drop_fraction)

FANOUT = {"one": "fanout_1_worker", "all": "fanout_all_workers"}
DEPLOYABLE = tuple(b for b in SPEC.baselines if "deployable" in SPEC.role(b))


def seed_target(p: Params, fedavg_wait: dict) -> float:
    """A seed's target test accuracy: target_fraction x FedAvg-wait's final accuracy (mean of its last 3 rounds)."""
    return p.target_fraction * final_accuracy(fedavg_wait["accuracy"])


def tuned_drop_fraction(p: Params, targets: dict[int, float], calibration: dict[tuple[int, float], dict]) -> float:
    """fedavg_drop's drop fraction: the grid's fraction with the lowest median time to the target over the
    calibration seeds (``targets``: calibration seed -> its target; ``calibration``: (seed, fraction) -> run).
    Times are on the clock fedavg_drop is judged on (``round_s``: measured CPU x speed + communication), read
    by the same smoothed crossing rule (``time_to_target``) as every evaluated time to target."""
    return tune_drop_fraction(_calibration_times(p, targets, calibration))


def _calibration_times(p: Params, targets: dict[int, float], calibration: dict[tuple[int, float], dict]):
    return {d: [time_to_target(calibration[s, d]["accuracy"], calibration[s, d]["round_s"], targets[s])[0]
                for s in sorted(targets)] for d in p.drop_fractions}


def charge_misses(samples: dict[str, dict[str, list[float]]], seeds: list[int], fluid_missed: list[int]) -> None:
    """A seed where FLuID missed the target has no time to target for it (its whole run is a lower bound):
    it is charged at least the slowest policy's time in that seed, so no pair of that seed counts as a
    FLuID win (against every baseline it is a loss or, against the slowest, a tie), whatever the run's length."""
    for s in fluid_missed:
        i = seeds.index(s)
        for m in ("time_to_accuracy_s", "time_to_accuracy_raw_s"):
            samples["fluid"][m][i] = max(samples[pol][m][i] for pol in samples if m in samples[pol] and samples[pol][m])


def missed_notes(samples: dict[str, dict[str, list[float]]], seeds: list[int], missed: dict[str, list[int]]) -> list[str]:
    """Which seeds each policy missed the target in, and a warning where the strongest deployable baseline
    by median time to target (the one the headline's vs_strongest is taken against) missed in any seed."""
    out = []
    if any(missed.values()):
        out.append("Seeds in which a policy never reached the target (time_to_accuracy_s is then its whole run, a "
                   "lower bound, not a time to target): " + "; ".join(
                       f"{pol} {', '.join(map(str, ss))}" for pol, ss in missed.items() if ss)
                   + (". FLuID's missed seeds are charged at least the slowest policy's time in that seed, so none "
                      "of their pairs counts as a FLuID win." if missed.get("fluid") else "."))
    times = {b: float(np.median(samples[b]["time_to_accuracy_s"])) for b in DEPLOYABLE if samples.get(b, {}).get("time_to_accuracy_s")}
    if times:
        best = min(times, key=times.get)
        if missed.get(best):
            out.append(f"The strongest deployable baseline by median time to the target, {best}, missed the target "
                       f"in seed(s) {', '.join(map(str, missed[best]))}: its time there is its whole run, a lower bound "
                       "that flatters it, so the ratio against it understates FLuID where FLuID reached the target, "
                       "and it is the strongest only on that lower bound.")
    return out


def _regime_sample(slowdown: float, times: dict[str, list[float]], samples: dict[str, dict[str, list[float]]]) -> RegimeSample:
    """Time to the target per policy at one slowdown; invalid where FLuID or the fastest deployable baseline
    there (the one the ratio is taken against) missed the target in a seed (``samples``: that point's
    reached_target per policy)."""
    rival = min((b for b in DEPLOYABLE if b in times), key=lambda b: float(np.median(times[b])))
    missed = []
    for v in ("fluid", rival):
        reached = samples[v]["reached_target"]
        if sum(reached) < len(reached):
            missed.append(f"{v} missed the target accuracy in {int(len(reached) - sum(reached))} of {len(reached)} seeds")
    return RegimeSample(value=float(slowdown), samples=times, kind="simulated", valid=not missed,
                        invalid="; ".join(missed))


def _point(p: Params, k: float, seeds: list[int], targets: list[float], runs: dict[tuple[int, str], dict],
           regime_runs: dict[tuple[float, int, str], dict]) -> RegimeSample:
    """One regime point: at the headline's slowdown the headline runs, elsewhere the runs re-done there
    (FedAvg-wait: its headline run re-timed with the slowed clients at ``k``, the run a re-run repeats)."""
    at: dict[str, list[float]] = {pol: [] for pol in REGIME_POLICIES}
    hit: dict[str, dict[str, list[float]]] = {pol: {"reached_target": []} for pol in REGIME_POLICIES}
    for s, target in zip(seeds, targets):
        for pol in REGIME_POLICIES:
            if k == p.straggler_slowdown:
                h = runs[s, pol]
                round_s = h["round_s"]
            elif pol not in REGIME_RERUN:
                h = runs[s, pol]
                round_s = round_times(h["trained"], rescale_stragglers(h["speed"], h["slowed"],
                                                                      k / p.straggler_slowdown))[0]
            else:
                h = regime_runs[k, s, pol]
                round_s = h["round_s"]
            tt, reached = time_to_target(h["accuracy"], round_s, target)
            at[pol].append(tt)
            hit[pol]["reached_target"].append(float(reached is not None))
    return _regime_sample(k, at, hit)


def build_result(p: Params, seeds: list[int], runs: dict[tuple[int, str], dict], fanout: dict | None,
                 regime_runs: dict[tuple[float, int, str], dict] | None = None,
                 calibration: tuple[dict, dict, float] | None = None) -> SystemResult:
    """``runs``: (seed, policy) -> the federate task's history; ``fanout``: fanout_timing's output, or None;
    ``regime_runs``: (slowdown, seed, policy) -> the history re-run at that slowdown (every regime slowdown
    but the headline's, every policy of REGIME_RERUN); ``calibration``: (calibration seed -> target,
    (seed, drop fraction) -> run, the fraction chosen)."""
    regime_runs = regime_runs or {}
    samples: dict[str, dict[str, list[float]]] = {pol: {m: [] for m in (*SIMULATED, *COUNTED, "client_cpu_s")}
                                                   for pol in POLICIES}
    targets = []
    for s in seeds:
        base = final_accuracy(runs[s, "fedavg_wait"]["accuracy"])
        target = p.target_fraction * base
        targets.append(target)
        for pol in POLICIES:
            h, m = runs[s, pol], samples[pol]
            tt, reached = time_to_target(h["accuracy"], h["round_s"], target)
            fin = final_accuracy(h["accuracy"])
            m["time_to_accuracy_s"].append(tt)
            m["time_to_accuracy_raw_s"].append(time_to_target(h["accuracy"], h["round_raw_s"], target)[0])
            m["mean_round_s"].append(float(np.mean(h["round_s"])))
            m["final_accuracy"].append(fin)
            m["accuracy_gap_pts"].append(100.0 * (fin - base))
            m["rounds_to_target"].append(float(reached if reached is not None else p.rounds))
            m["reached_target"].append(float(reached is not None))
            m["excluded_updates"].append(float(sum(len(e) for e in h["excluded"])))
            m["dropped_updates"].append(float(sum(len(d) for d in h["dropped"])))
            m["straggler_kept_fraction"].append(float(np.mean(h["kept_fraction"][1:])))
            # rounds (from 2) whose stragglers differ from the previous round's / (from 1) from the profile's
            m["straggler_changes"].append(float(sum(a != b for a, b in zip(h["stragglers"][1:], h["stragglers"][2:]))))
            m["rounds_off_profile"].append(float(sum(st != h["profile_stragglers"] for st in h["stragglers"][1:])))
            m["client_cpu_s"].append(float(sum(h["client_cpu_s"])))
    missed = {pol: [s for s, r in zip(seeds, samples[pol]["reached_target"]) if not r] for pol in POLICIES}
    charge_misses(samples, seeds, missed["fluid"])
    # regime: the federation re-run at each slowdown (the headline's runs at straggler_slowdown)
    regime = [_point(p, k, seeds, targets, runs, regime_runs) for k in p.regime_straggler_slowdown]
    variants: dict[str, dict[str, float]] = {pol: {} for pol in POLICIES}
    drop = calibration[2] if calibration else (runs[seeds[0], "fedavg_drop"].get("drop_fraction")
                                              if (seeds[0], "fedavg_drop") in runs else None)
    if fanout:
        for mode, name in FANOUT.items():
            if fanout[mode]:
                samples[name] = {"round_wall_s": fanout[mode]}

    clock = {
        **param_assumptions(p, "speed_min", "speed_max", "straggler_slowdown", "busy_prob", "busy_slowdown",
                            "busy_rounds", "redetect_every", "comm_latency_s", "bandwidth_mb_s"),
        "client_compute_s": Assumption(value="thread CPU time of the client's local training, measured in this run",
                                       source="measured in this run (time.thread_time around the SGD loop, one BLAS thread)"),
        "round_time": Assumption(value="max over the round's valid clients of compute x speed factor + latency + "
                                       "2 x (sub-)model bytes / bandwidth; compute = median of the client's measured "
                                       "CPU times at that model size over the run (time_to_accuracy_raw_s: that "
                                       "round's own measurement); the speed factor is that round's",
                                 source="FLuID's synchronous round model"),
        "speed_changes": Assumption(value="round 0 runs at the drawn speed factors (the profile); from round 1 a client "
                                          "that is not busy becomes busy with probability busy_prob per round and "
                                          "then trains busy_slowdown times slower for busy_rounds rounds; seeded by "
                                          "the seed alone, so every policy of a seed sees the same speeds",
                                    source="modelled device contention (a phone running another app), as FLuID "
                                           "adapts to stragglers that change during training"),
        "straggler_observation": Assumption(value="before re-detection the server estimates every client's "
                                                  "full-model training time from its latest valid round: counted "
                                                  "training FLOPs at the size it trained x that round's speed factor / "
                                                  "ref_gflops, over the sub-model's share of the full model's FLOPs",
                                            source="modelled from counted FLOPs (not the measured CPU time) so the "
                                                   "stragglers, and every accuracy, repeat with the seed; FLuID's "
                                                   "server re-profiles from the clients' reported training times"),
        "fedavg_drop": Assumption(value=(f"every client trains the full model; the round aggregates the first "
                                         f"{p.clients - drop_count(p.clients, drop)} of {p.clients} valid updates to "
                                         f"arrive (drop fraction {drop:g}, by that round's modelled finish time) and "
                                         "lasts until the last of them arrives" if drop is not None else "not run"),
                                  source="tuned on calibration seeds " + ", ".join(map(str, p.calibration_seed_list()))
                                         + f" over drop fractions {', '.join(f'{d:g}' for d in p.drop_fractions)}: "
                                         "the lowest median time to each calibration seed's own target, on the evaluation clock (round_s) "
                                         "and its smoothed crossing rule"),
    }
    first = seeds[0]
    curves = [
        Curve(title=f"test accuracy vs simulated time (seed {first})", x_label="simulated time (s)",
              y_label="test accuracy",
              series={pol: (np.cumsum(runs[first, pol]["round_s"]).tolist(), runs[first, pol]["accuracy"])
                      for pol in POLICIES}),
        Curve(title=f"test accuracy per round (seed {first})", x_label="round", y_label="test accuracy",
              series={pol: (list(range(1, p.rounds + 1)), runs[first, pol]["accuracy"]) for pol in POLICIES}),
        Curve(title=f"simulated round time per round (seed {first}; speeds change between rounds)", x_label="round",
              y_label="simulated round time (s)",
              series={pol: (list(range(1, p.rounds + 1)), runs[first, pol]["round_s"])
                      for pol in ("fedavg_wait", "fedavg_drop", "fluid", "fluid_static")}),
    ]
    th = [(i, a, b) for i, (a, b) in enumerate(runs[first, "fluid"]["theta"]) if np.isfinite(a) and np.isfinite(b)]
    if th:
        curves.append(Curve(title=f"Invariant Dropout threshold theta (seed {first})", x_label="round",
                            y_label="theta (relative update magnitude)", log_y=True,
                            series={"hidden layer 1": ([x[0] for x in th], [x[1] for x in th]),
                                    "hidden layer 2": ([x[0] for x in th], [x[2] for x in th])}))

    r0 = runs[first, "fluid"]
    sp0 = np.asarray(r0["speed"])
    busy = int(np.sum(sp0[1:] > sp0[0] * (1 + 1e-9)))  # client-rounds slower than the profile: busy
    changes_first = int(samples["fluid"]["straggler_changes"][0])
    off_first = int(samples["fluid"]["rounds_off_profile"][0])
    cpu_full, cpu_fluid = (np.median(samples[pol]["client_cpu_s"]) for pol in ("fedavg_wait", "fluid"))
    cal_runs = calibration[1] if calibration else {}
    n_rounds = (sum(len(h["accuracy"]) for h in (*runs.values(), *regime_runs.values(), *cal_runs.values()))
                + (len(calibration[0]) * p.rounds if calibration else 0))  # + the calibration seeds' FedAvg-wait
    reach = {pol: [int(x) for x in samples[pol]["rounds_to_target"]] for pol in ("fedavg_wait", "fluid")}
    reasons = sorted({why.split(":")[0] + (": " + why.split(": ")[1] if why.startswith("task failed") else "")
                      for pol in POLICIES for s in seeds for rnd in runs[s, pol]["excluded"] for _, why in rnd})
    notes = [
        f"Workload: sklearn load_digits, {p.clients} clients with Dirichlet({p.dirichlet_alpha}) label skew (seed "
        f"{first}: {min(r0['samples'])}-{max(r0['samples'])} samples and {min(r0['labels_per_client'])}-"
        f"{max(r0['labels_per_client'])} labels per client), a 64-{p.hidden}-{p.hidden}-10 ReLU MLP, {p.local_epochs} "
        f"local epoch(s) of SGD per round, {p.rounds} rounds per policy, {len(seeds)} seed(s) ({', '.join(map(str, seeds))}), "
        f"each seed its own split, speeds and init. Every client's local training really ran, as one Dask task per "
        f"client per round ({p.clients * n_rounds} tasks: {len(seeds) * len(POLICIES)} headline runs, "
        f"{len(regime_runs)} regime re-runs, {len(cal_runs) + (len(calibration[0]) if calibration else 0)} "
        "calibration runs).",
        "The clock is simulated: a client's round time is its measured local-training CPU time (the median over the "
        "run's rounds in which it trained the same model size, so one scheduling spike on the shared machine does not "
        "become the round's maximum; time_to_accuracy_raw_s uses each round's own measurement) x its speed factor in "
        f"that round + {p.comm_latency_s} s latency + its (sub-)model's bytes down and up at {p.bandwidth_mb_s} MB/s; "
        "a round lasts as long as its slowest valid client.",
        f"Changing speeds (modelled): each client's speed factor is drawn uniform in [{p.speed_min}, {p.speed_max}], "
        f"the slowest {p.straggler_fraction:.0%} by profiled compute are made {p.straggler_slowdown:g}x slower (seed "
        f"{first}: clients {r0['slowed']}); from round 1 a client that is not busy becomes busy with probability "
        f"{p.busy_prob:g} per round and then trains {p.busy_slowdown:g}x slower for {p.busy_rounds} round(s) "
        f"(seed {first}: busy in {busy} of {p.clients * (p.rounds - 1)} client-rounds). Every policy of a seed sees "
        "the same speeds.",
        f"Straggler re-detection: before round 1 and then every {p.redetect_every} round(s) the server takes the "
        f"slowest {p.straggler_fraction:.0%} of the clients by its estimate of their full-model training time, "
        "from each client's latest valid round (its training time at the size it trained, over that size's share of "
        "the full model's FLOPs; modelled from counted FLOPs x that round's speed factor, so it lags the speeds by "
        "one round and never sees the future), and gives each the largest sub-model that brings it to the slowest "
        "non-straggler's time. FedAvg-wait, random, ordered and Invariant Dropout all see the same re-detected "
        f"stragglers and sizes, so the dropout policies differ only in which neurons are dropped (seed {first}: the "
        f"profile's stragglers {r0['profile_stragglers']} with r = {r0['profile_r']}; the set changed "
        f"{changes_first} time(s) over rounds 2-{p.rounds - 1} and differed from the profile's in {off_first} of "
        f"{p.rounds - 1} dropout rounds). fluid_static is FLuID with the profile's stragglers and sizes kept for the "
        "whole run (no re-detection): the ablation of the dynamic adaptation.",
        f"Target accuracy: {p.target_fraction:.0%} of FedAvg-wait's final accuracy (mean of the last 3 rounds), i.e. "
        + ", ".join(f"{x:.3f}" for x in targets) + " per seed (held-out test set). A policy's time to it is read from "
        "its running mean accuracy over the last 3 rounds (the window of the final accuracy), interpolated linearly in "
        "time within the round in which it crosses, so one round's noise (one test image) moves it by a fraction of "
        "a round; a policy that never reaches it is charged its whole run (reached_target < 1 marks it). Rounds to the target (counted, per seed): FedAvg-wait "
        f"{reach['fedavg_wait']}, FLuID {reach['fluid']} of {p.rounds}. accuracy_gap_pts = final accuracy minus "
        "FedAvg-wait's, in points.",
        "FedAvg that drops its stragglers (fedavg_drop): every client trains the full model and the round aggregates "
        "only the valid updates that arrive first, by that round's finish times (the slowest "
        + (f"{drop:g} of the clients, {drop_count(p.clients, drop)} of {p.clients}, are not waited for; their training "
           "ran and its CPU is counted" if drop is not None else "share") + "). Its drop fraction was tuned on "
        f"calibration seed(s) {', '.join(map(str, p.calibration_seed_list()))} (their own split, speeds and init, "
        "each with its own FedAvg-wait target) over the grid "
        + ", ".join(f"{d:g}" for d in p.drop_fractions) + ": "
        + (", ".join(f"{d:g}: median {np.median(v):.3f} s" for d, v in _calibration_times(p, *calibration[:2]).items())
           + " to the target (on the evaluation clock, the smoothed crossing rule)"
           if calibration else "not calibrated in this run") + "; the evaluated seeds "
        "never entered the choice.",
        f"Mechanism: random_dropout is the ablation (FLuID with only the neuron choice replaced by chance, same "
        f"stragglers and sizes); ordered_dropout keeps the first r of each layer; fluid_static removes only the "
        f"re-detection. Regime: the slowed clients are {p.straggler_slowdown:g}x slower than their drawn speed factor "
        f"in the headline runs; at every other slowdown ({', '.join(f'{k:g}' for k in p.regime_straggler_slowdown if k != p.straggler_slowdown)}) "
        f"the federation is re-run ({', '.join(REGIME_RERUN)}; the same seeds, splits, slowed clients and busy "
        "spells, the slowed clients that many times slower), so the stragglers are re-detected and their sub-models "
        "re-sized to that slowdown in every round, and fedavg_drop races at it with the tuned drop fraction; each "
        "re-run stops at the first round whose running mean accuracy over 3 rounds reaches its seed's target (the headline's). FedAvg-wait's training "
        "does not depend on the speeds, so its point is its headline run re-timed at that slowdown: the run a "
        "re-run would repeat.",
        f"Local training CPU (measured, median over seeds): {cpu_full:.2f} s for FedAvg-wait, {cpu_fluid:.2f} s for "
        "FLuID: the stragglers' sub-models really do less work.",
    ]
    notes += missed_notes(samples, seeds, missed)
    if reasons:
        notes.append("Excluded client updates (the round completed without them), by reason: " + "; ".join(reasons)
                     + f". Injected faulty clients: {p.faulty_clients}.")
    if fanout and fanout["one"] and fanout["all"]:
        notes.append(f"Dask fan-out of one full-model round of {p.clients} clients (measured wall time, median of "
                     f"{len(fanout['one'])}): {np.median(fanout['one']):.3f} s on 1 worker vs "
                     f"{np.median(fanout['all']):.3f} s on {fanout['workers']} workers (variants {FANOUT['one']}, "
                     f"{FANOUT['all']}).")
    return SystemResult(variants=variants, samples=samples,
                        assumptions=dict.fromkeys(SIMULATED, clock), curves=curves, notes=notes,
                        deterministic=set(COUNTED), regime=regime,
                        regime_headline_value=float(p.straggler_slowdown))
