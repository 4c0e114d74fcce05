"""Mini-batch policies (root orders) and the vectorised fanout neighbour sampler (numpy, pure).

Policies, each one epoch's list of root batches of ``batch_size`` training nodes:
- ``random``: the training nodes uniformly shuffled (the usual GNN mini-batching);
- ``community``: the training nodes in id order, i.e. community by community in a fixed order;
- ``comm_rand``: COMM-RAND: the communities shuffled, grouped ``k`` at a time, the nodes of a group
  shuffled together, groups concatenated and cut into batches: a batch's roots come from the ``k``
  randomly chosen communities of its group (from two groups where a batch straddles a boundary),
  and the grouping changes every epoch;
- ``comm_fixed``: COMM-RAND without its randomisation over communities (the mechanism's ablation):
  groups of ``k`` communities and the nodes inside a group shuffled with the same random keys as
  COMM-RAND's (the group order is drawn from a separate generator), but the groups are consecutive
  community ids, visited in id order, the same every epoch.

The sampler draws ``fanout`` neighbours per node with replacement (positions uniform in the CSR
row). With ``bias`` p > 0 each draw comes, with probability p, from the node's same-community
neighbours only (the first ``intra_end - indptr`` entries of its row), else from the whole row.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .graph import Graph

POLICIES = ("random", "community", "comm_rand", "comm_fixed")
PAGE_BYTES = 4096


def random_batches(train: np.ndarray, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    return _cut(rng.permutation(train), batch_size)


def community_batches(train: np.ndarray, batch_size: int) -> list[np.ndarray]:
    return _cut(np.sort(train), batch_size)


def comm_rand_batches(train: np.ndarray, comm_of_train: np.ndarray, k: int, batch_size: int,
                      rng: np.random.Generator, randomise_communities: bool = True) -> list[np.ndarray]:
    """COMM-RAND's roots; ``randomise_communities=False`` is the ablation (``comm_fixed``): groups of
    consecutive community ids in id order, every epoch the same, nodes still shuffled inside a group.

    The group order comes from a generator of its own, seeded by one draw from ``rng`` that both variants
    make (the ablation discards it): what follows in ``rng`` (the keys that shuffle the roots inside the
    groups, then the neighbour sampling) is the same stream in both, so a node gets the same key in both
    and two roots of one community keep the same relative order."""
    present = np.unique(comm_of_train)
    order_rng = np.random.default_rng(int(rng.integers(2**63)))
    order = order_rng.permutation(present) if randomise_communities else present
    group_of_comm = np.empty(int(present.max()) + 1, np.int64)
    group_of_comm[order] = np.arange(len(order)) // k
    # a random key inside each group shuffles the group's nodes; the group index orders the groups
    key = group_of_comm[comm_of_train] + rng.random(len(train))
    return _cut(train[np.argsort(key, kind="stable")], batch_size)


def _cut(ids: np.ndarray, batch_size: int) -> list[np.ndarray]:
    return [ids[i:i + batch_size] for i in range(0, len(ids), batch_size)]


def policy_batches(policy: str, g: Graph, batch_size: int, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    if policy == "random":
        return random_batches(g.train, batch_size, rng)
    if policy == "community":
        return community_batches(g.train, batch_size)
    if policy == "comm_rand":
        return comm_rand_batches(g.train, g.community_of(g.train), k, batch_size, rng)
    if policy == "comm_fixed":
        return comm_rand_batches(g.train, g.community_of(g.train), k, batch_size, rng, randomise_communities=False)
    raise ValueError(f"unknown policy {policy!r}; one of {', '.join(POLICIES)}")


def sample_neighbors(g: Graph, targets: np.ndarray, fanout: int, rng: np.random.Generator,
                     bias: float = 0.0) -> np.ndarray:
    """[len(targets), fanout] neighbour ids (a node without neighbours samples itself)."""
    start = g.indptr[targets]
    deg = g.indptr[targets + 1] - start
    u = rng.random((len(targets), fanout))
    span = np.broadcast_to(deg[:, None], u.shape)
    if bias > 0.0:
        intra = (g.intra_end[targets] - start)[:, None]
        span = np.where((rng.random(u.shape) < bias) & (intra > 0), intra, span)
    pos = start[:, None] + (u * span).astype(np.int64)
    nbrs = g.indices[np.minimum(pos, len(g.indices) - 1)]
    return np.where(deg[:, None] > 0, nbrs, targets[:, None])


@dataclass
class Block:
    """One layer of a sampled batch: dst node i aggregates src rows ``nbr[i, :]`` and its own row ``self_idx[i]``."""

    src_nodes: np.ndarray  # int64, sorted unique ids of the block's source nodes
    self_idx: np.ndarray   # int64 [n_dst], position of each dst node among the src nodes
    nbr: np.ndarray        # int64 [n_dst, fanout], positions of the sampled neighbours among the src nodes


@dataclass
class Batch:
    roots: np.ndarray
    input_nodes: np.ndarray   # sorted unique node ids whose features the batch gathers
    blocks: list[Block]       # input side first (the first layer's block), roots' block last


def sample_batch(g: Graph, roots: np.ndarray, fanouts: tuple[int, ...], rng: np.random.Generator,
                 bias: float = 0.0) -> Batch:
    """Sample ``len(fanouts)`` hops outward from ``roots`` (fanouts[0] at the roots), deduplicating the
    nodes of each hop as DGL's message-flow graphs do; the blocks are returned input side first."""
    dst = np.asarray(roots, np.int64)
    blocks = []
    for f in fanouts:
        nbrs = sample_neighbors(g, dst, f, rng, bias)
        src, inv = np.unique(np.concatenate([dst, nbrs.ravel()]), return_inverse=True)
        blocks.append(Block(src_nodes=src, self_idx=inv[:len(dst)], nbr=inv[len(dst):].reshape(len(dst), f)))
        dst = src
    return Batch(roots=np.asarray(roots, np.int64), input_nodes=dst, blocks=blocks[::-1])


def pages_touched(rows: np.ndarray, row_bytes: int, page_bytes: int = PAGE_BYTES) -> int:
    """Distinct ``page_bytes`` pages of a C-contiguous array of ``row_bytes`` rows that reading ``rows`` touches."""
    rows = np.asarray(rows, np.int64)
    first = rows * row_bytes // page_bytes
    last = (rows * row_bytes + row_bytes - 1) // page_bytes
    span = last - first + 1
    pages = np.repeat(first, span) + (np.arange(int(span.sum())) - np.repeat(np.cumsum(span) - span, span))
    return int(len(np.unique(pages)))
