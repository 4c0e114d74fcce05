"""The causal MiniLM (the package's pretrained weights run causally, a second model with the serving interface) reuses its
cached K/V exactly, and the engine (model-agnostic; radix serves SmolLM2, tests/unit/test_smollm2.py)
really reuses cached K/V: served outputs are identical with and without the radix cache and the
block-hash cache, the caches save the prefill they should (the block cache recomputes the partial
block of every chat turn) and a leaked slot fails the pass, and longest-prefix-match-first beats FCFS
under cache pressure. Engine logic runs on MiniLM (cheap);
the parameters' workloads run on SmolLM2 at smoke scale."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.llm_serving.model_card import FIRST_WORD_ID, MODEL_POSITIONS, MODEL_VOCAB, TOKEN_IDS
from mlsys_flows.systems.radix import FIRST_TOKEN_ID, Params, common_prefix_len
from mlsys_flows.systems.radix import MODEL_POSITIONS as SERVED_POSITIONS
from mlsys_flows.systems.radix import MODEL_VOCAB as SERVED_VOCAB
from mlsys_flows.systems.radix import workloads as w
from mlsys_flows.systems.radix.engine import Engine, SlotLeakError
from mlsys_flows.systems.llm_serving.causal_minilm import KVPool, load_config, load_state_dict, pretrained, weights_dir
from mlsys_flows.systems.radix.run import make_requests, measure, serve, variants_of

ATOL = RTOL = 1e-4


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def model():
    return pretrained()


@pytest.fixture(scope="session")
def smollm2():
    from mlsys_flows.systems.llm_serving.smollm2 import pretrained as smollm2_pretrained

    return smollm2_pretrained()


def _tokens(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(TOKEN_IDS.start, TOKEN_IDS.stop, n)]


def test_constants_match_the_packaged_model():
    cfg = load_config()
    assert (cfg.layers, cfg.d_model, cfg.heads, cfg.intermediate) == (6, 384, 12, 1536)
    assert (cfg.max_positions, cfg.vocab) == (MODEL_POSITIONS, MODEL_VOCAB)
    vocab = (weights_dir() / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert len(vocab) == MODEL_VOCAB
    # every id below FIRST_WORD_ID is a special or unused piece; the ordinary wordpieces start there
    assert all(t.startswith("[") and t.endswith("]") for t in vocab[:FIRST_WORD_ID])
    assert vocab[FIRST_WORD_ID] == "!" and "[CLS]" not in vocab[FIRST_WORD_ID:]


def test_loaded_weights_are_the_package_state_dict(model):
    sd = load_state_dict()
    assert model.load_s > 0
    d = model.cfg.d_model
    e = "embeddings."
    assert torch.equal(model.word, sd[e + "word_embeddings.weight"])
    assert torch.equal(model.pos, sd[e + "position_embeddings.weight"])
    assert torch.equal(model.type0, sd[e + "token_type_embeddings.weight"][0])
    assert torch.equal(model.emb_ln_w, sd[e + "LayerNorm.weight"])
    for i, blk in enumerate(model.blocks):
        p = f"encoder.layer.{i}."
        for j, n in enumerate(("query", "key", "value")):
            assert torch.equal(blk["qkv_w"][j * d:(j + 1) * d], sd[p + f"attention.self.{n}.weight"])
            assert torch.equal(blk["qkv_b"][j * d:(j + 1) * d], sd[p + f"attention.self.{n}.bias"])
        assert torch.equal(blk["o_w"], sd[p + "attention.output.dense.weight"])
        assert torch.equal(blk["ln1_b"], sd[p + "attention.output.LayerNorm.bias"])
        assert torch.equal(blk["up_w"], sd[p + "intermediate.dense.weight"])
        assert torch.equal(blk["down_b"], sd[p + "output.dense.bias"])
        assert torch.equal(blk["ln2_w"], sd[p + "output.LayerNorm.weight"])


def test_architecture_equals_transformers_bert(model):
    """Our module on the same weights equals transformers' BertModel: bidirectional (what the weights
    were trained as) and causal (BertModel as a decoder): embeddings, post-LN and GELU are BERT's."""
    transformers = pytest.importorskip("transformers")
    path = str(weights_dir())
    tokens = _tokens(60, seed=3)
    ids = torch.tensor([tokens])
    with torch.inference_mode():
        enc = transformers.BertModel.from_pretrained(path, local_files_only=True).eval()
        dec = transformers.BertModel.from_pretrained(path, local_files_only=True, is_decoder=True).eval()
        bidir, causal = enc(ids).last_hidden_state[0], dec(ids).last_hidden_state[0]
    assert torch.allclose(model.hidden_states(tokens, causal=False), bidir, atol=ATOL)
    assert torch.allclose(model.hidden_states(tokens, causal=True), causal, atol=ATOL)
    assert not torch.allclose(bidir, causal, atol=1e-2)  # the causal mask really changes the result


