"""The comparison the flow runs: every policy at 0, 1, 2 and 4 failures on one calibrated cost model (pure)."""
from __future__ import annotations

from .policies import Cluster, LayerCosts, bamboo_plan, best_oobleck, oobleck_plan, place_failures, recycle_plan, \
    window_throughput
from .sim import Result, simulate


def layer_costs(times: dict, p) -> LayerCosts:
    """Per-layer costs from one calibration (``StageTimes`` as a dict, seconds) and the link parameters."""
    L = p.layers_per_stage
    return LayerCosts(forward=times["forward"] / L, backward_input=times["backward_input"] / L,
                      backward_weight=times["backward_weight"] / L, optimizer=times["optimizer"] / L,
                      layer_param_bytes=times["param_bytes"] / L, activation_bytes=times["activation_bytes"],
                      p2p_gb_s=p.p2p_gb_s, p2p_latency_s=p.p2p_latency_us * 1e-6, allreduce_gb_s=p.allreduce_gb_s,
                      backward_fused=times["backward_fused"] / L)


def _metrics(cl: Cluster, res: Result, workers: int, window: int, stall_s: float) -> dict[str, float]:
    it = res.steady_iteration_s()
    last = len(res.iteration_end) - 1
    busy = sum(r.end - r.start for r in res.records if r.worker >= 0 and r.kind != "sync" and 0 < r.iteration)
    span = res.iteration_end[-1] - res.iteration_end[0]
    return {"throughput": window_throughput(cl.samples_per_iteration, it, window, stall_s),
            "steady_throughput": cl.samples_per_iteration / it, "iteration_ms": it * 1e3,
            "compute_utilization": busy / (workers * span) if last > 0 and span > 0 else 0.0,
            "stall_ms": stall_s * 1e3, "live_workers": float(workers)}


def compare(p, costs: LayerCosts, failure_counts: tuple[int, ...], headline_failures: int,
            keep: tuple[str, ...] = (), restart_s: float | None = None
            ) -> tuple[dict[str, dict[str, float]], dict[str, dict], dict[str, str]]:
    """Simulate every policy. Returns (variant -> metrics, variant -> schedule for ``keep``,
    variant -> how the plan was chosen / where the failures are). Oobleck's restart per failure is
    ``restart_s`` seconds (measured), else ``p.restart_iterations`` fault-free iterations."""
    cl = p.cluster()
    n_it, window = p.sim_iterations, p.window_iterations
    out, schedules, info = {}, {}, {}

    def run(name, plan, res=None, stall=0.0):
        res = res or simulate(plan, n_it)
        out[name] = _metrics(cl, res, len(plan.workers), window, stall)
        if name in keep:
            schedules[name] = {"workers": plan.workers,
                               "records": [(r.worker, r.kind, r.iteration, r.mb, r.start, r.end)
                                           for r in res.records if r.worker >= 0],
                               "iteration_end": res.iteration_end}
        return res

    base = run("oobleck_f0", oobleck_plan(cl, costs, []))
    free = run("nofail", recycle_plan(cl, costs, []))
    run("bamboo_f0", bamboo_plan(cl, costs, []))
    dec = run("oobleck_decoupled_f0", oobleck_plan(cl, costs, [], decoupled=True))
    it_plain, it_free, it_dec = base.steady_iteration_s(), free.steady_iteration_s(), dec.steady_iteration_s()

    def restart(iteration_s: float) -> float:
        return restart_s if restart_s is not None else p.restart_iterations * iteration_s

    for f in failure_counts:
        failed = place_failures(cl.pipelines, cl.stages, f, p.seed)
        info[f"f{f}"] = "failed workers (pipeline, stage): " + ", ".join(f"({a}, {b})" for a, b in failed)
        run(f"recycle_f{f}", recycle_plan(cl, costs, failed), stall=f * p.lost_iterations * it_free)
        if f == headline_failures:
            run(f"recycle_fused_f{f}", recycle_plan(cl, costs, failed, decoupled=False, staggered=False),
                stall=f * p.lost_iterations * it_plain)
        run(f"bamboo_f{f}", bamboo_plan(cl, costs, failed))
        plan, res, choice = best_oobleck(cl, costs, failed, n_it)
        info[f"oobleck_f{f}"] = choice
        run(f"oobleck_f{f}", plan, res, stall=f * (p.lost_iterations * it_plain + restart(it_plain)))
        # the mechanism ablation: the same reconfiguration (and restart) with ReCycle's decoupled backward and
        # staggered optimizer, so that only the rerouting differs from recycle_f{f}
        plan, res, choice = best_oobleck(cl, costs, failed, n_it, decoupled=True)
        info[f"oobleck_decoupled_f{f}"] = choice
        run(f"oobleck_decoupled_f{f}", plan, res, stall=f * (p.lost_iterations * it_dec + restart(it_dec)))
    return out, schedules, info


REGIME_POLICIES = ("recycle", "oobleck", "oobleck_decoupled", "bamboo")


def regime_samples(metrics: dict[str, dict[str, float]], failures: list[int],
                   headline_failures: int) -> dict[int, dict[str, float]]:
    """{failures in the window: {headline variant of each policy: window throughput at that count}} from
    ``compare``'s metrics (0 failures: nofail for ReCycle); named as the headline's variants so the report
    compares the technique with the same baselines at every point."""
    return {f: {f"{pol}_f{headline_failures}": metrics["nofail" if pol == "recycle" and f == 0 else f"{pol}_f{f}"]["throughput"]
                for pol in REGIME_POLICIES} for f in failures}
