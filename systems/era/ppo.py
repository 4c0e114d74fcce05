"""Stage 2, online RL: PPO with turn-level advantages and the shaped reward.

ERA's agent answers each turn with a whole response; its turn-level PPO gives the turn one value
estimate and one advantage (GAE runs over turns, not tokens) and applies it to the log-probability of
the whole turn. Here a turn is one agent decision (one action id), so the value, the reward, the
discount and the generalized advantage estimate are all per turn, and the importance ratio is that of
the turn's action. The objective is PPO's clipped surrogate with a value head, an entropy bonus and
several epochs of minibatch updates per rollout.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..embodied.api import make_env
from .episodes import Shaping, action_mask, goal_progress
from .policy import Encoder, PolicyNet


@dataclass(frozen=True)
class PPOConfig:
    lr: float
    env_steps: int          # the RL stage's budget of environment steps (turns)
    n_envs: int             # episodes collected side by side
    rollout_steps: int      # turns per update (over all envs)
    epochs: int
    minibatch: int
    clip: float
    gamma: float
    gae_lambda: float
    entropy_coef: float
    value_coef: float
    max_grad_norm: float = 0.5
    value_only_updates: int = 0   # first updates train the value head only (critic warm-up; the policy is kept)


def gae(rewards: np.ndarray, values: np.ndarray, dones: np.ndarray, last_value: float, gamma: float,
        lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimates over one slot's consecutive turns (episodes may end inside:
    ``dones[t]`` cuts the bootstrap after turn t). Returns (advantages, returns)."""
    n = len(rewards)
    adv = np.zeros(n, np.float32)
    running = 0.0
    for t in range(n - 1, -1, -1):
        next_value = last_value if t == n - 1 else values[t + 1]
        nonterminal = 1.0 - float(dones[t])
        delta = rewards[t] + gamma * next_value * nonterminal - values[t]
        running = delta + gamma * lam * nonterminal * running
        adv[t] = running
    return adv, adv + values.astype(np.float32)


class _Slot:
    """One environment running episodes of randomly drawn training tasks."""

    def __init__(self, tasks: list, rng: np.random.Generator, encoder: Encoder, n_actions: int, shaping: Shaping,
                 make: Callable = make_env):
        self.tasks, self.rng, self.encoder, self.n_actions, self.shaping = tasks, rng, encoder, n_actions, shaping
        self.make = make
        self.buf: dict[str, list] = {k: [] for k in ("x", "mask", "a", "logp", "v", "r", "done")}
        self.new_episode()

    def new_episode(self) -> None:
        self.task = self.tasks[int(self.rng.integers(len(self.tasks)))]
        self.env = self.make(self.task)
        self.obs = self.env.reset()
        self.t = 0
        self.progress = goal_progress(self.env)
        self.dist = self.shaping.distance(self.env)
        self.ret = 0.0

    def inputs(self) -> tuple[np.ndarray, np.ndarray]:
        return self.encoder(self.obs.vector, self.task.instruction), action_mask(self.env, self.n_actions)

    def step(self, x, mask, a: int, logp: float, v: float) -> tuple[bool, bool, float] | None:
        """Take the action; returns (episode ended, success, shaped return) when an episode ends."""
        obs, _, done, info = self.env.step(a)
        self.t += 1
        timeout = self.t >= self.env.max_steps
        after = None if (done and info.get("success")) else self.shaping.distance(self.env)
        r = self.shaping.reward(info, self.progress, self.dist, after)
        self.progress = float(info.get("progress", self.progress))
        self.dist, self.obs, self.ret = after, obs, self.ret + r
        ended = bool(done or timeout)
        for k, val in zip(("x", "mask", "a", "logp", "v", "r", "done"), (x, mask, a, logp, v, r, ended)):
            self.buf[k].append(val)
        if ended:
            out = (True, bool(info.get("success")), self.ret)
            self.new_episode()
            return out
        return None

    def take(self, last_value: float, gamma: float, lam: float) -> dict[str, np.ndarray] | None:
        if not self.buf["a"]:
            return None
        b = {k: np.asarray(v) for k, v in self.buf.items()}
        b["adv"], b["ret"] = gae(b["r"].astype(np.float32), b["v"].astype(np.float32), b["done"], last_value, gamma, lam)
        self.buf = {k: [] for k in self.buf}
        return b


