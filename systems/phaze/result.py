"""The PHAZE run's SystemResult, assembled from the candidate tasks' outputs (pure: the flow only submits)."""
from __future__ import annotations

from mlsys_flows.systems.common.report import Assumption, Curve, RegimeSample, SystemResult, param_assumptions

from . import MODELLED, SIZES, TECH_FIELDS, area_mm2, pick, regime_pick, tpuv4_like


def _variant(design: dict, size: str, tech) -> dict[str, float]:
    r, a = design["results"][size], design["arch"]
    plan = r.get("plan") or dict(tp=0, pp=0, dp=0, micro_batch=0)
    return {"train_throughput": r["train_throughput"], "iteration_s": r.get("iteration_s", float("inf")),
            "peak_hbm_gib": r.get("peak_hbm_gib", 0.0), "area_mm2": r["area_mm2"],
            "peak_tflops": 2 * a["tensor_cores"] * a["tc_dim"] ** 2 * tech.clock_ghz / 1e3,
            "single_chip_samples_per_s": r["single_chip_samples_per_s"],
            "unbounded_throughput": r.get("unbounded_throughput", 0.0),
            "tensor_cores": a["tensor_cores"], "tc_dim": a["tc_dim"], "vector_cores": a["vector_cores"],
            "sram_mib": a["sram_mib"], "hbm_gib": a["hbm_stacks"] * tech.hbm_gib_per_stack,
            "tp": plan["tp"], "pp": plan["pp"], "dp": plan["dp"], "micro_batch": plan["micro_batch"],
            "recompute_stages": r.get("recompute_stages", 0), "ilps": r["ilps"], "ilp_max_gap": r["ilp_max_gap"],
            "configs_tried": r["configs_tried"]}


def _saved(r: dict, pas: str) -> float:
    serial = r[f"block_{pas}_serial_s"]
    return 1 - r[f"block_{pas}_s"] / serial if serial else 0.0


def _memory_validity(gib: float, throughput: dict[str, float]) -> dict:
    """A regime point's constraint is the chips' memory: a design whose placement does not fit at this
    capacity has no throughput (0). The point is invalid where the co-searched design, or every baseline
    it is compared with, fits nowhere."""
    baselines = {v: x for v, x in throughput.items() if v != "phaze"}
    if throughput["phaze"] and any(baselines.values()):
        return {}
    broke = [v for v, x in throughput.items() if not x]
    return {"valid": False, "invalid": f"at {gib:g} GiB per HBM stack no placement of {', '.join(broke)} fits in "
                                       "memory (modelled throughput 0)"}


def _binding(r: dict) -> str:
    """How HBM capacity constrains one design's placement: its placed throughput against the same placement
    search without a memory limit (and the peak memory that unconstrained plan would need)."""
    free, placed = r.get("unbounded_throughput", 0.0), r["train_throughput"]
    if not placed:
        return "fits no placement"
    if free <= placed * (1 + 1e-12):
        return "is not constrained by memory (its best placement without a memory limit fits)"
    need = r.get("unbounded_plan", {}).get("peak_hbm_gib", float("nan"))
    return (f"is constrained by memory: its best placement without a memory limit would need {need:.1f} GiB per "
            f"chip and train {free / placed:.3f}x faster")


