"""ERA's learned policies as agents of the EmbodiedBench protocol (systems/embodied/agents.run_episode).

    from mlsys_flows.systems.era import Params
    from mlsys_flows.systems.era.agent import trained_agents
    from mlsys_flows.systems.embodied.agents import run_episode

    agents = trained_agents(Params.for_scale("quick"), "low", seed_index=0)   # prior_only, prior_rl, rl_scratch
    res = run_episode(env, agents["prior_rl"], feedback=False, replan=True, max_rounds=env.max_steps)

The agent is the family package's ``PolicyAgent`` (systems/embodied/agents.py) around a
``GreedyPolicy``: a trained network as a step policy ``policy(observation_vector, valid_mask) -> action
id``. The policy is reactive (one action per observation), so it plays the closed-loop protocol one
action per round: each ``act`` returns a one-action plan chosen greedily from the current observation.
With ``feedback=False, replan=True`` and ``max_rounds >= env.max_steps`` it gets what it had in
training (the new observation each turn); the feedback text is never read. Under the open-loop
protocol (one plan from the first observation) a reactive policy can give only its first action, so it
is not comparable there. The observation is the environment's vector (``env.observe().vector``: the
same information as the text the language agents read); with ``use_mask=True`` (as in training) the
policy also gets the environment's valid-action mask, which language agents do not get: a labelled
advantage (at the low level it tells which neighbouring cells are blocked before the agent has seen
them).

``trained_policies`` is the one way to get ERA's trained policies outside the ERA flow: the ERA
flow's own training (``run.train_policies``), optionally with further test tasks kept out of training
(``exclude``: EmbodiedBench's test sets, tasks/embodiedbench.py).
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from ..embodied.agents import PolicyAgent
from ..embodied.api import N_ACTIONS, OBS_DIM
from .episodes import as_mask
from .policy import Encoder, PolicyNet
from .run import VARIANTS, train_policies


class GreedyPolicy:
    """A trained ERA network as a step policy: the argmax of its logits over the valid actions (ERA's
    own greedy evaluation, episodes.evaluate); every action when the mask allows none. With
    ``use_mask=False`` the network is not given the mask."""

    def __init__(self, net: PolicyNet, level: str, use_mask: bool = True):
        self.net, self.level, self.use_mask = net, level, use_mask
        self.encoder = Encoder(OBS_DIM[level])
        self.n_actions = N_ACTIONS[level]

    @torch.no_grad()
    def __call__(self, vector: np.ndarray, mask: np.ndarray) -> int:
        x = torch.from_numpy(self.encoder(vector))[None]
        m = torch.from_numpy(as_mask(mask, self.n_actions))[None] if self.use_mask else None
        was = self.net.training
        self.net.eval()
        logits, _ = self.net(x, m)
        self.net.train(was)
        return int(logits.argmax(-1))


def trained_policies(p, level: str, seed_index: int = 0, variants: tuple[str, ...] = VARIANTS,
                     lrs: dict[str, float] | None = None, use_mask: bool = True, exclude: Iterable[tuple] = (),
                     evaluate: bool = True) -> tuple[dict[str, GreedyPolicy], dict]:
    """Train ERA's ``variants`` on ``level`` exactly as the ERA flow's cell does (``run.train_policies``;
    ``lrs``: learning rates per RL variant, e.g. the ERA run's calibrated ones; default the parameters;
    ``exclude``: signatures of further test tasks to keep out of training; ``evaluate=False``: skip the
    evaluation on ERA's test set) and make each network a GreedyPolicy. Returns ({variant: policy}, the
    cell's output)."""
    nets, out = train_policies(p, level, seed_index, variants, lrs, exclude=exclude, evaluate=evaluate)
    return {v: GreedyPolicy(net, level, use_mask) for v, net in nets.items()}, out


def trained_agents(p, level: str, seed_index: int = 0, variants: tuple[str, ...] = ("prior_only", "prior_rl", "rl_scratch"),
                   lrs: dict[str, float] | None = None, use_mask: bool = True) -> dict[str, PolicyAgent]:
    """``trained_policies``, each wrapped as the family's PolicyAgent named ``era_<variant>`` (keyed by
    variant), bound to ``level``."""
    policies, _ = trained_policies(p, level, seed_index, variants, lrs, use_mask)
    return {v: PolicyAgent(pol, f"era_{v}", level) for v, pol in policies.items()}
