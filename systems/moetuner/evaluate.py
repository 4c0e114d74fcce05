"""The serving-time model a placement is evaluated with, on held-out tokens.

Tokens are served in batches of ``batch_tokens``. In MoE layer l of a batch:
- GPU g computes every (token, expert) pair routed to its experts: ``load[g] * expert_s_per_token``;
  the layer waits for the slowest GPU;
- after layer l, each token's hidden state goes from the GPUs of its layer-l experts to the GPUs of
  its layer-(l+1) experts (k*k transfers of ``token_bytes``; same-GPU ones are free); the transfer
  phase lasts as long as the worst GPU pair: ``traffic[i, j] * token_bytes / bandwidth[i, j]``;
- the non-MoE part (attention, router, norms; data parallel over the GPUs) takes a fixed
  ``batch * non_moe_s_per_token / G``.
End-to-end time sums layer times over layers and batches. A token's own latency counts, per layer,
only the GPUs and links it uses: the slowest GPU among its experts, the slowest pair among its
transfers, plus the non-MoE time. Its p99 over tokens is the tail latency.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .trace import RoutingTrace


@dataclass(frozen=True)
class Topology:
    nodes: int
    gpus_per_node: int
    intra_node_gb_s: float   # per GPU pair inside a node
    inter_node_gb_s: float   # per GPU pair across nodes

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def seconds_per_byte(self) -> np.ndarray:
        """(G, G) transfer time per byte for each ordered GPU pair; 0 on the diagonal (local)."""
        node = np.arange(self.gpus) // self.gpus_per_node
        bw = np.where(node[:, None] == node[None, :], self.intra_node_gb_s, self.inter_node_gb_s) * 1e9
        out = 1.0 / bw
        np.fill_diagonal(out, 0.0)
        return out

    def pair_weight(self) -> np.ndarray:
        """Pair cost relative to an intra-node link (what ILP 2 minimizes; unitless, 0 on the diagonal)."""
        return self.seconds_per_byte() * self.intra_node_gb_s * 1e9


@dataclass(frozen=True)
class CostModel:
    expert_us_per_token: float
    non_moe_us_per_token: float
    token_bytes: int
    batch_tokens: int


def evaluate(trace: RoutingTrace, gpu_of: np.ndarray, topo: Topology, cost: CostModel) -> dict:
    """Model the serving time of ``trace`` under placement ``gpu_of``; returns metrics and curves."""
    e = trace.experts
    n_tok, layers, k = e.shape
    g = topo.gpus
    batch = np.arange(n_tok) // cost.batch_tokens
    nb = int(batch[-1]) + 1
    batch_size = np.bincount(batch, minlength=nb)
    non_moe = batch_size * cost.non_moe_us_per_token * 1e-6 / g                     # (B,)
    spb = topo.seconds_per_byte() * cost.token_bytes                              # (G, G) s per token moved
    compute = np.zeros((nb, layers))
    comm = np.zeros((nb, layers))
    token_lat = non_moe[batch] * layers
    imbalance = []
    gpu_next = gpu_of[0][e[:, 0]]                                                 # (T, k)
    for l in range(layers):
        gpu_l = gpu_next
        loads = np.bincount((batch[:, None] * g + gpu_l).ravel(), minlength=nb * g).reshape(nb, g)
        gpu_time = loads * cost.expert_us_per_token * 1e-6
        compute[:, l] = gpu_time.max(1)
        imbalance.append(loads.max(1) / loads.mean(1))
        token_lat += gpu_time[batch[:, None], gpu_l].max(1)
        if l + 1 < layers:
            gpu_next = gpu_of[l + 1][e[:, l + 1]]
            src, dst = gpu_l[:, :, None], gpu_next[:, None, :]
            pairs = np.bincount(((batch[:, None, None] * g + src) * g + dst).ravel(), minlength=nb * g * g)
            pair_time = pairs.reshape(nb, g, g) * spb                               # diagonal is 0
            comm[:, l] = pair_time.reshape(nb, -1).max(1)
            token_lat += pair_time[batch[:, None, None], src, dst].reshape(n_tok, -1).max(1)
    layer_time = compute + comm + non_moe[:, None]
    return {
        "metrics": {
            "end_to_end_time_s": float(layer_time.sum()),
            "moe_compute_s": float(compute.sum()),
            "communication_s": float(comm.sum()),
            "non_moe_s": float(non_moe.sum() * layers),
            "token_p99_latency_s": float(np.percentile(token_lat, 99)),
            "token_p50_latency_s": float(np.percentile(token_lat, 50)),
            "gpu_load_max_over_mean": float(np.mean(imbalance)),
        },
        "layer_time_s": layer_time.mean(0),   # per layer, averaged over batches
        "token_latency_s": token_lat,
    }


def traffic(trace: RoutingTrace, gpu_of: np.ndarray, gpus: int, batch_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """What a placement makes the GPUs do, independent of link speeds and expert cost: token-expert pairs per
    (batch, layer, GPU) and transfers per (batch, transition, source GPU, destination GPU)."""
    e = trace.experts
    n_tok, layers, _ = e.shape
    batch = np.arange(n_tok) // batch_tokens
    nb = int(batch[-1]) + 1
    loads = np.zeros((nb, layers, gpus))
    pairs = np.zeros((nb, max(layers - 1, 0), gpus, gpus))
    gpu_next = gpu_of[0][e[:, 0]]
    for l in range(layers):
        gpu_l = gpu_next
        loads[:, l] = np.bincount((batch[:, None] * gpus + gpu_l).ravel(), minlength=nb * gpus).reshape(nb, gpus)
        if l + 1 < layers:
            gpu_next = gpu_of[l + 1][e[:, l + 1]]
            idx = (batch[:, None, None] * gpus + gpu_l[:, :, None]) * gpus + gpu_next[:, None, :]
            pairs[:, l] = np.bincount(idx.ravel(), minlength=nb * gpus * gpus).reshape(nb, gpus, gpus)
    return loads, pairs


def end_to_end_s(counts: tuple[np.ndarray, np.ndarray], batch_sizes: np.ndarray, topo: Topology,
                 cost: CostModel) -> float:
    """``evaluate``'s end-to-end time from ``traffic``'s counts, priced for ``topo`` and ``cost`` (the same
    sum: slowest GPU + worst pair + non-MoE time per layer and batch), without the per-token latencies."""
    loads, pairs = counts
    layers = loads.shape[1]
    compute = loads.max(2).sum() * cost.expert_us_per_token * 1e-6
    spb = topo.seconds_per_byte() * cost.token_bytes
    comm = (pairs * spb).reshape(pairs.shape[0], pairs.shape[1], -1).max(2).sum() if pairs.size else 0.0
    non_moe = batch_sizes.sum() * cost.non_moe_us_per_token * 1e-6 / topo.gpus * layers
    return float(compute + comm + non_moe)
