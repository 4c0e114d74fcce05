"""Per-row access cost of the fast and the slow memory tier, measured in this run.

The timed operation is a DLRM's: sum-pooled lookups of random rows (``embedding_bag``). On a CUDA
device: HBM = lookups in a table in GPU memory; UVM-like = lookups in a pinned host-memory table, the
pooled rows then copied to the GPU (host memory reached over PCIe, as a host-offloaded table is). On a
CPU only: fast tier = lookups in a table small enough to stay in the CPU caches (the stand-in for
HBM), slow tier = lookups in a table far larger than the caches (DRAM with cache and TLB misses, the
stand-in for host memory behind PCIe). Fast and slow are
measured interleaved (same noise for both), the median of the repeats kept.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from mlsys_flows.systems.common.timing import interleaved, median


BAG = 16  # ids pooled per sample in the timed lookups (sum pooling, as a DLRM's EmbeddingBag)


def measure(dims: list[int], device: str, *, gathers: int, fast_kb: int, slow_mb: int, repeats: int,
            seed: int) -> tuple[dict[int, float], dict[int, float], str]:
    """Seconds per row access for each dim: ({dim: fast}, {dim: slow}, description)."""
    g = torch.Generator().manual_seed(seed)
    cuda = device.startswith("cuda")
    slow_elems = slow_mb * (1 << 20) // 4
    if cuda:
        fast_flat = torch.ones(slow_elems, device=device)  # HBM: as large as the host table
        slow_flat = torch.ones(slow_elems).pin_memory()
        what = (f"measured on {torch.cuda.get_device_name(device)}: sum-pooled lookups (EmbeddingBag, {BAG} ids per "
                f"bag) in a {slow_mb} MiB GPU table vs in a {slow_mb} MiB pinned host table, pooled rows then "
                f"copied to the GPU")
    else:
        fast_flat = torch.ones(max(fast_kb * 256, max(dims) * 4))  # fits the caches
        slow_flat = torch.ones(slow_elems)  # ones, not zeros: every page really backed by memory
        what = (f"measured on this CPU (1 thread): sum-pooled lookups (EmbeddingBag, {BAG} ids per bag) in a "
                f"{fast_kb} KiB table (cache-resident, the HBM stand-in) vs in a {slow_mb} MiB table (DRAM, the "
                f"UVM stand-in)")
    offsets = torch.arange(0, gathers, BAG)
    fast, slow = {}, {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the other worker process keeps the second core
    try:
        for d in dims:
            f_src = fast_flat[: fast_flat.numel() // d * d].view(-1, d)
            s_src = slow_flat[: slow_elems // d * d].view(-1, d)
            f_idx = torch.randint(0, f_src.shape[0], (gathers,), generator=g)
            s_idx = torch.randint(0, s_src.shape[0], (gathers,), generator=g)
            if cuda:
                f_idx, f_off = f_idx.to(device), offsets.to(device)
                s_dev = torch.empty(len(offsets), d, device=device)

                def fast_fn():
                    return _clock(lambda: F.embedding_bag(f_idx, f_src, f_off, mode="sum"), True)

                def slow_fn():
                    return _clock(lambda: s_dev.copy_(F.embedding_bag(s_idx, s_src, offsets, mode="sum").pin_memory(),
                                                      non_blocking=True), True)
            else:
                def fast_fn():
                    return _clock(lambda: F.embedding_bag(f_idx, f_src, offsets, mode="sum"), False)

                def slow_fn():
                    return _clock(lambda: F.embedding_bag(s_idx, s_src, offsets, mode="sum"), False)

            fast_fn(), slow_fn()  # warm-up
            runs = interleaved({"fast": fast_fn, "slow": slow_fn}, repeats)
            fast[d], slow[d] = median(runs["fast"]) / gathers, median(runs["slow"]) / gathers
    finally:
        torch.set_num_threads(threads)
    return fast, slow, what


def _clock(fn, cuda: bool) -> float:
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def describe(fast: dict[int, float], slow: dict[int, float]) -> str:
    return ", ".join(f"dim {d}: {fast[d] * 1e9:.2f} vs {slow[d] * 1e9:.2f} ns/row ({slow[d] / fast[d]:.1f}x)"
                     for d in sorted(fast))

