"""ReCycle's failover run, the parts that need no cluster: the plans it executes, Oobleck's restored
layers, the membership round that drops a dead peer, and the summary of the ranks' time stamps. The
run itself (4 ranks on Dask workers, one SIGKILLed) is in tests/flows/test_recycle_flow.py."""
from __future__ import annotations

import io
import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from mlsys_flows.systems.recycle.failover import (VICTIM, FailoverConfig, Membership, _origin_pipeline, costs_from,
                                                  merge_shards, plans, summarize)
from mlsys_flows.systems.recycle.restart import build
from mlsys_flows.systems.recycle.stage import Stage

CFG = FailoverConfig(d_model=32, heads=2, layers_per_stage=2, micro_batch=2, seq=8, microbatches=4, steps=2)
TIMES = [{"forward": 0.008, "backward_input": 0.009, "backward_weight": 0.006, "backward_fused": 0.013, "optimizer": 0.005,
          "param_bytes": 1_000_000} for _ in range(4)]


@pytest.fixture(scope="module")
def pl():
    return plans(costs_from(TIMES, p2p_s=0.0003, allreduce_s=0.004, cfg=CFG), CFG)


def test_rerouted_plan_sends_the_lost_stage_to_its_peer(pl):
    # healthy: rank = pipeline * 2 + stage; after rank 3 dies, pipeline 1's second stage runs on rank 1
    assert {mb.route for mb in pl.healthy.microbatches} == {(0, 1), (2, 3)}
    assert {mb.route for mb in pl.rerouted.microbatches} == {(0, 1), (2, 1)}
    assert len(pl.rerouted.microbatches) == len(pl.healthy.microbatches) == 2 * CFG.microbatches
    assert [g.members for g in pl.rerouted.groups] == [(0, 2), (1,)]


def test_the_restart_rebuilds_oobleck_templates_from_whole_stages(pl):
    # the intact pipeline keeps its 2 stages; the damaged one shrinks to one worker with all 4 layers
    assert pl.restart_choice.startswith("shrunk")
    assert pl.restart_layers == [(0, 2), (2, 2), (0, 4)]
    assert [_origin_pipeline(pl, w) for w in range(3)] == [0, 0, 1]
    # the global batch stays whole: the same samples per step as before the failure
    assert len(pl.restart.microbatches) == 2 * CFG.microbatches
    predicted = pl.predicted_step_s()
    assert set(predicted) == {"healthy", "rerouted", "restart"} and all(x > 0 for x in predicted.values())
    assert predicted["rerouted"] > predicted["healthy"]  # rank 1 carries two stages' micro-batches


def test_merged_shards_restore_a_two_stage_worker_exactly():
    """The restarted worker of the shrunk pipeline holds both stages: its model and Adam state are the two
    shards, renumbered, and an Adam step from the merged state equals the steps of the two stages."""
    params = type("P", (), dict(d_model=32, heads=2, layers_per_stage=2, micro_batch=2, seq=8))()
    shards = [build(params, seed) for seed in (1, 2)]
    states = [_through_bytes({"model": s.state_dict(), "opt": o.state_dict()}) for s, o in shards]
    merged = merge_shards(states)
    whole = Stage(32, 2, 4)
    whole.load_state_dict(merged["model"])
    opt = torch.optim.Adam(whole.parameters(), lr=1e-4)
    opt.load_state_dict(merged["opt"])
    pairs = list(zip(whole.parameters(), [q for s, _ in shards for q in s.parameters()]))
    assert len(pairs) == len(list(whole.parameters())) and all(torch.equal(a, b) for a, b in pairs)
    for (a, b) in pairs:  # the same gradient on both sides: one Adam step must agree
        a.grad = torch.ones_like(a)
        b.grad = torch.ones_like(b)
    opt.step()
    for _, o in shards:
        o.step()
    assert all(torch.allclose(a, b) for a, b in pairs)


def _through_bytes(state: dict) -> dict:
    """What a checkpoint round trip gives back: copies, not the live tensors."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _store():
    return dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=timedelta(seconds=10),
                         wait_for_workers=False)


def test_membership_waits_for_live_peers_and_drops_a_dead_one():
    store = _store()
    dead = {3}
    rounds = {r: Membership(store, r, [0, 1, 2, 3], lambda q: q not in dead, prefix="t") for r in range(4)}
    # step 0: everyone stamps (in threads: each waits for the others)
    out = {}
    threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, rounds[r].round(0))) for r in range(3)]
    for th in threads:
        th.start()
    rounds[3].round(0)
    for th in threads:
        th.join(10)
    assert all(out[r] == {0, 1, 2, 3} for r in range(3))
    # step 1: rank 3 is gone (its worker left the cluster): the others go on without it
    threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, rounds[r].round(1))) for r in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(10)
    assert all(out[r] == {0, 1, 2} for r in range(3))


def test_membership_names_a_peer_that_hangs():
    store = _store()
    m = Membership(store, 0, [0, 1], lambda q: True, prefix="hang", timeout_s=0.2)
    with pytest.raises(TimeoutError, match=r"ranks \[1\] neither reached step 0"):
        m.round(0)


def test_summary_charges_the_kill_to_both_recoveries():
    def steps(t0: float, n: int, length: float) -> list[dict]:
        return [{"step": i, "start": t0 + i * length, "end": t0 + (i + 1) * length} for i in range(n)]

    common = {"times": TIMES, "p2p_s": 0.0003, "allreduce_s": 0.004, "restart_choice": "shrunk pipelines (templates)",
              "predicted_step_s": {"healthy": 0.2, "rerouted": 0.3, "restart": 0.25}, "checkpoint_s": 0.01,
              "killed_at": 100.0}
    recycle = [{**common, "rank": r, "before": steps(90.0, 3, 0.2), "after": steps(100.1, 3, 0.3),
                "detected": 100.05, "victim_before": steps(90.0, 3, 0.2)} for r in range(3)]
    restart = [{"rank": r, "steps": steps(200.5, 3, 0.25), "launched_at": 200.0, "entered": 200.2, "restore_s": 0.1}
               for r in range(3)]
    s = summarize(recycle, restart, CFG)
    per_step = 2 * CFG.microbatches * CFG.micro_batch
    assert s["before_samples_s"] == pytest.approx(per_step / 0.2)
    assert s["rerouted_samples_s"] == pytest.approx(per_step / 0.3)
    assert s["detection_s"] == pytest.approx(0.05)
    assert s["recycle_recover_s"] == pytest.approx(0.4)            # 100.1 + 0.3 - 100.0
    assert s["restart_recover_s"] == pytest.approx(0.05 + 0.75)    # detection + (200.75 - 200.0)
    assert s["prediction_error"]["rerouted"] == pytest.approx(0.0)
    assert VICTIM == 3
