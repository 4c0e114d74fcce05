"""The expert cost per token measured on this machine: one expert FFN (SwiGLU: gate, up, down GEMMs of
d_model x d_ff) timed with torch on a slice of d_ff columns. GEMM time grows linearly with the columns,
so the full expert's time per token is the slice's time x d_ff / slice (torch is imported lazily)."""
from __future__ import annotations

import statistics
import time


def expert_flops_per_token(d_model: int, d_ff: int) -> float:
    """Multiply-adds x 2 of one token through one SwiGLU expert (three d_model x d_ff GEMMs)."""
    return 3 * 2.0 * d_model * d_ff


def measure_expert_us_per_token(d_model: int, d_ff: int, *, tokens: int = 32, d_ff_slice: int = 256,
                                repeats: int = 5, seed: int = 0) -> dict:
    """Median microseconds per token of one expert on this machine's CPU (fp32, torch's threads), with the
    samples and the achieved GFLOP/s."""
    import torch

    cols = min(d_ff, d_ff_slice)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, d_model, generator=g)
    w_gate, w_up = (torch.randn(d_model, cols, generator=g) * d_model ** -0.5 for _ in range(2))
    w_down = torch.randn(cols, d_model, generator=g) * cols ** -0.5

    def ffn():
        return (torch.nn.functional.silu(x @ w_gate) * (x @ w_up)) @ w_down

    ffn()  # warm-up
    us = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ffn()
        us.append((time.perf_counter() - t0) / tokens * (d_ff / cols) * 1e6)
    med = statistics.median(us)
    return {"us_per_token": med, "samples_us": us, "gflop_s": expert_flops_per_token(d_model, d_ff) / (med * 1e3),
            "d_model": d_model, "d_ff": d_ff, "tokens": tokens, "d_ff_slice": cols,
            "threads": torch.get_num_threads()}
