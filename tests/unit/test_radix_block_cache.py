"""The block-hash prefix cache (vLLM's automatic prefix caching): on block-aligned shared prefixes it
reuses exactly the tokens the radix tree reuses, elsewhere the tree's match rounded down to whole
blocks; unreferenced blocks are evicted least recently used first, a chain from its tail, and
referenced blocks are never evicted."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_flows.systems.radix import RadixCache
from mlsys_flows.systems.radix.block_cache import BlockPrefixCache, block_hash

B = 4
seqs = st.lists(st.integers(0, 2), min_size=1, max_size=14)   # a tiny alphabet: many shared prefixes


def _serve(cache, prompts):
    """Engine-like use: match each prompt, then cache it with fresh slots for the unmatched part.
    Returns the tokens reused per prompt."""
    slot = itertools.count()
    reused = []
    for p in prompts:
        got, node = cache.match_prefix(p)
        cache.inc_lock(node)
        slots = got + [next(slot) for _ in p[len(got):]]
        assert cache.insert(p, slots) >= len(got)
        cache.dec_lock(node)
        cache.check()
        reused.append(len(got))
    return reused


def _aligned_workload():
    """Few-shot templates, a chat and a tree-of-thought, every branch point on a block boundary:
    each prompt's expected reuse is known in whole blocks."""
    sys_, shot1, shot2 = [1] * B + [2] * B, [3] * (2 * B), [4] * (3 * B)
    q = [[100 + i] * B for i in range(8)]
    prompts = [sys_ + shot1 + q[0], sys_ + shot1 + q[1], sys_ + shot2 + q[2], sys_ + shot1 + q[3],
               sys_ + shot2 + q[4], q[5] + q[6], sys_ + shot1 + q[0] + q[7]]
    expected = [0, 4 * B, 2 * B, 4 * B, 5 * B, 0, 5 * B]
    return prompts, expected


class _MissesLastBlock(BlockPrefixCache):
    """A broken cache that loses the last block of every match (what the comparison must catch)."""

    def match_prefix(self, tokens):
        got, node = super().match_prefix(tokens)
        if node is self.root:
            return got, node
        return got[:-self.block_size], node.parent


class _TreeMissesAToken(RadixCache):
    def match_prefix(self, tokens):
        got, node = super().match_prefix(tokens)
        return (got[:-1], node) if got else (got, node)


def test_block_cache_and_tree_reuse_the_same_tokens_on_aligned_prefixes():
    prompts, expected = _aligned_workload()
    assert _serve(RadixCache(), prompts) == expected
    assert _serve(BlockPrefixCache(B), prompts) == expected
    # the comparison fails when either misses a block (or a token)
    assert _serve(_MissesLastBlock(B), prompts) != expected
    assert _serve(_TreeMissesAToken(), prompts) != expected


@settings(max_examples=200, deadline=None)
@given(st.lists(seqs, min_size=1, max_size=12))
def test_block_match_is_the_tree_match_in_whole_blocks(prompts):
    tree, blocks = _serve(RadixCache(), prompts), _serve(BlockPrefixCache(B), prompts)
    assert blocks == [t - t % B for t in tree]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=4), min_size=1, max_size=10))
def test_aligned_random_workloads_reuse_exactly_what_the_tree_reuses(block_lists):
    """Prompts built from whole blocks (each block one repeated symbol): tree and blocks agree exactly."""
    prompts = [[t for sym in blocks for t in [sym] * B] for blocks in block_lists]
    assert _serve(BlockPrefixCache(B), prompts) == _serve(RadixCache(), prompts)


def test_partial_last_block_is_not_cached_and_caller_keeps_its_slots():
    c = BlockPrefixCache(B)
    toks = list(range(2 * B + 3))
    assert c.cacheable(len(toks)) == 2 * B
    assert c.insert(toks, list(range(100, 100 + len(toks)))) == 0
    assert sorted(c.all_slots()) == list(range(100, 100 + 2 * B))
    got, _ = c.match_prefix(toks)
    assert got == list(range(100, 100 + 2 * B))
    # re-inserting with other slots: everything cacheable was cached already (those slots are duplicates)
    assert c.insert(toks, list(range(200, 200 + len(toks)))) == 2 * B
    assert sorted(c.all_slots()) == list(range(100, 100 + 2 * B))
    c.check()


