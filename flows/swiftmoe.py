"""SwiftMoE flow: DeepSpeed-style (at its default and at swept capacity factors), FlexMoE-style and
SwiftMoE expert placement training the same tiny MoE on the same drifting token stream; time to a
target loss on a simulated clock built from compute measured in the run, calibrated against a real
2-rank gloo run on the cluster's workers, and re-priced for other links and expert sizes."""
from __future__ import annotations

from prefect import get_run_logger

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.swiftmoe import (CAPACITY_SWEEP, REPLACE_GRID, TUNED, choose_capacity,
                                          choose_replace_every)
from mlsys_flows.systems.swiftmoe.calibrate import WORLD, gloo_available, replay_rank
from mlsys_flows.systems.swiftmoe.calibrate import summarize as summarize_calibration
from mlsys_flows.systems.swiftmoe.result import LINK_FACTORS, POLICIES, STATE_SCALES, build_result
from mlsys_flows.tasks import swiftmoe as t


@system_flow("swiftmoe")
def swiftmoe(ctx: RunContext):
    p = ctx.params
    data = t.make_workload.submit(p, ctx.storage, ctx.key("tokens.npz")).result()
    # timed alone; the training tasks below only replay this measurement, so they may overlap
    prof = ctx.submit(t.profile, p, ctx.devices, device="gpu").result()
    # the regime's trainings (every drift rate x seed) may run at the smoke preset's sizes: their own
    # compute profile, also timed alone
    points = p.regime_points()
    small = next(iter(points.values()))
    rprof = prof if p.regime_scale == "same" else ctx.submit(t.profile, small, ctx.devices, device="gpu").result()
    # also alone: 2 torch.distributed ranks on 2 workers time the recorded work, measured against the simulator
    calib = None
    if gloo_available():
        prepared = t.calibration_job.submit(p, ctx.repeats).result()
        # the replay computes on CPU tensors, as the profile it checks was measured: gloo on any cluster
        launch = ctx.ranks(replay_rank, WORLD, prepared["job"], backend="gloo")
        calib = summarize_calibration(prepared, launch.results[0], launch.seconds)
        for name, c in calib.items():
            get_run_logger().info("swiftmoe calibration of %s (%d %s ranks on %s): measured %s ms/iter vs simulated "
                                  "%.2f ms (link %.2f Gbit/s)", name, launch.world_size, launch.backend,
                                  ", ".join(launch.workers), [round(x * 1e3, 2) for x in c["measured_iter_s"]],
                                  c["simulated_iter_s"] * 1e3, c["link_gbps"])
    else:
        get_run_logger().warning("swiftmoe calibration skipped: torch.distributed with gloo is not available")
    # the deployable baselines, tuned on the calibration trace (another seed): DeepSpeed's capacity factor and
    # FlexMoE's re-placement period, each the fastest there to its target
    factors = (p.capacity_factor, *CAPACITY_SWEEP)
    cal_futures = {cf: t.train_point.submit("deepspeed", p.calibration(), prof, ctx.devices, cf) for cf in factors}
    periods = sorted({*REPLACE_GRID, p.replace_every})
    flex_futures = {k: t.train_point.submit("flexmoe", p.calibration().model_copy(update={"replace_every": k}), prof,
                                            ctx.devices) for k in periods}
    futures = {n: t.train.submit(n, p, ctx.storage, data, prof, ctx.devices, record=n == "swiftmoe")
               for n in POLICIES if n != "flexmoe"}
    # the regime: every drift rate and seed (a point equal to this run reuses its trainings)
    fresh = {key: pt for key, pt in points.items() if pt != p}
    reg_futures = {(*key, "swiftmoe"): t.train_point.submit("swiftmoe", pt, rprof, ctx.devices)
                   for key, pt in fresh.items()}
    cal_flex = {k: f.result() for k, f in flex_futures.items()}
    tuned_re = choose_replace_every(cal_flex)
    futures["flexmoe"] = t.train.submit("flexmoe", p.model_copy(update={"replace_every": tuned_re}), ctx.storage, data,
                                        prof, ctx.devices, record=True)
    reg_futures |= {(*key, "flexmoe"): t.train_point.submit(
        "flexmoe", pt.model_copy(update={"replace_every": tuned_re}), rprof, ctx.devices) for key, pt in fresh.items()}
    cal = {cf: f.result() for cf, f in cal_futures.items()}
    tuned_cf = choose_capacity(cal)
    reg_futures |= {(*key, TUNED): t.train_point.submit(TUNED, pt, rprof, ctx.devices, tuned_cf)
                    for key, pt in fresh.items()}
    runs = {n: f.result() for n, f in futures.items()}
    reg = {key: f.result() for key, f in reg_futures.items()}
    links = [p.link_gbps * f for f in LINK_FACTORS]
    swept = t.sweep.submit(p, prof, *({"trace": runs[n].pop("trace"),
                                       "iterations_to_target": runs[n]["metrics"]["iterations_to_target"]}
                                      for n in ("flexmoe", "swiftmoe")), links, list(STATE_SCALES)).result()
    return build_result(p, data, prof, calib, runs, cal, tuned_cf, reg, swept, cal_flex, tuned_re)