def build_result(p, results: dict[str, dict], search_s: float) -> SystemResult:
    """``results``: design name -> its candidate task's output; ``search_s``: the flow's wall time from the
    first submit to the last result."""
    tech, designs = p.tech(), p.designs()
    task_s = [r["task_s"] for r in results.values()]
    # from the first task's start to the last one's end (worker start-up and imports excluded)
    span = max(r["end_unix"] for r in results.values()) - min(r["start_unix"] for r in results.values())

    variants: dict[str, dict[str, float]] = {}
    chosen = {}
    for size in SIZES:
        chosen[size] = pick({n: r["results"] for n, r in results.items()}, size, p.chip_first_topk)
        for variant, name in chosen[size].items():
            variants[variant + size] = _variant(results[name], size, tech)
    variants["phaze"] |= {"search_s": search_s, "fanout_span_s": span, "candidate_task_s_sum": sum(task_s),
                          "candidate_task_s_max": max(task_s), "parallel_speedup": sum(task_s) / span,
                          "designs_searched": len(designs)}

    budget = area_mm2(tpuv4_like(), tech)
    model = param_assumptions(p, *TECH_FIELDS, "state_bytes_per_param", "chips", "global_batch", "seq_len",
                              "large_seq_len", "block_style", "large_block_style") | {
        "area_budget_mm2": Assumption(value=round(budget, 1), unit="mm^2",
                                      source="area of the TPUv4-like design under the area model; every candidate spends it"),
        "bytes_per_value": Assumption(value=2, unit="B", source="bf16 activations, weights and gradients"),
        "activation_memory": Assumption(value="Korthikanti et al. 2022, s*b*h*(10 + 24/t + 5*a*s/(h*t)) per GPT block; "
                                              "parallel block 6 instead of 10; Llama block s*b*(8h + (8h + 8f)/t) + "
                                              "2*a*s^2*b/t (f = MLP width, no dropout)",
                                        source="stashed bytes per micro-batch under tensor parallelism"),
    }
    assumptions = {m: model for m in MODELLED}

    names = sorted(results)
    curves = [
        Curve(title=f"modelled training throughput of every design ({'second' if size else 'headline'} model)",
              x_label="design (sorted by name; 0 = tpuv4_like)", y_label="tokens/s (modelled)",
              series={"design": (list(range(len(names))),
                                 [results[n]["results"][size]["train_throughput"] for n in
                                  ["tpuv4_like", *[x for x in names if x != "tpuv4_like"]]])})
        for size in SIZES
    ] + [Curve(title="candidate task wall time (one Dask task per design)", x_label="design",
               y_label="seconds (measured)",
               series={"task": (list(range(len(names))), [results[n]["task_s"] for n in names])})]
    workers = len({r["pid"] for r in results.values()})
    notes = [
        f"Searched {len(designs)} designs of equal area ({budget:.0f} mm^2 under the stated area model); for each, "
        f"a HiGHS scheduling ILP per layer kind, pass, tensor-parallel degree and micro-batch size "
        f"({sum(r['results'][s]['ilps'] for r in results.values() for s in SIZES)} ILPs in all, largest gap "
        f"{max(r['results'][s]['ilp_max_gap'] for r in results.values() for s in SIZES):.2%}), then the "
        f"placement DP over data/pipeline/tensor parallelism on {p.chips} chips.",
        "Operator graphs with branches: " + "; ".join(
            f"{'second' if s else 'headline'} model {m.style} blocks, on the co-searched design the scheduling ILPs "
            f"shorten the block's forward by {_saved(results[chosen[s]['phaze']]['results'][s], 'fwd'):.1%} and its "
            f"backward by {_saved(results[chosen[s]['phaze']]['results'][s], 'bwd'):.1%} against running its operators "
            f"one at a time (summed over every tensor-parallel degree and micro-batch size)"
            for s, m in p.models().items()) + ".",
        "Chosen designs: " + "; ".join(
            f"{'second' if s else 'headline'} model: phaze -> {chosen[s]['phaze']}, single_chip_first -> "
            f"{chosen[s]['single_chip_first']}, chip_first_topk (best placed of the top {p.chip_first_topk} by "
            f"single-chip score) -> {chosen[s]['chip_first_topk']}" for s in SIZES) + ".",
        f"Search fan-out: {len(designs)} tasks ran on {workers} worker process(es); from the first task's start to "
        f"the last one's end {span:.1f} s vs {sum(task_s):.1f} s summed over the tasks (what one worker running "
        f"them back to back would need, without task overhead): parallel_speedup {sum(task_s) / span:.2f}x, "
        f"measured once (the search is not repeated); the whole search, submit to last result, took "
        f"{search_s:.1f} s including worker start-up and Prefect task overhead.",
        "Memory at the headline capacity (" + f"{p.hbm_gib_per_stack:g} GiB per HBM stack): " + "; ".join(
            f"{'second' if s else 'headline'} model: " + ", ".join(
                f"{v} ({chosen[s][v]}, {results[chosen[s][v]]['arch']['hbm_stacks'] * tech.hbm_gib_per_stack:g} GiB) "
                + _binding(results[chosen[s][v]]["results"][s])
                for v in ("single_chip_first", "chip_first_topk", "phaze")) for s in SIZES) + ".",
        "Throughputs are modelled (roofline latencies, an area model and link bandwidths: see assumptions), not "
        "measured on hardware; the TPUv4-like design is one point of the search space, so phaze >= tpuv4_like "
        "by construction and the ratio says how much better the best equal-area design is.",
    ]
    sweep = regime_pick({n: r["results"] for n, r in results.items()}, p.chip_first_topk)
    regime = [RegimeSample(value=g, samples={v: [x] for v, x in tp.items()}, kind="modelled",
                           **_memory_validity(g, tp)) for g, tp in sweep.items()]
    notes.append(
        "Regime: HBM capacity per stack swept over " + ", ".join(f"{g:g}" for g in sweep) + " GiB (memory per chip = "
        "stacks x capacity; the TPUv4-like design has 4 stacks): every design re-placed on the headline model at each "
        "capacity with the same layer costs. phaze / single_chip_first, phaze / chip_first_topk per capacity: " + ", ".join(
            f"{g:g} GiB " + " / ".join(f"{tp['phaze'] / tp[b]:.3f}x" if tp[b] else f"({b} infeasible)"
                                       for b in ("single_chip_first", "chip_first_topk")) for g, tp in sweep.items())
        + ". The co-search can differ from picking "
        "the best single chip first only where capacity binds.")
    return SystemResult(variants=variants, assumptions=assumptions, curves=curves, notes=notes,
                        deterministic={"designs_searched"}, regime=regime,
                        regime_headline_value=float(p.hbm_gib_per_stack))
