"""Episodes on the shared EmbodiedBench-style environments: task sets, the shaped reward, expert
demonstrations and greedy evaluation of a policy (torch, no Prefect)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..embodied.api import N_ACTIONS, OBS_DIM, SUBSETS, expert_plan, make_env, make_tasks, valid_actions
from .policy import Encoder, PolicyNet


def action_mask(env, n_actions: int) -> np.ndarray:
    """Boolean mask of the actions the environment accepts now (all True if it marks none valid)."""
    m = valid_actions(env)
    m = np.asarray(m, bool).reshape(-1)
    if m.shape[0] != n_actions or not m.any():
        return np.ones(n_actions, bool)
    return m


def task_signature(task, env=None) -> tuple:
    """What identifies a task's content (not its id): instruction, level and the reset observation."""
    env = env or make_env(task)
    obs = env.reset()
    return (task.level, task.instruction, obs.text, np.asarray(obs.vector, np.float32).round(5).tobytes())


@dataclass
class TaskSets:
    """Training tasks (expert demonstrations and RL episodes) and held-out test tasks, disjoint."""

    train: list
    test: list
    overlaps_dropped: int


def task_sets(level: str, train_per_subset: int, test_per_subset: int, seed: int) -> TaskSets:
    """The fixed seeded test set (generator seed ``seed``) and a training set from another generator
    seed; training tasks whose content equals a test task's are dropped (and counted)."""
    test = make_tasks(level, test_per_subset, seed)
    train = make_tasks(level, train_per_subset, seed + 7919)
    seen = {task_signature(t) for t in test}
    kept = [t for t in train if task_signature(t) not in seen]
    return TaskSets(train=kept, test=test, overlaps_dropped=len(train) - len(kept))


def goal_progress(env) -> float:
    """Share of the task's goal conditions met now (the environment reports it after every step in
    ``info["progress"]``; this reads it at reset)."""
    try:
        return float(env._progress())
    except Exception:
        return 0.0


class Shaping:
    """ERA's dense reward shaping on these environments. Per turn: ``success_reward`` on success;
    ``subgoal_coef`` x the change in the share of goal conditions met (the paper's subgoal rewards on
    the high level); ``distance_coef`` x the steps of progress toward the goal, measured as the scripted
    expert's remaining plan length before minus after the action (the paper's distance-to-target
    shaping on the low level); minus ``invalid_penalty`` for an action the environment rejects.
    All coefficients 0 but success_reward: the sparse success reward."""

    def __init__(self, success_reward: float, subgoal_coef: float, distance_coef: float, invalid_penalty: float):
        self.success_reward, self.subgoal_coef = success_reward, subgoal_coef
        self.distance_coef, self.invalid_penalty = distance_coef, invalid_penalty

    def distance(self, env) -> int | None:
        if self.distance_coef == 0.0:
            return None
        try:
            return len(expert_plan(env))
        except Exception:  # no plan from a dead-end state: no distance signal for this turn
            return None

    def reward(self, info: dict, progress_before: float, dist_before: int | None, dist_after: int | None) -> float:
        success = bool(info.get("success"))
        r = self.success_reward if success else 0.0
        r += self.subgoal_coef * (float(info.get("progress", progress_before)) - progress_before)
        if success:
            dist_after = 0
        if dist_before is not None and dist_after is not None:
            r += self.distance_coef * (dist_before - dist_after)
        if not info.get("valid", True):
            r -= self.invalid_penalty
        return r


def expert_demos(tasks: list, encoder: Encoder, n_actions: int) -> dict[str, np.ndarray]:
    """One scripted-expert trajectory per task: inputs, masks, actions, next-observation changes and
    remaining steps. Steps the expert takes are environment steps of the prior stage (counted)."""
    xs, masks, acts, deltas, remain = [], [], [], [], []
    successes = 0
    for task in tasks:
        env = make_env(task)
        obs = env.reset()
        plan = list(expert_plan(env))
        for k, a in enumerate(plan):
            xs.append(encoder(obs.vector, task.instruction))
            masks.append(action_mask(env, n_actions))
            nxt, _, done, info = env.step(int(a))
            acts.append(int(a))
            deltas.append(np.asarray(nxt.vector, np.float32) - np.asarray(obs.vector, np.float32))
            remain.append(len(plan) - k)
            obs = nxt
            if done:
                successes += bool(info.get("success"))
                break
    if not xs:
        raise ValueError("the scripted expert produced no demonstration steps")
    return {"x": np.stack(xs), "mask": np.stack(masks), "action": np.array(acts, np.int64),
            "delta": np.stack(deltas), "remaining": np.array(remain, np.float32),
            "episodes": np.array(len(tasks)), "expert_successes": np.array(successes)}


@torch.no_grad()
def evaluate(net: PolicyNet, tasks: list, encoder: Encoder, n_actions: int) -> dict:
    """Greedy (argmax) rollouts on ``tasks``: success per task, with its subset."""
    net.eval()
    per_subset: dict[str, list[bool]] = {s: [] for s in SUBSETS}
    steps = invalid = 0
    for task in tasks:
        env = make_env(task)
        obs = env.reset()
        success = False
        for _ in range(env.max_steps):
            x = torch.from_numpy(encoder(obs.vector, task.instruction))[None]
            mask = torch.from_numpy(action_mask(env, n_actions))[None]
            logits, _ = net(x, mask)
            obs, _, done, info = env.step(int(logits.argmax(-1)))
            steps += 1
            invalid += not info.get("valid", True)
            if done:
                success = bool(info.get("success"))
                break
        per_subset.setdefault(task.subset, []).append(success)
    net.train()
    flat = [s for v in per_subset.values() for s in v]
    return {"success_rate": float(np.mean(flat)), "episodes": len(flat), "steps": steps, "invalid": invalid,
            "per_subset": {s: float(np.mean(v)) for s, v in per_subset.items() if v}}


def dims(level: str) -> tuple[int, int]:
    return OBS_DIM[level], N_ACTIONS[level]
