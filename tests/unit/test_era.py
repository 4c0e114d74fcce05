"""ERA: turn-level GAE is right (and a version that ignores episode ends is caught), the shaped reward
pays what it says, training and test tasks are disjoint, behaviour cloning learns the expert, PPO
spends exactly its environment-step budget, masking keeps the policy's actions valid, a cell is
deterministic, and bad parameters are rejected by name."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.era import Params
from mlsys_flows.systems.era.episodes import (Shaping, action_mask, dims, evaluate, expert_demos, task_sets,
                                              task_signature)
from mlsys_flows.systems.era.policy import Encoder, make_policy
from mlsys_flows.systems.era.ppo import PPOConfig, gae, ppo_train
from mlsys_flows.systems.era.prior import learn_prior
from mlsys_flows.systems.era.run import run_cell


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread, as in the flow's worker processes (and no thread contention on a busy machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _gae_reference(r, v, d, last, gamma, lam, honour_dones=True):
    """Textbook GAE written out per turn: A_t = sum_k (gamma*lam)^k delta_{t+k}, stopping at an episode end."""
    n = len(r)
    vals = list(v) + [last]
    out = []
    for t in range(n):
        total, coef = 0.0, 1.0
        for k in range(t, n):
            end = d[k] if honour_dones else False
            delta = r[k] + gamma * vals[k + 1] * (0.0 if end else 1.0) - vals[k]
            total += coef * delta
            if end:
                break
            coef *= gamma * lam
        out.append(total)
    return np.array(out)


def test_gae_matches_textbook_and_cuts_at_episode_ends():
    rng = np.random.default_rng(0)
    r, v = rng.normal(size=9).astype(np.float32), rng.normal(size=9).astype(np.float32)
    d = np.array([0, 0, 1, 0, 0, 0, 1, 0, 0], bool)
    adv, ret = gae(r, v, d, 0.7, 0.9, 0.8)
    np.testing.assert_allclose(adv, _gae_reference(r, v, d, 0.7, 0.9, 0.8), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ret, adv + v, rtol=1e-6)
    # the check is sharp: a GAE that runs across episode ends does not pass it
    broken = _gae_reference(r, v, d, 0.7, 0.9, 0.8, honour_dones=False)
    assert not np.allclose(adv, broken, atol=1e-3)


def test_shaped_reward_terms():
    s = Shaping(success_reward=1.0, subgoal_coef=0.5, distance_coef=0.1, invalid_penalty=0.2)
    # two expert steps closer, a quarter of the goal conditions newly met
    assert s.reward({"valid": True, "success": False, "progress": 0.5}, 0.25, 5, 3) == pytest.approx(0.125 + 0.2)
    # an invalid action: no progress, the penalty
    assert s.reward({"valid": False, "success": False, "progress": 0.25}, 0.25, 3, 3) == pytest.approx(-0.2)
    # success: the last steps and conditions count, plus the success reward
    assert s.reward({"valid": True, "success": True, "progress": 1.0}, 0.5, 1, None) == pytest.approx(1 + 0.25 + 0.1)
    sparse = Shaping(1.0, 0.0, 0.0, 0.0)
    assert sparse.reward({"valid": True, "success": False, "progress": 0.5}, 0.0, None, None) == 0.0


@pytest.mark.parametrize("level", ["high", "low"])
def test_tasks_disjoint_and_expert_demos(level):
    sets = task_sets(level, 2, 1, seed=3)
    test = {task_signature(t) for t in sets.test}
    assert sets.train and not any(task_signature(t) in test for t in sets.train)
    obs_dim, n_actions = dims(level)
    demos = expert_demos(sets.train, Encoder(obs_dim), n_actions)
    assert demos["expert_successes"] == len(sets.train)  # the scripted expert solves every training task
    assert demos["x"].shape == (len(demos["action"]), obs_dim) and demos["mask"][np.arange(len(demos["action"])), demos["action"]].all()


def test_prior_learning_clones_the_expert_and_masking_keeps_actions_valid():
    obs_dim, n_actions = dims("high")
    sets = task_sets("high", 2, 1, seed=5)
    enc = Encoder(obs_dim)
    demos = expert_demos(sets.train, enc, n_actions)
    torch.manual_seed(0)
    net = make_policy("high", obs_dim, n_actions, 64)
    before = evaluate(net, sets.train[:6], enc, n_actions)
    losses = learn_prior(net, demos, epochs=40, lr=3e-3, batch=64, grounding_weight=0.5, max_steps=16,
                         generator=torch.Generator().manual_seed(0))
    assert losses["bc_accuracy"] > 0.8 and losses["grounding_loss"] < 1.0
    after = evaluate(net, sets.train[:6], enc, n_actions)
    assert after["success_rate"] > before["success_rate"]
    assert after["invalid"] == 0 and before["invalid"] == 0  # masked logits never choose a rejected action


def test_ppo_spends_exactly_its_budget():
    obs_dim, n_actions = dims("low")
    sets = task_sets("low", 1, 1, seed=1)
    enc = Encoder(obs_dim)
    torch.manual_seed(0)
    net = make_policy("low", obs_dim, n_actions, 32)
    w0 = [p.detach().clone() for p in net.parameters()]
    cfg = PPOConfig(lr=1e-3, env_steps=150, n_envs=4, rollout_steps=64, epochs=2, minibatch=32, clip=0.2,
                    gamma=0.97, gae_lambda=0.95, entropy_coef=0.01, value_coef=0.5)
    log = ppo_train(net, sets.train, enc, n_actions, cfg, Shaping(1.0, 0.5, 0.05, 0.05),
                    np.random.default_rng(0), torch.Generator().manual_seed(0))
    assert log["env_steps"] == 150 and log["updates"] == 3 and log["curve_steps"] == [64, 128, 150]
    assert any(not torch.equal(a, b) for a, b in zip(w0, net.parameters()))


def test_action_mask_matches_environment():
    from mlsys_flows.systems.embodied.api import make_env
    sets = task_sets("high", 1, 1, seed=2)
    env = make_env(sets.test[0])
    env.reset()
    m = action_mask(env, dims("high")[1])
    for a in range(len(m)):
        probe = make_env(sets.test[0])
        probe.reset()
        assert probe.step(a)[3]["valid"] == bool(m[a])


def test_cell_is_deterministic():
    p = Params.for_scale("smoke", train_per_subset=1, rl_env_steps=64, rollout_steps=32, minibatch=32, prior_epochs=3)
    a, b = run_cell(p, "low", 0), run_cell(p, "low", 0)
    for v in ("rl_scratch", "prior_only", "prior_rl"):
        assert a["variants"][v]["success_rate"] == b["variants"][v]["success_rate"]
        np.testing.assert_array_equal(np.array(a["curves"].get(v, ([], []))[1], float),
                                      np.array(b["curves"].get(v, ([], []))[1], float))
    assert a["variants"]["rl_scratch"]["rl_env_steps"] == a["variants"]["prior_rl"]["rl_env_steps"] == 64
    assert a["variants"]["prior_only"]["rl_env_steps"] == 0


@pytest.mark.parametrize("field,value", [("minibatch", 100_000), ("seeds", 0), ("clip", 0.0), ("gamma", 1.5),
                                         ("n_envs", 10_000)])
def test_bad_params_rejected_by_name(field, value):
    with pytest.raises(ParamsError) as err:
        Params.for_scale("smoke", **{field: value})
    assert field in str(err.value) or "parameters" in str(err.value)


class _CueEnv:
    """A tiny two-turn task for PPO's sanity check: the observation shows a cue c (one of 4) and the turn;
    the task succeeds only if the first action is c and the second (c + 1) % 4, rewarded at the end (so
    the first turn's credit comes through the value and GAE). A random policy succeeds 1 time in 16."""

    n, max_steps = 4, 2

    def __init__(self, task):
        self.task, self.cue = task, task.seed % self.n

    def reset(self):
        self.steps, self.ok, self.succeeded = 0, True, False
        return self._obs()

    def _obs(self):
        from types import SimpleNamespace
        v = np.zeros(self.n + 2, np.float32)
        v[self.cue] = 1.0
        v[self.n + min(self.steps, 1)] = 1.0
        return SimpleNamespace(vector=v)

    def _progress(self):
        return float(self.succeeded)

    def valid_mask(self):
        return np.ones(self.n, bool)

    def step(self, a):
        self.ok &= a == (self.cue + self.steps) % self.n
        self.steps += 1
        done = self.steps >= self.max_steps
        self.succeeded = done and self.ok
        return self._obs(), float(self.succeeded), done, {"valid": True, "success": self.succeeded,
                                                          "progress": float(self.succeeded)}


def _greedy_success(net, tasks):
    wins = 0
    for t in tasks:
        env = _CueEnv(t)
        obs = env.reset()
        for _ in range(env.max_steps):
            logits, _ = net(torch.from_numpy(obs.vector)[None])
            obs, _, done, info = env.step(int(logits.argmax(-1)))
        wins += info["success"]
    return wins / len(tasks)


def ppo_learns_the_cue_task(steps: int = 3072) -> tuple[float, float, dict]:
    """(greedy success before, after, the training log) of PPO from scratch on _CueEnv."""
    from types import SimpleNamespace

    from mlsys_flows.systems.era.policy import MLPPolicy
    tasks = [SimpleNamespace(seed=c, instruction="") for c in range(_CueEnv.n)]
    torch.manual_seed(0)
    net = MLPPolicy(_CueEnv.n + 2, _CueEnv.n, 32)
    before = _greedy_success(net, tasks)
    cfg = PPOConfig(lr=1e-2, env_steps=steps, n_envs=8, rollout_steps=256, epochs=4, minibatch=64, clip=0.2,
                    gamma=0.97, gae_lambda=0.95, entropy_coef=0.0, value_coef=0.5)
    log = ppo_train(net, tasks, Encoder(_CueEnv.n + 2), _CueEnv.n, cfg, Shaping(1.0, 0.0, 0.0, 0.0),
                    np.random.default_rng(0), torch.Generator().manual_seed(0), make=_CueEnv)
    return before, _greedy_success(net, tasks), log


def test_ppo_learns_a_tiny_task_it_cannot_solve_by_chance():
    """Fails when PPO does not learn (a flipped surrogate sign, advantages that ignore the reward, a
    broken GAE or update): the greedy policy must solve every cue, and training success must climb
    from about chance (1/16) to most episodes."""
    before, after, log = ppo_learns_the_cue_task()
    assert before < 1.0 and after == 1.0
    curve = [x for x in log["curve_success"] if not np.isnan(x)]
    assert curve[0] < 0.3 and curve[-1] > 0.7   # (with the reward negated it ends near 0: checked by hand)


def test_ppo_reports_its_policy_at_every_update_for_the_regime():
    seen = []
    obs_dim, n_actions = dims("low")
    sets = task_sets("low", 1, 1, seed=1)
    torch.manual_seed(0)
    net = make_policy("low", obs_dim, n_actions, 16)
    cfg = PPOConfig(lr=1e-3, env_steps=128, n_envs=4, rollout_steps=64, epochs=1, minibatch=32, clip=0.2,
                    gamma=0.97, gae_lambda=0.95, entropy_coef=0.01, value_coef=0.5)
    ppo_train(net, sets.train, Encoder(obs_dim), n_actions, cfg, Shaping(1.0, 0.5, 0.05, 0.05),
              np.random.default_rng(0), torch.Generator().manual_seed(0), on_update=seen.append)
    assert seen == [64, 128]


def test_regime_budgets_are_read_off_the_same_runs():
    p = Params.for_scale("smoke", train_per_subset=1, rl_env_steps=128, rollout_steps=32, minibatch=32, prior_epochs=3,
                         regime_rl_share=[0.0, 0.6, 1.0])
    assert p.regime_rl_steps == [0, 64, 128]   # 0.6 of 128 steps, rounded down to whole 32-step rollouts
    cell = run_cell(p, "low", 0)
    v = cell["variants"]
    for name in ("rl_scratch", "prior_rl"):
        assert set(v[name]["success_at_rl_steps"]) == {"0", "64", "128"}
        assert v[name]["success_at_rl_steps"]["128"] == v[name]["success_rate"]   # the full budget is the run
    # no RL yet: prior + RL is the prior; the prior alone takes no RL steps
    assert v["prior_rl"]["success_at_rl_steps"]["0"] == v["prior_only"]["success_rate"]
    assert set(v["prior_only"]["success_at_rl_steps"].values()) == {v["prior_only"]["success_rate"]}
    # evaluating along the way does not change the training: same result as a run without the sweep
    plain = run_cell(p.model_copy(update={"regime_rl_share": [0.0, 1.0]}), "low", 0)
    assert plain["variants"]["prior_rl"]["success_rate"] == v["prior_rl"]["success_rate"]
    np.testing.assert_array_equal(np.array(plain["curves"]["prior_rl"], float), np.array(cell["curves"]["prior_rl"], float))


def test_regime_budgets_are_whole_rollouts_within_the_budget():
    assert Params.for_scale("quick").regime_rl_steps == [0, 1024, 2048, 3072, 4096]
    assert Params.for_scale("smoke", rl_env_steps=100).regime_rl_steps == [0, 100]
    with pytest.raises(ParamsError, match="regime_rl_share"):
        Params.for_scale("smoke", regime_rl_share=[0.0, 1.5])
    with pytest.raises(ParamsError, match="regime_rl_share"):
        Params.for_scale("smoke", regime_rl_share=[0.1, 0.2])   # both round down to 0 steps of the 128


def test_the_spec_declares_every_subset_metrics_kind():
    """The spec writes the six subsets out (it loads without numpy): they must be the environments' own."""
    from mlsys_flows.systems.embodied.core import SUBSETS
    from mlsys_flows.systems.era import SPEC, SUBSET_METRICS

    assert SUBSET_METRICS == tuple(f"success_{s}" for s in SUBSETS)
    assert SPEC.kinds["train_s"] == "measured" and all(SPEC.kinds[m] == "counted" for m in SUBSET_METRICS)
