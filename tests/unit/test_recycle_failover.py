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

from mlsys_flows.systems.recycle import Params
from mlsys_flows.systems.recycle.failover import (FailoverConfig, Membership, _origin_pipeline, check_victims,
                                                  costs_from, draw_failure, merge_shards, plans, summarize, took_over)
from mlsys_flows.systems.recycle.sim import simulate
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
    assert [_origin_pipeline(pl, w, CFG.failed()) for w in range(3)] == [0, 0, 1]
    # the global batch stays whole: the same samples per step as before the failure
    assert len(pl.restart.microbatches) == 2 * CFG.microbatches
    predicted = pl.predicted_step_s()
    assert set(predicted) == {"healthy", "rerouted", "restart", "restart_decoupled"}
    assert all(x > 0 for x in predicted.values())
    # decoupled Oobleck, replayed after the restart: the same workers and routes, a decoupled backward
    assert pl.restart_decoupled.decoupled and not pl.restart.decoupled
    assert pl.restart_decoupled.workers == pl.restart.workers
    assert [mb.route for mb in pl.restart_decoupled.microbatches] == [mb.route for mb in pl.restart.microbatches]
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
              "predicted_step_s": {"healthy": 0.2, "rerouted": 0.3, "restart": 0.25, "restart_decoupled": 0.24},
              "checkpoint_s": 0.01, "killed_at": {0: 100.0}, "checkpoint_step": 2}
    recycle = [{**common, "rank": r, "before": steps(90.0, 3, 0.2), "after": steps(100.1, 3, 0.3),
                "detected": 100.05, "victim_before": {0: steps(90.0, 3, 0.2)},
                "took_over": {0: 4} if r == 2 else {}} for r in (1, 2, 3)]
    restart = [{"rank": r, "steps": steps(200.5, 3, 0.25), "decoupled_steps": steps(201.5, 3, 0.2),
                "launched_at": 200.0, "entered": 200.2, "restore_s": 0.1, "layers": [0, 2]} for r in range(3)]
    s = summarize(recycle, restart, CFG, lost=[0])
    per_step = 2 * CFG.microbatches * CFG.micro_batch
    assert s["before_samples_s"] == pytest.approx(per_step / 0.2)
    assert s["rerouted_samples_s"] == pytest.approx(per_step / 0.3)
    assert s["restart_decoupled_samples_s"] == pytest.approx(per_step / 0.2)
    assert s["detection_s"] == pytest.approx(0.05)
    assert s["recycle_recover_s"] == pytest.approx(0.4)            # 100.1 + 0.3 - 100.0
    assert s["restart_recover_s"] == pytest.approx(0.05 + 0.75)    # detection + (200.75 - 200.0)
    assert s["prediction_error"]["rerouted"] == pytest.approx(0.0)
    # what happened, from the record: rank 0 lost after step 2, its micro-batches on rank 2
    assert (s["victims"], s["lost_ranks"], s["fail_step"], s["survivors"]) == ([0], [0], 3, [1, 2, 3])
    assert s["rerouted_to"] == {0: {2: 4}}
    # the simulator's error on the ratio between policies: measured 0.25 / 0.3 against predicted 0.25 / 0.3
    assert s["ratio_prediction_error"]["restart"] == pytest.approx(0.0)
    assert s["ratio_prediction_error"]["restart_decoupled"] == pytest.approx((0.2 / 0.3) / (0.24 / 0.3) - 1)


def test_the_failure_is_drawn_from_the_seed_and_any_rank_can_be_drawn():
    """Issue 48: the killed rank is no constant. Drawn from the seed (reproducible), every rank, rank 0
    included, is drawn by some seed; the moment is a step count in 2 .. 1 + steps."""
    draws = {seed: draw_failure(seed, 5) for seed in range(40)}
    assert draws == {seed: draw_failure(seed, 5) for seed in range(40)}
    assert {v for (v,), _ in draws.values()} == {0, 1, 2, 3}
    assert {step for _, step in draws.values()} <= set(range(2, 7)) and len({step for _, step in draws.values()}) > 1
    assert draw_failure(0, 5, [0], 3) == ((0,), 3)
    assert draw_failure(0, 5, [3, 0])[0] == (0, 3)


