"""A serving engine around a causal LM over a slot-indexed KV pool (SmolLM2-135M-Instruct,
``llm_serving.smollm2``, by default; the causal MiniLM has the same interface): continuous batching,
with no cache, the radix cache (``tree.RadixCache``) or the block-hash prefix cache of vLLM
(``block_cache.BlockPrefixCache``), and the two admission orders compared in the paper (SGLang,
Sec. 3): first come first served, and longest prefix match first (LPM, the paper's cache-aware
scheduling).

The batching itself (newcomers prefilled together, the persistent lane K/V of the running batch,
sampling, the logit check) is the serving family's core, ``llm_serving.engine.Batch``, the one
metropolis's model server runs too; what is here is the cache and the admission order.

Prefilling the newcomers of a round together would lose reuse between two of them that share a
prefix the cache does not hold yet (neither is cached before both are computed). As SGLang's
in-batch prefix check does, a candidate that would match more once a request admitted in the
same round is cached (the shared tokens in the tree, only the whole blocks among them in the
block cache: the cache says, ``would_match``) than the cache gives it now waits for that round's
prefill (which caches the earlier one's prompt) and is matched again: every request reuses exactly
what it would reuse admitted alone, and no cache waits for what it could not gain.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from mlsys_flows.errors import MlsysError
from mlsys_flows.systems.llm_serving.engine import Batch, Sampler, Seq, check_logits
from mlsys_flows.systems.llm_serving.kv_pool import KVPool
from .block_cache import BlockPrefixCache
from .tree import RadixCache, common_prefix_len

CACHE_KINDS = ("radix", "block")


class SlotLeakError(MlsysError, RuntimeError):
    """A pass ended with KV-pool slots that are neither free nor cached: the engine lost track of them."""


@dataclass(frozen=True)
class Request:
    """``append`` follows the parent's prompt and output (``parent`` None: the whole prompt)."""
    rid: int
    parent: int | None
    append: tuple[int, ...]
    max_new: int


def longest_sequence(requests: list[Request]) -> int:
    """Positions of the longest request chain (its prompts and outputs): what the model must hold."""
    by_id = {r.rid: r for r in requests}
    memo: dict[int, int] = {}

    def length(rid: int) -> int:
        if rid not in memo:
            r = by_id[rid]
            memo[rid] = (length(r.parent) if r.parent is not None else 0) + len(r.append) + r.max_new
        return memo[rid]

    return max((length(r.rid) for r in requests), default=0)


@dataclass(eq=False)
class _Running:
    req: Request
    seq: Seq                        # what the batch runs (prompt, slots, output)
    node: object | None             # locked cache node covering the cached prefix (None: no cache)
    matched: int                    # leading positions whose slots the cache owns (the rest are the run's)
    reused: int = 0                 # prompt positions served from the cache at admission


