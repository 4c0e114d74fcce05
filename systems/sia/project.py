"""SIA on a real FPGA card: a modelled projection of ops/s from this run's measured host time and counted
retraining work (pure).

The host serves at the speed measured here without its blocked time; each retrain costs the host one
DMA of its arguments over PCIe (counted bytes) and a fixed call latency; the board runs one retrain at
a time at a stated QR throughput on the counted floating-point work. The run's time is the larger of the
host's and the board's busy time (one queue: when the board is the bottleneck the host ends up waiting
for it through back-pressure).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FpgaCard:
    pcie_gb_s: float = 12.0        # PCIe Gen3 x16, effective DMA bandwidth (AWS F1)
    call_us: float = 10.0          # driver call and DMA doorbell per submission
    gflops: float = 100.0          # the board's QR/matrix-vector datapath, fp64-equivalent GFLOP/s


def retrain_flops(qr_rows: float, merged_rows: float, n_feat: int) -> float:
    """Householder QR of the factorised rows (2 rows n^2) plus, per retrain, A^T y and the error bound
    over every merged row (2 passes of 2 n flops)."""
    n = n_feat + 1
    return 2.0 * qr_rows * n * n + 4.0 * merged_rows * n


def project_ops_per_s(ops: float, ops_per_s: float, stall_share: float, retrains: float, submit_mb: float,
                      qr_rows: float, merged_rows: float, n_feat: int, card: FpgaCard) -> float:
    """Projected ops/s of one variant on ``card`` from its measured ops/s and stall share and its counted
    retraining work in the same run."""
    host_s = ops / ops_per_s * (1.0 - stall_share)          # the host's own serving time (blocked time out)
    host_s += submit_mb * 1e6 / (card.pcie_gb_s * 1e9) + retrains * card.call_us * 1e-6
    board_s = retrain_flops(qr_rows, merged_rows, n_feat) / (card.gflops * 1e9)
    return ops / max(host_s, board_s)
