"""FlexShard (arXiv 2301.02959): row-level tiered sharding of sequence embedding tables, vs row-wise
mod sharding, on 8 devices in 2 nodes; exact bytes from replaying a held-out trace."""
from __future__ import annotations

import io
from typing import ClassVar

import numpy as np
from pydantic import Field, model_validator

from mlsys_flows.systems.common.params import SystemParams
from mlsys_flows.systems.common.spec import Claim, SystemSpec, reduction

from .plan import FULL, NODE, SHARD, Plan, Topology, access_estimates, baseline_capacity, flexshard, rowwise, tier_costs
from .replay import FIELDS, link_time, replay, sync_matrices
from .workload import Workload, chunk_from_npz, chunk_to_npz, heldout_chunk, make_workload

# memory headrooms of the trade-off curve (the run's own headroom is added)
HEADROOM_SWEEP = (0.0, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5)


class Params(SystemParams):
    SYSTEM: ClassVar[str] = "flexshard"
    PRESETS: ClassVar[dict] = {
        "smoke": dict(tables=2, rows=100_000, batch_per_device=16, train_iterations=80, eval_iterations=8, replay_tasks=2),
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
    memory_headroom: float = Field(0.05, ge=0.0, le=8.0, description="Per-device embedding memory of both plans, as a share above row-wise sharding's footprint; FlexShard may fill it with replicas.")
    dedup_ids: bool = Field(False, description="Fetch each distinct row once per device and iteration (default: every lookup moves its row, as sequence embeddings are materialized per position).")

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
        if self.tables * self.rows > 1_000_000_000:
            raise ValueError(f"tables x rows must be at most 1e9 (got {self.tables * self.rows})")
        return self

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node

    def topology(self) -> Topology:
        return Topology(self.nodes, self.devices_per_node, self.intra_node_gb_s, self.inter_node_gb_s,
                        self.dim * self.element_bytes)

    def make_workload(self) -> Workload:
        return make_workload(self.tables, self.rows, self.dim, self.seq_len, self.coverage, self.devices,
                             self.batch_per_device, self.train_iterations, self.seed)

    def chunk_iterations(self) -> list[int]:
        """Held-out iterations of each replay chunk."""
        return [len(c) for c in np.array_split(np.arange(self.eval_iterations), self.replay_tasks)]


def make_plans(p: Params, w: Workload) -> dict[str, Plan]:
    """The baseline, FlexShard, and FlexShard at each headroom of the trade-off sweep."""
    topo = p.topology()
    lam, q, u = access_estimates(w.train_counts, w.offsets, w.train_iterations, w.devices)
    demand = q if p.dedup_ids else lam
    plans = {"rowwise": rowwise(w.offsets, topo), "flexshard": flexshard(demand, u, w.offsets, topo, p.memory_headroom)}
    for h in sorted(set(HEADROOM_SWEEP) | {p.memory_headroom}):
        plans[f"sweep_{h:g}"] = flexshard(demand, u, w.offsets, topo, h)
    return plans


def plans_to_npz(plans: dict[str, Plan]) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **{f"{k}.tier": v.tier for k, v in plans.items()},
                        **{f"{k}.owner": v.owner for k, v in plans.items()},
                        **{f"{k}.capacity": np.array(v.capacity_rows) for k, v in plans.items()})
    return buf.getvalue()


def plans_from_npz(data: bytes) -> dict[str, Plan]:
    z = np.load(io.BytesIO(data))
    names = sorted({k.rsplit(".", 1)[0] for k in z.files})
    return {k: Plan(k, z[f"{k}.tier"], z[f"{k}.owner"], int(z[f"{k}.capacity"])) for k in names}


def plan_metrics(plan: Plan, p: Params, baseline_rows: int) -> dict[str, float]:
    """Memory of a plan: rows per device (max) against the row-wise footprint, and its tiers."""
    per_device = plan.rows_per_device(p.topology())
    tiers = np.bincount(plan.tier, minlength=3)
    return {"memory_rows_per_device": float(per_device.max()),
            "memory_vs_rowwise": float(per_device.max() / baseline_rows),
            "rows_full_replica": float(tiers[FULL]), "rows_node_replica": float(tiers[NODE]),
            "rows_sharded": float(tiers[SHARD])}


def replay_chunk(p: Params, w: Workload, plans: dict[str, Plan], ids: np.ndarray, counts: np.ndarray) -> dict[str, dict[str, list[float]]]:
    """Every plan on one held-out chunk: plan -> field -> per-iteration values."""
    topo = p.topology()
    return {name: {k: v.tolist() for k, v in replay(plan, ids, counts, topo, w.total_rows, p.dedup_ids).items()}
            for name, plan in plans.items()}


def summarize(per_iteration: dict[str, list[float]]) -> dict[str, float]:
    """Mean per iteration of the replayed fields, with the totals the ratios compare."""
    m = {k: float(np.mean(v)) for k, v in per_iteration.items()}
    m["alltoall_bytes"] = m["alltoall_intra_bytes"] + m["alltoall_inter_bytes"]
    m["sync_bytes"] = m["sync_intra_bytes"] + m["sync_inter_bytes"]
    m["comm_bytes"] = m["alltoall_bytes"] + m["sync_bytes"]
    m["comm_inter_node_bytes"] = m["alltoall_inter_bytes"] + m["sync_inter_bytes"]
    m["fetched_per_lookup"] = m["fetched_rows"] / m["lookups"]
    return m


__all__ = ["Params", "Plan", "Topology", "Workload", "FIELDS", "HEADROOM_SWEEP", "SHARD", "NODE", "FULL",
           "access_estimates", "baseline_capacity", "flexshard", "rowwise", "tier_costs", "replay", "link_time",
           "sync_matrices", "make_workload", "heldout_chunk", "chunk_to_npz", "chunk_from_npz", "make_plans",
           "plans_to_npz", "plans_from_npz", "plan_metrics", "replay_chunk", "summarize"]


SPEC = SystemSpec(
    name="flexshard", title="FlexShard: row-level tiering of sequence embeddings", paper="FlexShard",
    family="recsys-embeddings", params=Params, baselines=("rowwise",),
    claims=(
        Claim("alltoall_bytes", "rowwise", "flexshard", "lower", round(reduction(0.85), 2),
              ">85% less all-to-all traffic (ratio 1/(1-0.85)), ~6x lower communication latency", headline=True),
        Claim("alltoall_inter_bytes", "rowwise", "flexshard", "lower", statement="inter-node all-to-all bytes"),
        Claim("modeled_comm_latency_s", "rowwise", "flexshard", "lower", 6.0, "~6x lower communication latency"),
        Claim("comm_bytes", "rowwise", "flexshard", "lower",
              statement="all communication: all-to-all plus the replicas' gradient all-reduce"),
        Claim("comm_inter_node_bytes", "rowwise", "flexshard", "lower", statement="all inter-node communication"),
    ),
)