def test_hash_is_of_the_whole_prefix():
    c = BlockPrefixCache(B)
    a, b = [1] * B + [7] * B, [2] * B + [7] * B     # the same second block after different first blocks
    c.insert(a, list(range(2 * B)))
    assert len(c.match_prefix(b)[0]) == 0
    assert block_hash(block_hash(b"\0" * 16, [1] * B), [7] * B) != block_hash(block_hash(b"\0" * 16, [2] * B), [7] * B)


def test_lru_eviction_frees_least_recent_chain_tail_first():
    c = BlockPrefixCache(B)
    A, Bq, C = [1] * 2 * B, [2] * 2 * B, [3] * 2 * B
    c.insert(A, list(range(0, 2 * B)))
    c.insert(Bq, list(range(10, 10 + 2 * B)))
    c.insert(C, list(range(20, 20 + 2 * B)))
    c.match_prefix(A)                                # A is now the most recent: B is the LRU chain
    assert c.evict(B) == list(range(10 + B, 10 + 2 * B))   # B's tail block first
    assert len(c.match_prefix(Bq)[0]) == B
    c.match_prefix(C)
    c.match_prefix(A)
    assert c.evict(1) == list(range(10, 10 + B))     # then the rest of B (still least recent)
    assert c.evict(2 * B) == list(range(20 + B, 20 + 2 * B)) + list(range(20, 20 + B))
    assert [len(c.match_prefix(s)[0]) for s in (A, Bq, C)] == [2 * B, 0, 0]
    c.check()


def test_shared_parent_is_evicted_only_after_its_children():
    c = BlockPrefixCache(B)
    p = [9] * B
    c.insert(p + [1] * B, list(range(0, 2 * B)))
    c.insert(p + [2] * B, [0, 1, 2, 3] + list(range(10, 10 + B)))
    # the shared parent is the least recently used... but continued: its children go first
    c.match_prefix(p + [2] * B)
    freed = c.evict(B)
    assert freed == list(range(B, 2 * B))            # child 1 (least recent leaf)
    assert c.evict(B) == list(range(10, 10 + B))     # child 2, then the parent became a leaf
    assert c.evict(B) == list(range(B))
    assert c.total_size() == 0
    c.check()


def test_referenced_blocks_are_pinned():
    c = BlockPrefixCache(B)
    keep, other = [5] * 3 * B, [6] * 2 * B
    c.insert(keep, list(range(3 * B)))
    c.insert(other, list(range(50, 50 + 2 * B)))
    got, node = c.match_prefix(keep[:2 * B] + [0] * B)   # a request holding keep's first two blocks
    assert len(got) == 2 * B
    c.inc_lock(node)
    c.inc_lock(node)                                     # a second request on the same prefix
    assert c.protected_size == 2 * B
    freed = c.evict(10_000)
    c.check()
    assert sorted(freed) == list(range(2 * B, 3 * B)) + list(range(50, 50 + 2 * B))
    assert c.match_prefix(keep)[0] == list(range(2 * B))
    c.dec_lock(node)
    assert c.evict(10_000) == [] and c.protected_size == 2 * B   # still referenced once
    c.dec_lock(node)
    assert c.evictable_size == 2 * B
    assert sorted(c.evict(10_000)) == list(range(2 * B))
    with pytest.raises(RuntimeError, match="unreferenced"):
        c.dec_lock(node)


def test_checks_catch_broken_caches_and_bad_input():
    c = BlockPrefixCache(B)
    c.insert([1] * 2 * B, list(range(2 * B)))
    blk = next(iter(c.blocks.values()))
    blk.slots.append(99)
    with pytest.raises(AssertionError):
        c.check()
    blk.slots.pop()
    c._evictable += 1
    with pytest.raises(AssertionError, match="counters"):
        c.check()
    with pytest.raises(ValueError, match="block_size"):
        BlockPrefixCache(0)
    with pytest.raises(ValueError, match="slots"):
        BlockPrefixCache(B).insert([1, 2], [0])
