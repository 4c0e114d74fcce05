"""The shared embodied environments (systems/embodied): the fixed seeded test set, the scripted expert
solving every task within its budget, invalid actions never crashing, hidden state, the subsets'
distinguishing structure; and the checks failing on deliberately broken inputs."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mlsys_flows.systems.embodied import (ACTION_NAMES, LEVELS, N_ACTIONS, OBS_DIM, SUBSETS, EnvError, Task,
                                          expert_plan, make_env, make_tasks, valid_actions)
from mlsys_flows.systems.embodied import high, low


@pytest.mark.parametrize("level", LEVELS)
def test_test_set_is_fixed_and_tagged(level):
    a, b = make_tasks(level, 3, 7), make_tasks(level, 3, 7)
    assert a == b and a != make_tasks(level, 3, 8)
    assert [t.subset for t in a[:6]] == list(SUBSETS) and len(a) == 18
    assert len({t.id for t in a}) == 18 and all(t.level == level for t in a)
    assert len(ACTION_NAMES[level]) == N_ACTIONS[level]
    assert make_tasks(level, 3, 7)[:6] == make_tasks(level, 1, 7)   # a longer set extends the shorter one


@pytest.mark.parametrize("level", LEVELS)
def test_expert_solves_every_task_within_its_budget(level):
    for task in make_tasks(level, 12, 1):
        env = make_env(task)
        obs = env.reset()
        assert obs.vector.shape == (OBS_DIM[level],) and obs.vector.dtype == np.float32
        assert task.instruction in obs.text
        plan = expert_plan(env)
        assert len(plan) <= env.max_steps
        for k, a in enumerate(plan):
            assert valid_actions(env)[a]
            obs, r, done, info = env.step(a)
            assert info["valid"] and set(info) >= {"valid", "feedback", "success", "progress"}
            assert done == (k == len(plan) - 1)
        assert info["success"] and r == 1.0 and info["progress"] == 1.0


@pytest.mark.parametrize("level", LEVELS)
def test_expert_replans_from_a_midway_state(level):
    for task in make_tasks(level, 2, 2):
        env = make_env(task)
        rng = np.random.default_rng(0)
        for _ in range(5):   # a few random valid actions, then the expert from there
            env.step(int(rng.choice(np.flatnonzero(valid_actions(env)))))
        if env.done:
            continue
        for a in expert_plan(env):
            _, _, done, info = env.step(a)
        assert info["success"] or env.steps >= env.max_steps


@pytest.mark.parametrize("level", LEVELS)
def test_invalid_actions_are_reported_not_raised(level):
    env = make_env(make_tasks(level, 1, 0)[0])
    before = env.observe().vector.copy()
    for bad in (-1, N_ACTIONS[level], "x", 1.5, None, True):
        _, r, done, info = env.step(bad)
        assert info["valid"] is False and "Invalid action" in info["feedback"] and r == 0.0
    impossible = np.flatnonzero(~valid_actions(env))
    assert impossible.size
    _, _, _, info = env.step(int(impossible[0]))
    assert info["valid"] is False and info["feedback"]
    after = env.observe().vector
    n = OBS_DIM[level] - 1 - 64   # the state part (the step counter moved on)
    assert np.array_equal(before[:n], after[:n]) and env.invalid_actions == 7 and env.steps == 7


def test_episode_ends_at_the_step_budget():
    env = make_env(make_tasks("high", 1, 0)[0])
    for _ in range(env.max_steps):
        _, _, done, info = env.step(-1)
    assert done and not info["success"] and "Out of steps" in info["feedback"]
    assert env.step(0)[3]["feedback"] == "The episode is over."


def test_high_hidden_objects_appear_when_their_container_opens():
    for task in make_tasks("high", 6, 3):
        if task.subset != "long_horizon":
            continue
        env = make_env(task)
        w = env.w
        hidden = [s for s in range(high.N_SLOTS) if w.ent[s] and w.ent[s]["kind"] == "obj" and not w.visible(s)]
        assert hidden   # long-horizon tasks hide at least one target
        o = hidden[0]
        r = w.loc(o)
        assert f"[slot {o}]" in env.observe().text.split("Not in view")[1]
        _, _, _, info = env.step(high.action_id("pick", o))
        assert not info["valid"] and "closed container" in info["feedback"]
        env.step(high.action_id("find", r))
        _, _, _, info = env.step(high.action_id("open", r))
        assert info["valid"] and f"[slot {o}]" in info["feedback"]
        assert w.visible(o) and f"[slot {o}]" in env.observe().text.split("Not in view")[0]
        return
    pytest.fail("no long-horizon task")


def test_low_obstacles_are_seen_only_from_a_neighbouring_cell():
    env = make_env(make_tasks("low", 1, 5)[0])
    w = env.w
    assert w.seen <= w.obstacles and w.seen != w.obstacles
    for r, c in w.seen:
        assert max(abs(r - w.agent[0]), abs(c - w.agent[1])) <= 1
    for a in expert_plan(env):
        env.step(a)
    assert len(w.seen) >= 1 and w.seen <= w.obstacles


def test_subsets_have_their_distinguishing_structure():
    for task in make_tasks("high", 4, 11):
        w = make_env(task).w
        (o, _), *rest = w.placements
        objs = [e for e in w.ent if e and e["kind"] == "obj"]
        t = w.ent[o]
        if task.subset == "common_sense":
            assert t["type"] not in task.instruction and high.OBJECTS[t["type"]][0] in task.instruction
        elif task.subset == "complex_instruction":
            named = [e for e in objs if e is not t and f"{e['colour']} {e['type']}" in task.instruction]
            assert named   # a distractor object is named
        elif task.subset == "spatial":
            twins = [e for e in objs if (e["type"], e["colour"], e["shape"]) == (t["type"], t["colour"], t["shape"])]
            assert len(twins) == 2 and ("left" in task.instruction or "right" in task.instruction)
        elif task.subset == "visual_appearance":
            same = [e for e in objs if e["type"] == t["type"]]
            assert len(same) == 3 and t["shape"] in task.instruction
        elif task.subset == "long_horizon":
            assert len(w.placements) >= 2 and w.closed_goal
        else:
            assert sum(e["type"] == t["type"] for e in objs) == 1


def test_a_task_whose_instruction_does_not_match_its_seed_is_rejected():
    task = make_tasks("low", 1, 0)[0]
    with pytest.raises(EnvError, match="instruction"):
        make_env(dataclasses.replace(task, instruction="Move the red cube to the blue pad."))
    with pytest.raises(EnvError, match="level"):
        make_tasks("middle", 1, 0)
    with pytest.raises(EnvError, match="per_subset"):
        make_tasks("low", 0, 0)
    with pytest.raises(EnvError, match="level"):
        make_env(Task("x", "mid", "base", "", 0))


def test_low_bfs_avoids_obstacles():
    blocked = {(0, 1), (1, 1), (2, 1)}
    path = low.bfs_path((0, 0), (0, 2), blocked)
    assert path is not None and len(path) == 8
    assert low.bfs_path((0, 0), (0, 2), blocked | {(3, 1), (4, 1), (5, 1), (6, 1)}) is None
