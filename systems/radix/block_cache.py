"""A block-hash prefix cache: vLLM's automatic prefix caching (Kwon et al., SOSP 2023, and vLLM's
"automatic prefix caching" design), the prefix reuse practitioners deploy. Pure Python, no torch.

The KV of a sequence is cut into fixed-size blocks of ``block_size`` tokens. A *full* block is
cached under the hash of the whole prefix up to and including it, computed as a chain
(hash(parent block's hash, this block's tokens)), so a lookup walks the blocks of a new prompt in
order and stops at the first block whose prefix hash is unknown. A partial last block is never
cached. Blocks hold reference counts for the running requests that use them; a block nobody
references stays cached and is evicted least recently used first. As in vLLM, where the blocks
a request frees are queued tail first, a block is evicted only after the blocks that continue it
(children), so the cached blocks always form prefix-closed chains and a hit is always contiguous.

Same interface shape as the radix tree (``tree.RadixCache``) offers the engine: ``match_prefix``
returns the slots of the longest cached prefix (whole blocks only) and a handle (the last matched
block) to ``inc_lock``/``dec_lock``; ``insert`` caches the full blocks of a sequence and returns how
many leading tokens were cached already; ``evict`` frees slots of unreferenced blocks. Unlike the
tree, tokens past the last full block are *not* taken over by ``insert``: the caller keeps and
frees them (``cacheable`` says how many tokens a sequence contributes).
"""
from __future__ import annotations

import hashlib
import heapq
import itertools
from dataclasses import dataclass, field
from typing import Sequence

_clock = itertools.count(1)  # logical access times: strictly increasing, no ties


def block_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The hash of a prefix: its parent prefix's hash chained with this block's token ids (a
    128-bit BLAKE2b digest: equal prefixes hash equal, a collision is negligible)."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(b"".join(int(t).to_bytes(8, "little", signed=True) for t in tokens))
    return h.digest()


ROOT_HASH = b"\0" * 16


@dataclass(eq=False)
class Block:
    key: bytes                       # hash of the whole prefix up to and including this block
    tokens: tuple[int, ...] = ()     # this block's token ids (kept for checks and introspection)
    slots: list[int] = field(default_factory=list)
    parent: "Block | None" = None
    children: dict[bytes, "Block"] = field(default_factory=dict)
    depth: int = 0                   # blocks from the root (the root is 0)
    ref: int = 0                     # running requests holding this block
    last_access: int = 0

    # the tree's node vocabulary, so code written against ``RadixCache`` reads the handle the same way
    @property
    def lock_ref(self) -> int:
        return self.ref

    @property
    def value(self) -> list[int]:
        return self.slots

    @property
    def is_leaf(self) -> bool:
        return not self.children


