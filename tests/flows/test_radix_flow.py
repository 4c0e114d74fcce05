"""The RadixAttention flow at smoke (the session's shared reference run): every workload's variants,
a measured headline on multi-turn chat against the strongest of no cache and the block-hash cache,
the block cache with the tree's admission order as the mechanism's ablation, exact prefill counts
that show the reuse (and where token granularity matters), and identical outputs across variants."""
from __future__ import annotations

import math
import statistics

from faultkit import reference_run

VARIANTS = {"": ("no_cache", "radix", "block_cache", "block_cache_lpm"),          # multi-turn chat: the headline
            "_fewshot": ("no_cache", "radix", "block_cache"), "_tot": ("no_cache", "radix", "block_cache"),
            "_noshare": ("no_cache", "radix"),
            "_pressure": ("no_cache", "radix", "radix_fcfs", "block_cache", "block_cache_lpm")}


def test_radix_smoke_report():
    report, storage = reference_run("radix")
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"], h["kind"]) == ("requests_per_s", "no_cache", "radix", "measured")
    assert math.isfinite(h["ratio"]) and h["ratio"] > 0
    v, kinds, samples = report["variants"], report["metric_kinds"], report["samples"]
    assert set(v) == {f"{n}{s}" for s, names in VARIANTS.items() for n in names}
    assert kinds["prefill_tokens"] == kinds["hit_rate"] == kinds["prefill_tokens_saved"] == "counted"
    assert {"prefill_tokens", "hit_rate"} <= set(report["deterministic_metrics"])
    for s in ("", "_fewshot", "_tot", "_pressure"):   # sharing workloads: the cache saves most of the prefill
        assert v[f"radix{s}"]["prompt_tokens"] == v[f"no_cache{s}"]["prompt_tokens"] == v[f"no_cache{s}"]["prefill_tokens"]
        assert v[f"radix{s}"]["prefill_tokens"] < 0.6 * v[f"no_cache{s}"]["prefill_tokens"]
        assert v[f"radix{s}"]["hit_rate"] > 0.4 and v[f"no_cache{s}"]["hit_rate"] == 0.0
        assert v[f"block_cache{s}"]["prompt_tokens"] == v[f"radix{s}"]["prompt_tokens"]
    assert v["radix_noshare"]["hit_rate"] < 0.05
    # the block cache reuses whole blocks: the few-shot prefix (whole blocks) exactly as the tree, less of a chat
    # turn or a tree-of-thought branch (their boundaries fall inside a block), with either admission order
    assert v["block_cache_fewshot"]["prefill_tokens"] == v["radix_fewshot"]["prefill_tokens"]
    for block, tree in (("block_cache", "radix"), ("block_cache_lpm", "radix"), ("block_cache_tot", "radix_tot")):
        assert v[block]["prefill_tokens"] > v[tree]["prefill_tokens"]
    # longest prefix match first evicts and recomputes less than FCFS with the same small pool, for either cache
    assert v["radix_pressure"]["prefill_tokens"] < v["radix_fcfs_pressure"]["prefill_tokens"]
    assert v["radix_pressure"]["evicted_tokens"] < v["radix_fcfs_pressure"]["evicted_tokens"]
    assert v["block_cache_lpm_pressure"]["prefill_tokens"] < v["block_cache_pressure"]["prefill_tokens"]
    # under pressure the tree alone and the scheduler alone are measured claims too, not only counted ones
    judged = {(r["metric"], r["baseline"], r["technique"]) for r in report["ratios"]}
    assert {("requests_per_s", "block_cache_lpm_pressure", "radix_pressure"),
            ("requests_per_s", "block_cache_pressure", "block_cache_lpm_pressure")} <= judged
    assert all(len(samples[name]["requests_per_s"]) == report["parameters"]["repeats"] for name in v)
    assert any("identical with and without the cache" in n and "NO" not in n for n in report["notes"])
    assert storage.exists(f"reports/radix/{report['run_id']}.json")
    # contract v3: the ablation is the block cache with the tree's own admission order (only the token
    # granularity removed), judged on the headline's chat; the strongest deployable baseline is the faster of
    # no cache and the block cache there
    assert h["mechanism"]["baseline"] == "block_cache_lpm"
    assert report["roles"] == {"no_cache": ["paper", "deployable"], "block_cache": ["deployable"]}
    rate = {b: statistics.median(samples[b]["requests_per_s"]) for b in ("no_cache", "block_cache")}
    assert h["vs_strongest"]["baseline"] == max(rate, key=rate.get)
    reg, p = report["regime"], report["parameters"]
    assert reg["parameter"] == "shared_prefix_share" and [pt["value"] for pt in reg["points"]] == [0.0, 0.75]
    assert all(pt["kind"] == "measured" and pt["repeats"] == 1 and pt["baseline"] in rate for pt in reg["points"])
    assert math.isclose(reg["headline_value"], v["radix"]["hit_rate"])
