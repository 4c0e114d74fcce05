"""FlexShard (arXiv 2301.02959): row-level tiered sharding of sequence embedding tables, vs row-wise
mod sharding given the same per-device memory as a cache of hot rows (and vs deduplicating row-wise
all-to-all, with and without the cache), on 8 devices in 2 nodes; exact bytes from replaying a
held-out trace."""
from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from pydantic import Field, model_validator

from mlsys_flows.systems.common.lazy import lazy_exports
from mlsys_flows.systems.common.params import SystemParams
from mlsys_flows.systems.common.spec import Claim, Mechanism, Regime, SystemSpec, reduction

if TYPE_CHECKING:
    from .plan import Topology
    from .workload import Workload

# the planner, the replay and the experiment (numpy) load on first use, not with the spec
lazy_exports(__name__, {
    ".plan": ("FULL", "NODE", "SHARD", "Plan", "Topology", "access_estimates", "baseline_capacity", "flexshard",
              "rowwise", "rowwise_cache", "tier_costs"),
    ".replay": ("FIELDS", "fetch_stream", "link_time", "replay", "sync_matrices"),
    ".workload": ("Workload", "chunk_from_npz", "chunk_to_npz", "heldout_chunk", "make_workload"),
    ".experiment": ("equal_memory_pair", "make_plans", "sweep_points", "replays", "plans_to_npz", "plans_from_npz",
                    "plan_metrics", "replay_chunk", "regime_point", "summarize"),
})

# memory headrooms of the trade-off curve (the run's own headroom is added)
HEADROOM_SWEEP = (0.0, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5)

# variant -> (plan, dedup): each variant is a plan replayed with every lookup moving its row (as
# sequence embeddings are materialized per position) or with a deduplicating all-to-all (each
# distinct remote row fetched once per device and iteration). The row-wise variants with a cache
# hold exactly the per-device memory of the FlexShard plan of the same setting.
VARIANTS: dict[str, tuple[str, bool]] = {
    "rowwise": ("rowwise", False),
    "rowwise_cache": ("rowwise_cache", False),
    "flexshard": ("flexshard", False),
    "rowwise_dedup": ("rowwise", True),
    "rowwise_dedup_cache": ("rowwise_dedup_cache", True),
    "flexshard_dedup": ("flexshard_dedup", True),
    "flexshard_flat": ("flexshard_flat", False),
}
ABLATION = "flexshard_flat"  # FlexShard without its per-node tier: rows sharded or replicated on every device
# the regime's variants at each point: the technique, its ablation, the per-lookup baselines (the headline's
# rivals) and the dedup setting (flexshard_dedup against rowwise_dedup and rowwise_dedup_cache: dedup vs dedup)
REGIME_VARIANTS = ("rowwise", "rowwise_cache", "rowwise_dedup", "rowwise_dedup_cache", "flexshard", "flexshard_dedup",
                   ABLATION)
# the regime's dedup-against-dedup series: (baseline, technique) pairs reported beside the headline's point ratios
REGIME_DEDUP_PAIRS = (("rowwise_dedup", "flexshard"), ("rowwise_dedup", "flexshard_dedup"),
                      ("rowwise_dedup_cache", "flexshard_dedup"))


