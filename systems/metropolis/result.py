"""The metropolis SystemResult from its tasks' outputs: the plan on the simulated clock, the timed runs,
the Prefect-task probe and the radius sweep, with curves, notes and the projection (pure: the flow only
submits). With ``llm=sleep`` the timed runs replay the drawn latencies as sleeps, so what they give is
``emulated``, not measured."""
from __future__ import annotations

import statistics

from mlsys_flows.systems.common.report import Assumption, Curve, Projection, RegimeSample, SystemResult, param_assumptions

from . import SIMULATED, TIMED, Params
from .engine import POLICIES

REPLAY = "an LLM serving engine's call latencies, replayed as lognormal sleeps holding one of K slots (llm=sleep)"


def llm_note(p: Params, runs: dict) -> str:
    """What answered the LLM calls of the timed runs, in words and the server's counts."""
    shape = (f"each call's latency is drawn lognormal (median {p.latency_median_s} s, sigma {p.latency_sigma}) from a "
             "key of (agent, step, call)")
    if p.llm == "sleep":
        return (f"LLM calls are not a model: {shape} and really slept by a thread holding one of {p.llm_slots} priority "
                "slots (lagging agents first). makespan_s is therefore the wall clock of a real-time replay of a "
                "simulated workload (emulated, not measured): what is measured is the scheduler and its threads "
                "(orchestration_overhead_s), what is slept stands for the LLM; sim_makespan_s is the same schedule on a "
                "discrete-event clock with no orchestration cost (simulated).")
    batch = {name: statistics.median(x["served_mean_batch"] for x in runs[name]) for name in POLICIES}
    tokens = statistics.median(x["served_tokens"] for x in runs["global_sync"])
    checks = [x["served_logit_check"] for name in POLICIES for x in runs[name] if "served_logit_check" in x]
    checked = sum(int(x.get("served_logit_checked", 0)) for name in POLICIES for x in runs[name])
    check = (f" After every run (untimed) the last logits served to a few of its calls (its first calls of more than "
             f"one token and one admitted into the run's largest batch) were recomputed by a full causal pass over each "
             f"call's whole sequence without pool or batch: worst max |difference| over the logits' scale "
             f"{max(checks):.2e} over {checked} calls in {len(checks)} runs (counted; a run fails past 1e-3 or when "
             "it checked no call).") if checks else ""
    return (f"LLM calls run a real model: SmolLM2-135M-Instruct (the radix system's model, run by the serving "
            "family's batching core that radix's engine runs too), one server thread on one torch thread, up to "
            f"{p.llm_slots} requests active at once, admitted lagging agents first; the newcomers of a step are "
            "prefilled together in one packed call and each is gathered into a free lane of the persistent batch K/V "
            "(a finished request's lane takes the last lane; nothing is re-gathered); each decode step advances every "
            "active request by one token, sampled (temperature "
            f"{p.temperature:g}, top-k {p.top_k}) with a generator per call seeded from the town's seed and the call's "
            f"key. A call prefills a {p.prompt_tokens}-token prompt and generates its length in tokens: {shape}, "
            f"and a call at the median generates {p.tokens_median} tokens, the others in proportion (at most "
            f"{p.max_new_tokens}); {tokens:.0f} tokens per run (counted, median over the towns). makespan_s is the wall clock "
            "(measured) of the whole simulation with that generation; utilization is the server's busy slot-seconds "
            "(active requests x step time) over K x makespan. Median requests per decode step: "
            + ", ".join(f"{n} {b:.1f}" for n, b in batch.items()) + " (counted per run). sim_makespan_s is the same "
            "schedule on a discrete-event clock with the drawn latencies (simulated), not the model's." + check)


def _split_sentence(busy: dict[str, tuple[float, float, float]]) -> str:
    """Which part of the server's time the policies differ in, from this run's medians (prefill, decode,
    makespan per policy): a prefill ratio within 5% of 1 is no part of the gain."""
    pre = busy["global_sync"][0] / busy["out_of_order"][0]
    dec = busy["global_sync"][1] / busy["out_of_order"][1]
    where = ("the decode steps (fuller batches), not the prefill forwards" if abs(pre - 1) <= 0.05 else
             "fewer prefill forwards and fuller decode steps together" if pre > 1 else
             "the decode steps, against more prefill time")
    return (f"Decode time alone global_sync / out_of_order {dec:.2f}x, prefill time alone {pre:.2f}x (measured): "
            f"the measured ratio comes from {where}.")


