"""The real-model server behind AI Metropolis's LLM calls (systems/metropolis/serve.py, SmolLM2 on the
serving family's batching core): batched generation gives every request the tokens it would get
alone (greedy), sampled generation reproduces with its seed and differs between calls, requests are
admitted lagging agents first, a dead server wakes its callers, the served logits pass the in-run
check, and a simulation on it ends in the same world as on sleeps."""
from __future__ import annotations

import threading

import pytest
import torch

from mlsys_flows.systems.llm_serving.engine import LOGIT_REL_BOUND, LogitCheckError
from mlsys_flows.systems.llm_serving.model_card import SMOLLM2_TOKEN_IDS
from mlsys_flows.systems.llm_serving.smollm2 import pretrained
from mlsys_flows.systems.metropolis import Params, execute_model, simulate
from mlsys_flows.systems.metropolis.serve import ModelServer, ServeConfig


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def alone(prompt: list[int], n: int) -> list[int]:
    """Greedy decoding of one request with full causal passes (no pool, no batch)."""
    model, toks = pretrained(), list(prompt)
    for _ in range(n):
        toks.append(int(model.full_logits(toks)[-1].argmax()))
    return toks[len(prompt):]


def _serve_all(server: ModelServer, jobs) -> dict[int, list[int]]:
    got: dict[int, list[int]] = {}
    threads = [threading.Thread(target=lambda i=i, p=p, n=n: got.__setitem__(i, server.generate(p, n, 0, key=i)))
               for i, (p, n) in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def test_batched_generation_matches_each_request_alone():
    cfg = ServeConfig(prompt_tokens=6, tokens_median=3, max_new_tokens=5, temperature=0.0)
    server = ModelServer(3, cfg)
    try:
        jobs = [(server.prompt_for(key), n) for key, n in [(1, 5), (2, 2), (3, 4), (4, 1), (5, 3)]]
        got = _serve_all(server, jobs)
    finally:
        server.close()
    for i, (prompt, n) in enumerate(jobs):
        assert all(t in SMOLLM2_TOKEN_IDS for t in prompt)
        assert got[i] == alone(prompt, n), i
    assert server.tokens == sum(n for _, n in jobs) and server.prefills == len(jobs)
    assert server.prefill_calls < len(jobs)   # newcomers were prefilled together
    assert server.pool.free == server.pool.size  # every slot released
    worst, checked = server.check_logits()
    assert worst < LOGIT_REL_BOUND and checked >= 2   # the first call of more than one token and the largest batch's


def test_sampled_generation_reproduces_and_calls_differ():
    def run(seed: int) -> dict[int, list[int]]:
        server = ModelServer(4, ServeConfig(prompt_tokens=6, tokens_median=4, max_new_tokens=6, seed=seed))
        try:
            same = server.prompt_for(7)   # one prompt for every call: only the call's key tells them apart
            return _serve_all(server, [(same, 6)] * 4)
        finally:
            server.close()

    a, b, c = run(0), run(0), run(1)
    assert a == b and a != c
    assert len({tuple(o) for o in a.values()}) > 1


def test_lagging_calls_are_admitted_first():
    """One slot: while a long request runs, three wait; they are served in priority order, not arrival."""
    server = ModelServer(1, ServeConfig(prompt_tokens=4, tokens_median=1, max_new_tokens=120))
    order = []
    try:
        first = threading.Thread(target=server.generate, args=(server.prompt_for(0), 120, 0))
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


def test_the_logit_check_keeps_the_largest_batchs_call_and_fails_on_nothing_checked():
    """check=0: no first calls are kept, yet the call admitted into the run's largest batch is checked;
    a run whose calls all have one token (no decode step) checked nothing and fails."""
    server = ModelServer(3, ServeConfig(prompt_tokens=4, tokens_median=2, max_new_tokens=3, temperature=0.0, check=0))
    try:
        _serve_all(server, [(server.prompt_for(k), n) for k, n in [(1, 3), (2, 1), (3, 2), (4, 3)]])
        worst, checked = server.check_logits()
    finally:
        server.close()
    assert worst < LOGIT_REL_BOUND and checked == 1
    server = ModelServer(2, ServeConfig(prompt_tokens=4, tokens_median=1, max_new_tokens=1, temperature=0.0))
    try:
        _serve_all(server, [(server.prompt_for(k), 1) for k in range(3)])
        with pytest.raises(LogitCheckError, match="no call"):
            server.check_logits()
    finally:
        server.close()


def test_a_failing_model_wakes_every_caller_with_an_error():
    class Broken:
        cfg = pretrained().cfg

        def prefill_batch(self, *a, **k):
            raise ValueError("kernel failed")

    server = ModelServer(2, ServeConfig(prompt_tokens=4, tokens_median=1, max_new_tokens=2), model=Broken())
    with pytest.raises(RuntimeError, match="model server failed"):
        server.generate([1000, 1001, 1002, 1003], 2, 0)
    with pytest.raises(RuntimeError, match="stopped|failed"):
        server.generate([1000], 1, 0)
    server.close()


def test_prompt_and_output_must_fit_the_models_positions():
    with pytest.raises(ValueError, match="positions"):
        ModelServer(1, ServeConfig(prompt_tokens=8190, tokens_median=1, max_new_tokens=20))
    Params(prompt_tokens=8000, max_new_tokens=192)  # 8192: fits
    with pytest.raises(ValueError, match="prompt_tokens \\+ max_new_tokens \\(8193\\)"):
        Params(prompt_tokens=8001, max_new_tokens=192)
    assert Params().llm == "smollm2"
    with pytest.raises(ValueError):
        Params(llm="minilm")   # the old stand-in is gone


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
    assert served["prefill_calls"] <= served["prefills"]
    assert 0 <= served["logit_check"] < LOGIT_REL_BOUND and served["logit_checked"] >= 1
