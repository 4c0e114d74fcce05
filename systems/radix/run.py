"""One workload served by every variant, repeats interleaved (pure; torch imported here, not at
package import)."""
from __future__ import annotations

import hashlib
import json

import numpy as np

from mlsys_flows.systems.common.repeats import AdaptiveRepeats

from . import SPEC, TOKEN_IDS
from . import workloads as w
from .engine import Engine, Request, ServeStats

WORKLOADS = ("fewshot", "chat", "tot", "noshare", "pressure")   # the order seeds each workload's requests
LOGIT_CHECKS = 2   # requests per variant and workload whose logits are recomputed (first timed pass)
HEADLINE = "chat"   # the headline's workload: its variants carry no suffix
SUFFIX = {"fewshot": "_fewshot", "chat": "", "tot": "_tot", "noshare": "_noshare", "pressure": "_pressure"}
# variant -> (cache, admission policy, cache kind). block_cache is vLLM's automatic prefix caching with
# its FCFS admission (the strongest deployable baseline); block_cache_lpm the same block cache with the
# radix variant's longest-prefix-match-first admission (the mechanism's ablation: only the token
# granularity of the tree removed); radix_fcfs the tree with FCFS admission (the scheduler's ablation)
VARIANTS = {"no_cache": (False, "fcfs", "radix"), "radix": (True, "lpm", "radix"),
            "radix_fcfs": (True, "fcfs", "radix"), "block_cache": (True, "fcfs", "block"),
            "block_cache_lpm": (True, "lpm", "block")}
REGIME_VARIANTS = ("no_cache", "radix", "block_cache")


def variants_of(workload: str) -> tuple[str, ...]:
    """The variants served on ``workload``: the block cache wherever there is sharing; the ablations
    (block_cache_lpm, radix_fcfs) where they are judged: the headline's chat and the pressure workload."""
    return {"chat": ("no_cache", "radix", "block_cache", "block_cache_lpm"),
            "fewshot": ("no_cache", "radix", "block_cache"),
            "tot": ("no_cache", "radix", "block_cache"),
            "noshare": ("no_cache", "radix"),
            "pressure": ("no_cache", "radix", "radix_fcfs", "block_cache", "block_cache_lpm")}[workload]


def make_requests(p, workload: str) -> list[Request]:
    index = WORKLOADS.index(workload) if workload in WORKLOADS else len(WORKLOADS)  # a regime point
    rng = np.random.default_rng([p.seed, index])
    if workload == "fewshot":
        return w.fewshot(rng, TOKEN_IDS, p.fewshot_requests, p.fewshot_prefix, p.question_len, p.new_tokens)
    if workload == "chat":
        return w.chat(rng, TOKEN_IDS, p.chat_sessions, p.chat_turns, p.chat_system, p.chat_user, p.chat_new_tokens)
    if workload == "tot":
        return w.tree_of_thought(rng, TOKEN_IDS, p.tot_trees, p.tot_branch, p.tot_depth, p.tot_question,
                                 p.tot_step, p.tot_new_tokens)
    if workload == "noshare":
        return w.no_sharing(rng, TOKEN_IDS, p.noshare_requests, p.noshare_prompt, p.new_tokens)
    if workload.startswith("share"):   # the regime: a share of every prompt is one common prefix
        return w.shared_share(rng, TOKEN_IDS, p.regime_requests, p.fewshot_prefix + p.question_len,
                              float(workload[len("share"):]), p.new_tokens)
    if workload == "pressure":
        return w.interleaved_templates(rng, TOKEN_IDS, p.pressure_templates, p.pressure_per_template,
                                       p.pressure_prefix, p.question_len, p.new_tokens)
    raise ValueError(f"unknown workload {workload!r}")


def make_engine(p) -> Engine:
    """An engine on SmolLM2 (weights loaded once per process), ``p.torch_threads`` threads."""
    import torch

    torch.set_num_threads(p.torch_threads)
    return Engine()


def model_note() -> dict:
    """What was served and how long loading its weights took (once per process, never in a timed
    pass; ``load_source``: the dequantized cache under the project's home, or the GGUF file)."""
    from mlsys_flows.systems.llm_serving.smollm2 import pretrained

    model = pretrained()
    cfg = model.cfg
    return {"name": cfg.name, "layers": cfg.layers, "d_model": cfg.d_model, "heads": cfg.heads,
            "kv_heads": cfg.kv_heads, "intermediate": cfg.intermediate, "vocab": cfg.vocab,
            "max_positions": cfg.max_positions, "rope_theta": cfg.rope_theta, "load_s": model.load_s,
            "load_source": model.load_source}


def outputs_digest(st: ServeStats) -> str:
    return hashlib.sha256(json.dumps(sorted(st.outputs.items())).encode()).hexdigest()


