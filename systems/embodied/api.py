"""The environment API (see the package docstring); members import from here."""
from __future__ import annotations

import numpy as np

from . import high, low
from .core import INSTRUCTION_BUCKETS, LEVELS, SUBSETS, Env, EnvError, Observation, Task, instruction_features

N_ACTIONS: dict[str, int] = {"high": high.N_ACTIONS, "low": low.N_ACTIONS}
OBS_DIM: dict[str, int] = {"high": high.OBS_DIM_STATE + 1 + INSTRUCTION_BUCKETS,
                           "low": low.OBS_DIM_STATE + 1 + INSTRUCTION_BUCKETS}
ACTION_NAMES: dict[str, list[str]] = {"high": list(high.ACTION_NAMES), "low": list(low.ACTION_NAMES)}
_ENVS = {"high": high.HighEnv, "low": low.LowEnv}
_GEN = {"high": high._generate, "low": low._generate}


def _check_level(level: str) -> None:
    if level not in LEVELS:
        raise EnvError(f"level: {level!r} is not one of {LEVELS}")


def make_task(level: str, subset: str, seed: int, index: int = 0) -> Task:
    """One task whose world is generated from ``seed``."""
    _check_level(level)
    if subset not in SUBSETS:
        raise EnvError(f"subset: {subset!r} is not one of {SUBSETS}")
    _, instruction = _GEN[level](subset, np.random.default_rng(seed))
    return Task(f"{level}-{subset}-{index:03d}", level, subset, instruction, int(seed))


def make_tasks(level: str, per_subset: int, seed: int) -> list[Task]:
    """The fixed, seeded test set of one level: ``per_subset`` tasks of each of the six subsets, in
    round-robin order (base 0, common_sense 0, ..., base 1, ...). Same arguments, same tasks."""
    _check_level(level)
    if per_subset < 1:
        raise EnvError(f"per_subset: must be >= 1, got {per_subset}")
    seeds = np.random.default_rng([int(seed), LEVELS.index(level)]).integers(0, 2**31 - 1, (per_subset, len(SUBSETS)))
    return [make_task(level, subset, int(seeds[i, j]), i) for i in range(per_subset) for j, subset in enumerate(SUBSETS)]


def make_env(task: Task) -> Env:
    """A fresh environment for ``task`` (call ``reset()`` before stepping)."""
    _check_level(task.level)
    env = _ENVS[task.level](task)
    env.reset()
    return env


def expert_plan(env: Env) -> list[int]:
    """A scripted expert's actions that complete the task from the env's current state, using the
    full state (hidden objects and obstacles included). Executing them succeeds within the step
    budget from the initial state of every generated task."""
    return env.expert_plan()


def valid_actions(env: Env) -> np.ndarray:
    """Boolean mask over N_ACTIONS[level]: which actions are valid in the current state."""
    return env.valid_mask()


__all__ = ["LEVELS", "SUBSETS", "N_ACTIONS", "OBS_DIM", "ACTION_NAMES", "Task", "Observation", "Env", "EnvError",
           "make_task", "make_tasks", "make_env", "expert_plan", "valid_actions", "instruction_features"]
