"""Accelerator design points of equal die area (PHAZE's architecture search space) and the area model.

A chip has ``tensor_cores`` systolic arrays of ``tc_dim`` x ``tc_dim`` MACs, ``vector_cores`` SIMD
units of ``vc_lanes`` lanes, ``sram_mib`` of on-chip buffer and ``hbm_stacks`` off-chip HBM stacks.
Its area is a sum of per-resource areas (``Tech``); every candidate spends the same budget (the
TPUv4-like design's area), the on-chip SRAM taking whatever the compute and HBM PHYs leave.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Tech:
    """Technology and system constants (every one is listed in the report's assumptions)."""
    clock_ghz: float = 1.05              # TPUv4 clock
    mac_area_um2: float = 600.0          # one bf16 MAC of a systolic array, incl. its registers
    lane_area_um2: float = 10_000.0      # one vector lane (fp32 ALU, register file slice)
    sram_mm2_per_mib: float = 0.8        # dense on-chip SRAM incl. periphery
    hbm_phy_mm2: float = 15.0            # one HBM stack's PHY and controller (die shoreline)
    fixed_mm2: float = 150.0             # interconnect, ICI, control: the same for every design
    hbm_gib_per_stack: float = 8.0
    hbm_gb_s_per_stack: float = 300.0
    sram_gb_s: float = 8000.0            # on-chip buffer bandwidth to the cores
    link_gb_s: float = 50.0              # chip-to-chip (ICI-like) bandwidth per direction
    link_latency_us: float = 2.0         # per hop of a ring collective
    vector_flops_per_lane_cycle: float = 1.0
    min_sram_mib: float = 16.0           # a design must keep at least this much buffer


@dataclass(frozen=True)
class Arch:
    name: str
    tensor_cores: int
    tc_dim: int
    vector_cores: int
    vc_lanes: int
    sram_mib: float
    hbm_stacks: int

    def macs(self) -> int:
        return self.tensor_cores * self.tc_dim ** 2

    def hbm_gib(self, tech: Tech) -> float:
        return self.hbm_stacks * tech.hbm_gib_per_stack

    def hbm_gb_s(self, tech: Tech) -> float:
        return self.hbm_stacks * tech.hbm_gb_s_per_stack

    def peak_tflops(self, tech: Tech) -> float:
        return 2 * self.macs() * tech.clock_ghz / 1e3

    def describe(self, tech: Tech) -> str:
        return (f"{self.tensor_cores}x{self.tc_dim}^2 TC, {self.vector_cores}x{self.vc_lanes} VC, "
                f"{self.sram_mib:.0f} MiB SRAM, {self.hbm_gib(tech):.0f} GiB HBM @ {self.hbm_gb_s(tech):.0f} GB/s")


def area_mm2(a: Arch, tech: Tech) -> float:
    return (a.macs() * tech.mac_area_um2 / 1e6 + a.vector_cores * a.vc_lanes * tech.lane_area_um2 / 1e6
            + a.sram_mib * tech.sram_mm2_per_mib + a.hbm_stacks * tech.hbm_phy_mm2 + tech.fixed_mm2)


def tpuv4_like() -> Arch:
    """Two TensorCores of four 128x128 MXUs each (8 arrays), a 8x128-lane VPU per TensorCore,
    128 MiB CMEM + 2 x 16 MiB VMEM, four HBM2 stacks (32 GiB, 1.2 TB/s)."""
    return Arch("tpuv4_like", tensor_cores=8, tc_dim=128, vector_cores=2, vc_lanes=1024, sram_mib=160.0, hbm_stacks=4)


def with_sram_filling(name: str, tensor_cores: int, tc_dim: int, vector_cores: int, vc_lanes: int,
                      hbm_stacks: int, budget_mm2: float, tech: Tech) -> Arch | None:
    """The design whose SRAM takes the area left in the budget (whole MiB), or None if too little is left."""
    probe = Arch(name, tensor_cores, tc_dim, vector_cores, vc_lanes, 0.0, hbm_stacks)
    sram = int((budget_mm2 - area_mm2(probe, tech)) / tech.sram_mm2_per_mib)
    if sram < tech.min_sram_mib:
        return None
    return Arch(name, tensor_cores, tc_dim, vector_cores, vc_lanes, float(sram), hbm_stacks)


def candidates(tech: Tech, count: int, seed: int, tc_dims=(64, 128, 256), mac_scales=(0.5, 1.0, 1.5),
               vector_scales=(0.5, 1.0, 2.0), hbm_options=(2, 4, 6)) -> list[Arch]:
    """Equal-area designs: a grid over tensor-core size, total MACs (relative to the TPUv4-like chip),
    vector lanes and HBM stacks, SRAM filling the rest of the TPUv4-like area. ``count`` of them, a
    seeded sample when the grid holds more; the TPUv4-like design itself is always one of them."""
    ref = tpuv4_like()
    budget = area_mm2(ref, tech)
    grid = []
    for dim, ms, vs, hbm in itertools.product(tc_dims, mac_scales, vector_scales, hbm_options):
        cores = max(1, round(ms * ref.macs() / dim ** 2))
        vcores = max(1, round(vs * ref.vector_cores))
        a = with_sram_filling(f"tc{cores}x{dim}_vc{vcores}_hbm{hbm}", cores, dim, vcores, ref.vc_lanes, hbm, budget, tech)
        if a is not None and not (cores == ref.tensor_cores and dim == ref.tc_dim and vcores == ref.vector_cores
                                  and hbm == ref.hbm_stacks):
            grid.append(a)
    rng = random.Random(seed)
    chosen = grid if count - 1 >= len(grid) else rng.sample(grid, count - 1)
    return [ref, *sorted(chosen, key=lambda a: a.name)]
