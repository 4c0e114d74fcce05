"""The catalogue of systems: one entry per paper technique in SYSTEMS.md.

Pure data (no prefect/dask imports) so the CLI can list systems instantly. A system is
``implemented`` when its flow module ``flows/<name>.py`` exists; the flow harness reads the
claim here to build the RunReport's headline, so a headline is always oriented the same way.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import asdict, dataclass
from typing import Any, Literal

Better = Literal["higher", "lower"]


@dataclass(frozen=True)
class Claim:
    metric: str          # key in each variant's metrics
    baseline: str        # variant name of the paper's baseline
    technique: str       # variant name of the technique
    better: Better       # which direction of the raw metric wins
    paper_ratio: float | None  # the paper's value, oriented so >1 means the technique wins
    statement: str       # the claim in words, with the paper's own numbers


@dataclass(frozen=True)
class SystemSpec:
    name: str
    title: str
    paper: str
    family: str
    claim: Claim

    @property
    def module(self) -> str:
        return f"mlsys_flows.flows.{self.name}"

    @property
    def entrypoint(self) -> str:
        """Prefect entrypoint, relative to the repository root."""
        return f"flows/{self.name}.py:{self.name}"

    @property
    def status(self) -> str:
        try:
            found = importlib.util.find_spec(self.module) is not None
        except ModuleNotFoundError:
            found = False
        return "implemented" if found else "planned"

    def load_flow(self):
        """The Prefect flow object (imports prefect)."""
        return getattr(importlib.import_module(self.module), self.name)

    def params_model(self):
        """The system's pydantic parameter model, ``Params`` in ``systems/<name>/`` (pure)."""
        return getattr(importlib.import_module(f"mlsys_flows.systems.{self.name}"), "Params")

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "paper": self.paper, "family": self.family,
                "status": self.status, "entrypoint": self.entrypoint, "claim": asdict(self.claim)}


def _s(name, title, paper, family, metric, baseline, technique, better, paper_ratio, statement) -> SystemSpec:
    return SystemSpec(name, title, paper, family, Claim(metric, baseline, technique, better, paper_ratio, statement))