def _prefix_then_suffix(model, tokens, split, prefix_slots_shift=0):
    pool = KVPool(model.cfg, 128)
    slots = torch.arange(len(tokens)) + 7
    model.prefill(pool, tokens[:split], 0, slots[:split])
    reuse = slots.clone()
    reuse[:split] = (reuse[:split] + prefix_slots_shift) % 128
    return model.prefill(pool, tokens[split:], split, reuse)


def test_prefill_over_cached_prefix_equals_full_prefill(model):
    tokens = _tokens(40)
    ref = model.full_logits(tokens)[-1]
    whole = model.prefill(KVPool(model.cfg, 64), tokens, 0, torch.arange(40))
    assert torch.allclose(whole, ref, atol=ATOL, rtol=RTOL)
    for split in (1, 17, 39):
        assert torch.allclose(_prefix_then_suffix(model, tokens, split), ref, atol=ATOL, rtol=RTOL)


def test_wrong_prefix_slots_give_different_logits(model):
    """The equality above is not vacuous: reading the prefix from the wrong slots changes the result."""
    tokens = _tokens(40)
    ref = model.full_logits(tokens)[-1]
    assert not torch.allclose(_prefix_then_suffix(model, tokens, 17, prefix_slots_shift=50), ref, atol=1e-2)


def test_decode_matches_full_recompute(model):
    """Batched decode steps over a gathered batch K/V, updated in place step after step, equal a full
    causal pass over each whole sequence."""
    a, b = _tokens(12, seed=1), _tokens(20, seed=2)
    pool = KVPool(model.cfg, 128)
    sa, sb = torch.arange(0, 15), torch.arange(40, 63)
    model.prefill(pool, a, 0, sa[:12])
    model.prefill(pool, b, 0, sb[:20])
    rows = torch.nn.utils.rnn.pad_sequence([sa, sb], batch_first=True)
    batch_kv = model.gather_batch(pool, rows)
    fed = ([5000, 5001, 5002], [9000, 9001, 9002])
    for step in range(3):
        out = model.decode(pool, [fed[0][step], fed[1][step]], [12 + step, 20 + step], rows, batch_kv)
        assert torch.allclose(out[0], model.full_logits(a + fed[0][:step + 1])[-1], atol=ATOL, rtol=RTOL)
        assert torch.allclose(out[1], model.full_logits(b + fed[1][:step + 1])[-1], atol=ATOL, rtol=RTOL)
    # without a kept batch K/V the step gathers it from the pool, which decode kept up to date
    again = model.decode(pool, [fed[0][2], fed[1][2]], [14, 22], rows)
    assert torch.allclose(again, out, atol=ATOL, rtol=RTOL)


def test_positions_past_the_model_fail_clearly(model):
    with pytest.raises(ValueError, match="512 positions"):
        model.prefill(KVPool(model.cfg, 1024), _tokens(20), 500, torch.arange(520))
    long = [w.Request(0, None, tuple(_tokens(500)), 20)]
    with pytest.raises(ValueError, match="needs 520 positions"):
        Engine(model).serve(long, kv_slots=1024, max_running=1, cache=True)
    # radix serves SmolLM2 (8192 positions): only chains of many turns or levels can pass them
    for field, value, more in (("chat_turns", 20, dict(chat_user=300, chat_new_tokens=200)),    # 32 + 20 x 500
                               ("tot_depth", 8, dict(tot_step=500, tot_new_tokens=500))):      # 64 + 8 x 500 + 9 x 500
        with pytest.raises(ParamsError, match=field) as err:
            Params.for_scale("quick", **{field: value}, **more)
        assert err.value.field == field and str(SERVED_POSITIONS) in str(err.value)


@pytest.mark.parametrize("workload", ["fewshot", "chat", "tot", "noshare", "pressure"])
def test_outputs_identical_with_and_without_cache(smollm2, workload):
    """The parameters' workloads on the served model (SmolLM2), every variant of the workload."""
    p = Params.for_scale("smoke")
    engine = Engine(smollm2)
    reqs = make_requests(p, workload)
    base = serve(engine, p, workload, "no_cache", reqs)
    variants = [v for v in variants_of(workload) if v != "no_cache"]
    results = {v: serve(engine, p, workload, v, reqs) for v in variants}
    for got in [base, *results.values()]:
        assert got.outputs == base.outputs
        assert got.requests == base.requests == len(reqs)
        assert got.prompt_tokens == base.prompt_tokens
        assert got.prefill_tokens + got.cached_tokens == base.prefill_tokens
        assert got.unaccounted_slots == 0
    if workload != "noshare":
        assert results["radix"].prefill_tokens < 0.6 * base.prefill_tokens


