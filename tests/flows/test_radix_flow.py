"""The RadixAttention flow at smoke (the session's shared reference run): every workload's variants,
a measured headline, exact prefill counts that show the reuse, and identical outputs across variants."""
from __future__ import annotations

import math

from faultkit import reference_run


def test_radix_smoke_report():
    report, storage = reference_run("radix")
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"], h["kind"]) == ("requests_per_s", "no_cache", "radix", "measured")
    assert math.isfinite(h["ratio"]) and h["ratio"] > 0
    v, kinds = report["variants"], report["metric_kinds"]
    expected = {f"{n}{s}" for n in ("no_cache", "radix") for s in ("", "_chat", "_tot", "_noshare", "_pressure")}
    assert set(v) == expected | {"radix_fcfs_pressure", "exact_cache", "block_cache"}
    assert kinds["prefill_tokens"] == kinds["hit_rate"] == kinds["prefill_tokens_saved"] == "counted"
    assert {"prefill_tokens", "hit_rate"} <= set(report["deterministic_metrics"])
    for s in ("", "_chat", "_tot", "_pressure"):   # sharing workloads: the cache saves most of the prefill
        assert v[f"radix{s}"]["prompt_tokens"] == v[f"no_cache{s}"]["prompt_tokens"] == v[f"no_cache{s}"]["prefill_tokens"]
        assert v[f"radix{s}"]["prefill_tokens"] < 0.6 * v[f"no_cache{s}"]["prefill_tokens"]
        assert v[f"radix{s}"]["hit_rate"] > 0.4 and v[f"no_cache{s}"]["hit_rate"] == 0.0
    assert v["radix_noshare"]["hit_rate"] < 0.05
    # longest prefix match first evicts and recomputes less than FCFS with the same small pool
    assert v["radix_pressure"]["prefill_tokens"] < v["radix_fcfs_pressure"]["prefill_tokens"]
    assert v["radix_pressure"]["evicted_tokens"] < v["radix_fcfs_pressure"]["evicted_tokens"]
    assert all(len(report["samples"][name]["requests_per_s"]) == report["parameters"]["repeats"] for name in v)
    assert any("identical with and without the cache" in n and "NO" not in n for n in report["notes"])
    assert storage.exists(f"reports/radix/{report['run_id']}.json")
    # contract v3: the exact-prompt cache (no prefix matching) is the ablation; on few-shot prompts, which share
    # a prefix but are never identical, it reuses nothing, exactly like no cache
    assert h["mechanism"]["baseline"] == "exact_cache"
    assert report["roles"] == {"no_cache": ["paper", "deployable"], "block_cache": ["deployable"]}
    # the block-hash cache (vLLM's automatic prefix caching) reuses the few-shot prefix in whole blocks
    assert 0 < v["block_cache"]["hit_rate"] <= v["radix"]["hit_rate"]
    assert v["block_cache"]["prompt_tokens"] == v["radix"]["prompt_tokens"]
    assert v["exact_cache"]["prefill_tokens"] == v["no_cache"]["prefill_tokens"] and v["exact_cache"]["hit_rate"] == 0.0
    reg, p = report["regime"], report["parameters"]
    assert reg["parameter"] == "shared_prefix_share" and [pt["value"] for pt in reg["points"]] == [0.0, 0.75]
    assert all(pt["kind"] == "measured" and pt["repeats"] == 1 for pt in reg["points"])
    assert math.isclose(reg["headline_value"], p["fewshot_prefix"] / (p["fewshot_prefix"] + p["question_len"]))
