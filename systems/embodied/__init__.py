"""Shared embodied environments and agents (family ``embodied``: the ``embodiedbench`` and ``era`` systems).

API (pure numpy; no prefect/dask/torch imports)::

    LEVELS = ("high", "low")
    SUBSETS = ("base", "common_sense", "complex_instruction", "spatial", "visual_appearance", "long_horizon")
    N_ACTIONS[level], OBS_DIM[level], ACTION_NAMES[level]   # fixed per level
    Task(id, level, subset, instruction, seed)              # frozen dataclass
    make_tasks(level, per_subset, seed) -> list[Task]        # fixed seeded test set, subsets interleaved
    env = make_env(task); obs = env.reset()                  # Observation(.text: str, .vector: float32[OBS_DIM])
    obs, reward, done, info = env.step(action_id)            # info: valid, feedback, success, progress, steps
    env.max_steps, env.task, env.steps, env.invalid_actions
    expert_plan(env) -> list[int]                            # scripted expert from the current state (for BC)
    valid_actions(env) -> np.ndarray[bool] (N_ACTIONS[level])

Levels. ``high``: household (EB-ALFRED-like), 10 numbered slots holding receptacles (fridge, cabinet,
drawer, microwave open and close; counter, table, sink, shelf) and objects with a colour and a shape;
action id = verb_index * 10 + slot, verbs find, pick, put, open, close (50 actions). Objects inside closed
containers are hidden until opened. ``low``: a 7x7 grid with obstacles (seen only from a neighbouring
cell), objects (colour x shape) and coloured pads; actions up, down, left, right, pick up, put down.

Subsets (each task has one): base (direct reference); common_sense (object/place named by its use or a
common-sense property); complex_instruction (distractor clauses naming other objects); spatial (two
look-alikes told apart by relative position); visual_appearance (same-type objects told apart by colour
and shape); long_horizon (2-3 objects to place, plus closing a container at the high level).

Rewards: 1.0 on the step that completes the task, else 0.0; ``info["progress"]`` (share of goal
conditions met) is there for shaped rewards. Invalid actions (impossible, out of range, not an int)
never raise: they return ``valid=False`` with a feedback string, cost a step and change nothing. An
episode ends on success or after ``max_steps`` steps.

Member systems declare ``family="embodied"`` in their SystemSpec, and import from the SUBMODULES
(``from mlsys_flows.systems.embodied.api import make_env``; ``from ..embodied.agents import ...``):
the import contract allows ``systems.<member> -> systems.embodied.**``, which does not match the
package itself (``from ..embodied import make_env`` breaks `.ci/lint_imports.py`). This package
re-exports the API for users and tests.
Agents (JSON plans of action ids, scripted and OpenAI-compatible LLM agents) live in ``.agents``.
"""
from .api import *  # noqa: F401,F403
from .api import __all__  # noqa: F401
