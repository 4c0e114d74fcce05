"""A serving engine around a causal LM over a slot-indexed KV pool (SmolLM2-135M-Instruct,
``llm_serving.smollm2``, by default; the causal MiniLM has the same interface): continuous batching,
with no cache, the radix cache (``tree.RadixCache``) or the block-hash prefix cache of vLLM
(``block_cache.BlockPrefixCache``), and the two admission orders compared in the paper (SGLang,
Sec. 3): first come first served, and longest prefix match first (LPM, the paper's cache-aware
scheduling)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch.nn.utils.rnn import pad_sequence

from mlsys_flows.errors import MlsysError
from mlsys_flows.systems.llm_serving.kv_pool import KVPool
from .block_cache import BlockPrefixCache
from .tree import RadixCache

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


@dataclass
class _Running:
    req: Request
    prompt: list[int]
    node: object | None            # locked cache node covering the cached prefix (None: no cache)
    matched: int                    # leading positions whose slots the cache owns (the rest are the run's)
    slots: torch.Tensor             # slots of positions 0 .. len(prompt) + max_new - 2
    output: list[int] = field(default_factory=list)


@dataclass
class ServeStats:
    wall_s: float = 0.0
    requests: int = 0
    prompt_tokens: int = 0
    prefill_tokens: int = 0       # prompt tokens whose K/V were computed
    output_tokens: int = 0
    decode_steps: int = 0
    evicted_tokens: int = 0
    outputs: dict[int, list[int]] = field(default_factory=dict)
    finished_prefill: list[int] = field(default_factory=list)  # cumulative prefill tokens at each finish
    unaccounted_slots: int = 0    # at the end: pool slots neither free nor cached (serve raises unless 0)

    @property
    def cached_tokens(self) -> int:
        return self.prompt_tokens - self.prefill_tokens

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class Engine:
    def __init__(self, model=None):
        """``model``: a causal LM with the pool interface (``prefill``, ``gather_batch``, ``decode``,
        ``cfg``); None: SmolLM2-135M-Instruct, loaded once per process."""
        if model is None:
            from mlsys_flows.systems.llm_serving.smollm2 import pretrained

            model = pretrained()
        self.model = model
        self.cfg = self.model.cfg

    def serve(self, requests: list[Request], *, kv_slots: int, max_running: int, cache: bool,
              policy: str = "lpm", cache_kind: str = "radix", block_size: int = 16) -> ServeStats:
        """Serve ``requests`` (a request becomes ready when its parent finishes; ready requests
        queue in the order they became ready) and return the counts and the wall time.
        ``cache_kind``: ``radix`` (the tree: any prefix, token by token) or ``block`` (vLLM's automatic
        prefix caching: whole ``block_size``-token blocks keyed by the hash of the prefix); ``policy``:
        ``lpm`` (longest prefix match first) or ``fcfs``. Raises ``SlotLeakError`` when a pool slot is
        neither free nor cached at the end (checked on every pass, after the clock stops)."""
        if policy not in ("lpm", "fcfs"):
            raise ValueError(f"policy must be 'lpm' or 'fcfs' (got {policy!r})")
        if cache_kind not in CACHE_KINDS:
            raise ValueError(f"cache_kind must be one of {', '.join(CACHE_KINDS)} (got {cache_kind!r})")
        longest = longest_sequence(requests)
        if longest > self.cfg.max_positions:
            raise ValueError(f"a request chain needs {longest} positions (prompt + generated tokens) but "
                             f"{self.cfg.name} has {self.cfg.max_positions}")
        # the decode batch's gather buffers are sized (and touched) before the clock starts
        model, pool = self.model, KVPool(self.cfg, kv_slots, batch_tokens=min(max_running, len(requests)) * longest)
        tree = (RadixCache() if cache_kind == "radix" else BlockPrefixCache(block_size)) if cache else None
        children: dict[int | None, list[Request]] = {}
        for r in requests:
            children.setdefault(r.parent, []).append(r)
        full: dict[int, list[int]] = {}   # rid -> prompt + output
        waiting: list[tuple[Request, list[int]]] = [(r, list(r.append)) for r in children.get(None, [])]
        running: list[_Running] = []
        st = ServeStats()
        rows: torch.Tensor | None = None   # the running batch's slot rows; None: rebuild (and re-gather)
        batch_kv = None
        order_key = None  # (tree version, ready count) when the queue was last ordered
        ready = len(waiting)
        t0 = time.perf_counter()
        while waiting or running:
            # ---- admission: prefill as many ready requests as fit in the pool and the batch ----
            if waiting and len(running) < max_running:
                if tree is not None and policy == "lpm" and order_key != (tree.version, ready):
                    depth = {r.rid: len(tree.match_prefix(p[:-1])[0]) for r, p in waiting}
                    waiting.sort(key=lambda rp: -depth[rp[0].rid])  # stable: ties keep arrival order
                    order_key = (tree.version, ready)
                admitted = 0
                while waiting and len(running) < max_running:
                    req, prompt = waiting[0]
                    run = self._admit(req, prompt, pool, tree, st)
                    if run is None:
                        break
                    waiting.pop(0)
                    admitted += 1
                    if len(run.output) == req.max_new:
                        ready += self._finish(run, pool, tree, st, full, children, waiting)
                    else:
                        running.append(run)
                if admitted:
                    rows = None
                elif not running:
                    raise RuntimeError(f"request {waiting[0][0].rid} needs more KV slots than the pool has ({kv_slots})")
            if not running:
                continue
            # ---- one decoding step of the whole running batch ----
            if rows is None:
                rows = pad_sequence([r.slots for r in running], batch_first=True)
                batch_kv = model.gather_batch(pool, rows)
            logits = model.decode(pool, [r.output[-1] for r in running],
                                  [len(r.prompt) + len(r.output) - 1 for r in running], rows, batch_kv)
            st.decode_steps += 1
            nxt = logits.argmax(-1).tolist()
            still = []
            for r, tok in zip(running, nxt):
                r.output.append(tok)
                if len(r.output) == r.req.max_new:
                    ready += self._finish(r, pool, tree, st, full, children, waiting)
                else:
                    still.append(r)
            if len(still) != len(running):
                running, rows = still, None
        st.wall_s = time.perf_counter() - t0
        st.unaccounted_slots = kv_slots - pool.free - (tree.total_size() if tree is not None else 0)
        if st.unaccounted_slots:
            raise SlotLeakError(f"{st.unaccounted_slots} of {kv_slots} KV-pool slots are neither free nor cached "
                                f"after serving {len(requests)} requests ({cache_kind if tree is not None else 'no'} "
                                f"cache, {policy}): the engine leaked them")
        return st

    def _admit(self, req: Request, prompt: list[int], pool: KVPool, tree: RadixCache | None,
               st: ServeStats) -> _Running | None:
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
        slots = torch.tensor(prefix + new, dtype=torch.long)
        m = len(prefix)
        logits = self.model.prefill(pool, prompt[m:], m, slots[:len(prompt)])
        st.prompt_tokens += len(prompt)
        st.prefill_tokens += len(prompt) - m
        run = _Running(req, prompt, node, m, slots, [int(logits.argmax())])
        if tree is not None:   # cache the prompt at once, so requests admitted next can share it
            self._cache(run, prompt, pool, tree)
        return run

    @staticmethod
    def _cache(run: _Running, tokens: list[int], pool: KVPool, tree: RadixCache) -> None:
        """Insert ``tokens`` (a prefix of the run's positions) with the run's slots; free the run's
        duplicates of tokens someone else cached meanwhile, switch to the cache's slots and move the
        lock to the node that now covers what is cached of ``tokens`` (all of them in the tree; the
        whole blocks in the block cache, whose partial last block stays the run's)."""
        n = len(tokens)
        mine = run.slots[:n].tolist()
        have = tree.insert(tokens, mine)
        slots, node = tree.match_prefix(tokens)
        m = len(slots)
        dup = [s for s, t in zip(mine[run.matched:have], slots[run.matched:have]) if s != t]
        if dup:
            pool.release(dup)
            run.slots[:m] = torch.tensor(slots, dtype=torch.long)
        tree.inc_lock(node)
        tree.dec_lock(run.node)
        run.node, run.matched = node, m

    def _finish(self, run: _Running, pool: KVPool, tree: RadixCache | None, st: ServeStats,
                full: dict, children: dict, waiting: list) -> int:
        """Cache (or free) the finished run's K/V; queue its children; returns how many."""
        seq = run.prompt + run.output
        kv_len = len(seq) - 1   # the last output token was never fed back: it has no K/V
        if tree is not None:
            self._cache(run, seq[:kv_len], pool, tree)
            tree.dec_lock(run.node)
            pool.release(run.slots[run.matched:].tolist())   # what the cache did not take (block cache)
        else:
            pool.release(run.slots.tolist())
        st.requests += 1
        st.output_tokens += len(run.output)
        st.outputs[run.req.rid] = list(run.output)
        st.finished_prefill.append(st.prefill_tokens)
        full[run.req.rid] = seq
        kids = children.get(run.req.rid, [])
        for child in kids:
            waiting.append((child, seq + list(child.append)))
        return len(kids)
