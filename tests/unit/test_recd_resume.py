"""RecD's training resumed from any checkpoint continues exactly as if it had never stopped."""
from __future__ import annotations

import io

import torch

from mlsys_flows.systems.recd import Params
from mlsys_flows.systems.recd import pipeline as pl
from mlsys_flows.systems.recd.workload import arrival_order, generate, generate_split


def test_resumed_training_matches_uninterrupted_bitwise():
    p = Params.for_scale("smoke")
    table, rg = generate(p), p.batch_size * p.batches_per_row_group
    blob, arrival = pl.parquet_bytes(table, rg), pl.parquet_bytes(arrival_order(table, p.seed), rg)
    # the flow's three trainers: arrival-order KJT, clustered KJT, clustered IKJT
    batches = {"kjt": list(pl.read_batches(arrival, p, dedup=False)),
               "kjt_clustered": list(pl.read_batches(blob, p, dedup=False)),
               "ikjt": list(pl.read_batches(blob, p, dedup=True))}
    saved: dict[int, bytes] = {}

    def keep(turn, state):  # through torch.save/load(weights_only) like CheckpointStore
        buf = io.BytesIO()
        torch.save(state, buf)
        saved[turn] = buf.getvalue()

    heldout = pl.table_batches(generate_split(p)[1], p, dedup=True)  # the held-out curve resumes too
    full = pl.train_interleaved(batches, p, checkpoint=keep, checkpoint_every=2, heldout=heldout)
    turns = -(-len(batches["kjt"]) // p.chunk_steps)
    assert sorted(saved) == sorted({t for t in range(turns) if (t + 1) % 2 == 0} | {turns - 1})
    for turn in sorted(saved)[:2]:
        state = torch.load(io.BytesIO(saved[turn]), weights_only=True)
        resumed = pl.train_interleaved(batches, p, state=state, heldout=heldout)
        for n in batches:
            assert resumed[n]["losses"] == full[n]["losses"]
            assert resumed[n]["evals"] == full[n]["evals"] and len(full[n]["evals"]) == turns + 1
            assert len(resumed[n]["chunk_rates"]) == turns