@pytest.mark.parametrize("victims", [[0, 2], [1, 3], [0, 1, 2], [4], [], [1, 1]])
def test_victims_must_leave_every_stage_a_live_rank(victims):
    with pytest.raises(ValueError):
        check_victims(victims)
    with pytest.raises(ValueError):
        Params.for_scale("smoke", failover_victims=victims)


def test_losing_rank_0_reroutes_like_any_other_rank():
    """Rank 0 (pipeline 0, stage 0) lost: its micro-batches run stage 0 on rank 2 (pipeline 1's stage 0),
    every one of them; the restart rebuilds pipeline 0 as one worker from whole stages."""
    cfg = FailoverConfig(d_model=32, heads=2, layers_per_stage=2, micro_batch=2, seq=8, microbatches=4, steps=2,
                         victims=(0,), fail_step=2)
    pl0 = plans(costs_from(TIMES, p2p_s=0.0003, allreduce_s=0.004, cfg=cfg), cfg)
    # survivors are ranks 1, 2, 3 -> plan workers 0, 1, 2
    assert pl0.rerouted.workers == ["p0s1", "p1s0", "p1s1"]
    assert {mb.route for mb in pl0.rerouted.microbatches} == {(1, 0), (1, 2)}
    survivors = [1, 2, 3]
    took = {r: took_over(pl0.rerouted, simulate(pl0.rerouted, 1).order(i, 0), i, r, cfg)
            for i, r in enumerate(survivors)}
    assert took == {1: {}, 2: {0: cfg.microbatches}, 3: {}}
    assert all(first % 2 == 0 and count % 2 == 0 for first, count in pl0.restart_layers)
    assert sorted(_origin_pipeline(pl0, w, cfg.failed()) for w in range(len(pl0.restart.workers))) in ([0, 1, 1], [1, 1])


def test_two_victims_in_different_stages_are_survivable():
    cfg = FailoverConfig(d_model=32, heads=2, layers_per_stage=2, micro_batch=2, seq=8, microbatches=4, steps=2,
                         victims=(0, 3), fail_step=2)
    pl2 = plans(costs_from(TIMES, p2p_s=0.0003, allreduce_s=0.004, cfg=cfg), cfg)
    assert pl2.rerouted.workers == ["p0s1", "p1s0"]
    assert {mb.route for mb in pl2.rerouted.microbatches} == {(1, 0)}


def test_the_ratio_error_is_set_beside_the_headline_margin():
    """Review of issue 48: the simulator's error on the ratio between policies (with its per-step range and
    the victim) is compared in a note with the headline's margin over the strongest deployable baseline."""
    from mlsys_flows.systems.recycle.result import error_vs_margin, ratio_error_range

    r = {"victims": [0], "rerouted_steps_s": [0.3, 0.33], "restart_steps_s": [0.25, 0.26],
         "restart_decoupled_steps_s": [0.2, 0.22],
         "ratio_predicted": {"restart": 0.25 / 0.3, "restart_decoupled": 0.24 / 0.3},
         "ratio_prediction_error": {"restart": 0.0, "restart_decoupled": (0.2 / 0.3) / (0.24 / 0.3) - 1}}
    lo, hi = ratio_error_range(r, "restart")
    assert lo < 0.0 < hi and lo == pytest.approx(0.25 / 0.33 / (0.25 / 0.3) - 1)

    def samples(recycle: float) -> dict:
        return {"recycle_f1": {"throughput": [recycle]}, "oobleck_f1": {"throughput": [100.0]},
                "bamboo_f1": {"throughput": [90.0]}, "oobleck_decoupled_f1": {"throughput": [101.0]}}

    close = error_vs_margin(r, samples(103.0))   # margin +2% over decoupled Oobleck, error -17%
    assert "oobleck_decoupled_f1" in close and "LARGER than the headline's margin" in close
    assert "rank 0 (pipeline 0, stage 0)" in close and "not a verdict change" in close
    assert "predicts ReCycle slower than the restart" in close
    wide = error_vs_margin(r, samples(200.0))    # margin +98%
    assert "the margin is larger than the simulator's error" in wide and "LARGER" not in wide