def ppo_train(net: PolicyNet, tasks: list, encoder: Encoder, n_actions: int, cfg: PPOConfig, shaping: Shaping,
              rng: np.random.Generator, generator: torch.Generator, on_update: Callable[[int], None] | None = None,
              make: Callable = make_env) -> dict:
    """Train ``net`` in place for exactly ``cfg.env_steps`` environment steps. Returns counts and the
    training curve (env steps at each update, success rate of the episodes finished in that rollout).
    ``on_update(env_steps)`` runs after every update (e.g. to evaluate the policy at a smaller budget: the
    training is the same prefix whatever the budget, as long as it is a multiple of the rollout); ``make``
    builds a task's environment (the embodied ones by default; a unit test passes a tiny one)."""
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr, eps=1e-5)
    slots = [_Slot(tasks, rng, encoder, n_actions, shaping, make) for _ in range(cfg.n_envs)]
    steps = episodes = successes = updates = 0
    curve_steps: list[int] = []
    curve_success: list[float] = []
    curve_return: list[float] = []
    while steps < cfg.env_steps:
        target = min(cfg.rollout_steps, cfg.env_steps - steps)
        taken = 0
        finished: list[tuple[bool, float]] = []
        while taken < target:
            active = slots[:min(len(slots), target - taken)]
            rows = [s.inputs() for s in active]
            x = torch.from_numpy(np.stack([r[0] for r in rows]))
            mask = torch.from_numpy(np.stack([r[1] for r in rows]))
            with torch.no_grad():
                logits, values = net(x, mask)
                dist = torch.distributions.Categorical(logits=logits)
                acts = torch.multinomial(dist.probs, 1, generator=generator).squeeze(-1)
                logps = dist.log_prob(acts)
            for i, s in enumerate(active):
                end = s.step(rows[i][0], rows[i][1], int(acts[i]), float(logps[i]), float(values[i]))
                if end is not None:
                    finished.append(end[1:])
            taken += len(active)
        steps += taken
        batches = []
        with torch.no_grad():
            for s in slots:
                if not s.buf["a"]:
                    continue
                last = 0.0 if s.buf["done"][-1] else float(net(*(torch.from_numpy(v)[None] for v in s.inputs()))[1][0])
                batches.append(s.take(last, cfg.gamma, cfg.gae_lambda))
        batch = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
        _update(net, opt, batch, cfg, generator, value_only=updates < cfg.value_only_updates)
        updates += 1
        episodes += len(finished)
        successes += sum(ok for ok, _ in finished)
        curve_steps.append(steps)
        curve_success.append(float(np.mean([ok for ok, _ in finished])) if finished else float("nan"))
        curve_return.append(float(np.mean([r for _, r in finished])) if finished else float("nan"))
        if on_update is not None:
            on_update(steps)
    return {"env_steps": steps, "episodes": episodes, "train_successes": successes, "updates": updates,
            "curve_steps": curve_steps, "curve_success": curve_success, "curve_return": curve_return}


def _update(net: PolicyNet, opt: torch.optim.Optimizer, b: dict[str, np.ndarray], cfg: PPOConfig,
            generator: torch.Generator, value_only: bool = False) -> None:
    x = torch.from_numpy(np.stack(b["x"]).astype(np.float32))
    mask = torch.from_numpy(np.stack(b["mask"]).astype(bool))
    act = torch.from_numpy(b["a"].astype(np.int64))
    old_logp = torch.from_numpy(b["logp"].astype(np.float32))
    adv = torch.from_numpy(b["adv"])
    ret = torch.from_numpy(b["ret"].astype(np.float32))
    if len(adv) > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    n = len(act)
    for _ in range(cfg.epochs):
        perm = torch.randperm(n, generator=generator)
        for start in range(0, n, cfg.minibatch):
            idx = perm[start:start + cfg.minibatch]
            logits, value = net(x[idx], mask[idx])
            dist = torch.distributions.Categorical(logits=logits)
            ratio = torch.exp(dist.log_prob(act[idx]) - old_logp[idx])
            surrogate = torch.min(ratio * adv[idx], ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * adv[idx])
            value_loss = nn.functional.mse_loss(value, ret[idx])
            if value_only:
                loss = value_loss
                for p in net.parameters():
                    p.grad = None
                loss.backward(inputs=list(net.v.parameters()))
                nn.utils.clip_grad_norm_(net.v.parameters(), cfg.max_grad_norm)
                opt.step()
                continue
            loss = -surrogate.mean() + cfg.value_coef * value_loss - cfg.entropy_coef * dist.entropy().mean()
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), cfg.max_grad_norm)
            opt.step()
