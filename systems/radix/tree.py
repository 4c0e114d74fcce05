"""The radix tree of RadixAttention (SGLang, Zheng et al., NeurIPS 2024, Sec. 3): token ids on the
edges, the KV-cache slots of those tokens on the nodes, reference counts that protect the prefixes of
running requests, and LRU eviction of unlocked leaves. Pure Python, no torch.

Every node holds an edge ``key`` (a tuple of token ids, never empty except at the root) and
``value``, the pool slots of exactly those tokens. ``match_prefix`` returns the slots of the longest
cached prefix of a token sequence and splits an edge when the match ends inside it, so that the
returned node covers exactly the matched prefix (it can then be locked on its own).
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Sequence


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if tuple(a[:n]) == tuple(b[:n]):  # the common case (a whole edge matches) at C speed
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]: bisect on prefix equality
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tuple(a[lo:mid]) == tuple(b[lo:mid]):
            lo = mid
        else:
            hi = mid
    return lo


_clock = itertools.count()  # a logical clock: strictly increasing access times, no ties


@dataclass(eq=False)
class Node:
    key: tuple[int, ...] = ()
    value: list[int] = field(default_factory=list)
    parent: "Node | None" = None
    children: dict[int, "Node"] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0

    @property
    def is_leaf(self) -> bool:
        return not self.children


class RadixCache:
    """Prefix cache of token ids -> KV slots. Slots freed by eviction are returned to the caller,
    which owns the pool (see ``KVPool``)."""

    def __init__(self) -> None:
        self.root = Node()
        self.root.lock_ref = 1  # the root is never evicted
        self._evictable = 0     # tokens in nodes with lock_ref == 0
        self._protected = 0     # tokens in locked nodes (root excluded)
        self.version = 0        # bumped whenever cached content changes (insert, evict)

    # --- queries ----------------------------------------------------------------------------------
    def match_prefix(self, tokens: Sequence[int]) -> tuple[list[int], Node]:
        """Slots of the longest cached prefix of ``tokens`` and the node that ends it. Splits an
        edge when the match ends inside it; refreshes the access time of every node on the path."""
        tokens = tuple(tokens)
        node, i, slots = self.root, 0, []
        now = next(_clock)
        node.last_access = now
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            n = common_prefix_len(child.key, tokens[i:i + len(child.key)])
            partial = n < len(child.key)
            if partial:
                child = self._split(child, n)
            child.last_access = now
            slots.extend(child.value)
            node, i = child, i + n
            if partial:
                break
        return slots, node

    def would_match(self, shared: int) -> int:
        """Positions a prompt would match once a sequence sharing its first ``shared`` tokens is
        cached: all of them (the tree caches any prefix, token by token)."""
        return shared

    def _split(self, child: Node, n: int) -> Node:
        """Split ``child``'s edge after ``n`` tokens; returns the new upper node (covering them)."""
        parent = child.parent
        upper = Node(key=child.key[:n], value=child.value[:n], parent=parent,
                     lock_ref=child.lock_ref, last_access=child.last_access)
        child.key, child.value = child.key[n:], child.value[n:]
        child.parent = upper
        upper.children[child.key[0]] = child
        parent.children[upper.key[0]] = upper
        return upper

    # --- updates ----------------------------------------------------------------------------------
    def insert(self, tokens: Sequence[int], slots: Sequence[int]) -> int:
        """Cache ``tokens`` with their ``slots``. Returns how many leading tokens were cached
        already: the caller's slots for those positions that differ from the tree's are duplicates
        to free; the tree owns the rest from now on."""
        tokens, slots = tuple(tokens), list(slots)
        if len(tokens) != len(slots):
            raise ValueError(f"{len(tokens)} tokens but {len(slots)} slots")
        node, i = self.root, 0
        now = next(_clock)
        node.last_access = now
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                new = Node(key=tokens[i:], value=slots[i:], parent=node, last_access=now)
                node.children[tokens[i]] = new
                self._evictable += len(new.key)
                self.version += 1
                return i
            n = common_prefix_len(child.key, tokens[i:i + len(child.key)])
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            node, i = child, i + n
        return i

    def inc_lock(self, node: Node) -> None:
        """Protect the path root..node from eviction (a running request uses it)."""
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError("dec_lock on an unlocked node")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
            node = node.parent

    def evict(self, num_tokens: int) -> list[int]:
        """Free at least ``num_tokens`` slots (or as many as possible) by removing unlocked leaves,
        least recently used first; a parent that becomes an unlocked leaf joins the candidates."""
        heap = [(n.last_access, id(n), n) for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(heap)
        freed: list[int] = []
        self.version += 1
        while len(freed) < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            freed.extend(node.value)
            parent = node.parent
            del parent.children[node.key[0]]
            self._evictable -= len(node.key)
            if parent is not self.root and parent.is_leaf and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return freed

    # --- introspection ----------------------------------------------------------------------------
    def _nodes(self):
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _leaves(self):
        return (n for n in self._nodes() if n.is_leaf and n is not self.root)

    @property
    def evictable_size(self) -> int:
        return self._evictable

    @property
    def protected_size(self) -> int:
        return self._protected

    def total_size(self) -> int:
        return sum(len(n.key) for n in self._nodes())

    def all_slots(self) -> list[int]:
        return [s for n in self._nodes() for s in n.value]

    def sequences(self) -> list[tuple[int, ...]]:
        """Every root-to-leaf token sequence (for checks)."""
        out = []

        def walk(node: Node, prefix: tuple[int, ...]) -> None:
            prefix = prefix + node.key
            if node.is_leaf and node is not self.root:
                out.append(prefix)
            for c in node.children.values():
                walk(c, prefix)

        walk(self.root, ())
        return out

    def check(self) -> None:
        """Raise AssertionError when an invariant is broken (tests call it after every step)."""
        evictable = protected = 0
        for node in self._nodes():
            if node is self.root:
                continue
            assert node.key and len(node.key) == len(node.value), "edge and slots disagree"
            assert node.parent.children.get(node.key[0]) is node, "child indexed by a wrong token"
            assert node.lock_ref >= 0
            assert all(c.lock_ref <= node.lock_ref for c in node.children.values()), "a locked child under a less locked parent"
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
        assert (evictable, protected) == (self._evictable, self._protected), "size counters drifted"
        slots = self.all_slots()
        assert len(slots) == len(set(slots)), "a slot is cached twice"


class NaivePrefixStore:
    """The reference the tree is tested against: a list of cached (tokens, slots) sequences and a
    linear scan for the longest common prefix."""

    def __init__(self) -> None:
        self.entries: list[tuple[tuple[int, ...], list[int]]] = []

    def match(self, tokens: Sequence[int]) -> list[int]:
        best: list[int] = []
        for key, slots in self.entries:
            n = common_prefix_len(key, tokens)
            if n > len(best):
                best = slots[:n]
        return best

    def insert(self, tokens: Sequence[int], slots: Sequence[int]) -> int:
        have = self.match(tokens)
        self.entries.append((tuple(tokens), have + list(slots)[len(have):]))
        return len(have)