def serve(engine: Engine, p, workload: str, variant: str, requests: list[Request], check: int = 0) -> ServeStats:
    """One pass; ``check``: requests whose served logits are recomputed without pool or cache after
    the clock stops (the engine raises past the bound)."""
    cache, policy, kind = VARIANTS[variant]
    slots = p.pressure_kv_slots if workload == "pressure" else p.kv_slots
    return engine.serve(requests, kv_slots=slots, max_running=p.max_running, cache=cache, policy=policy,
                        cache_kind=kind, block_size=p.block_size, check=check)


def warm_up(engine: Engine, p, workload: str, names, requests: list[Request]) -> None:
    """One untimed pass of every variant on the first eighth of ``requests`` (parents precede
    children): allocator, kernels, caches of the interpreter. Off (``p.warmup``) at smoke, whose
    timings decide nothing."""
    if p.warmup:
        for v in names:
            serve(engine, p, workload, v, requests[: max(2, len(requests) // 8)])


def regime_workload(share: float) -> str:
    return f"share{share:g}"


def measure_regime(p, log=None) -> dict[float, dict[str, list[float]]]:
    """Requests/s of no cache, the radix cache and the block cache at every shared-prefix share of
    ``p.regime_shared_share``: ``p.regime_requests`` prompts of the few-shot length whose first share of
    tokens is common, ``p.regime_repeats`` timed passes per variant (interleaved, their order rotated;
    one warm-up pass of each variant before the first point: the points share the process's warm state)."""
    eng = make_engine(p)
    out = {}
    for i, share in enumerate(p.regime_shared_share):
        name = regime_workload(share)
        requests = make_requests(p, name)
        rates: dict[str, list[float]] = {v: [] for v in REGIME_VARIANTS}
        if i == 0:
            warm_up(eng, p, name, REGIME_VARIANTS, requests)
        k = len(REGIME_VARIANTS)
        for rep in range(p.regime_repeats):
            for v in REGIME_VARIANTS[rep % k:] + REGIME_VARIANTS[:rep % k]:
                st = serve(eng, p, name, v, requests)
                rates[v].append(st.requests / st.wall_s)
        if log:
            log(f"shared share {share:g}: " + ", ".join(f"{v} {sorted(r)[len(r) // 2]:.3g} req/s" for v, r in rates.items()))
        out[float(share)] = rates
    return out


def measure(p, workload: str, log=None) -> dict:
    """Serve ``workload`` with each of its variants ``p.repeats`` times, variants interleaved and
    their order rotated per repeat, after one untimed warm-up pass of each. Counts come from the
    first timed pass (every pass of a variant serves the same requests the same way)."""
    eng = make_engine(p)
    requests = make_requests(p, workload)
    names = variants_of(workload)
    warm_up(eng, p, workload, names, requests)
    rates: dict[str, list[float]] = {v: [] for v in names}
    first: dict[str, ServeStats] = {}
    digests: dict[str, set[str]] = {v: set() for v in names}
    # the headline's workload repeats until its verdict decides (within max_repeats / the budget)
    reps = p.adaptive_repeats() if workload == HEADLINE else AdaptiveRepeats(p.repeats)
    for rep in reps:
        order = names[rep % len(names):] + names[:rep % len(names)]
        for v in order:
            st = serve(eng, p, workload, v, requests, check=0 if v in first else LOGIT_CHECKS)
            rates[v].append(st.requests / st.wall_s)
            digests[v].add(outputs_digest(st))
            first.setdefault(v, st)
            if log:
                log(f"{workload}/{v}: {st.requests} requests in {st.wall_s:.3f} s, prefill {st.prefill_tokens} "
                    f"of {st.prompt_tokens} prompt tokens, hit rate {st.hit_rate:.3f}")
        reps.record_headline(SPEC, {v + SUFFIX[workload]: r for v, r in rates.items()})
    if log and reps.adaptive:
        log(f"{workload}: {reps.done} repeats, stopped: {reps.stopped}")
    out = {"workload": workload, "rates": rates, "metrics": {}, "finished_prefill": {}, "repeats": reps.summary(),
           "digests": {v: sorted(d) for v, d in digests.items()}, "model": model_note(), "logit_check": {}}
    for v, st in first.items():
        out["metrics"][v] = {
            "prefill_tokens": float(st.prefill_tokens), "prompt_tokens": float(st.prompt_tokens),
            "prefill_tokens_saved": float(st.cached_tokens), "hit_rate": st.hit_rate,
            "evicted_tokens": float(st.evicted_tokens), "decode_steps": float(st.decode_steps),
            "output_tokens": float(st.output_tokens), "requests": float(st.requests)}
        out["logit_check"][v] = {"max_rel": st.logit_check, "requests": st.logit_checked, "prefill_calls": st.prefill_calls,
                                 "lane_moves": st.lane_moves}
        out["finished_prefill"][v] = list(st.finished_prefill)
    return out
