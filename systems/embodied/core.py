"""Level-independent pieces of the embodied environments: tasks, observations, the Env base class."""
from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field

import numpy as np

from mlsys_flows.errors import MlsysError

LEVELS = ("high", "low")
SUBSETS = ("base", "common_sense", "complex_instruction", "spatial", "visual_appearance", "long_horizon")

#: buckets of the hashed bag-of-words of the instruction at the end of every observation vector
INSTRUCTION_BUCKETS = 64


class EnvError(MlsysError, ValueError):
    """A bad level, subset or task description (never raised for a bad action: see Env.step)."""


@dataclass(frozen=True)
class Task:
    """One episode of the fixed test set: the world is regenerated from (level, subset, seed)."""
    id: str
    level: str
    subset: str
    instruction: str
    seed: int


@dataclass(frozen=True)
class Observation:
    """What an agent sees: ``text`` for language agents, ``vector`` (float32, OBS_DIM[level]) for
    policy networks. Both show the same information (hidden things stay hidden in both)."""
    text: str
    vector: np.ndarray = field(repr=False)


def instruction_features(instruction: str) -> np.ndarray:
    """Hashed bag of words (crc32 of each lower-cased word, INSTRUCTION_BUCKETS buckets, counts
    clipped to 1): a fixed-size, deterministic encoding of the instruction for the vector."""
    v = np.zeros(INSTRUCTION_BUCKETS, np.float32)
    for w in re.findall(r"[a-z]+", instruction.lower()):
        v[zlib.crc32(w.encode()) % INSTRUCTION_BUCKETS] = 1.0
    return v


class Env:
    """Base class of both levels. Subclasses set the class attributes below and implement
    ``_apply(action) -> (valid, feedback)``, ``_progress() -> fraction of goal conditions met``,
    ``_text()``, ``_state_vector()`` and ``_valid_mask()``.

    ``step`` never raises for an action: an out-of-range or impossible action returns
    ``info["valid"] = False`` with a feedback string, costs one step and changes nothing."""

    level: str = ""
    n_actions: int = 0
    action_names: list[str] = []
    # Each level sets these: its world type, ``generate(subset, rng) -> (world, instruction)`` and
    # its step budgets (per subset, else the default).
    world_type: type = object
    generate = None
    max_steps_by_subset: dict[str, int] = {}
    default_max_steps: int = 0

    def __init__(self, task: Task):
        self.task = task
        self.max_steps = int(self.max_steps_by_subset.get(task.subset, self.default_max_steps))
        self.w = self.world_type()
        self.steps = 0
        self.done = False
        self.succeeded = False
        self.invalid_actions = 0
        self._instr_vec = instruction_features(task.instruction)

    # -- public API -------------------------------------------------------------------------
    def reset(self) -> Observation:
        """Rebuild the world of this task (deterministic) and return the first observation."""
        self.steps = 0
        self.done = False
        self.succeeded = False
        self.invalid_actions = 0
        self.w, instruction = type(self).generate(self.task.subset, np.random.default_rng(self.task.seed))
        if instruction != self.task.instruction:
            raise EnvError(f"task {self.task.id}: instruction does not match its seed")
        return self.observe()

    def observe(self) -> Observation:
        text = (f"Instruction: {self.task.instruction}\n{self._text()}\n"
                f"Steps used: {self.steps}/{self.max_steps}.")
        vec = np.concatenate([self._state_vector(), [self.steps / max(1, self.max_steps)], self._instr_vec])
        return Observation(text, vec.astype(np.float32))

    def step(self, action) -> tuple[Observation, float, bool, dict]:
        """Apply one action id. Returns (observation, reward, done, info) with info keys ``valid``,
        ``feedback``, ``success``, ``progress`` (share of goal conditions met, for shaped rewards)
        and ``steps``. Reward is 1.0 on the step that completes the task, else 0.0."""
        if self.done:
            return self.observe(), 0.0, True, dict(valid=False, feedback="The episode is over.",
                                                   success=self.succeeded, progress=self._progress(),
                                                   steps=self.steps)
        try:
            a = int(action)
            ok_type = not isinstance(action, bool) and a == action
        except (TypeError, ValueError, OverflowError):
            a, ok_type = -1, False
        if not ok_type or not 0 <= a < self.n_actions:
            valid, feedback = False, f"Invalid action {action!r}: action ids are integers 0..{self.n_actions - 1}."
        else:
            valid, feedback = self._apply(a)
            feedback = f"{self.action_names[a]}: {feedback}"
        self.steps += 1
        self.invalid_actions += not valid
        progress = self._progress()
        reward = 0.0
        if progress >= 1.0 and not self.succeeded:
            self.succeeded, reward = True, 1.0
            feedback += " The task is complete."
        self.done = self.succeeded or self.steps >= self.max_steps
        if self.done and not self.succeeded:
            feedback += " Out of steps: the task was not completed."
        return self.observe(), reward, self.done, dict(valid=valid, feedback=feedback, success=self.succeeded,
                                                       progress=progress, steps=self.steps)

    def valid_mask(self) -> np.ndarray:
        """Boolean mask (n_actions) of the actions that would be valid now."""
        return self._valid_mask()

    def scene_actions(self) -> list[tuple[int, str]]:
        """(id, name) of the actions this scene offers, by id: what EmbodiedBench's simulators list to a
        language agent (an action on an empty slot, or verb a thing does not take, is not offered; an
        offered one may still be invalid in the current state: this is no valid-action mask). Fixed
        for the episode. Default: every action id with its generic name."""
        return list(enumerate(self.action_names))

    # -- for subclasses ---------------------------------------------------------------------
    def _apply(self, a: int) -> tuple[bool, str]: raise NotImplementedError
    def _progress(self) -> float: raise NotImplementedError
    def _text(self) -> str: raise NotImplementedError
    def _state_vector(self) -> np.ndarray: raise NotImplementedError
    def _valid_mask(self) -> np.ndarray: raise NotImplementedError
    def expert_plan(self) -> list[int]: raise NotImplementedError
