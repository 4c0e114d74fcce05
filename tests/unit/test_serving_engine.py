"""The serving family's batching core (systems/llm_serving/engine.py), the one radix's engine and
metropolis's model server run: newcomers prefilled together give what one-at-a-time prefill gives
(logits within the bound, the same greedy tokens); the persistent lane K/V equals a fresh gather of
the running batch after every admission and departure (and a lane not moved, or a newcomer not
gathered, is caught); seeded sampling reproduces and differs between requests; the logit check
fails on wrong logits; radix's reuse counts do not change with batched prefill.

Engine mechanics run on a tiny random-weight Llama (the project's SmolLM2 module, small config);
the bound on packed prefill runs on SmolLM2 itself (loaded once per session)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mlsys_flows.systems.llm_serving.engine import (LOGIT_REL_BOUND, Batch, LaneKV, LogitCheckError, Sampler, Seq,
                                                    check_logits, logit_check)
from mlsys_flows.systems.llm_serving.kv_pool import KVPool
from mlsys_flows.systems.llm_serving.model_card import SMOLLM2_TOKEN_IDS
from mlsys_flows.systems.llm_serving.smollm2 import LlamaConfig, SmolLM2, _tensor_shapes


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def tiny():
    """A Llama of SmolLM2's layout (grouped K/V heads, tied embeddings) with random weights and
    SmolLM2's vocabulary size, so workloads' token ids fit."""
    cfg = LlamaConfig(vocab=49152, d_model=32, layers=2, heads=4, kv_heads=2, intermediate=48, max_positions=512,
                      eps=1e-5, rope_theta=10000.0, tied=True, bos=1, eos=2, name="tiny-llama")
    g = torch.Generator().manual_seed(0)
    sd = {k: (1.0 + 0.1 * torch.randn(*s, generator=g)) if len(s) == 1 else 0.3 * torch.randn(*s, generator=g)
          for k, s in _tensor_shapes(cfg).items()}
    return SmolLM2(cfg, sd).eval()


@pytest.fixture(scope="session")
def smollm2():
    from mlsys_flows.systems.llm_serving.smollm2 import pretrained

    return pretrained()


def _prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(SMOLLM2_TOKEN_IDS.start, SMOLLM2_TOKEN_IDS.stop, n).tolist()


def _seqs(pool: KVPool, specs, keep=True) -> list[Seq]:
    out = []
    for key, (n, new) in enumerate(specs):
        slots = pool.alloc(n + new - 1)
        out.append(Seq(key=key, prompt=_prompt(n, key), max_new=new, slots=torch.tensor(slots), keep_logits=keep))
    return out


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a - ref).abs().max() / ref.abs().max())


# --- batched prefill -------------------------------------------------------------------------------
def test_batched_prefill_matches_one_at_a_time_prefill(smollm2):
    """Four newcomers of different lengths prefilled in one packed call, against each prefilled
    alone: logits within the bound of their scale and the same greedy tokens, through several decode
    steps (SmolLM2's real weights)."""
    specs = [(9, 4), (23, 3), (5, 4), (14, 2)]
    runs = {}
    for together in (True, False):
        pool = KVPool(smollm2.cfg, 256)
        batch = Batch(smollm2, pool, lanes=4, cap=32)
        seqs = _seqs(pool, specs)
        first = []
        if together:
            batch.prefill(seqs)
            first = [s.output[0] for s in seqs]
            logits = smollm2.prefill_batch(KVPool(smollm2.cfg, 256), [(s.prompt, 0, s.slots[:len(s.prompt)])
                                                                     for s in seqs])
        else:
            for s in seqs:
                batch.prefill([s])
            first = [s.output[0] for s in seqs]
            logits = torch.stack([smollm2.prefill(KVPool(smollm2.cfg, 256), s.prompt, 0, torch.arange(len(s.prompt)))
                                  for s in seqs])
        for s in seqs:
            batch.join(s)
        while batch.running:
            batch.step()
        runs[together] = (first, logits, [s.output for s in seqs], seqs)
        assert batch.prefill_calls == (1 if together else len(specs))
    (f1, l1, o1, s1), (f0, l0, o0, s0) = runs[True], runs[False]
    assert _rel(l1, l0) < LOGIT_REL_BOUND and f1 == f0
    assert o1 == o0
    # and each request's last served logits equal a full recomputation (the in-run check)
    assert check_logits(smollm2, s1, "test") < LOGIT_REL_BOUND


# --- the persistent lane K/V -----------------------------------------------------------------------
def _assert_lanes_equal_a_fresh_gather(model, batch: Batch) -> None:
    """The lanes' K/V of every running request's positions with K/V equal a gather of its slots now."""
    if not batch.running:
        return
    width = max(s.length for s in batch.running)
    rows = torch.zeros(len(batch.running), width, dtype=torch.long)
    for b, s in enumerate(batch.running):
        assert s.lane == b
        rows[b, :s.length] = s.slots[:s.length]
    k, v = model.gather_batch(batch.pool, rows)
    _, (lk, lv) = batch.kv.views(width)
    for b, s in enumerate(batch.running):
        n = s.length
        assert torch.equal(lk[:, b, :, :n], k[:, b, :, :n]), f"lane {b} K"
        assert torch.equal(lv[:, b, :, :n], v[:, b, :, :n]), f"lane {b} V"


def _serve_staggered(model, batch: Batch, check_lanes: bool) -> list[Seq]:
    """Requests arriving over the steps with different lengths, so the batch gains and loses members
    (departures from the middle included) almost every step."""
    specs = [(7, 6), (12, 2), (4, 5), (9, 1), (15, 4), (6, 3), (10, 7), (3, 2)]
    seqs = _seqs(batch.pool, specs)
    arrivals = {0: seqs[:3], 1: seqs[3:5], 3: seqs[5:7], 4: seqs[7:]}
    step = 0
    while step in arrivals or batch.running or any(k > step for k in arrivals):
        if step in arrivals:
            batch.admit(arrivals[step])
        if check_lanes:
            _assert_lanes_equal_a_fresh_gather(model, batch)
        batch.step()
        if check_lanes:
            _assert_lanes_equal_a_fresh_gather(model, batch)
        step += 1
    return seqs


def test_lane_kv_equals_a_regathered_batch_across_admissions_and_departures(tiny):
    batch = Batch(tiny, KVPool(tiny.cfg, 512), lanes=8, cap=32)
    seqs = _serve_staggered(tiny, batch, check_lanes=True)
    assert batch.kv.moves > 0 and batch.kv.gathered == sum(s.max_new > 1 for s in seqs)
    assert all(s.done for s in seqs) and batch.kv.n == 0
    # the served tokens are what a full causal pass gives every request (greedy)
    for s in seqs:
        toks = list(s.prompt)
        for _ in range(s.max_new):
            toks.append(int(tiny.full_logits(toks)[-1].argmax()))
        assert s.output == toks[len(s.prompt):], s.key
        assert logit_check(tiny, s) < LOGIT_REL_BOUND


class _NoMove(LaneKV):
    def remove(self, lane, length):   # forgets to move the last lane into the freed one
        self.n -= 1
        return None if lane == self.n else self.n


class _NoGather(LaneKV):
    def add(self, pool, slots, known):   # a newcomer's row set, its K/V not gathered
        self.rows[self.n, :len(slots)] = slots
        self.n += 1
        return self.n - 1


@pytest.mark.parametrize("broken", [_NoMove, _NoGather])
def test_the_lane_check_catches_a_lane_not_moved_or_a_newcomer_not_gathered(tiny, broken):
    batch = Batch(tiny, KVPool(tiny.cfg, 512), lanes=8, cap=32)
    batch.kv = broken(tiny.cfg, 8, 32)
    with pytest.raises(AssertionError):
        _serve_staggered(tiny, batch, check_lanes=True)


def test_decode_reads_views_of_the_lanes_without_copies(tiny):
    """The decode batch is a view of the lane buffers (sliced to the active lanes and the longest
    length): decode writes the new token's K/V into the lanes themselves."""
    batch = Batch(tiny, KVPool(tiny.cfg, 256), lanes=4, cap=32)
    batch.admit(_seqs(batch.pool, [(5, 4), (8, 4)]))
    rows, (k, v) = batch.kv.views(9)
    assert k.data_ptr() == batch.kv.k.data_ptr() and k.shape[1] == 2 and k.shape[3] == 9
    before = batch.kv.k[:, 1, :, 8].clone()
    batch.step()   # request 1 feeds its first output at position 8
    assert not torch.equal(batch.kv.k[:, 1, :, 8], before)


# --- sampling --------------------------------------------------------------------------------------
def test_seeded_sampling_reproduces_and_requests_differ(tiny):
    def run(seed: int) -> list[list[int]]:
        batch = Batch(tiny, KVPool(tiny.cfg, 512), lanes=4, cap=32, sampler=Sampler(temperature=1.0, top_k=0, seed=seed))
        pool = batch.pool
        same = [5, 6, 7, 8, 9]   # every request has the same prompt: only its key tells them apart
        seqs = [Seq(key=k, prompt=list(same), max_new=8, slots=torch.tensor(pool.alloc(12))) for k in range(4)]
        batch.admit(seqs)
        while batch.running:
            batch.step()
        return [s.output for s in seqs]

    a, b, c = run(1), run(1), run(2)
    assert a == b                          # a rerun reproduces
    assert len({tuple(o) for o in a}) == 4  # the same prompt, different keys: different tokens
    assert a != c                          # another run seed, other tokens
    g = Sampler().generator(3)
    assert g is None and Sampler().sample(torch.tensor([[0.0, 2.0, 1.0]]), [None]) == [1]   # greedy: argmax
    logits = torch.tensor([[0.0, 5.0, 4.0, -1.0]])
    top2 = Sampler(temperature=1.0, top_k=2, seed=0)
    draws = {top2.sample(logits, [top2.generator(k)])[0] for k in range(50)}
    assert draws == {1, 2}                 # top-k keeps the two largest, and both are drawn
    with pytest.raises(ValueError, match="temperature"):
        Sampler(temperature=-1.0)


# --- the logit check -------------------------------------------------------------------------------
def test_the_logit_check_fails_on_wrong_logits(tiny):
    batch = Batch(tiny, KVPool(tiny.cfg, 256), lanes=2, cap=32)
    seqs = _seqs(batch.pool, [(6, 3), (9, 2)])
    batch.admit(seqs)
    while batch.running:
        batch.step()
    assert check_logits(tiny, seqs, "ok") < LOGIT_REL_BOUND
    seqs[1].last_logits = seqs[1].last_logits + 0.01 * seqs[1].last_logits.abs().max()
    with pytest.raises(LogitCheckError, match="bound"):
        check_logits(tiny, seqs, "tampered")
    with pytest.raises(ValueError, match="kept no logits"):
        logit_check(tiny, Seq(key=0, prompt=[1], max_new=1, slots=torch.tensor([0])))


# --- radix on the core -----------------------------------------------------------------------------
@pytest.mark.parametrize("workload", ["chat", "pressure", "tot", "fewshot"])
def test_radix_reuse_is_unchanged_by_batched_prefill(tiny, workload):
    """Radix's engine on its workloads (smoke sizes, more concurrency): batched prefill with the
    in-batch prefix check reuses and evicts exactly what one-at-a-time prefill does, in fewer
    prefill calls, with the same outputs."""
    from mlsys_flows.systems.radix import Params
    from mlsys_flows.systems.radix.engine import Engine
    from mlsys_flows.systems.radix.run import VARIANTS, make_requests, variants_of

    p = Params.for_scale("smoke", max_running=8, chat_sessions=3, pressure_per_template=3, fewshot_requests=4)
    engine = Engine(tiny)
    reqs = make_requests(p, workload)
    fewer = False
    for v in variants_of(workload):
        cache, policy, kind = VARIANTS[v]
        kw = dict(kv_slots=p.pressure_kv_slots if workload == "pressure" else p.kv_slots, max_running=p.max_running,
                  cache=cache, policy=policy, cache_kind=kind, block_size=p.block_size)
        one = engine.serve(reqs, batched_prefill=False, **kw)
        many = engine.serve(reqs, batched_prefill=True, check=2, **kw)
        assert (many.prefill_tokens, many.prompt_tokens, many.evicted_tokens) == \
            (one.prefill_tokens, one.prompt_tokens, one.evicted_tokens), v
        assert many.outputs == one.outputs and many.requests == len(reqs)
        assert many.prefill_calls <= one.prefill_calls == one.requests
        fewer |= many.prefill_calls < one.prefill_calls
        assert many.logit_check is not None and many.logit_check < LOGIT_REL_BOUND and many.logit_checked >= 1
    assert fewer   # somewhere the round's newcomers really were prefilled together


def _waits_only_for_a_gain(prompt, pending, tree) -> bool:
    """The in-batch check by brute force: cache the round's pending prompts in a fresh cache of the
    same kind (and block size) and match the candidate there; wait only when that beats what the
    real cache matches now (a prefix cache's match over the union of two contents is the larger of
    the two matches, so this is exactly what waiting for the round's prefill would gain)."""
    if tree is None:
        return False
    from mlsys_flows.systems.radix.block_cache import BlockPrefixCache
    from mlsys_flows.systems.radix.tree import RadixCache

    fresh = BlockPrefixCache(tree.block_size) if isinstance(tree, BlockPrefixCache) else RadixCache()
    slot = 0
    for r in pending:
        n = len(r.seq.prompt)
        fresh.insert(r.seq.prompt, list(range(slot, slot + n)))
        slot += n
    return len(fresh.match_prefix(prompt[:-1])[0]) > len(tree.match_prefix(prompt[:-1])[0])


@pytest.mark.parametrize("workload", ["chat", "tot", "share0.75"])
def test_each_cache_waits_in_a_round_only_for_what_it_can_gain(tiny, workload, monkeypatch):
    """At quick sizes, every cached variant makes exactly the prefill calls of a brute-force
    in-batch check (a candidate waits for the round's prefill only when the pending prompts, once
    cached, would give it more than the cache gives now: whole blocks for the block cache), with the
    same reuse. A check that waits for a shared prefix the block cache cannot hold (a partial
    block), or that always waits, makes more calls; one that never waits reuses less."""
    from mlsys_flows.systems.radix import Params
    from mlsys_flows.systems.radix.engine import Engine
    from mlsys_flows.systems.radix.run import VARIANTS, make_requests, variants_of

    p = Params.for_scale("quick")
    reqs = make_requests(p, workload)
    engine = Engine(tiny)
    names = [v for v in (variants_of(workload) if not workload.startswith("share") else ("radix", "block_cache"))
             if VARIANTS[v][0]]
    assert "block_cache" in names and "radix" in names
    got = {}
    for v in names:
        cache, policy, kind = VARIANTS[v]
        kw = dict(kv_slots=p.kv_slots, max_running=p.max_running, cache=cache, policy=policy, cache_kind=kind,
                  block_size=p.block_size)
        got[v] = engine.serve(reqs, **kw)
        with monkeypatch.context() as m:
            m.setattr(Engine, "_shares_uncached", staticmethod(_waits_only_for_a_gain))
            want = engine.serve(reqs, **kw)
        assert (got[v].prefill_calls, got[v].prefill_tokens) == (want.prefill_calls, want.prefill_tokens), v
        assert got[v].prefill_calls < got[v].requests, v   # the round's newcomers were packed somewhere
    assert got["block_cache"].prefill_tokens >= got["radix"].prefill_tokens
