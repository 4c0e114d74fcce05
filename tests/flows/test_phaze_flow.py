"""The phaze flow at smoke scale (the session's shared reference run): every variant at both model sizes,
modelled throughputs with their assumptions, one Dask task per design with its wall time, the chosen
designs consistent with the per-design results saved on storage."""
import math

from faultkit import reference_run

from mlsys_flows.systems.phaze import Params


def test_phaze_flow_smoke():
    report, storage = reference_run("phaze")
    v, kinds = report["variants"], report["metric_kinds"]
    assert set(v) == {f"{n}{s}" for n in ("phaze", "tpuv4_like", "single_chip_first", "chip_first_topk") for s in ("", "_large")}
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"], h["kind"]) == ("train_throughput", "tpuv4_like", "phaze", "modelled")
    assert kinds["search_s"] == kinds["parallel_speedup"] == "measured" and kinds["tp"] == "counted"
    assumptions = report["assumptions"]["train_throughput"]
    assert {"clock_ghz", "mac_area_um2", "sram_mm2_per_mib", "hbm_gb_s_per_stack", "link_gb_s", "area_budget_mm2"} <= set(assumptions)
    p = Params.for_scale("smoke")
    designs = storage.list(f"runs/phaze/{report['run_id']}/designs")
    assert len(designs) == p.candidates == v["phaze"]["designs_searched"]
    saved = [storage.read_json(k) for k in designs]
    for size in ("", "_large"):
        best = max(d["results"][size]["train_throughput"] for d in saved)
        tpu = next(d for d in saved if d["design"] == "tpuv4_like")["results"][size]["train_throughput"]
        assert v["phaze" + size]["train_throughput"] == best and v["tpuv4_like" + size]["train_throughput"] == tpu
        single = max(saved, key=lambda d: d["results"][size]["single_chip_samples_per_s"])
        assert v["single_chip_first" + size]["train_throughput"] == single["results"][size]["train_throughput"]
        for name in ("phaze", "tpuv4_like", "single_chip_first", "chip_first_topk"):
            m = v[name + size]
            assert m["tp"] * m["pp"] * m["dp"] == p.chips and m["peak_hbm_gib"] <= m["hbm_gib"]
            seq = p.large_seq_len if size else p.seq_len
            assert math.isclose(m["train_throughput"], p.global_batch * seq / m["iteration_s"], rel_tol=1e-9)
        # the practitioner's chip-first: the best placed of the top chip_first_topk single-chip designs
        top = sorted(saved, key=lambda d: (d["results"][size]["single_chip_samples_per_s"], d["design"]),
                     reverse=True)[:p.chip_first_topk]
        assert v["chip_first_topk" + size]["train_throughput"] == max(d["results"][size]["train_throughput"] for d in top)
    # the fan-out: every task's wall time recorded, the search's wall time below their sum on 2 workers
    tasks = [d["task_s"] for d in saved]
    assert v["phaze"]["candidate_task_s_sum"] == sum(tasks) and v["phaze"]["candidate_task_s_max"] == max(tasks)
    assert v["phaze"]["search_s"] + 0.5 >= v["phaze"]["fanout_span_s"] >= max(tasks) * (1 - 1e-6)
    assert math.isclose(v["phaze"]["parallel_speedup"], sum(tasks) / v["phaze"]["fanout_span_s"], rel_tol=1e-9)
    # contract v3: the ablation is single_chip_first (same search, chip chosen first), never above the co-search
    assert h["mechanism"]["baseline"] == "single_chip_first" and h["mechanism"]["ratio"] >= 1 - 1e-12
    reg = report["regime"]
    assert reg["parameter"] == "HBM capacity per stack" and [pt["value"] for pt in reg["points"]] == p.regime_gib_per_stack
    assert reg["headline_value"] == p.hbm_gib_per_stack and all(pt["kind"] == "modelled" for pt in reg["points"])
    # at the headline capacity the regime's point is the headline itself (same designs, same placement)
    at = next(pt for pt in reg["points"] if pt["value"] == p.hbm_gib_per_stack)
    assert math.isclose(at["ratio"], h["vs_strongest"]["ratio"], rel_tol=1e-9)
    assert all(pt["ratio"] >= 1 - 1e-12 for pt in reg["points"])  # the co-search's best is never below a baseline
