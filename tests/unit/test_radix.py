"""The radix tree of RadixAttention: prefix matches equal a naive longest-common-prefix search
(hypothesis), edges split where a match ends, locks protect running requests from eviction, and
eviction takes unlocked leaves least recently used first."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_flows.systems.radix import NaivePrefixStore, Params, RadixCache, common_prefix_len
from mlsys_flows.systems.common.params import ParamsError

seqs = st.lists(st.integers(0, 3), min_size=1, max_size=12)   # a tiny alphabet: many shared prefixes


def _fill(ops):
    tree, naive, slot = RadixCache(), NaivePrefixStore(), itertools.count()
    for tokens in ops:
        slots = [next(slot) for _ in tokens]
        assert tree.insert(tokens, slots) == naive.insert(tokens, slots)
        tree.check()
    return tree, naive


@settings(max_examples=200, deadline=None)
@given(st.lists(seqs, max_size=12), st.lists(seqs, min_size=1, max_size=8))
def test_match_prefix_equals_naive_search(inserts, queries):
    tree, naive = _fill(inserts)
    for q in queries:
        got, node = tree.match_prefix(q)
        assert got == naive.match(q)
        tree.check()
        # the returned node ends exactly at the match: the path to it spells the matched tokens
        path, n = [], node
        while n is not tree.root:
            path[:0] = n.key
            n = n.parent
        assert tuple(path) == tuple(q[:len(got)])
    assert sorted(tree.all_slots()) == sorted({s for _, sl in naive.entries for s in sl})


@settings(max_examples=100, deadline=None)
@given(st.lists(seqs, min_size=1, max_size=12), st.data())
def test_eviction_never_touches_locked_paths_and_frees_lru_leaves(inserts, data):
    tree, _ = _fill(inserts)
    keep = data.draw(st.sampled_from(inserts))
    _, node = tree.match_prefix(keep)
    tree.inc_lock(node)
    tree.check()
    locked = tree.protected_size
    freed = tree.evict(10_000)
    tree.check()
    assert tree.evictable_size == 0 and tree.total_size() == locked == len(keep)
    assert tree.match_prefix(keep)[0] and len(tree.match_prefix(keep)[0]) == len(keep)
    assert len(freed) + locked == len(set(freed) | set(tree.all_slots()))  # disjoint, nothing lost
    tree.dec_lock(node)
    tree.check()
    assert tree.evictable_size == len(keep)


def test_match_inside_an_edge_splits_it():
    tree = RadixCache()
    tree.insert([1, 2, 3, 4, 5], [10, 11, 12, 13, 14])
    slots, node = tree.match_prefix([1, 2, 3, 9])
    assert slots == [10, 11, 12] and node.key == (1, 2, 3) and node.value == [10, 11, 12]
    (child,) = node.children.values()
    assert child.key == (4, 5) and child.value == [13, 14]
    assert tree.insert([1, 2, 3, 7], [20, 21, 22, 23]) == 3   # 3 tokens cached: slots 20-22 are duplicates
    assert tree.match_prefix([1, 2, 3, 7])[0] == [10, 11, 12, 23]
    tree.check()


def test_lru_order_and_parent_becomes_leaf():
    tree = RadixCache()
    tree.insert([1, 2, 3], [0, 1, 2])
    tree.insert([1, 2, 4], [0, 1, 5])    # splits after (1, 2); leaves (3,) and (4,)
    tree.insert([7, 8], [6, 7])
    tree.match_prefix([1, 2, 4])          # (4,) and (1, 2) recently used; (3,) and (7, 8) are older
    assert sorted(tree.evict(1)) == [2]   # (3,) is the least recently used leaf
    assert sorted(tree.evict(2)) == [6, 7]
    assert sorted(tree.evict(3)) == [0, 1, 5]  # (4,), then its parent (1, 2) once it became a leaf
    assert tree.total_size() == 0
    tree.check()


def test_locks_nest_and_unbalanced_unlock_fails():
    tree = RadixCache()
    tree.insert([1, 2, 3], [0, 1, 2])
    _, node = tree.match_prefix([1, 2, 3])
    tree.inc_lock(node)
    tree.inc_lock(node)
    tree.dec_lock(node)
    assert tree.evict(5) == [] and tree.protected_size == 3
    tree.dec_lock(node)
    assert sorted(tree.evict(5)) == [0, 1, 2]
    with pytest.raises(RuntimeError):
        tree.dec_lock(node)


def test_the_checks_catch_broken_trees():
    """The invariant check and the comparison with the naive search fail on a corrupted tree."""
    tree, naive = _fill([[1, 2, 3], [1, 2, 4]])
    (top,) = tree.root.children.values()
    top.value = top.value[:-1]                       # slots no longer match the edge
    with pytest.raises(AssertionError):
        tree.check()
    tree, naive = _fill([[1, 2, 3], [1, 2, 4]])
    (top,) = tree.root.children.values()
    next(iter(top.children.values())).value[0] = 99  # a wrong slot: the match disagrees with the naive one
    assert tree.match_prefix([1, 2, 3])[0] != naive.match([1, 2, 3]) or \
        tree.match_prefix([1, 2, 4])[0] != naive.match([1, 2, 4])
    tree, _ = _fill([[1, 2, 3]])
    tree._evictable += 1                             # a drifted size counter
    with pytest.raises(AssertionError):
        tree.check()


@given(st.lists(st.integers(0, 2), max_size=40), st.lists(st.integers(0, 2), max_size=40))
def test_common_prefix_len(a, b):
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert common_prefix_len(a, b) == n


def test_params_reject_impossible_pools():
    with pytest.raises(ParamsError, match="kv_slots"):
        Params.for_scale("quick", kv_slots=100)             # the few-shot chain is 96 + 16 + 4 tokens
    with pytest.raises(ParamsError, match="pressure_kv_slots"):
        Params.for_scale("smoke", pressure_kv_slots=5000)   # holds every template: no pressure
    with pytest.raises(ParamsError, match="chat_turns"):
        Params.for_scale("smoke", chat_turns=40, chat_user=300)   # 16 + 40 x 302: past SmolLM2's 8192 positions


def test_lengths_are_capped_by_the_served_model_not_minilm():
    """SmolLM2 has 8192 positions: prompts past MiniLM's 512 are accepted; one past the model's is rejected,
    naming the field."""
    p = Params.for_scale("quick", fewshot_prefix=4000, noshare_prompt=2000, kv_slots=8192)
    assert (p.fewshot_prefix, p.noshare_prompt) == (4000, 2000)
    for field in ("fewshot_prefix", "noshare_prompt", "pressure_prefix", "tot_question", "chat_system"):
        with pytest.raises(ParamsError, match=field):
            Params.for_scale("quick", **{field: 8193})