def test_fewshot_prefill_counts_exact(model):
    """One shared prefix, admitted one request at a time: only the first request computes it."""
    engine = Engine(model)
    reqs = w.fewshot(np.random.default_rng(0), TOKEN_IDS, 6, 50, 5, 3)
    st = engine.serve(reqs, kv_slots=2048, max_running=4, cache=True)
    assert st.prompt_tokens == 6 * 55
    # every earlier prompt is cached when the next is admitted (no eviction): the naive count
    prompts = [r.append for r in reqs]
    expect = sum(len(q) - min(len(q) - 1, max((common_prefix_len(q, e) for e in prompts[:i]), default=0))
                 for i, q in enumerate(prompts))
    assert st.prefill_tokens == expect <= 55 + 5 * 5
    none = engine.serve(reqs, kv_slots=2048, max_running=4, cache=False)
    assert none.prefill_tokens == 6 * 55 and none.outputs == st.outputs


def test_lpm_beats_fcfs_under_pressure_and_pool_is_conserved(model):
    engine = Engine(model)
    reqs = w.interleaved_templates(np.random.default_rng(3), TOKEN_IDS, 4, 6, 60, 4, 2)
    lpm = engine.serve(reqs, kv_slots=150, max_running=2, cache=True, policy="lpm")
    fcfs = engine.serve(reqs, kv_slots=150, max_running=2, cache=True, policy="fcfs")
    assert lpm.outputs == fcfs.outputs
    assert lpm.prefill_tokens < fcfs.prefill_tokens and lpm.evicted_tokens < fcfs.evicted_tokens
    assert lpm.unaccounted_slots == fcfs.unaccounted_slots == 0
    with pytest.raises(RuntimeError, match="more KV slots"):
        engine.serve(reqs, kv_slots=40, max_running=2, cache=True)


