"""The SIA FPGA projection (pure): host-bound vs board-bound, and the counted flops."""
from __future__ import annotations

import pytest

from mlsys_flows.systems.sia.project import FpgaCard, project_ops_per_s, retrain_flops


def test_retrain_flops():
    assert retrain_flops(100, 1000, 3) == 2 * 100 * 16 + 4 * 1000 * 4


def test_host_bound_projection_drops_the_blocked_time_and_adds_the_dma():
    card = FpgaCard(pcie_gb_s=1.0, call_us=100.0, gflops=1e6)
    # 1000 ops in 1 s, half of it blocked; 10 retrains of 1 MB each
    got = project_ops_per_s(1000, 1000.0, 0.5, 10, 10.0, 0, 0, 8, card)
    assert got == pytest.approx(1000 / (0.5 + 0.01 + 0.001))


def test_board_bound_projection_is_the_board_time():
    card = FpgaCard(gflops=1.0)
    flops = retrain_flops(1e6, 1e6, 24)
    got = project_ops_per_s(1000, 1e6, 0.0, 1, 0.0, 1e6, 1e6, 24, card)
    assert got == pytest.approx(1000 / (flops / 1e9))
    # less QR work (SIA's incremental update) projects higher when the board binds
    assert project_ops_per_s(1000, 1e6, 0.0, 1, 0.0, 1e4, 1e6, 24, card) > got
