"""The real-model server behind AI Metropolis's LLM calls (systems/metropolis/serve.py): batched
generation gives every request the tokens it would get alone, requests are admitted lagging agents
first, a dead server wakes its callers, and a simulation on it ends in the same world as on sleeps."""
from __future__ import annotations

import threading

import pytest
import torch

from mlsys_flows.systems.metropolis import Params, execute_model, simulate
from mlsys_flows.systems.metropolis.serve import ModelServer, ServeConfig
from mlsys_flows.systems.llm_serving.causal_minilm import pretrained


def alone(prompt: list[int], n: int) -> list[int]:
    """Greedy decoding of one request with full causal passes (no pool, no batch)."""
    model, toks = pretrained(), list(prompt)
    for _ in range(n):
        toks.append(int(model.full_logits(toks)[-1].argmax()))
    return toks[len(prompt):]


def test_batched_generation_matches_each_request_alone():
    cfg = ServeConfig(prompt_tokens=6, tokens_median=3, max_new_tokens=5)
    server = ModelServer(3, cfg)
    try:
        jobs = [(server.prompt_for(key), n) for key, n in [(1, 5), (2, 2), (3, 4), (4, 1), (5, 3)]]
        got: dict[int, list[int]] = {}
        threads = [threading.Thread(target=lambda i=i, p=p, n=n: got.__setitem__(i, server.generate(p, n, 0)))
                   for i, (p, n) in enumerate(jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        server.close()
    for i, (prompt, n) in enumerate(jobs):
        assert got[i] == alone(prompt, n), i
    assert server.tokens == sum(n for _, n in jobs) and server.prefills == len(jobs)
    assert server.pool.free == server.pool.size  # every slot released


def test_lagging_calls_are_admitted_first():
    """One slot: while a long request runs, three wait; they are served in priority order, not arrival."""
    server = ModelServer(1, ServeConfig(prompt_tokens=4, tokens_median=1, max_new_tokens=200))
    order = []
    try:
        first = threading.Thread(target=server.generate, args=(server.prompt_for(0), 200, 0))
        first.start()
        with server._cond:   # the first request holds the only slot once it is prefilled
            while server.prefills < 1:
                server._cond.wait(0.01)
        waiters = [threading.Thread(target=lambda prio=prio: order.append(
            (prio, server.generate(server.prompt_for(prio), 1, prio)) and prio)) for prio in (5, 1, 3)]
        for t in waiters:
            t.start()
        with server._cond:
            while len(server._waiting) < 3:
                server._cond.wait(0.01)
            queued_while_busy = first.is_alive()
        for t in [first, *waiters]:
            t.join()
    finally:
        server.close()
    assert queued_while_busy
    assert order == [1, 3, 5]


def test_a_failing_model_wakes_every_caller_with_an_error():
    class Broken:
        cfg = pretrained().cfg

        def prefill(self, *a, **k):
            raise ValueError("kernel failed")

    server = ModelServer(2, ServeConfig(prompt_tokens=4, tokens_median=1, max_new_tokens=2), model=Broken())
    with pytest.raises(RuntimeError, match="model server failed"):
        server.generate([1000, 1001, 1002, 1003], 2, 0)
    with pytest.raises(RuntimeError, match="stopped|failed"):
        server.generate([1000], 1, 0)
    server.close()


def test_prompt_and_output_must_fit_the_models_positions():
    with pytest.raises(ValueError, match="positions"):
        ModelServer(1, ServeConfig(prompt_tokens=500, tokens_median=1, max_new_tokens=20))
    Params(prompt_tokens=256, max_new_tokens=256)  # 512: fits
    with pytest.raises(ValueError, match="prompt_tokens \\+ max_new_tokens \\(513\\)"):
        Params(prompt_tokens=257, max_new_tokens=256)


def test_a_simulation_on_the_model_ends_in_the_same_world():
    p = Params(**Params.PRESETS["smoke"])
    cfg = p.config()
    ref = simulate("global_sync", cfg, p.llm_slots)
    threads = torch.get_num_threads()
    out, served = execute_model("out_of_order", cfg, p.llm_slots, p.serve_config())
    assert torch.get_num_threads() == threads     # restored
    assert out.digest == ref.digest and sorted(out.steps) == sorted(ref.steps)
    assert served["prefills"] == ref.llm_calls and served["tokens"] >= served["prefills"]
    assert 1 <= served["mean_batch"] <= p.llm_slots
