"""Stage 1, embodied prior learning: behaviour cloning on the scripted expert's trajectories plus an
auxiliary grounding objective (predict how the observation changes under an action, and how many
steps remain to the goal) on the same trunk."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .policy import PolicyNet


def learn_prior(net: PolicyNet, demos: dict[str, np.ndarray], *, epochs: int, lr: float, batch: int,
                grounding_weight: float, max_steps: int, generator: torch.Generator) -> dict[str, float]:
    """Minimize cross-entropy to the expert's action (masked logits) + grounding_weight x (standardized
    next-observation-change MSE + remaining-steps MSE). Returns the last epoch's mean losses."""
    x = torch.from_numpy(demos["x"])
    mask = torch.from_numpy(demos["mask"])
    act = torch.from_numpy(demos["action"])
    delta = torch.from_numpy(demos["delta"])
    scale = delta.std(0).clamp_min(1e-3)
    delta = delta / scale
    remaining = torch.from_numpy(demos["remaining"]) / float(max_steps)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    n = x.shape[0]
    last = {"bc_loss": float("nan"), "grounding_loss": float("nan"), "bc_accuracy": float("nan")}
    for _ in range(epochs):
        perm = torch.randperm(n, generator=generator)
        totals = np.zeros(3)
        for start in range(0, n, batch):
            idx = perm[start:start + batch]
            logits, pred_delta, pred_remaining = net.prior_outputs(x[idx], mask[idx], act[idx])
            bc = nn.functional.cross_entropy(logits, act[idx])
            ground = nn.functional.mse_loss(pred_delta, delta[idx]) + nn.functional.mse_loss(pred_remaining, remaining[idx])
            loss = bc + grounding_weight * ground
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            totals += [bc.item() * len(idx), ground.item() * len(idx), (logits.argmax(-1) == act[idx]).sum().item()]
        last = {"bc_loss": totals[0] / n, "grounding_loss": totals[1] / n, "bc_accuracy": totals[2] / n}
    return last
