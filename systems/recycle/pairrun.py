"""The real decoupled schedule for one stage pair: two processes, torch.distributed gloo on 127.0.0.1.

Each process owns one pipeline stage (the same small transformer stage as the calibration). They
first time their own F, B_input, B_weight and optimizer step at the same time (so both see the same
CPU contention as in the run) and a ping-pong of one activation; the simulator then plans the
iteration from those times (1F1B, Bw deferred into bubbles, per-stage optimizer step) and predicts its
length; both processes execute exactly that per-worker operation order with real sends and receives,
and rank 0 times the steps between two barriers. ``run_pair`` starts the processes and returns the
prediction next to the measured step times.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from mlsys_flows.systems.common.net import free_port

from .config import RunConfig
from .sim import Group, MicroBatch, Plan, simulate


@dataclass(frozen=True)
class PairConfig(RunConfig):
    layers: int = 2
    steps: int = 5
    warmup_steps: int = 2
    calibration_reps: int = 7


def pair_plan(times: list[dict], p2p_s: float, microbatches: int) -> Plan:
    """The two-stage plan of one data-parallel pipeline from each rank's measured times."""
    durs = tuple((t["forward"], t["backward_input"], t["backward_weight"], t["backward_fused"]) for t in times)
    mbs = [MicroBatch((0, 1), durs, k) for k in range(microbatches)]
    groups = [Group((s,), times[s]["optimizer"]) for s in range(2)]
    return Plan(workers=["stage0", "stage1"], microbatches=mbs, groups=groups, limits=[2, 1], decoupled=True,
                barrier=False, p2p_s=p2p_s, max_deferred=2, label="pair")


def run_pair(cfg: PairConfig, timeout_s: float = 120.0) -> dict:
    """Run both ranks as subprocesses; returns rank 0's record (prediction and measurement)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="recycle-pair-") as tmp:
        out = Path(tmp) / "result.json"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", __name__, "--port", str(port), "--out", str(out), "--config", json.dumps(asdict(cfg))]
        procs = [subprocess.Popen([*cmd, "--rank", str(r)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                 for r in range(2)]
        logs = []
        try:
            for p in procs:
                logs.append(p.communicate(timeout=timeout_s)[0].decode(errors="replace"))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(p.returncode for p in procs) or not out.exists():
            raise RuntimeError("stage-pair run failed:\n" + "\n".join(x[-2000:] for x in logs))
        return json.loads(out.read_text())


def _worker(rank: int, port: int, out: str, cfg: PairConfig) -> None:
    import torch
    import torch.distributed as dist

    from .execute import Worker, run_step
    from .stage import Stage, calibrate

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    peer = 1 - rank
    try:
        # 1. calibrate this rank's stage while the other rank calibrates its own
        dist.barrier()
        st = calibrate(cfg.d_model, cfg.heads, cfg.layers, cfg.micro_batch, cfg.seq, reps=cfg.calibration_reps,
                       seed=cfg.seed + rank, threads=1)
        keys = ("forward", "backward_input", "backward_weight", "backward_fused", "optimizer")
        mine = torch.tensor([getattr(st, k) for k in keys], dtype=torch.float64)
        both = [torch.zeros(len(keys), dtype=torch.float64) for _ in range(2)]
        dist.all_gather(both, mine)
        times = [dict(zip(keys, t.tolist())) for t in both]
        # 2. one-way time of one activation (ping-pong)
        act = torch.zeros(cfg.micro_batch, cfg.seq, cfg.d_model)
        rtts = []
        for _ in range(15):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(act, 1)
                dist.recv(act, 1)
            else:
                dist.recv(act, 0)
                dist.send(act, 0)
            rtts.append(time.perf_counter() - t0)
        p2p = torch.tensor([statistics.median(rtts[3:]) / 2], dtype=torch.float64)
        dist.broadcast(p2p, 0)  # both ranks plan with the same numbers
        plan = pair_plan(times, float(p2p.item()), cfg.microbatches)
        predicted = simulate(plan, iterations=1)
        order = predicted.order(rank, 0)
        # 3. execute the planned order for real
        torch.manual_seed(cfg.seed + rank)
        stage = Stage(cfg.d_model, cfg.heads, cfg.layers)
        gen = torch.Generator().manual_seed(cfg.seed)
        data = [torch.randn(cfg.micro_batch, cfg.seq, cfg.d_model, generator=gen) for _ in range(cfg.microbatches)]
        worker = Worker(me=rank, ranks=[0, 1], stage=stage, optimizer=torch.optim.Adam(stage.parameters(), lr=1e-4),
                        shape=(cfg.micro_batch, cfg.seq, cfg.d_model), inputs=data.__getitem__)
        steps = []
        for step in range(cfg.warmup_steps + cfg.steps):
            dist.barrier()
            t0 = time.perf_counter()
            run_step(plan, order, worker)
            dist.barrier()
            if step >= cfg.warmup_steps:
                steps.append(time.perf_counter() - t0)
        if rank == 0:
            Path(out).write_text(json.dumps({
                "predicted_step_s": predicted.makespan, "measured_step_s": statistics.median(steps),
                "measured_steps_s": steps, "times": times, "p2p_s": float(p2p.item()),
                "order": [order, predicted.order(peer, 0)], "config": asdict(cfg)}))
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", required=True)
    a = ap.parse_args(argv)
    _worker(a.rank, a.port, a.out, PairConfig(**json.loads(a.config)))


if __name__ == "__main__":
    main()