SYSTEMS: tuple[SystemSpec, ...] = (
    # Input data pipelines
    _s("cedar", "cedar: composable, optimized ML input pipelines", "arXiv:2401.08895", "input-data",
       "samples_per_s", "dataloader", "cedar_optimized", "higher", 2.74,
       "2.74x vs PyTorch DataLoader (average of six pipelines); 2.49x vs tf.data, 2.18x vs Ray Data"),
    _s("recd", "RecD: deduplicated recommendation training data (IKJT)", "arXiv:2211.05239", "input-data",
       "train_samples_per_s", "kjt", "ikjt", "higher", 2.48,
       "up to 2.48x training throughput, 1.79x preprocessing throughput, 3.71x storage efficiency"),
    _s("dsi", "DSI/DPP: disaggregated data preprocessing", "arXiv:2108.09373", "input-data",
       "trainer_samples_per_s", "inline", "dpp", "higher", round(1 / (1 - 0.56), 2),
       "on-trainer preprocessing loses up to 56% of training throughput (ratio 1/(1-0.56)); "
       "storage and preprocessing optimizations give 1.9x and 2.3x"),
    # Recommendation embeddings
    _s("recshard", "RecShard: statistical embedding sharding (MILP)", "RecShard (ASPLOS 2022)", "recsys-embeddings",
       "embedding_throughput", "greedy", "recshard", "higher", 6.0,
       ">6x embedding throughput, 12x better load balance, 87x fewer slow-memory accesses vs greedy sharders"),
    _s("flexshard", "FlexShard: row-level tiering of sequence embeddings", "FlexShard", "recsys-embeddings",
       "alltoall_bytes", "rowwise", "flexshard", "lower", round(1 / (1 - 0.85), 2),
       ">85% less all-to-all traffic (ratio 1/(1-0.85)), ~6x lower communication latency"),
    _s("fae", "FAE: hot-embedding-aware training", "FAE (VLDB 2022)", "recsys-embeddings",
       "train_time_s", "hybrid", "fae", "lower", 2.34, "2.34x faster training vs CPU-GPU hybrid at equal accuracy"),
    _s("hotline", "Hotline: popular/non-popular micro-batch pipelining", "Hotline (ISCA 2024)", "recsys-embeddings",
       "samples_per_s", "hybrid", "hotline", "higher", 2.2, "2.2x vs Intel-optimized CPU-GPU DLRM"),
    _s("slipstream", "Slipstream: skipping stale-embedding inputs", "arXiv:2404.04270", "recsys-embeddings",
       "time_to_logloss_s", "fae", "slipstream", "lower", 1.2, "2x vs XDL, 1.2x vs FAE, 1.175x vs Hotline"),
    # Mixture of experts
    _s("swiftmoe", "SwiftMoE: decoupled expert optimizer state, per-iteration replication", "arXiv:2504.19925", "moe",
       "time_to_target_s", "deepspeed", "swiftmoe", "lower", 1.305,
       "30.5% and 25.9% faster time-to-convergence than DeepSpeed-MoE and FlexMoE"),
    _s("moetuner", "MoETuner: ILP expert placement and routing", "arXiv:2502.06643", "moe",
       "end_to_end_time_s", "contiguous", "moetuner", "lower", 1.093,
       "9.3% (single node) and 17.5% (multi node) end-to-end speedup; token tail latency -36%"),
    # Parallelism, placement, fault tolerance
    _s("recycle", "ReCycle: pipeline-adaptive fault-tolerant training", "arXiv:2405.14009", "parallelism",
       "throughput", "oobleck", "recycle", "higher", 1.46, "up to 1.46x vs Oobleck and 1.64x vs Bamboo under failures"),
    _s("placement", "Optimal device placement by DP over downsets", "Tarnawski et al., NeurIPS 2020", "parallelism",
       "max_stage_load", "pipedream", "dp_optimal", "lower", 1.17,
       "optimal max-stage load; 1.3x over an expert split on ResNet-50, 1.17x over PipeDream"),
    _s("phaze", "PHAZE: accelerator architecture and placement co-search", "PHAZE (ICML 2024)", "parallelism",
       "train_throughput", "tpuv4_like", "phaze", "higher", None,
       "higher training throughput than a TPUv4-like design and the Spotlight search"),
    # LLM serving, caching, retrieval, simulation
    _s("vcache", "vCache: verified semantic prompt caching", "arXiv:2502.03771", "llm-serving",
       "hit_rate", "static_threshold", "vcache", "higher", 12.0,
       "up to 12x hit rate and 92% lower error vs static thresholds while meeting the error bound"),
    _s("radix", "RadixAttention: KV-cache reuse with a radix tree", "SGLang (NeurIPS 2024)", "llm-serving",
       "tokens_per_s", "no_cache", "radix", "higher", 6.4, "up to 5-6.4x throughput on shared-prefix workloads"),
    _s("metropolis", "AI Metropolis: out-of-order multi-agent simulation", "AI Metropolis", "llm-serving",
       "makespan_s", "global_sync", "out_of_order", "lower", 4.15, "1.3x-4.15x over global synchronization"),
    _s("bagel", "BAGEL: budgeted retrieval by Gaussian-process search", "BAGEL", "llm-serving",
       "recall_at_k", "llm_rerank", "bagel", "higher", None,
       "beats LLM reranking of the retriever's top-B at equal budget on four datasets"),
    # Serverless, edge, federated
    _s("llama", "Llama: latency-targeted serverless video pipelines", "arXiv:2102.01887", "serverless-edge-fl",
       "cost", "best_static", "llama", "lower", 17.2, "7.9x lower latency and 17.2x lower cost"),
    _s("swarm", "Swarm control: centralized vs distributed drone tasking", "arXiv:1805.01786", "serverless-edge-fl",
       "p99_decision_latency_s", "centralized", "distributed", "lower", None,
       "distributed control trades decision quality for latency and resilience at scale"),
    _s("fluid", "FLuID: invariant-dropout straggler mitigation in FL", "FLuID (NeurIPS 2023)", "serverless-edge-fl",
       "time_to_accuracy_s", "fedavg_wait", "fluid", "lower", None,
       "lower round time at baseline accuracy vs FedAvg-wait, random and ordered dropout"),
    # Hardware and security
    _s("shef", "ShEF: shielded enclaves for cloud FPGAs", "arXiv:2103.03500", "hardware-security",
       "throughput_mb_s", "uniform_shield", "custom_shield", "higher", None,
       "security at minimum overhead through per-region customized Shield engines"),
    _s("sia", "SIA: incremental-QR learned string index on FPGA", "SIA (VLDB 2024)", "hardware-security",
       "ops_per_s", "full_retrain", "sia", "higher", 2.6, "2.6x and 3.4x throughput vs ALEX, LIPP, SIndex"),
    # Graphs, agents, operations
    _s("commrand", "COMM-RAND: community-aware GNN mini-batching", "COMM-RAND", "graphs-agents-ops",
       "epoch_time_s", "random", "comm_rand", "lower", 1.8,
       "up to 2.76x (1.8x average) faster training within 1.79 (0.42 average) points of accuracy"),
    _s("embodiedbench", "EmbodiedBench: embodied agent benchmark", "arXiv:2502.09560", "graphs-agents-ops",
       "success_rate", "no_feedback", "with_feedback", "higher", None,
       "best model averages 28.9%; high-level tasks easier than low-level manipulation"),
    _s("era", "ERA: embodied prior learning + online RL", "ERA", "graphs-agents-ops",
       "success_rate", "rl_scratch", "prior_rl", "higher", None,
       "a 3B model beats GPT-4o by 8.4 (high level) and 19.4 (low level) points"),
    _s("atlas", "Atlas: LLM-synthesized causal graphs for root-cause analysis", "Atlas", "graphs-agents-ops",
       "top1_accuracy", "pc_algorithm", "atlas", "higher", None,
       "far better than data-driven causal discovery, close to the true graph"),
)

_BY_NAME = {s.name: s for s in SYSTEMS}


class UnknownSystem(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return self.args[0]


def get(name: str) -> SystemSpec:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnknownSystem(f"unknown system {name!r}; known: {', '.join(_BY_NAME)}") from None


def implemented() -> list[SystemSpec]:
    return [s for s in SYSTEMS if s.status == "implemented"]


def markdown_table() -> str:
    """The system table of the README (kept in sync by a test)."""
    lines = ["| system | family | status | paper | headline claim (paper) |", "|---|---|---|---|---|"]
    for s in SYSTEMS:
        c = s.claim
        doc = f"[{s.name}](docs/{s.name}.md)" if s.status == "implemented" else s.name
        lines.append(f"| {doc} | {s.family} | {s.status} | {s.paper} | {c.statement} |")
    return "\n".join(lines)