@pytest.mark.parametrize("block", [1, 7])
def test_block_cache_serves_the_same_outputs_and_reuses_whole_blocks(model, block):
    """The block-hash cache through the engine: outputs equal no cache; a few-shot prefix of whole
    blocks is reused exactly as the tree reuses it, and the partial last block is recomputed; the
    pool is conserved under eviction (the partial blocks the cache does not take are freed)."""
    engine = Engine(model)
    reqs = w.fewshot(np.random.default_rng(0), TOKEN_IDS, 6, 48, 5, 3)     # a 48-token prefix: 3 blocks of 16
    none = engine.serve(reqs, kv_slots=2048, max_running=4, cache=False)
    radix = engine.serve(reqs, kv_slots=2048, max_running=4, cache=True, policy="fcfs")
    blk = engine.serve(reqs, kv_slots=2048, max_running=4, cache=True, policy="fcfs", cache_kind="block", block_size=block)
    assert blk.outputs == radix.outputs == none.outputs
    assert blk.unaccounted_slots == radix.unaccounted_slots == 0
    # request i > 0 reuses the prefix's whole blocks (42 of its 48 tokens with blocks of 7); with block 1 the
    # block cache is the tree
    per = [len(r.append) for r in reqs]
    assert radix.prefill_tokens == per[0] + sum(p - 48 for p in per[1:])
    assert blk.prefill_tokens == per[0] + sum(p - 48 // block * block for p in per[1:])
    pressure = w.interleaved_templates(np.random.default_rng(3), TOKEN_IDS, 3, 3, 40, 4, 2)
    base = engine.serve(pressure, kv_slots=100, max_running=2, cache=False).outputs
    for policy in ("lpm", "fcfs"):
        st = engine.serve(pressure, kv_slots=100, max_running=2, cache=True, policy=policy, cache_kind="block", block_size=block)
        assert st.evicted_tokens > 0 and st.unaccounted_slots == 0
        assert st.outputs == base
    with pytest.raises(ValueError, match="cache_kind"):
        engine.serve(reqs, kv_slots=2048, max_running=4, cache=True, cache_kind="paged")
    with pytest.raises(ValueError, match="policy"):
        engine.serve(reqs, kv_slots=2048, max_running=4, cache=True, policy="random")


def test_block_cache_recomputes_the_partial_block_of_every_chat_turn(model):
    """Multi-turn chat (the headline's workload): turn k reuses its conversation so far, all but the
    last output token (it has no K/V yet); the tree reuses all of it, the block cache (FCFS or with the
    tree's admission order) only its whole blocks, so each turn recomputes the partial last block."""
    engine = Engine(model)
    sessions, turns, system, user, new, block = 2, 3, 20, 9, 3, 16
    reqs = w.chat(np.random.default_rng(4), TOKEN_IDS, sessions, turns, system, user, new)
    # tokens each request reuses: turn 0 of a later session the system prompt (turn 0 of the first session
    # is cached right after its prefill, in the same admission round), turn k > 0 its parent's prompt and output
    # but the last output token
    seq = {}
    reuse = []
    for r in reqs:
        prompt = (seq[r.parent] if r.parent is not None else 0) + len(r.append)
        seq[r.rid] = prompt + r.max_new
        reuse.append(seq[r.parent] - 1 if r.parent is not None else (system if r.rid else 0))
    prompt_tokens = sum(seq[r.rid] - r.max_new for r in reqs)
    none = engine.serve(reqs, kv_slots=2048, max_running=4, cache=False)
    radix = engine.serve(reqs, kv_slots=2048, max_running=4, cache=True, policy="lpm")
    blk = {policy: engine.serve(reqs, kv_slots=2048, max_running=4, cache=True, policy=policy, cache_kind="block",
                                block_size=block) for policy in ("fcfs", "lpm")}
    assert none.prompt_tokens == none.prefill_tokens == prompt_tokens
    assert radix.prefill_tokens == prompt_tokens - sum(reuse)
    for st in blk.values():
        assert st.prefill_tokens == prompt_tokens - sum(m // block * block for m in reuse) > radix.prefill_tokens
        assert st.outputs == radix.outputs == none.outputs


def test_a_leaked_slot_fails_the_pass(model, monkeypatch):
    """serve() checks at the end of every pass that each pool slot is free or cached: a pool that loses one
    slot of the first slots released (a finished run's without a cache, the partial blocks the block cache
    does not take, evicted ones) fails it, with every cache and without one."""
    from mlsys_flows.systems.llm_serving import kv_pool

    engine = Engine(model)
    reqs = w.interleaved_templates(np.random.default_rng(3), TOKEN_IDS, 3, 3, 40, 4, 2)   # evicts in 110 slots
    kinds = (dict(cache=False), dict(cache=True), dict(cache=True, cache_kind="block"))
    for kw in kinds:
        st = engine.serve(reqs, kv_slots=110, max_running=2, **kw)
        assert st.unaccounted_slots == 0 and (st.evicted_tokens > 0) == kw["cache"]
    real = kv_pool.KVPool.release

    def lossy(self, slots):
        slots = list(slots)
        if slots and not getattr(self, "lost", False):
            self.lost, slots = True, slots[1:]
        real(self, slots)

    monkeypatch.setattr(kv_pool.KVPool, "release", lossy)
    for kw in kinds:
        with pytest.raises(SlotLeakError, match="1 of 110 KV-pool slots are neither free nor cached"):
            engine.serve(reqs, kv_slots=110, max_running=2, **kw)


def test_measure_reports_every_variant():
    p = Params.for_scale("smoke", repeats=2)
    out = measure(p, "tot")
    assert set(out["rates"]) == {"no_cache", "radix", "block_cache"}
    assert all(len(r) == 2 and min(r) > 0 for r in out["rates"].values())
    m = out["metrics"]
    assert m["radix"]["prefill_tokens_saved"] == m["radix"]["prompt_tokens"] - m["radix"]["prefill_tokens"] > 0
    assert m["no_cache"]["hit_rate"] == 0.0 and 0 < m["radix"]["hit_rate"] < 1
    assert out["model"]["name"] == "SmolLM2-135M-Instruct" and out["model"]["max_positions"] == SERVED_POSITIONS
    assert out["model"]["kv_heads"] == 3 and out["model"]["load_source"] in ("cache", "gguf")


def test_workload_tokens_are_ordinary_tokens():
    p = Params.for_scale("smoke")
    for name in ("fewshot", "chat", "tot", "noshare", "pressure"):
        assert all(FIRST_TOKEN_ID <= t < SERVED_VOCAB for r in make_requests(p, name) for t in r.append)
    with pytest.raises(ValueError, match="ids"):
        w.fewshot(np.random.default_rng(0), 512, 2, 4, 2, 1)


def test_shared_share_workload_shares_exactly_that_prefix():
    ids = range(0, 512)
    reqs = w.shared_share(np.random.default_rng(1), ids, 10, 100, 0.75, 4)
    assert all(len(r.append) == 100 and r.append[:75] == reqs[0].append[:75] for r in reqs)
    assert max(common_prefix_len(a.append, b.append) for a in reqs for b in reqs if a is not b) < 80
    assert all(common_prefix_len(a.append, b.append) < 5 for a in w.shared_share(np.random.default_rng(2), ids, 5, 50, 0.0, 1)
               for b in w.shared_share(np.random.default_rng(3), ids, 5, 50, 0.0, 1))
    with pytest.raises(ValueError):
        w.shared_share(np.random.default_rng(1), ids, 2, 10, 1.5, 1)
