"""ERA's learned policies as agents of the EmbodiedBench protocol (systems/embodied/agents.run_episode).

    from mlsys_flows.systems.era import Params
    from mlsys_flows.systems.era.agent import PolicyAgent, trained_agents
    from mlsys_flows.systems.embodied.agents import run_episode

    agents = trained_agents(Params.for_scale("quick"), "low", seed_index=0)   # prior_only, prior_rl, rl_scratch
    res = run_episode(env, agents["prior_rl"], feedback=False, replan=True, max_rounds=env.max_steps)

The policy is reactive (one action per observation), so it plays the closed-loop protocol one action per
round: each ``act`` returns a one-action plan chosen greedily from the current observation. With
``feedback=False, replan=True`` and ``max_rounds >= env.max_steps`` it gets what it had in training (the
new observation each turn); the feedback text is never read. Under the open-loop protocol (one plan
from the first observation) a reactive policy can give only its first action, so it is not comparable
there. The observation is the environment's vector (``env.observe().vector``: the same information as
the text the language agents read); with ``use_mask=True`` (as in training) the policy also gets the
environment's valid-action mask, which language agents do not get: a labelled advantage (at the low
level it tells which neighbouring cells are blocked before the agent has seen them).
"""
from __future__ import annotations

import torch

from ..embodied.agents import plan_json
from ..embodied.api import N_ACTIONS, OBS_DIM
from .episodes import action_mask
from .policy import Encoder, PolicyNet


class PolicyAgent:
    """A trained ERA network as an EmbodiedBench agent (``reset(env)``, ``act(inp) -> JSON plan``)."""

    uses_feedback = False

    def __init__(self, net: PolicyNet, level: str, name: str = "era", use_mask: bool = True):
        self.net, self.level, self.name, self.use_mask = net, level, name, use_mask
        self.encoder = Encoder(OBS_DIM[level])
        self.env = None

    def reset(self, env) -> None:
        if env.task.level != self.level:
            raise ValueError(f"level: the policy was trained on the {self.level} level, not {env.task.level!r}")
        self.env = env

    @torch.no_grad()
    def act(self, inp) -> str:
        env = self.env
        x = torch.from_numpy(self.encoder(env.observe().vector))[None]
        mask = torch.from_numpy(action_mask(env, N_ACTIONS[self.level]))[None] if self.use_mask else None
        was = self.net.training
        self.net.eval()
        logits, _ = self.net(x, mask)
        self.net.train(was)
        return plan_json([int(logits.argmax(-1))])


def trained_agents(p, level: str, seed_index: int = 0, variants: tuple[str, ...] = ("prior_only", "prior_rl", "rl_scratch"),
                   lrs: dict[str, float] | None = None, use_mask: bool = True) -> dict[str, PolicyAgent]:
    """Train ERA's ``variants`` on ``level`` exactly as the ERA flow's cell does (``run.train_policies``;
    ``lrs``: learning rates per RL variant, e.g. the ERA run's calibrated ones; default the parameters)
    and wrap each network as a PolicyAgent named ``era_<variant>``."""
    from .run import train_policies

    nets, _ = train_policies(p, level, seed_index, variants, lrs)
    return {v: PolicyAgent(net, level, f"era_{v}", use_mask) for v, net in nets.items()}
