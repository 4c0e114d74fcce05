"""Episodes on the shared EmbodiedBench-style environments: task sets, the shaped reward, expert
demonstrations and greedy evaluation of a policy (torch, no Prefect)."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from ..embodied.api import N_ACTIONS, OBS_DIM, SUBSETS, expert_plan, make_env, make_tasks, valid_actions
from .policy import Encoder, PolicyNet


def action_mask(env, n_actions: int) -> np.ndarray:
    """Boolean mask of the actions the environment accepts now (all True if it marks none valid)."""
    return as_mask(valid_actions(env), n_actions)


def as_mask(m, n_actions: int) -> np.ndarray:
    """A valid-action mask as the policy reads it: boolean, ``n_actions`` long; all True when the given
    mask marks no action valid (or is not ``n_actions`` long)."""
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


def task_sets(level: str, train_per_subset: int, test_per_subset: int, seed: int,
              exclude: Iterable[tuple] = ()) -> TaskSets:
    """The fixed seeded test set (generator seed ``seed``) and a training set from another generator
    seed; training tasks whose content equals a test task's are dropped (and counted), and so are those
    whose ``task_signature`` is in ``exclude`` (another benchmark's test tasks: EmbodiedBench's)."""
    test = make_tasks(level, test_per_subset, seed)
    train = make_tasks(level, train_per_subset, seed + 7919)
    seen = {task_signature(t) for t in test} | set(exclude)
    kept = [t for t in train if task_signature(t) not in seen]
    return TaskSets(train=kept, test=test, overlaps_dropped=len(train) - len(kept))


def goal_progress(env) -> float:
    """Share of the task's goal conditions met now (the environment reports it after every step in
    ``info["progress"]``; this reads it at reset)."""
    try:
        return float(env._progress())
    except Exception:
        return 0.0


def state_key(env) -> tuple | None:
    """Everything of an environment's state that the scripted expert's plan depends on (the task, and
    the world's mutable parts: positions, what is held, open containers, contents), hashable; None
    for an environment of another kind (then nothing is memoised). What the agent has seen (the low
    level's revealed obstacles) and the step count are left out: the expert reads neither."""
    w, task = getattr(env, "w", None), getattr(env, "task", None)
    if w is None or task is None:
        return None
    ident = (task.level, task.subset, task.seed, task.instruction)
    if task.level == "low" and hasattr(w, "agent"):
        return ident + (w.agent, w.holding, tuple(o["pos"] for o in w.objects))
    if task.level == "high" and hasattr(w, "contents"):
        return ident + (w.at, w.holding, tuple(None if e is None else e.get("open") for e in w.ent),
                        tuple((r, tuple(c)) for r, c in sorted(w.contents.items())))
    return None


class Shaping:
    """ERA's dense reward shaping on these environments. Per turn: ``success_reward`` on success;
    ``subgoal_coef`` x the change in the share of goal conditions met (the paper's subgoal rewards on
    the high level); ``distance_coef`` x the steps of progress toward the goal, measured as the scripted
    expert's remaining plan length before minus after the action (the paper's distance-to-target
    shaping on the low level); minus ``invalid_penalty`` for an action the environment rejects.
    All coefficients 0 but success_reward: the sparse success reward."""

    MEMO_MAX = 500_000

    def __init__(self, success_reward: float, subgoal_coef: float, distance_coef: float, invalid_penalty: float):
        self.success_reward, self.subgoal_coef = success_reward, subgoal_coef
        self.distance_coef, self.invalid_penalty = distance_coef, invalid_penalty
        self._memo: dict[tuple, int | None] = {}
        self.memo_hits = 0

    def distance(self, env) -> int | None:
        """The scripted expert's remaining plan length from the env's state, memoised per state: RL
        episodes restart the same training tasks and revisit the same states, and the expert's plan
        (a deep copy of the world and a search) is the dominant cost of an RL step without the memo.
        The key is the whole mutable state the expert reads (``state_key``), so the memo is exact."""
        if self.distance_coef == 0.0:
            return None
        key = state_key(env)
        if key is not None and key in self._memo:
            self.memo_hits += 1
            return self._memo[key]
        try:
            d = len(expert_plan(env))
        except Exception:  # no plan from a dead-end state: no distance signal for this turn
            d = None
        if key is not None:
            if len(self._memo) >= self.MEMO_MAX:
                self._memo.clear()
            self._memo[key] = d
        return d

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
def evaluate(net: PolicyNet, tasks: list, encoder: Encoder, n_actions: int, batch: int = 64) -> dict:
    """Greedy (argmax) rollouts on ``tasks``: success per task, with its subset. Up to ``batch`` tasks
    run side by side, one batched forward pass per turn (each episode sees only its own observations,
    so the result is that of running the tasks one by one)."""
    net.eval()
    per_subset: dict[str, list[bool]] = {s: [] for s in SUBSETS}
    results: list[bool] = [False] * len(tasks)
    steps = invalid = 0
    for lo in range(0, len(tasks), batch):
        chunk = list(range(lo, min(lo + batch, len(tasks))))
        envs = {i: make_env(tasks[i]) for i in chunk}
        obs = {i: envs[i].reset() for i in chunk}
        live = list(chunk)
        while live:
            x = torch.from_numpy(np.stack([encoder(obs[i].vector, tasks[i].instruction) for i in live]))
            mask = torch.from_numpy(np.stack([action_mask(envs[i], n_actions) for i in live]))
            logits, _ = net(x, mask)
            acts = logits.argmax(-1).tolist()
            still = []
            for i, a in zip(live, acts):
                obs[i], _, done, info = envs[i].step(int(a))
                steps += 1
                invalid += not info.get("valid", True)
                if done or envs[i].steps >= envs[i].max_steps:
                    results[i] = bool(info.get("success"))
                else:
                    still.append(i)
            live = still
    net.train()
    for task, ok in zip(tasks, results):
        per_subset.setdefault(task.subset, []).append(ok)
    flat = [s for v in per_subset.values() for s in v]
    return {"success_rate": float(np.mean(flat)), "episodes": len(flat), "steps": steps, "invalid": invalid,
            "per_subset": {s: float(np.mean(v)) for s, v in per_subset.items() if v}}


def dims(level: str) -> tuple[int, int]:
    return OBS_DIM[level], N_ACTIONS[level]
