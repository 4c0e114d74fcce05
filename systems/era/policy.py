"""The ERA agent's small policy networks (structured per level, or an MLP), with policy, value and grounding heads.

The paper fine-tunes a 3B vision-language model; here the agent is a small network over the environment's
observation vector, which already ends with a hashed bag-of-words embedding of the task instruction
(systems/embodied). Invalid actions are masked out of the policy when the environment says which
actions are valid.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn


class Encoder:
    """Turns an observation into the policy's input row (checks its size)."""

    def __init__(self, obs_dim: int):
        self.obs_dim = obs_dim

    @property
    def dim(self) -> int:
        return self.obs_dim

    def __call__(self, vector: np.ndarray, instruction: str = "") -> np.ndarray:
        vec = np.asarray(vector, np.float32).reshape(-1)
        if vec.shape[0] != self.obs_dim:
            raise ValueError(f"observation vector has {vec.shape[0]} entries, expected {self.obs_dim}")
        return vec


class PolicyNet(nn.Module):
    """Base of the agent's networks: ``features(x) -> h`` (pooled state features) and ``heads(x) ->
    (logits, value, h)``; shared heads: value and the two grounding heads used in prior learning (the
    next observation's change given the action taken, and the remaining steps to the goal)."""

    def __init__(self, feat_dim: int, obs_dim: int, n_actions: int, hidden: int):
        super().__init__()
        self.n_actions = n_actions
        self.v = nn.Sequential(nn.Linear(feat_dim, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.dynamics = nn.Sequential(nn.Linear(feat_dim + n_actions, hidden), nn.Tanh(), nn.Linear(hidden, obs_dim))
        self.progress = nn.Linear(feat_dim, 1)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # (logits, pooled features)
        raise NotImplementedError

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        logits, h = self.heads(x)
        if mask is not None:
            logits = logits.masked_fill(~mask, -1e9)
        return logits, self.v(h).squeeze(-1)

    def grounding(self, x: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Predicted next-observation change for the taken actions, and predicted remaining steps."""
        return self.prior_outputs(x, None, actions)[1:]

    def prior_outputs(self, x: torch.Tensor, mask: torch.Tensor | None,
                      actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(masked logits, predicted next-observation change, predicted remaining steps) in one pass."""
        logits, h = self.heads(x)
        if mask is not None:
            logits = logits.masked_fill(~mask, -1e9)
        onehot = nn.functional.one_hot(actions, self.n_actions).to(h.dtype)
        return logits, self.dynamics(torch.cat([h, onehot], -1)), self.progress(h).squeeze(-1)


class MLPPolicy(PolicyNet):
    """Two tanh layers over the flat observation vector (the unstructured baseline architecture)."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int):
        super().__init__(hidden, obs_dim, n_actions, hidden)
        self.trunk = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.pi = nn.Linear(hidden, n_actions)
        nn.init.orthogonal_(self.pi.weight, 0.01)
        nn.init.zeros_(self.pi.bias)

    def heads(self, x):
        h = self.trunk(x)
        return self.pi(h), h


class SlotPolicy(PolicyNet):
    """High level: one token per numbered slot (its features and slot id) matched against the global
    token (instruction, holding, step), one self-attention layer over the tokens, and per slot one
    logit per verb, so action id = verb * n_slots + slot. Sharing weights across slots lets the policy
    generalize to unseen arrangements."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int, n_slots: int, per_slot: int):
        d = hidden
        super().__init__(2 * d, obs_dim, n_actions, hidden)
        self.n_slots, self.per_slot, self.n_verbs = n_slots, per_slot, n_actions // n_slots
        self.slot_in = nn.Linear(per_slot + n_slots, d)
        self.glob_in = nn.Linear(obs_dim - n_slots * per_slot, d)
        self.match = nn.Sequential(nn.Linear(3 * d, d), nn.ReLU(), nn.Linear(d, d))
        self.attend = nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, batch_first=True)
        self.pi = nn.Linear(d, self.n_verbs)
        nn.init.orthogonal_(self.pi.weight, 0.01)
        nn.init.zeros_(self.pi.bias)
        self.register_buffer("slot_ids", torch.eye(n_slots), persistent=False)

    def heads(self, x):
        b = x.shape[0]
        slots = x[:, :self.n_slots * self.per_slot].reshape(b, self.n_slots, self.per_slot)
        slots = torch.cat([slots, self.slot_ids.expand(b, -1, -1)], -1)
        e = torch.relu(self.slot_in(slots))
        g = torch.relu(self.glob_in(x[:, self.n_slots * self.per_slot:]))[:, None]
        h = self.match(torch.cat([e, g.expand_as(e), e * g], -1))
        out = self.attend(torch.cat([g, h], 1))
        logits = self.pi(out[:, 1:]).transpose(1, 2).reshape(b, -1)  # (b, verbs, slots) -> verb-major ids
        return logits, torch.cat([out[:, 0], out[:, 1:].mean(1)], -1)


class GridPolicy(PolicyNet):
    """Low level: the grid re-centred on the agent (egocentric, cells outside the room marked), a 3x3
    convolution modulated by the global features (instruction, held object, step; FiLM), a strided 3x3
    convolution, then an MLP to the action logits."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int, grid: int, channels: int, agent_channel: int = 1):
        super().__init__(hidden, obs_dim, n_actions, hidden)
        self.grid, self.channels, self.agent_channel = grid, channels, agent_channel
        self.view = 2 * grid - 1
        c = 8
        self.glob_in = nn.Sequential(nn.Linear(obs_dim - grid * grid * channels, hidden), nn.ReLU())
        self.conv1 = nn.Conv2d(channels + 1, c, 3, padding=1)
        self.film = nn.Linear(hidden, 2 * c)
        self.conv2 = nn.Conv2d(c, 2 * c, 3, stride=2, padding=1)
        side = (self.view + 1) // 2
        self.fc = nn.Sequential(nn.Linear(2 * c * side * side + hidden, hidden), nn.ReLU(),
                                nn.Linear(hidden, hidden), nn.ReLU())
        self.pi = nn.Linear(hidden, n_actions)
        nn.init.orthogonal_(self.pi.weight, 0.01)
        nn.init.zeros_(self.pi.bias)

    def egocentric(self, x: torch.Tensor) -> torch.Tensor:
        g, b = self.grid, x.shape[0]
        grid = x[:, :g * g * self.channels].reshape(b, g, g, self.channels)
        outside = torch.zeros(b, g, g, 1, dtype=x.dtype)
        grid = torch.cat([grid, outside], -1)
        pad = torch.zeros(b, 3 * g - 2, 3 * g - 2, self.channels + 1, dtype=x.dtype)
        pad[..., -1] = 1.0
        pad[:, g - 1:2 * g - 1, g - 1:2 * g - 1] = grid
        pos = grid[..., self.agent_channel].reshape(b, -1).argmax(-1)
        r, c = pos // g, pos % g
        rows = r[:, None] + torch.arange(self.view)
        cols = c[:, None] + torch.arange(self.view)
        view = pad[torch.arange(b)[:, None, None], rows[:, :, None], cols[:, None, :]]
        return view.permute(0, 3, 1, 2)

    def heads(self, x):
        glob = self.glob_in(x[:, self.grid * self.grid * self.channels:])
        gamma, beta = self.film(glob).chunk(2, -1)
        y = torch.relu(self.conv1(self.egocentric(x)) * (1 + gamma[..., None, None]) + beta[..., None, None])
        y = torch.relu(self.conv2(y))
        h = self.fc(torch.cat([y.flatten(1), glob], -1))
        return self.pi(h), h


def make_policy(level: str, obs_dim: int, n_actions: int, hidden: int, architecture: str = "structured") -> PolicyNet:
    """The policy network of a level: ``structured`` (slots at the high level, an egocentric grid at the
    low level; layouts from systems/embodied) or ``mlp`` (flat observation vector)."""
    if architecture == "mlp":
        return MLPPolicy(obs_dim, n_actions, hidden)
    if architecture != "structured":
        raise ValueError(f"architecture: {architecture!r} is not 'structured' or 'mlp'")
    if level == "high":
        from ..embodied.high import N_SLOTS, PER_SLOT
        return SlotPolicy(obs_dim, n_actions, hidden, N_SLOTS, PER_SLOT)
    from ..embodied.low import CHANNELS, GRID
    return GridPolicy(obs_dim, n_actions, hidden, GRID, CHANNELS)