def _projection(p: Params, sim_med: dict, runs: dict) -> tuple[Projection, str]:
    """The same schedules' decode steps on an engine whose decode step is flat in the batch up to K
    (decode only: the prefill forwards are left out), and the note on where the model server's time
    went (llm=smollm2 only)."""
    a = statistics.median(x["served_step_fixed_s"] for name in POLICIES for x in runs[name])
    b = statistics.median(x["served_step_per_request_s"] for name in POLICIES for x in runs[name])
    busy = {name: (statistics.median(x["served_prefill_s"] for x in runs[name]),
                   statistics.median(x["served_decode_s"] for x in runs[name]),
                   statistics.median(x["makespan_s"] for x in runs[name])) for name in POLICIES}
    calls = {name: statistics.median(x["served_prefill_calls"] for x in runs[name]) for name in POLICIES}
    note = ("Where the time went (medians over repeats, measured): the model server's thread spent "
            + "; ".join(f"{n} {pf:.1f} s prefilling + {dc:.1f} s decoding of a {mk:.1f} s makespan"
                        for n, (pf, dc, mk) in busy.items())
            + f". A decode step cost {a * 1e3:.2f} ms + {b * 1e3:.2f} ms per request in the batch (least-squares "
            f"fit over every step of every run, median over runs): a batch of {p.llm_slots} costs "
            f"{(a + b * p.llm_slots) / (a + b):.2f}x a batch of one (modelled from the fit; a step proportional to "
            f"the batch would cost {p.llm_slots}x, a flat one 1x). Packed prefill forwards per run (counted, median): "
            + ", ".join(f"{n} {c:.0f}" for n, c in calls.items())
            + "; each is one forward over a server step's newcomers, its cost growing with the newcomers it packs. "
            + _split_sentence(busy)
            + " The projection (modelled) is decode steps only, prefill left out: the same schedules' calls on an "
            "engine whose decode step stays flat in the batch up to K.")
    step = a + b   # one request's step: on a flat engine, every step of a batch up to K costs this
    scale = step * p.tokens_median / p.latency_median_s
    proj = {n: sim_med[n]["sim_makespan_s"] * scale for n in ("global_sync", "out_of_order")}
    meas = {n: busy[n][2] for n in ("global_sync", "out_of_order")}
    note += (" Measured beside projected makespan (medians over the repeats' towns): "
             + "; ".join(f"{n} {meas[n]:.1f} s measured, {proj[n]:.1f} s projected" for n in meas)
             + f"; global_sync / out_of_order {meas['global_sync'] / meas['out_of_order']:.2f}x measured, "
             f"{proj['global_sync'] / proj['out_of_order']:.2f}x projected (decode only). The gap between the two is "
             "not a hardware gap: the projection leaves out the prefill forwards, "
             + ", ".join(f"{n} {100 * busy[n][0] / busy[n][2]:.0f}%" for n in meas)
             + " of the measured makespan, and the time the server waits for the schedule's threads.")
    projection = Projection(
        baseline_value=proj["global_sync"], technique_value=proj["out_of_order"],
        assumptions={
            "step_s": Assumption(value=step, unit="s", source="measured in this run: a one-request decode step "
                                 "of the model server (fit a + b x 1)"),
            "flat_batch": Assumption(value=p.llm_slots, unit="requests", source="assumed: a serving engine whose "
                                     "step costs the same for any batch up to K (a GPU below saturation)"),
            **param_assumptions(p, "tokens_median", "latency_median_s", "llm_slots")},
        statement="decode steps only, prefill left out (not the paper's hardware): makespan of the same schedules on "
                  "an engine whose decode step is flat in the batch up to K, each call's tokens x this run's "
                  "one-request step time on the simulated clock (median over the repeats' towns); the packed prefill "
                  "forwards, a large share of the measured makespan, are not modelled")
    return projection, note