@dataclass
class ServeStats:
    wall_s: float = 0.0
    requests: int = 0
    prompt_tokens: int = 0
    prefill_tokens: int = 0       # prompt tokens whose K/V were computed
    output_tokens: int = 0
    decode_steps: int = 0
    prefill_calls: int = 0        # packed prefill calls (each prefills one round's newcomers)
    lane_moves: int = 0           # batch lanes copied when a request left (the persistent batch K/V)
    evicted_tokens: int = 0
    outputs: dict[int, list[int]] = field(default_factory=dict)
    finished_prefill: list[int] = field(default_factory=list)  # cumulative prefill tokens at each finish
    unaccounted_slots: int = 0    # at the end: pool slots neither free nor cached (serve raises unless 0)
    logit_check: float | None = None   # worst served-vs-recomputed logit difference / scale (checked requests)
    logit_checked: int = 0

    @property
    def cached_tokens(self) -> int:
        return self.prompt_tokens - self.prefill_tokens

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class Engine:
    def __init__(self, model=None):
        """``model``: a causal LM with the pool interface (``prefill_batch``, ``decode``, ``full_logits``,
        ``cfg``); None: SmolLM2-135M-Instruct, loaded once per process."""
        if model is None:
            from mlsys_flows.systems.llm_serving.smollm2 import pretrained

            model = pretrained()
        self.model = model
        self.cfg = self.model.cfg

    def serve(self, requests: list[Request], *, kv_slots: int, max_running: int, cache: bool,
              policy: str = "lpm", cache_kind: str = "radix", block_size: int = 16, batched_prefill: bool = True,
              check: int = 0) -> ServeStats:
        """Serve ``requests`` (a request becomes ready when its parent finishes; ready requests
        queue in the order they became ready) and return the counts and the wall time.
        ``cache_kind``: ``radix`` (the tree: any prefix, token by token) or ``block`` (vLLM's automatic
        prefix caching: whole ``block_size``-token blocks keyed by the hash of the prefix); ``policy``:
        ``lpm`` (longest prefix match first) or ``fcfs``; ``batched_prefill`` False prefills one
        request at a time (the reference the tests compare with). Greedy decoding: every cache
        variant must produce the same tokens. ``check``: after the clock stops, recompute the last
        logits of that many finished requests (the one that reused the most cached prefix first)
        without pool or cache, and raise ``LogitCheckError`` past the bound. Raises
        ``SlotLeakError`` when a pool slot is neither free nor cached at the end (checked on every
        pass, after the clock stops)."""
        self._keep = check > 0
        if policy not in ("lpm", "fcfs"):
            raise ValueError(f"policy must be 'lpm' or 'fcfs' (got {policy!r})")
        if cache_kind not in CACHE_KINDS:
            raise ValueError(f"cache_kind must be one of {', '.join(CACHE_KINDS)} (got {cache_kind!r})")
        longest = longest_sequence(requests)
        if longest > self.cfg.max_positions:
            raise ValueError(f"a request chain needs {longest} positions (prompt + generated tokens) but "
                             f"{self.cfg.name} has {self.cfg.max_positions}")
        # the batch's lane buffers are allocated (and touched) before the clock starts
        pool = KVPool(self.cfg, kv_slots)
        batch = Batch(self.model, pool, lanes=max(1, min(max_running, len(requests))), cap=max(1, longest),
                      sampler=Sampler())
        tree = (RadixCache() if cache_kind == "radix" else BlockPrefixCache(block_size)) if cache else None
        children: dict[int | None, list[Request]] = {}
        for r in requests:
            children.setdefault(r.parent, []).append(r)
        waiting: list[tuple[Request, list[int]]] = [(r, list(r.append)) for r in children.get(None, [])]
        st = ServeStats()
        done: list[_Running] = []
        order_key = None  # (tree version, ready count) when the queue was last ordered
        ready = len(waiting)
        t0 = time.perf_counter()
        while waiting or batch.running:
            # ---- admission: reserve as many ready requests as fit in the pool and the batch, prefill them together ----
            if waiting and len(batch.running) < max_running:
                if tree is not None and policy == "lpm" and order_key != (tree.version, ready):
                    depth = {r.rid: len(tree.match_prefix(p[:-1])[0]) for r, p in waiting}
                    waiting.sort(key=lambda rp: -depth[rp[0].rid])  # stable: ties keep arrival order
                    order_key = (tree.version, ready)
                admitted = 0
                pending: list[_Running] = []
                while waiting and len(batch.running) + len(pending) < max_running:
                    req, prompt = waiting[0]
                    if pending and (not batched_prefill or self._shares_uncached(prompt, pending, tree)):
                        ready += self._prefill(batch, pending, pool, tree, st, done, children, waiting)
                        pending = []
                        continue
                    run = self._reserve(req, prompt, pool, tree, st)
                    if run is None:
                        break
                    waiting.pop(0)
                    admitted += 1
                    pending.append(run)
                ready += self._prefill(batch, pending, pool, tree, st, done, children, waiting)
                if not admitted and not batch.running:
                    raise RuntimeError(f"request {waiting[0][0].rid} needs more KV slots than the pool has ({kv_slots})")
            if not batch.running:
                continue
            # ---- one decoding step of the whole running batch ----
            for s in batch.step():
                ready += self._finish(s.tag, pool, tree, st, done, children, waiting)
        st.wall_s = time.perf_counter() - t0
        st.decode_steps, st.prefill_calls, st.lane_moves = batch.decode_steps, batch.prefill_calls, batch.kv.moves
        st.unaccounted_slots = kv_slots - pool.free - (tree.total_size() if tree is not None else 0)
        if st.unaccounted_slots:
            raise SlotLeakError(f"{st.unaccounted_slots} of {kv_slots} KV-pool slots are neither free nor cached "
                                f"after serving {len(requests)} requests ({cache_kind if tree is not None else 'no'} "
                                f"cache, {policy}): the engine leaked them")
        if check:
            best = sorted(done, key=lambda r: -r.reused)   # stable: the first finished among equals
            picked = best[:check - 1] + done[-1:] if check > 1 else best[:1]
            seqs = list({id(r.seq): r.seq for r in picked}.values())
            st.logit_check = check_logits(self.model, seqs, f"{cache_kind if tree is not None else 'no'} cache, {policy}")
            st.logit_checked = len(seqs)
        return st

    @staticmethod
    def _shares_uncached(prompt: list[int], pending: list[_Running], tree) -> bool:
        """Would ``prompt`` reuse more once the round's pending requests are cached? (SGLang's
        in-batch prefix check.) What waiting gains is what the cache would match of the longest
        prefix shared with a pending prompt (``would_match``: every shared token in the tree, the
        whole blocks among them in the block cache), compared with what it matches now. Without a
        cache nothing is reused: never."""
        if tree is None:
            return False
        shared = max(common_prefix_len(prompt[:-1], r.seq.prompt) for r in pending)
        return tree.would_match(shared) > len(tree.match_prefix(prompt[:-1])[0])

    def _reserve(self, req: Request, prompt: list[int], pool: KVPool, tree, st: ServeStats) -> _Running | None:
        """Match the cached prefix, lock it, and allocate the rest (evicting if the pool is short)."""
        need_total = len(prompt) + req.max_new - 1       # positions that get K/V
        if tree is not None:  # keep at least the last prompt token to compute: its logits start decoding
            prefix, node = tree.match_prefix(prompt[:-1])
            tree.inc_lock(node)                          # before evicting: the match must survive
        else:
            prefix, node = [], None
        need = need_total - len(prefix)
        if pool.free < need and tree is not None:
            freed = tree.evict(need - pool.free)
            st.evicted_tokens += len(freed)
            pool.release(freed)
        new = pool.alloc(need)
        if new is None:
            if tree is not None:
                tree.dec_lock(node)
            return None
        m = len(prefix)
        st.prompt_tokens += len(prompt)
        st.prefill_tokens += len(prompt) - m
        seq = Seq(key=req.rid, prompt=prompt, max_new=req.max_new, slots=torch.tensor(prefix + new, dtype=torch.long),
                  start=m, keep_logits=self._keep)
        run = _Running(req, seq, node, m, reused=m)
        seq.tag = run
        return run

    def _prefill(self, batch: Batch, pending: list[_Running], pool: KVPool, tree, st: ServeStats, done: list,
                 children: dict, waiting: list) -> int:
        """Prefill the round's reserved requests in one call; cache their prompts at once (so requests
        admitted next can share them); the unfinished join the batch. Returns children queued."""
        if not pending:
            return 0
        batch.prefill([r.seq for r in pending])
        queued = 0
        for run in pending:
            if tree is not None:
                self._cache(run, run.seq.prompt, pool, tree)
            if run.seq.done:
                queued += self._finish(run, pool, tree, st, done, children, waiting)
            else:
                batch.join(run.seq)
        return queued

    @staticmethod
    def _cache(run: _Running, tokens: list[int], pool: KVPool, tree: RadixCache) -> None:
        """Insert ``tokens`` (a prefix of the run's positions) with the run's slots; free the run's
        duplicates of tokens someone else cached meanwhile, switch to the cache's slots and move the
        lock to the node that now covers what is cached of ``tokens`` (all of them in the tree; the
        whole blocks in the block cache, whose partial last block stays the run's)."""
        n = len(tokens)
        run_slots = run.seq.slots
        mine = run_slots[:n].tolist()
        have = tree.insert(tokens, mine)
        slots, node = tree.match_prefix(tokens)
        m = len(slots)
        dup = [s for s, t in zip(mine[run.matched:have], slots[run.matched:have]) if s != t]
        if dup:
            pool.release(dup)
            run_slots[:m] = torch.tensor(slots, dtype=torch.long)
        tree.inc_lock(node)
        tree.dec_lock(run.node)
        run.node, run.matched = node, m

    def _finish(self, run: _Running, pool: KVPool, tree, st: ServeStats, done: list, children: dict,
                waiting: list) -> int:
        """Cache (or free) the finished run's K/V; queue its children; returns how many."""
        seq = run.seq.prompt + run.seq.output
        kv_len = len(seq) - 1   # the last output token was never fed back: it has no K/V
        if tree is not None:
            self._cache(run, seq[:kv_len], pool, tree)
            tree.dec_lock(run.node)
            pool.release(run.seq.slots[run.matched:].tolist())   # what the cache did not take (block cache)
        else:
            pool.release(run.seq.slots.tolist())
        st.requests += 1
        st.output_tokens += len(run.seq.output)
        st.outputs[run.req.rid] = list(run.seq.output)
        st.finished_prefill.append(st.prefill_tokens)
        done.append(run)
        kids = children.get(run.req.rid, [])
        for child in kids:
            waiting.append((child, seq + list(child.append)))
        return len(kids)