class BlockPrefixCache:
    """Prefix cache of token ids -> KV slots in fixed-size hashed blocks. Slots freed by eviction
    are returned to the caller, which owns the pool (see ``KVPool``)."""

    def __init__(self, block_size: int = 16) -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive integer (got {block_size!r})")
        self.block_size = block_size
        self.root = Block(ROOT_HASH)
        self.root.ref = 1               # the root is never evicted
        self.blocks: dict[bytes, Block] = {}
        self._evictable = 0             # tokens in blocks with ref == 0
        self._protected = 0             # tokens in referenced blocks
        self.version = 0                # bumped whenever cached content changes (insert, evict)

    def cacheable(self, n: int) -> int:
        """Tokens of an n-token sequence that can be cached: its full blocks."""
        return n - n % self.block_size

    def would_match(self, shared: int) -> int:
        """Positions a prompt would match once a sequence sharing its first ``shared`` tokens is
        cached: the whole blocks among them (a partial block is never cached, so waiting for one
        gains nothing)."""
        return self.cacheable(shared)

    # --- queries ----------------------------------------------------------------------------------
    def _walk(self, tokens: Sequence[int]):
        """Yield (block tokens, hash, cached block or None) for each full block of ``tokens``."""
        B, parent = self.block_size, ROOT_HASH
        for i in range(0, self.cacheable(len(tokens)), B):
            chunk = tuple(int(t) for t in tokens[i:i + B])
            key = block_hash(parent, chunk)
            yield chunk, key, self.blocks.get(key)
            parent = key

    def match_prefix(self, tokens: Sequence[int]) -> tuple[list[int], Block]:
        """Slots of the longest cached prefix of ``tokens`` in whole blocks, and its last block (the
        root when nothing matches). Refreshes the access time of every matched block."""
        node, slots = self.root, []
        now = next(_clock)
        node.last_access = now
        for chunk, _, block in self._walk(tokens):
            if block is None or block.tokens != chunk:
                break
            block.last_access = now
            slots.extend(block.slots)
            node = block
        return slots, node

    # --- updates ----------------------------------------------------------------------------------
    def insert(self, tokens: Sequence[int], slots: Sequence[int]) -> int:
        """Cache the full blocks of ``tokens`` with their ``slots``. Returns how many leading tokens
        were cached already: the caller's slots for those positions that differ from the cache's are
        duplicates to free; the cache owns the slots of the newly cached blocks from now on, and the
        caller keeps those past the last full block (``cacheable``)."""
        if len(tokens) != len(slots):
            raise ValueError(f"{len(tokens)} tokens but {len(slots)} slots")
        B = self.block_size
        node, have = self.root, None
        now = next(_clock)
        node.last_access = now
        for i, (chunk, key, block) in enumerate(self._walk(tokens)):
            if block is None:
                if have is None:
                    have = i * B
                block = Block(key, chunk, [int(s) for s in slots[i * B:(i + 1) * B]], parent=node,
                              depth=node.depth + 1, last_access=now)
                self.blocks[key] = block
                node.children[key] = block
                self._evictable += B
                self.version += 1
            elif block.tokens != chunk:   # pragma: no cover - a 128-bit collision
                raise RuntimeError("block hash collision")
            block.last_access = now
            node = block
        return self.cacheable(len(tokens)) if have is None else have

    def inc_lock(self, node: Block) -> None:
        """Reference every block of the chain root..node (a running request uses it)."""
        while node is not self.root:
            if node.ref == 0:
                self._evictable -= len(node.slots)
                self._protected += len(node.slots)
            node.ref += 1
            node = node.parent

    def dec_lock(self, node: Block) -> None:
        while node is not self.root:
            if node.ref <= 0:
                raise RuntimeError("dec_lock on an unreferenced block")
            node.ref -= 1
            if node.ref == 0:
                self._evictable += len(node.slots)
                self._protected -= len(node.slots)
            node = node.parent

    def evict(self, num_tokens: int) -> list[int]:
        """Free at least ``num_tokens`` slots (or as many as possible) by dropping unreferenced
        blocks that no cached block continues, least recently used first, so a chain is freed from
        its tail; a parent left without children joins the candidates."""
        heap = [(b.last_access, id(b), b) for b in self.blocks.values() if b.ref == 0 and not b.children]
        heapq.heapify(heap)
        freed: list[int] = []
        self.version += 1
        while len(freed) < num_tokens and heap:
            *_, block = heapq.heappop(heap)
            freed.extend(block.slots)
            parent = block.parent
            del parent.children[block.key]
            del self.blocks[block.key]
            self._evictable -= len(block.slots)
            if parent is not self.root and not parent.children and parent.ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return freed

    # --- introspection ----------------------------------------------------------------------------
    @property
    def evictable_size(self) -> int:
        return self._evictable

    @property
    def protected_size(self) -> int:
        return self._protected

    def total_size(self) -> int:
        return sum(len(b.slots) for b in self.blocks.values())

    def all_slots(self) -> list[int]:
        return [s for b in self.blocks.values() for s in b.slots]

    def sequences(self) -> list[tuple[int, ...]]:
        """Every cached chain that no block continues, as token ids (for checks)."""
        out = []
        for b in self.blocks.values():
            if b.children:
                continue
            chain, node = [], b
            while node is not self.root:
                chain.append(node.tokens)
                node = node.parent
            out.append(tuple(t for blk in reversed(chain) for t in blk))
        return out

    def check(self) -> None:
        """Raise AssertionError when an invariant is broken (tests call it after every step)."""
        evictable = protected = 0
        B = self.block_size
        for key, b in self.blocks.items():
            assert b.key == key and len(b.tokens) == len(b.slots) == B, "a block is not full or misfiled"
            assert b.parent is not None and b.parent.children.get(key) is b, "block not under its parent"
            assert b.parent is self.root or self.blocks.get(b.parent.key) is b.parent, "parent not cached"
            assert key == block_hash(b.parent.key, b.tokens), "hash is not the prefix's"
            assert b.depth == b.parent.depth + 1
            assert b.ref >= 0 and all(c.ref <= b.ref for c in b.children.values()), "a child referenced more than its parent"
            if b.ref:
                protected += B
            else:
                evictable += B
        assert (evictable, protected) == (self._evictable, self._protected), "size counters drifted"
        slots = self.all_slots()
        assert len(slots) == len(set(slots)), "a slot is cached twice"