class Params(SystemParams):
    SYSTEM: ClassVar[str] = "flexshard"
    PRESETS: ClassVar[dict] = {
        "smoke": dict(tables=2, rows=100_000, batch_per_device=16, train_iterations=80, eval_iterations=8, replay_tasks=2,
                      regime_lookups_per_row=[0.03, 3.0], regime_train_iterations=20, regime_eval_iterations=2),
        "quick": dict(tables=4, rows=500_000, batch_per_device=64, train_iterations=40, eval_iterations=16, replay_tasks=2),
        "full": dict(tables=8, rows=4_000_000, batch_per_device=512, train_iterations=100, eval_iterations=64, replay_tasks=16),
    }

    # workload: sequence features, each an embedding table with calibrated Zipf rows
    tables: int = Field(4, ge=1, le=64, description="Sequence embedding tables (features).")
    rows: int = Field(500_000, ge=1000, le=100_000_000, description="Rows per table.")
    dim: int = Field(64, ge=1, le=4096, description="Embedding dimension.")
    element_bytes: int = Field(4, ge=1, le=8, description="Bytes per embedding element (4: fp32, 2: fp16).")
    coverage: float = Field(0.8, gt=0.0, le=1.0, description="Share of each table's rows that hashing ever reaches.")
    seq_len: int = Field(256, ge=1, le=8192, description="Mean sequence length: lookups per sample and table (Poisson).")
    batch_per_device: int = Field(64, ge=1, le=65_536, description="Samples per device per iteration.")
    train_iterations: int = Field(40, ge=1, le=100_000, description="Iterations of the training trace that estimates row access probabilities.")
    eval_iterations: int = Field(16, ge=1, le=100_000, description="Held-out iterations replayed against each plan.")
    replay_tasks: int = Field(2, ge=1, le=256, description="Chunks of the held-out trace, one replay task each.")
    # cluster
    nodes: int = Field(2, ge=1, le=64, description="Nodes.")
    devices_per_node: int = Field(4, ge=1, le=64, description="Devices (GPUs) per node.")
    intra_node_gb_s: float = Field(300.0, gt=0.0, le=100_000.0, description="Intra-node bandwidth per device and direction, GB/s (A100 NVLink: 600 GB/s bidirectional).")
    inter_node_gb_s: float = Field(25.0, gt=0.0, le=100_000.0, description="Inter-node bandwidth per device and direction, GB/s (one 200 Gb/s RDMA NIC per GPU).")
    # technique
    # the regime: batch x sequence / rows
    regime_lookups_per_row: list[float] = Field(
        [0.03, 0.3, 1.0, 3.0], min_length=2, max_length=12,
        description="Values of batch_per_device x seq_len / rows (a device's lookups per iteration per table row) "
                    "of the regime sweep: at each, rows = batch_per_device x seq_len / value, one table, FlexShard and "
                    "the baselines planned and replayed (counted) on a shorter trace (regime_*_iterations).")
    regime_train_iterations: int = Field(20, ge=1, le=100_000, description="Training iterations at each regime point.")
    regime_eval_iterations: int = Field(4, ge=1, le=100_000, description="Held-out iterations at each regime point.")
    memory_headroom: float = Field(0.05, ge=0.0, le=8.0, description="Per-device embedding memory FlexShard may use for replicas, as a share above row-wise sharding's footprint; the row-wise baselines get the memory FlexShard's plan uses as a cache of hot rows.")

    @model_validator(mode="after")
    def _consistent(self):
        d = self.nodes * self.devices_per_node
        if not 2 <= d <= 1024:
            raise ValueError(f"nodes * devices_per_node must be 2..1024 devices (got {d})")
        if self.replay_tasks > self.eval_iterations:
            raise ValueError(f"replay_tasks ({self.replay_tasks}) must not exceed eval_iterations ({self.eval_iterations})")
        lookups = d * self.batch_per_device * self.seq_len * self.tables
        if lookups * max(self.train_iterations, -(-self.eval_iterations // self.replay_tasks)) > 2_000_000_000:
            raise ValueError("devices x batch_per_device x seq_len x tables x (train_iterations, or eval_iterations / "
                             f"replay_tasks) exceeds 2e9 lookups per task ({lookups} lookups per iteration)")
        for x in self.regime_lookups_per_row:
            if not 0 < x <= 1000 or not 1000 <= self.regime_rows(x) <= 100_000_000:
                raise ValueError(f"regime_lookups_per_row value {x} gives {self.regime_rows(x) if x > 0 else 0} rows "
                                 "(batch_per_device x seq_len / value must be 1000..1e8)")
        if len(set(self.regime_lookups_per_row)) != len(self.regime_lookups_per_row):
            raise ValueError("regime_lookups_per_row repeats a value")
        if self.tables * self.rows > 1_000_000_000:
            raise ValueError(f"tables x rows must be at most 1e9 (got {self.tables * self.rows})")
        return self

    def regime_rows(self, lookups_per_row: float) -> int:
        """Rows of the one table of a regime point: batch_per_device x seq_len / lookups_per_row."""
        return int(round(self.batch_per_device * self.seq_len / lookups_per_row))

    def lookups_per_row(self) -> float:
        """The headline workload's batch_per_device x seq_len / rows."""
        return self.batch_per_device * self.seq_len / self.rows

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node

    def topology(self) -> Topology:
        from .plan import Topology

        return Topology(self.nodes, self.devices_per_node, self.intra_node_gb_s, self.inter_node_gb_s,
                        self.dim * self.element_bytes)

    def make_workload(self) -> Workload:
        from .workload import make_workload

        return make_workload(self.tables, self.rows, self.dim, self.seq_len, self.coverage, self.devices,
                             self.batch_per_device, self.train_iterations, self.seed)

    def chunk_iterations(self) -> list[int]:
        """Held-out iterations of each replay chunk."""
        import numpy as np

        return [len(c) for c in np.array_split(np.arange(self.eval_iterations), self.replay_tasks)]


__all__ = ["Params", "ABLATION", "REGIME_VARIANTS", "REGIME_DEDUP_PAIRS", "regime_point", "Plan", "Topology", "Workload", "FIELDS", "HEADROOM_SWEEP", "VARIANTS", "SHARD", "NODE", "FULL",
           "access_estimates", "baseline_capacity", "flexshard", "rowwise", "rowwise_cache", "tier_costs", "replay",
           "fetch_stream", "link_time", "sync_matrices", "make_workload", "heldout_chunk", "chunk_to_npz",
           "chunk_from_npz", "equal_memory_pair", "make_plans", "sweep_points", "replays", "plans_to_npz",
           "plans_from_npz", "plan_metrics", "replay_chunk", "summarize"]


_ALL_TRAFFIC = ("all communication per iteration: the all-to-all (rows forward, gradients back) plus the "
                "gradient all-reduce of every replicated row (FlexShard's replicas, the baseline's cached rows)")
_EQUAL_MEMORY = "row-wise sharding given FlexShard's per-device memory as a replicated cache of the hottest rows"

_INTER = ("inter-node all-to-all bytes per iteration (rows forward, gradients back across the node boundary): "
          "the paper's \"global\" traffic. FlexShard's planner minimises modelled link time, of which this is one "
          "term (it also weighs intra-node all-to-all and the replicas' gradient sync, inter-node bytes at the "
          "bandwidth gap): the counted bytes depend on the assumed link bandwidths through the plans")

SPEC = SystemSpec(
    name="flexshard", title="FlexShard: row-level tiering of sequence embeddings", paper="FlexShard",
    family="recsys-embeddings", params=Params,
    # the headline's rivals fetch per lookup, as FlexShard does (sequence embeddings materialized per position):
    # like with like. The deduplicating all-to-all is a second setting, compared dedup against dedup
    # (flexshard_dedup vs rowwise_dedup and rowwise_dedup_cache, further claims), never against per-lookup FlexShard
    baselines=("rowwise_cache", "rowwise"),
    # every baseline is planned from the training trace only (the caches hold the rows most looked up in
    # training) and replayed on the held-out trace
    roles={"rowwise": ("paper", "deployable"), "rowwise_cache": ("deployable",), "rowwise_dedup": ("deployable",),
           "rowwise_dedup_cache": ("deployable",)},
    mechanism=Mechanism(
        "row-level tiering with a per-node replica tier, chosen by the traffic each copy saves", ABLATION,
        f"{ABLATION} is FlexShard's planner (the same touch probabilities, the same saving-per-byte ranking, the same "
        "memory) with the per-node tier removed: a row is sharded or replicated on every device, never once per node, "
        "so inter- vs intra-node bandwidth can no longer shape the plan"),
    regime=Regime(
        "batch x sequence / rows", unit="lookups per row per device per iteration",
        paper_source="not stated by the paper; its production tables are touched many times per device per "
                     "iteration (issue 30: the sweep spans 0.03-3)",
        statement="a row a device touches less than about once per iteration costs more to keep in sync as a replica "
                  "than its fetches cost; the more lookups per row, the more rows replication pays for"),
    # bytes, rows and lookups counted exactly by the held-out replay and the plans; the latency is the
    # busiest link's bytes at the assumed link bandwidths
    kinds={**dict.fromkeys(("lookups", "fetched_rows", "fetched_per_lookup", "alltoall_intra_bytes",
                            "alltoall_inter_bytes", "alltoall_bytes", "sync_intra_bytes", "sync_inter_bytes",
                            "sync_bytes", "comm_bytes", "comm_inter_node_bytes", "memory_rows_per_device",
                            "memory_bytes_per_device", "memory_vs_rowwise", "rows_full_replica", "rows_node_replica",
                            "rows_sharded"), "counted"),
           "modeled_comm_latency_s": "modelled"},
    claims=(
        Claim("alltoall_inter_bytes", "rowwise_cache", "flexshard", "lower", round(reduction(0.85), 2),
              f"{_INTER}, vs {_EQUAL_MEMORY}, both fetching per lookup. Paper: >85% less global all-to-all traffic "
              "(ratio 1/(1-0.85)) at no extra memory", headline=True),
        Claim("modeled_comm_latency_s", "rowwise_cache", "flexshard", "lower", 6.0,
              f"beside the headline: the link time FlexShard's planner minimises (modelled from link bandwidths, the "
              f"busiest link per phase, replica sync included), vs {_EQUAL_MEMORY}. Paper: ~6x lower communication "
              "latency"),
        Claim("comm_inter_node_bytes", "rowwise_cache", "flexshard", "lower",
              statement=f"beside the headline: all inter-node traffic, the all-to-all plus the replicas' (and cached "
                        f"rows') gradient sync across the node boundary, vs {_EQUAL_MEMORY}: the headline leaves the "
                        "sync out, the planner does not"),
        Claim("alltoall_inter_bytes", "rowwise", "flexshard", "lower", round(reduction(0.85), 2),
              "the paper's comparison on global traffic: inter-node all-to-all bytes vs row-wise sharding (FlexShard's "
              "extra memory left idle there). Paper: >85% less global all-to-all traffic"),
        Claim("alltoall_inter_bytes", "rowwise_dedup", "flexshard_dedup", "lower",
              statement="dedup against dedup: inter-node all-to-all bytes with a deduplicating all-to-all on both sides "
                        "(each distinct remote row fetched once per device and iteration), FlexShard planned for it"),
        Claim("alltoall_inter_bytes", "rowwise_dedup_cache", "flexshard_dedup", "lower",
              statement="dedup against dedup at equal memory: inter-node all-to-all bytes vs the row-wise hot-row "
                        "cache in the memory of FlexShard's plan for that setting"),
        Claim("modeled_comm_latency_s", "rowwise_dedup_cache", "flexshard_dedup", "lower",
              statement="modelled communication latency, deduplicating all-to-all on both sides, at equal memory"),
        Claim("comm_bytes", "rowwise_cache", "flexshard", "lower",
              statement=f"total bytes: {_ALL_TRAFFIC}, intra- and inter-node alike, vs {_EQUAL_MEMORY}"),
        Claim("alltoall_bytes", "rowwise", "flexshard", "lower", round(reduction(0.85), 2),
              "all-to-all bytes intra- and inter-node alike, vs row-wise sharding (the replicas' gradient sync not "
              "counted). Paper: >85% less all-to-all traffic"),
        Claim("alltoall_bytes", "rowwise_cache", "flexshard", "lower",
              statement=f"all-to-all bytes intra- and inter-node alike, vs {_EQUAL_MEMORY}"),
        Claim("comm_bytes", "rowwise", "flexshard", "lower",
              statement="total bytes vs row-wise sharding that leaves FlexShard's extra memory idle"),
        Claim("comm_bytes", "rowwise_dedup", "flexshard_dedup", "lower",
              statement="total bytes with a deduplicating all-to-all on both sides, FlexShard planned for it"),
        Claim("comm_bytes", "rowwise_dedup_cache", "flexshard_dedup", "lower",
              statement="total bytes, deduplicating all-to-all, vs the row-wise hot-row cache in the memory of "
                        "FlexShard's plan for that setting"),
    ),
)