def _sweep_medians(planned: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """The slot sweep's simulated makespans, per policy and K the median over the repeats' towns."""
    first = planned[0]["sweep"]
    return {name: [(k, statistics.median(plan["sweep"][name][i][1] for plan in planned))
                   for i, (k, _) in enumerate(pts)] for name, pts in first.items()}


def build_result(p: Params, planned: list[dict], probe: list[float], runs: dict[str, list[dict]],
                 sweep: dict[int, dict[str, float]]) -> SystemResult:
    """``planned``: the plan task's output per repeat (each repeat its own town); ``probe``: seconds of
    each no-op Prefect task; ``runs``: policy -> its timed runs in repeat order; ``sweep``: radius ->
    policy -> simulated makespan in each repeat's town."""
    replay = p.llm == "sleep"
    variants, samples = {}, {}
    for name in POLICIES:
        real = runs[name]
        sims = [plan["policies"][name] for plan in planned]
        # the same town's world at the end, the same (time, cluster) steps on the simulated clock, and
        # as many cluster steps and LLM calls in the timed run
        matches = all(sim["digest"] == plan["digest"] and sim["steps_match_global"] == 1.0 and x["digest"] == plan["digest"]
                      and (x["cluster_steps"], x["llm_calls"]) == (sim["cluster_steps"], sim["llm_calls"])
                      for sim, plan, x in zip(sims, planned, real, strict=True))
        variants[name] = {"state_matches_global": float(matches)}
        # every other metric is one sample per repeat's town, paired across policies by repeat
        samples[name] = {"llm_calls": [s["llm_calls"] for s in sims], "cluster_steps": [s["cluster_steps"] for s in sims],
                         "conversations": [s["conversations"] for s in sims],
                         "sim_makespan_s": [s["makespan_s"] for s in sims],
                         "sim_max_clock_spread": [s["max_clock_spread"] for s in sims],
                         "sim_utilization": [s["utilization"] for s in sims],
                         "makespan_s": [x["makespan_s"] for x in real],
                         "utilization": [x["utilization"] for x in real],
                         "max_clock_spread": [float(x["max_clock_spread"]) for x in real]}
        if replay:  # the slept calls are the simulated ones: the difference is orchestration
            samples[name]["orchestration_overhead_s"] = [x["makespan_s"] - s["makespan_s"] for x, s in zip(real, sims)]
    sim_med = {name: {m: statistics.median(samples[name][m]) for m in ("sim_makespan_s", "llm_calls", "cluster_steps",
                                                                          "conversations")} for name in POLICIES}
    # not a repeat of the variants' run: the median of its own probe tasks (overhead_probe_tasks)
    variants["out_of_order"]["prefect_task_overhead_s"] = statistics.median(probe)
    latency = param_assumptions(p, "latency_median_s", "latency_sigma", "llm_slots", "act_prob", "talk_prob", "max_turns")
    assumptions = {m: latency for m in SIMULATED}
    kinds: dict = {}
    emulated: dict[str, str] = {}
    if replay:
        kinds = dict.fromkeys(TIMED, "emulated")
        emulated = dict.fromkeys(TIMED, REPLAY)
        assumptions |= {m: latency for m in TIMED}

    first = planned[0]["policies"]  # one town's progress: curves of different towns do not average
    curves = [Curve(title=f"simulated progress (town of seed {p.seed})", x_label="simulated time (s)",
                    y_label="mean agent clock (steps)",
                    series={name: ([x for x, _ in first[name]["progress"]], [y for _, y in first[name]["progress"]])
                            for name in POLICIES})]
    if p.llm == "smollm2":
        curves.append(Curve(title="decode batch of the model server", x_label="repeat", y_label="mean requests per decode step",
                            series={name: (list(range(len(runs[name]))), [x["served_mean_batch"] for x in runs[name]])
                                    for name in POLICIES}))
    if any(planned[0]["sweep"].values()):
        curves.append(Curve(title="simulated makespan vs LLM slots (median over towns)", x_label="concurrent LLM calls (K)",
                            y_label="makespan (s)", series={name: ([k for k, _ in pts], [m for _, m in pts])
                                                            for name, pts in _sweep_medians(planned).items()}))
    med = {name: statistics.median(samples[name]["makespan_s"]) for name in POLICIES}
    # the regime: the simulated makespan (the same schedules without orchestration cost) at each radius
    regime = [RegimeSample(value=float(r), samples={name: list(m[name]) for name in POLICIES}, kind="simulated")
              for r, m in sweep.items()]
    timed_kind = "emulated" if replay else "measured"
    notes = [
        f"Workload: {p.agents} agents for {p.steps} steps on a {p.map_size}x{p.map_size} grid, interaction radius "
        f"{p.radius}, speed <= {p.max_speed} cell/step, {p.hotspots} hotspots; repeat r is the town of seed {p.seed}+r "
        f"(seeds {p.seed}-{p.seed + len(planned) - 1}), the same for every policy of that repeat; median "
        f"{sim_med['global_sync']['cluster_steps']:.0f} cluster steps making {sim_med['global_sync']['llm_calls']:.0f} "
        f"LLM calls ({sim_med['global_sync']['conversations']:.0f} conversations) per town, the same in every policy "
        "(counted).",
        llm_note(p, runs),
        "Mechanism: the ablation is global_sync itself (the same engine, slots and priority with only the "
        "dependency rule replaced by a per-step barrier), so the mechanism ratio is the headline. Regime: the "
        f"interaction radius, radii {', '.join(map(str, p.regime_radius))} (the headline runs at {p.radius}), every "
        "policy simulated at each radius on the simulated clock (kind simulated) in every repeat's town, one "
        "sample per town, the oracle with that radius and town's true clusters.",
        f"Equivalence: every run's final world (positions, goals, memories, cooldowns of all agents) "
        f"{'equals' if all(v['state_matches_global'] == 1.0 for v in variants.values()) else 'DOES NOT equal'} "
        f"global synchronization's in the same town (digests {', '.join(plan['digest'] for plan in planned)}); on the "
        "simulated clock each policy stepped exactly the same (time, cluster) pairs, and each timed run as many "
        "cluster steps and LLM calls.",
        f"Granularity: one Prefect task on this runner took {statistics.median(probe) * 1e3:.0f} ms (median of "
        f"{len(probe)} no-op tasks, measured) against a median LLM call of {p.latency_median_s * 1e3:.0f} ms. Every "
        f"agent's {p.steps} steps form a chain, so a Prefect task per cluster step would put at least "
        f"{p.steps} x {statistics.median(probe):.2f} s = {p.steps * statistics.median(probe):.1f} s of dispatch on the "
        "critical path of every policy; each run of a policy is therefore one Prefect task on a Dask worker, and its "
        "cluster steps go to a worker-side thread executor"
        + (" whose whole cost is orchestration_overhead_s (wall clock minus the simulated clock of the same "
           "schedule)." if replay else " (microseconds per dispatch)."),
        f"Median makespans ({timed_kind}): global_sync {med['global_sync']:.2f} s, out_of_order {med['out_of_order']:.2f} "
        f"s, oracle {med['oracle']:.2f} s. The oracle knows the clusters of the finished run (hindsight); it is a bound, "
        "not a baseline a user can run: its role is oracle (vs_oracle), never the headline's denominator.",
        "The paper ran LLM-driven generative agents on GPU serving engines; here the agents' decisions are seeded "
        "rules (the model's output does not steer them), so the speedup reflects the scheduling and how it fills "
        "the serving engine: it grows with the calls' length spread, the agents' spread over the map and the free "
        "LLM slots, and shrinks when the slots are saturated (see the slot sweep, simulated).",
    ]
    projection = None
    if p.llm == "smollm2":
        projection, note = _projection(p, sim_med, runs)
        notes.append(note)
    deterministic = {"state_matches_global"}  # the rest differ by town
    return SystemResult(variants=variants, kinds=kinds, samples=samples, assumptions=assumptions, curves=curves,
                        notes=notes, deterministic=deterministic, regime=regime,
                        regime_headline_value=float(p.radius), projection=projection, emulated=emulated)
