"""The decoder really reuses cached K/V: logits with a cached prefix equal a full recomputation,
served outputs are identical with and without the radix cache, the cache saves the prefill it
should, and longest-prefix-match-first beats FCFS under cache pressure."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mlsys_flows.systems.radix import Params, common_prefix_len
from mlsys_flows.systems.radix import workloads as w
from mlsys_flows.systems.radix.engine import Engine
from mlsys_flows.systems.radix.model import KVPool, ModelConfig, TinyDecoder
from mlsys_flows.systems.radix.run import make_requests, measure, serve

CFG = ModelConfig(vocab=64, d_model=32, layers=2, heads=4, max_seq_len=256)


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _prefix_then_suffix(model, tokens, split, prefix_slots_shift=0):
    pool = KVPool(CFG, 128)
    slots = torch.arange(len(tokens)) + 7
    model.prefill(pool, tokens[:split], 0, slots[:split])
    reuse = slots.clone()
    reuse[:split] = (reuse[:split] + prefix_slots_shift) % 128
    return model.prefill(pool, tokens[split:], split, reuse)


def test_prefill_over_cached_prefix_equals_full_recompute():
    model = TinyDecoder(CFG, seed=1)
    tokens = [int(t) for t in np.random.default_rng(0).integers(0, CFG.vocab, 40)]
    ref = model.full_logits(tokens)[-1]
    for split in (1, 17, 39):
        assert torch.allclose(_prefix_then_suffix(model, tokens, split), ref, atol=1e-4, rtol=1e-4)


def test_wrong_prefix_slots_give_different_logits():
    """The equality above is not vacuous: reading the prefix from the wrong slots changes the result."""
    model = TinyDecoder(CFG, seed=1)
    tokens = [int(t) for t in np.random.default_rng(0).integers(0, CFG.vocab, 40)]
    ref = model.full_logits(tokens)[-1]
    assert not torch.allclose(_prefix_then_suffix(model, tokens, 17, prefix_slots_shift=50), ref, atol=1e-2)


def test_decode_matches_full_recompute():
    model = TinyDecoder(CFG, seed=2)
    rng = np.random.default_rng(1)
    a, b = ([int(t) for t in rng.integers(0, CFG.vocab, n)] for n in (12, 20))
    pool = KVPool(CFG, 128)
    sa, sb = torch.arange(0, 13), torch.arange(40, 61)
    model.prefill(pool, a, 0, sa[:12])
    model.prefill(pool, b, 0, sb[:20])
    rows = torch.nn.utils.rnn.pad_sequence([sa, sb], batch_first=True)
    out = model.decode(pool, [5, 9], [12, 20], rows)
    assert torch.allclose(out[0], model.full_logits(a + [5])[-1], atol=1e-4, rtol=1e-4)
    assert torch.allclose(out[1], model.full_logits(b + [9])[-1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("workload", ["fewshot", "chat", "tot", "noshare", "pressure"])
def test_outputs_identical_with_and_without_cache(workload):
    p = Params.for_scale("smoke", d_model=32, fewshot_prefix=96, tot_question=48, pressure_prefix=96,
                         pressure_kv_slots=256, noshare_prompt=48)
    from mlsys_flows.systems.radix.run import model_config
    engine = Engine(model_config(p), seed=0)
    reqs = make_requests(p, workload)
    base = serve(engine, p, workload, "no_cache", reqs)
    variants = ("radix", "radix_fcfs") if workload == "pressure" else ("radix",)
    results = {v: serve(engine, p, workload, v, reqs) for v in variants}
    for got in results.values():
        assert got.outputs == base.outputs
        assert got.requests == base.requests == len(reqs)
        assert got.prompt_tokens == base.prompt_tokens
        assert got.prefill_tokens + got.cached_tokens == base.prefill_tokens
    if workload != "noshare":
        assert results["radix"].prefill_tokens < base.prefill_tokens / 2


def test_fewshot_prefill_counts_exact():
    """One shared prefix, admitted one request at a time: only the first request computes it."""
    engine = Engine(CFG, seed=0)
    reqs = w.fewshot(np.random.default_rng(0), CFG.vocab, 6, 50, 5, 3)
    st = engine.serve(reqs, kv_slots=2048, max_running=4, cache=True)
    assert st.prompt_tokens == 6 * 55
    # every earlier prompt is cached when the next is admitted (no eviction): the naive count
    prompts = [r.append for r in reqs]
    expect = sum(len(q) - min(len(q) - 1, max((common_prefix_len(q, e) for e in prompts[:i]), default=0))
                 for i, q in enumerate(prompts))
    assert st.prefill_tokens == expect <= 55 + 5 * 5
    none = engine.serve(reqs, kv_slots=2048, max_running=4, cache=False)
    assert none.prefill_tokens == 6 * 55 and none.outputs == st.outputs


def test_lpm_beats_fcfs_under_pressure_and_pool_is_conserved():
    engine = Engine(CFG, seed=0)
    reqs = w.interleaved_templates(np.random.default_rng(3), CFG.vocab, 4, 6, 60, 4, 2)
    lpm = engine.serve(reqs, kv_slots=150, max_running=2, cache=True, policy="lpm")
    fcfs = engine.serve(reqs, kv_slots=150, max_running=2, cache=True, policy="fcfs")
    assert lpm.outputs == fcfs.outputs
    assert lpm.prefill_tokens < fcfs.prefill_tokens and lpm.evicted_tokens < fcfs.evicted_tokens
    with pytest.raises(RuntimeError, match="more KV slots"):
        engine.serve(reqs, kv_slots=40, max_running=2, cache=True)


def test_measure_reports_every_variant():
    p = Params.for_scale("smoke", d_model=32, repeats=2)
    out = measure(p, "pressure")
    assert set(out["rates"]) == {"no_cache", "radix", "radix_fcfs"}
    assert all(len(r) == 2 and min(r) > 0 for r in out["rates"].values())
    m = out["metrics"]
    assert m["radix"]["prefill_tokens_saved"] == m["radix"]["prompt_tokens"] - m["radix"]["prefill_tokens"] > 0
    assert m["no_cache"]["hit_rate"] == 0.0 and 0 < m["radix"]["hit_rate"] < 1


def test_exact_prompt_cache_reuses_only_whole_identical_prompts():
    """The mechanism's ablation: prompts sharing a prefix recompute it; an identical prompt reuses it whole."""
    engine = Engine(CFG, seed=0)
    reqs = w.fewshot(np.random.default_rng(0), CFG.vocab, 6, 50, 5, 3)
    exact = engine.serve(reqs, kv_slots=2048, max_running=4, cache=True, match="exact")
    radix = engine.serve(reqs, kv_slots=2048, max_running=4, cache=True)
    assert exact.prefill_tokens == exact.prompt_tokens == 6 * 55 > radix.prefill_tokens
    assert exact.outputs == radix.outputs
    same = [w.Request(i, None, reqs[0].append, 3) for i in range(4)]  # four identical prompts
    st = engine.serve(same, kv_slots=2048, max_running=1, cache=True, match="exact")
    assert st.prefill_tokens == 55 + 3 * 1  # the first computes it; the rest reuse all but the last token
    with pytest.raises(ValueError, match="match"):
        engine.serve(reqs, kv_slots=2048, max_running=4, cache=True, match="fuzzy")


def test_shared_share_workload_shares_exactly_that_prefix():
    reqs = w.shared_share(np.random.default_rng(1), 512, 10, 100, 0.75, 4)
    assert all(len(r.append) == 100 and r.append[:75] == reqs[0].append[:75] for r in reqs)
    assert max(common_prefix_len(a.append, b.append) for a in reqs for b in reqs if a is not b) < 80
    assert all(common_prefix_len(a.append, b.append) < 5 for a in w.shared_share(np.random.default_rng(2), 512, 5, 50, 0.0, 1)
               for b in w.shared_share(np.random.default_rng(3), 512, 5, 50, 0.0, 1))
    with pytest.raises(ValueError):
        w.shared_share(np.random.default_rng(1), 512, 2, 10, 1.5, 1)
