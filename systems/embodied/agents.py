"""Agents for the embodied environments and the episode runner.

An agent sees text only (the instruction, the observation text and, when feedback is enabled, the
environment's feedback on its previous plan) and replies with a JSON plan of action ids, e.g.
``{"plan": [3, 13, 24]}`` (also accepted: a bare list, or EmbodiedBench's ``{"executable_plan":
[{"action_id": 3}, ...]}``; a ```json fence around it is fine). ``run_episode`` parses the reply;
a reply that is not valid JSON, holds no plan, or names an action id outside the level's range is an
invalid plan: it is counted with its reason and never raises.

Protocols: ``feedback=False`` is open loop -- the agent plans once from the initial observation and
the plan runs until it ends, an action is invalid, or the episode ends. ``feedback=True`` is closed
loop -- after each plan the agent gets the new observation plus the feedback on every executed action
and replans, up to ``max_rounds`` plans (an invalid plan costs a round). ``feedback=False,
replan=True`` gives the same round budget without the feedback: the agent replans from the new
observation alone (the ablation that separates feedback from retries).

Agents: ``ScriptedPlanner`` (a keyword planner that reads the text the way a weak model would: it takes
the first object/destination pair unless the instruction is a plain list, reads one attribute word
only, knows only part of the common-sense vocabulary, ignores spatial relations, and guesses where a
hidden object is; it uses no feedback), ``FeedbackReplanner`` (the same reading, but it replans from
the feedback: after a plan that ran without error yet did not finish the task it moves to its next
interpretation, after an invalid action it replans from what the new observation reveals),
``ObservationReplanner`` (the same reading, replanning from the new observation only: without
feedback it cannot tell a plan cut short by an invalid action from a plan that ran and did not finish
the task, so after every plan it moves to its next interpretation, re-reading the world it now sees),
``LLMAgent`` (any OpenAI-compatible chat endpoint through systems.common.llm; prompted as EmbodiedBench
prompts: every action the scene offers with its id and name, one worked example per level from a task
outside every test set), ``PrefixLLMAgent`` (a local model whose reply is forced to start with the plan's
JSON and whose decoding is constrained to a list of the offered ids: SmolLM2 through the project's own
forward), ``RandomPlanner`` (random plans from the offered actions: the floor), ``PolicyAgent`` (a learned step policy, e.g. ERA's, one action per plan) and ``ExpertAgent``
(reads the environment's full state: an upper bound, not a language agent). The scripted planners'
weaknesses are written by this project: they are a labelled reference, never the headline's evidence.
"""
from __future__ import annotations

import functools
import json
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from mlsys_flows.errors import MlsysError

from . import high, low
from .api import N_ACTIONS, expert_plan
from .core import Env, EnvError

# --- plans -------------------------------------------------------------------------------------


class PlanError(MlsysError, ValueError):
    """A reply that is not a usable plan; ``str(error)`` is the reason recorded for the episode."""


def parse_plan(reply: Any, n_actions: int, max_len: int = 200) -> list[int]:
    """Action ids from an agent's reply (see the module docstring); raises PlanError with the reason."""
    if not isinstance(reply, str):
        raise PlanError(f"reply is {type(reply).__name__}, not text")
    text = reply.strip()
    m = re.search(r"```(?:json)?\s*(.*?)```", text, re.S)
    if m:
        text = m.group(1).strip()
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    if not starts:
        raise PlanError(f"invalid JSON: no JSON object or list in the reply {reply[:80]!r}")
    start = min(starts)
    try:
        data, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as exc:
        raise PlanError(f"invalid JSON: {exc.msg} at char {exc.pos}") from None
    if isinstance(data, dict):
        for k in ("plan", "executable_plan", "actions"):
            if k in data:
                data = data[k]
                break
        else:
            raise PlanError(f"JSON object without a 'plan' list (keys {sorted(data)[:5]})")
    if not isinstance(data, list):
        raise PlanError(f"the plan is {type(data).__name__}, not a list of action ids")
    if not data:
        raise PlanError("empty plan")
    if len(data) > max_len:
        raise PlanError(f"plan of {len(data)} actions exceeds {max_len}")
    out = []
    for x in data:
        if isinstance(x, dict):
            x = x.get("action_id", x.get("id"))
        if isinstance(x, bool) or not isinstance(x, int):
            raise PlanError(f"action {x!r} is not an integer id")
        if not 0 <= x < n_actions:
            raise PlanError(f"action id {x} out of range 0..{n_actions - 1}")
        out.append(x)
    return out


@dataclass(frozen=True)
class AgentInput:
    """What an agent sees each round."""
    level: str
    instruction: str
    observation: str
    feedback: str | None      # None when feedback is disabled (open loop, or the first round)
    round: int
    action_names: tuple[str, ...]
    #: (id, name) of the actions the scene offers (``Env.scene_actions``); empty: every id, generic names
    actions: tuple[tuple[int, str], ...] = ()


class Agent(Protocol):
    name: str

    def reset(self, env: Env) -> None: ...
    def act(self, inp: AgentInput) -> str: ...


def plan_json(actions: list[int]) -> str:
    return json.dumps({"plan": [int(a) for a in actions]})


# --- reading the observation text (what a language agent has) --------------------------------

_SLOT = re.compile(r"(?:(\w+) (\w+) )?(\w+) \[slot (\d+)\]")


def _read_high(obs: str) -> dict:
    recs, objs, at, holding = {}, {}, None, None
    for line in obs.splitlines():
        m = re.match(r"- (\w+) \[slot (\d+)\]: (.*)$", line)
        if m:
            r = int(m.group(2))
            closed = m.group(3).startswith("closed")
            recs[r] = dict(type=m.group(1), closed=closed, openable=closed or m.group(3).startswith("open"))
            if not closed:
                for k, om in enumerate(_SLOT.finditer(m.group(3).split("(left to right)", 1)[-1])):
                    objs[int(om.group(4))] = dict(colour=om.group(1), shape=om.group(2), type=om.group(3), loc=r, pos=k)
        elif line.startswith("Not in view"):
            for om in _SLOT.finditer(line.split(":", 1)[1]):
                objs[int(om.group(4))] = dict(colour=om.group(1), shape=om.group(2), type=om.group(3), loc=None, pos=0)
        elif line.startswith("You are "):
            m1 = re.search(r"You are at the (\w+)\.", line)
            if m1:
                at = next((r for r, e in recs.items() if e["type"] == m1.group(1)), m1.group(1))
            m2 = re.search(r"holding the (\w+) (\w+) (\w+) \[slot (\d+)\]", line)
            if m2:
                holding = int(m2.group(4))
                objs[holding] = dict(colour=m2.group(1), shape=m2.group(2), type=m2.group(3), loc="hand", pos=0)
    # resolve "at" (the receptacle lines come after the "You are" line)
    m1 = re.search(r"You are at the (\w+)\.", obs)
    if m1:
        at = next((r for r, e in recs.items() if e["type"] == m1.group(1)), None)
    return dict(recs=recs, objs=objs, at=at, holding=holding)


def _cell(s: str) -> tuple[int, int]:
    a, b = s.strip("() ").split(",")
    return int(a), int(b)


def _read_low(obs: str) -> dict:
    agent = _cell(re.search(r"You are at (\(\d+, \d+\))", obs).group(1))
    m = re.search(r"holding the (\w+) (\w+)\.", obs)
    holding = (m.group(1), m.group(2)) if m else None
    objs = [dict(colour=c, shape=s, pos=(int(r), int(q)))
            for c, s, r, q in re.findall(r"(\w+) (\w+) at \((\d+), (\d+)\)", obs.split("Objects:", 1)[1].split("\n", 1)[0])]
    pads = {c: (int(r), int(q)) for c, r, q in re.findall(r"(\w+) pad at \((\d+), (\d+)\)", obs)}
    obst = {(int(r), int(q)) for r, q in re.findall(r"\((\d+), (\d+)\)", obs.split("Known obstacles:", 1)[1].split("\n", 1)[0])}
    return dict(agent=agent, holding=holding, objs=objs, pads=pads, obstacles=obst)


# --- the scripted planner's (partial) knowledge ----------------------------------------------

# common-sense vocabulary the planner knows: half of each table (the rest it must guess)
KNOWN_USES = {k: v[0] for k, v in high.OBJECTS.items() if k in ("mug", "apple", "knife", "book", "towel")}
KNOWN_PLACES = {k: v[2] for k, v in high.RECEPTACLES.items() if k in ("fridge", "sink", "table", "cabinet")}
KNOWN_SHAPES_CS = {k: v for k, v in low.SHAPE_CS.items() if k in ("ball", "cube")}
KNOWN_COLOURS_CS = {k: v for k, v in low.COLOUR_CS.items() if k in ("green", "blue")}


def _mentions(instruction: str, level: str) -> list[tuple[str, Any]]:
    """Ordered mentions: ("obj", (colour or None, type)) and ("dest", name) in the instruction."""
    text = instruction.lower()
    found: list[tuple[int, str, Any]] = []
    if level == "high":
        colours, types, dests = high.COLOURS, tuple(high.OBJECTS), tuple(high.RECEPTACLES)
        for use_t, use in KNOWN_USES.items():
            for m in re.finditer(re.escape(use), text):
                found.append((m.start(), "obj", (None, use_t)))
        for place, use in KNOWN_PLACES.items():
            for m in re.finditer(re.escape(use), text):
                found.append((m.start(), "dest", place))
    else:
        colours, types, dests = low.COLOURS, low.SHAPES, ()
        for shape, phrase in KNOWN_SHAPES_CS.items():
            for m in re.finditer(re.escape(phrase), text):
                found.append((m.start(), "obj", (None, shape)))
        for colour, phrase in KNOWN_COLOURS_CS.items():
            for m in re.finditer(re.escape(phrase), text):
                found.append((m.start(), "dest", colour))
        for m in re.finditer(r"(\w+) pad\b", text):
            if m.group(1) in low.COLOURS:
                found.append((m.start(), "dest", m.group(1)))
    words = list(re.finditer(r"[a-z]+", text))
    for i, w in enumerate(words):
        if w.group() in types:
            prev = words[i - 1].group() if i else ""
            # one attribute word only: the word just before the noun, if it is a colour
            found.append((w.start(), "obj", (prev if prev in colours else None, w.group())))
        elif w.group() in dests:
            found.append((w.start(), "dest", w.group()))
    if re.search(r"\b(a|the) (thing|place|pad)\b", text) and not any(k == "obj" for _, k, _ in found):
        found.append((len(text), "obj", (None, None)))   # an object the planner cannot name
    found.sort(key=lambda x: x[0])
    return [(k, v) for _, k, v in found]


def read_goals(instruction: str, level: str) -> tuple[list[tuple[Any, Any]], bool, list[str]]:
    """(object, destination) pairs in order of mention (each object with the next destination
    mentioned after it), whether the instruction is a plain list to do in full, and the receptacles
    to close (high level)."""
    ms = _mentions(instruction, level)
    pairs, complete = [], True
    for i, (k, v) in enumerate(ms):
        if k == "obj":
            dest = next((d for kk, d in ms[i + 1:] if kk == "dest"), None)
            if dest is None:   # the destination named by an unknown common-sense phrase
                dest = "?"
            complete &= i + 1 < len(ms) and ms[i + 1][0] == "dest"
            pairs.append((v, dest))
    if not pairs:
        pairs = [((None, None), "?")]
    # a plain list: "Put/Move A to X, B to Y ..." with every object directly followed by its destination
    listing = bool(re.match(r"^(put|move) ", instruction.lower())) and complete
    closes = re.findall(r"then close the (\w+)", instruction.lower())
    return pairs, listing, closes


# --- scripted planners -------------------------------------------------------------------------


class ScriptedPlanner:
    """Open-loop keyword planner (see the module docstring). Deterministic."""
    name = "scripted"
    uses_feedback = False

    def reset(self, env: Env) -> None:
        self.hyp = 0
        self._last_obs = None

    # candidates for one (object, destination) mention, in the order the planner tries them
    def _high_candidates(self, st, obj, dest) -> list[tuple[int, int]]:
        colour, typ = obj
        objs = sorted(st["objs"].items(), key=lambda kv: (kv[1]["loc"] is None, kv[0]))
        c_obj = [s for s, o in objs if (typ is None or o["type"] == typ) and (colour is None or o["colour"] == colour)]
        if not c_obj:
            c_obj = [s for s, o in objs if typ is None or o["type"] == typ] or [s for s, _ in objs]
        c_dest = [r for r, e in sorted(st["recs"].items()) if e["type"] == dest] or sorted(st["recs"])
        return [(o, d) for o in c_obj for d in c_dest]

    def _low_candidates(self, st, obj, dest) -> list[tuple[int, str]]:
        _, shape = obj   # reads the shape word only
        objs = st["objs"]
        c_obj = [(o["colour"], o["shape"], o["pos"]) for o in objs if shape is None or o["shape"] == shape] or \
            [(o["colour"], o["shape"], o["pos"]) for o in objs]
        c_dest = [dest] if dest in st["pads"] else sorted(st["pads"])
        return [(o, d) for o in c_obj for d in c_dest]

    def hypotheses(self, inp: AgentInput, st) -> list[list[tuple[Any, Any]]]:
        """Each hypothesis: a list of (object, destination) placements to carry out in order."""
        pairs, listing, _ = read_goals(inp.instruction, inp.level)
        cand = self._high_candidates if inp.level == "high" else self._low_candidates
        if listing and len(pairs) > 1:
            return [[cand(st, o, d)[0] for o, d in pairs]]
        return [[c] for o, d in pairs for c in cand(st, o, d)]

    def act(self, inp: AgentInput) -> str:
        st = _read_high(inp.observation) if inp.level == "high" else _read_low(inp.observation)
        hyps = self.hypotheses(inp, st) if not hasattr(self, "_hyps") or inp.round == 0 else self._hyps
        self._hyps = hyps
        self._update(inp)
        goal = hyps[min(self.hyp, len(hyps) - 1)]
        if inp.level == "high":
            _, _, closes = read_goals(inp.instruction, "high")
            return plan_json(_plan_high(st, goal, closes))
        return plan_json(_plan_low(st, goal))

    def _update(self, inp: AgentInput) -> None:
        pass


class FeedbackReplanner(ScriptedPlanner):
    """The scripted planner, closed loop: a plan that ran cleanly but left the task unfinished
    falsifies the current interpretation (move to the next); an invalid action means the world
    differed from the plan's assumptions (replan from the new observation, same interpretation)."""
    name = "scripted_feedback"
    uses_feedback = True

    def _update(self, inp: AgentInput) -> None:
        fb = inp.feedback or ""
        if inp.round > 0 and "INVALID" not in fb and "not complete" in fb:
            self.hyp += 1


class ObservationReplanner(ScriptedPlanner):
    """The scripted planner given the closed loop's round budget but no feedback: each new plan is made
    from the new observation only. Being asked again tells it the task is not done, but not why, so it
    moves to its next interpretation after every plan (keeping the same one replans a wrong reading
    forever and does worse: tests/unit/test_embodiedbench.py)."""
    name = "scripted_replan"
    uses_feedback = False

    def _update(self, inp: AgentInput) -> None:
        if inp.round > 0:
            self.hyp += 1


def _plan_high(st, goal, closes) -> list[int]:
    A = high.action_id
    recs, objs = st["recs"], st["objs"]
    plan, at, holding = [], st["at"], st["holding"]
    opened = set()

    def go(r):
        nonlocal at
        if at != r:
            plan.append(A("find", r))
            at = r
        if recs[r]["openable"] and recs[r]["closed"] and r not in opened:
            plan.append(A("open", r))
            opened.add(r)

    targets = [o for o, _ in goal]
    if holding is not None and holding not in targets and at is not None:
        plan.append(A("put", at))
        holding = None
    for o, d in goal:
        if holding != o:
            if holding is not None:
                break
            loc = objs[o]["loc"]
            if loc is None:   # hidden: guess the container (the object's usual place first)
                closed = [r for r, e in sorted(recs.items()) if e["closed"] and r not in opened]
                home = high.OBJECTS.get(objs[o]["type"], (None, None))[1]
                closed.sort(key=lambda r: recs[r]["type"] != home)
                if not closed:
                    break
                loc = closed[0]
            go(loc)
            plan.append(A("pick", o))
            holding = o
        go(d)
        plan.append(A("put", d))
        holding = None
    for name in closes:
        r = next((r for r, e in recs.items() if e["type"] == name), None)
        if r is not None:
            if at != r:
                plan.append(A("find", r))
                at = r
            plan.append(A("close", r))
    return plan or [A("find", min(recs))]


def _path(start, goal, blocked) -> list[int]:
    path = low.bfs_path(start, goal, blocked)
    return path if path is not None else []


def _plan_low(st, goal) -> list[int]:
    """Goal items: ((colour, shape, position when first seen), pad colour). Plans on the known
    obstacles only (unknown cells are assumed free)."""
    plan, pos = [], st["agent"]
    objs, pads, blocked = st["objs"], st["pads"], st["obstacles"]
    holding = st["holding"]
    for (c, s, p0), d in goal:
        if d not in pads:
            continue
        if holding != (c, s):
            if holding is not None:   # put down whatever else is held
                plan.append(5)
                holding = None
            same = [o["pos"] for o in objs if (o["colour"], o["shape"]) == (c, s)]
            target = min(same, key=lambda q: abs(q[0] - p0[0]) + abs(q[1] - p0[1])) if same else None
            occupant = next((o for o in objs if o["pos"] == pads[d]), None)
            if occupant is not None and occupant["pos"] != target:
                # a wrong object sits on the pad (an earlier interpretation): move it off first
                free = [(pads[d][0] + dr, pads[d][1] + dc) for dr, dc in low.MOVES.values()]
                free = [q for q in free if 0 <= q[0] < low.GRID and 0 <= q[1] < low.GRID and q not in blocked
                        and all(o["pos"] != q for o in objs) and q not in pads.values()]
                if free:
                    plan += _path(pos, pads[d], blocked) + [4] + _path(pads[d], free[0], blocked) + [5]
                    pos = free[0]
                    objs = [dict(o, pos=free[0]) if o is occupant else o for o in objs]
            same = [o["pos"] for o in objs if (o["colour"], o["shape"]) == (c, s)]
            if not same:
                continue
            target = min(same, key=lambda q: abs(q[0] - p0[0]) + abs(q[1] - p0[1]))
            plan += _path(pos, target, blocked) + [4]
            pos = target
        plan += _path(pos, pads[d], blocked) + [5]
        pos, holding = pads[d], None
    return plan or [4]


class ExpertAgent:
    """Reads the full environment state (the scripted expert): the upper bound of the test set."""
    name = "expert"
    uses_feedback = False

    def reset(self, env: Env) -> None:
        self.env = env

    def act(self, inp: AgentInput) -> str:
        return plan_json(expert_plan(self.env))


# --- LLM agent -----------------------------------------------------------------------------

#: the world seed of each level's worked example: at or above 2**31, outside the range [0, 2**31 - 1) that
#: every test set and ERA's training sets draw their world seeds from (``api.make_tasks``), so the example
#: is never a test task (tests/unit/test_embodiedbench_agents.py checks it against the presets' test sets)
EXAMPLE_SEED = 2**31 + 11
EXAMPLE_SUBSET = "base"
_WORLD = {"high": "a house: receptacles and objects in numbered slots",
          "low": "a grid room: you move one cell at a time, pick up and put down objects"}


def prompt_observation(text: str) -> str:
    """The observation text as a language agent gets it: without the environment's own line on how
    action ids are formed (the prompt lists every action with its id instead, as EmbodiedBench does)."""
    return "\n".join(line for line in text.splitlines() if not line.startswith("Actions:"))


def action_lines(actions) -> list[str]:
    """``id: name`` for each (id, name) offered."""
    return [f"{a}: {name}" for a, name in actions]


@functools.lru_cache(maxsize=None)
def worked_example(level: str) -> str:
    """One solved task of ``level`` for the system prompt: a ``base`` task from ``EXAMPLE_SEED`` (never a
    test task), its actions, observation and the scripted expert's plan, step by step and as the reply."""
    from .api import make_env, make_task

    env = make_env(make_task(level, EXAMPLE_SUBSET, EXAMPLE_SEED))
    actions = env.scene_actions()
    names = dict(actions)
    plan = expert_plan(env)
    return "\n".join([
        "Example (a different task, solved):",
        f"Instruction: {env.task.instruction}",
        "Actions you can take (id: action):", *action_lines(actions),
        "Observation:", prompt_observation(env.observe().text),
        "The plan, step by step: " + "; ".join(f"{a} = {names[a]}" for a in plan) + ".",
        "Reply: " + plan_json(plan)])


def system_prompt(level: str) -> str:
    """The system turn of ``level``: the task, the reply format in words, and the worked example (the same
    for every request of the level, so a local engine can cache it)."""
    return (f"You control an agent in {_WORLD[level]}. Each turn you get the instruction, the actions you can take "
            "(an id and a name each), what the agent observes and, after a plan, the feedback on it. Reply with "
            "the ids of the actions to execute, in order, as a JSON object whose \"plan\" is the list of ids, as "
            "in the example. An action that is not possible in the current state stops the plan.\n\n"
            + worked_example(level))


#: what the blind replanner (no feedback, more plans) is told before each further plan: only that it is
#: asked again, the same closing line the feedback arm's feedback ends with
NOT_COMPLETE = "Your previous plan has been executed. The task is not complete yet."


class LLMAgent:
    """Any OpenAI-compatible chat model (``client``: systems.common.llm.OpenAICompatibleClient).
    Endpoint errors (HTTP errors, timeouts, replies without a message) raise PlanError("endpoint
    error: ..."), which run_episode counts as an invalid plan; they never crash the run."""
    uses_feedback = True

    def __init__(self, client, max_tokens: int = 256, name: str = "llm"):
        self.client, self.max_tokens, self.name = client, max_tokens, name
        self.requests = self.errors = 0

    def reset(self, env: Env) -> None:
        pass

    @staticmethod
    def actions(inp: AgentInput) -> tuple[tuple[int, str], ...]:
        return inp.actions or tuple(enumerate(inp.action_names))

    def prompt(self, inp: AgentInput) -> str:
        parts = [f"Instruction: {inp.instruction}", "Actions you can take (id: action):",
                 *action_lines(self.actions(inp)), "Observation:", prompt_observation(inp.observation)]
        if inp.feedback:
            parts += ["Feedback on your previous plan:", inp.feedback]
        elif inp.round > 0:
            parts.append(NOT_COMPLETE)
        parts.append("Reply with the JSON plan only.")
        return "\n".join(parts)

    def act(self, inp: AgentInput) -> str:
        from mlsys_flows.systems.common.llm import LLMError

        self.requests += 1
        try:
            return self.client.complete(self.prompt(inp), max_tokens=self.max_tokens, system=system_prompt(inp.level))
        except LLMError as exc:
            self.errors += 1
            raise PlanError(f"endpoint error: LLMError: {exc}") from None


PLAN_PREFIX = '{"plan": ['


def close_plan(text: str, prefix: str = PLAN_PREFIX) -> str:
    """A reply forced to start with ``prefix`` and cut at its first ``]``, made a JSON object again: a
    list the token budget cut short keeps its complete ids (up to the last comma) and is closed; what
    the model wrote is otherwise left as it is, for ``parse_plan`` to accept or reject."""
    if not text.startswith(prefix):
        return text
    body = text[len(prefix):]
    if "]" in body:
        return prefix + body[:body.index("]")] + "]}"
    return prefix + (body[:body.rindex(",")] if "," in body else "") + "]}"


class PrefixLLMAgent(LLMAgent):
    """A local chat model whose reply can be started and constrained for it
    (``systems.llm_serving.chat.SmolLM2Chat``): the same prompt and system prompt as ``LLMAgent``, the
    assistant turn forced to begin with ``{"plan": [``, then grammar-constrained decoding
    (``int_list``): the model can only write ids of the actions offered (``inp.actions``), ``", "``
    between them and ``]`` to close, greedy; a list the token budget cuts short keeps its complete ids
    (``close_plan``). Which ids, how many and in what order are the model's."""

    def __init__(self, client, max_tokens: int = 64, name: str = "smollm2", constrained: bool = True):
        super().__init__(client, max_tokens, name)
        self.constrained = constrained

    def act(self, inp: AgentInput) -> str:
        self.requests += 1
        extra = {"int_list": [a for a, _ in self.actions(inp)]} if self.constrained else {}
        text = self.client.complete(self.prompt(inp), max_tokens=self.max_tokens, system=system_prompt(inp.level),
                                    prefix=PLAN_PREFIX, stop=("]",), **extra)
        return close_plan(text)


class RandomPlanner:
    """The floor: plans of 1 to 5 actions drawn uniformly from those the scene offers (the choices the
    constrained language model has), seeded by the task, replanning as the runner allows. A comparison
    whose both sides score at or below it decides nothing."""
    name = "random_plan"
    uses_feedback = False

    def reset(self, env: Env) -> None:
        import numpy as np

        self.rng = np.random.default_rng([env.task.seed, 0x5EED])

    def act(self, inp: AgentInput) -> str:
        ids = [a for a, _ in LLMAgent.actions(inp)]
        return plan_json([ids[int(i)] for i in self.rng.integers(0, len(ids), int(self.rng.integers(1, 6)))])


class MaskedRandomAgent:
    """The floor of the learned step policies: one action per plan, drawn uniformly from the actions the
    environment's valid-action mask allows now (the mask ERA's policies get; every action when it allows
    none), seeded by the task. Run it as a PolicyAgent is run (``replan=True``, a round budget of the
    episode's step budget): a learned policy that scores at or below it has learned nothing the mask does
    not give."""
    name = "random_valid"
    uses_feedback = False

    def reset(self, env: Env) -> None:
        import numpy as np

        self.env = env
        self.rng = np.random.default_rng([env.task.seed, 0x3A5C])

    def act(self, inp: AgentInput) -> str:
        import numpy as np

        mask = np.asarray(self.env.valid_mask(), bool)
        ids = np.flatnonzero(mask) if mask.any() else np.arange(len(mask))
        return plan_json([int(ids[int(self.rng.integers(0, len(ids)))])])


class PolicyAgent:
    """A step policy (a learned network: ERA's, ``systems/era/agent.GreedyPolicy``) under the benchmark's
    episode runner: each plan is the one action ``policy(observation_vector, valid_mask)`` picks, so run
    it with ``replan=True`` and a round budget of the episode's step budget. It reads the observation
    vector (the same information as the text) and the environment's mask of valid actions, as the
    policy was trained; it has no channel for the feedback text. ``level``: the level the policy was
    trained on, if it has one (``reset`` on an environment of another level raises EnvError)."""
    uses_feedback = False

    def __init__(self, policy, name: str, level: str | None = None):
        self.policy, self.name, self.level = policy, name, level

    def reset(self, env: Env) -> None:
        if self.level is not None and env.task.level != self.level:
            raise EnvError(f"level: the policy {self.name!r} was trained on the {self.level} level, "
                           f"not {env.task.level!r}")
        self.env = env

    def act(self, inp: AgentInput) -> str:
        return plan_json([int(self.policy(self.env.observe().vector, self.env.valid_mask()))])


# --- episodes ------------------------------------------------------------------------------


@dataclass
class EpisodeResult:
    task_id: str
    level: str
    subset: str
    feedback: bool
    success: bool = False
    steps: int = 0
    rounds: int = 0
    invalid_plans: int = 0
    invalid_actions: int = 0
    success_round: int | None = None
    reasons: list[str] = field(default_factory=list)


def run_episode(env: Env, agent, feedback: bool, max_rounds: int = 10, replan: bool | None = None) -> EpisodeResult:
    """One episode under the open-loop (feedback=False: one plan) or closed-loop protocol (feedback=True:
    up to ``max_rounds`` plans, each told the feedback on the last one). ``replan=True`` without feedback
    allows the same ``max_rounds`` plans, each made from the new observation alone (default: replan
    exactly when there is feedback). Invalid plans and actions are recorded in the result; agent
    exceptions are too (never raised)."""
    replan = feedback if replan is None else replan
    obs = env.reset()
    agent.reset(env)
    task = env.task
    res = EpisodeResult(task.id, task.level, task.subset, feedback)
    names = tuple(env.action_names)
    offered = tuple(env.scene_actions())
    fb_text: str | None = None
    for rnd in range(max_rounds if replan else 1):
        res.rounds += 1
        inp = AgentInput(task.level, task.instruction, obs.text, fb_text if feedback else None, rnd, names, offered)
        try:
            reply = agent.act(inp)
        except PlanError as exc:  # e.g. the endpoint failed: no reply to parse
            reply, reason = None, str(exc)
        except Exception as exc:  # an agent bug is a failed plan, not a crashed run
            reply = None
            reason = f"agent raised {type(exc).__name__}: {exc}"
        try:
            if reply is None:
                raise PlanError(reason)
            plan = parse_plan(reply, N_ACTIONS[task.level])
        except PlanError as exc:
            res.invalid_plans += 1
            res.reasons.append(f"round {rnd}: invalid plan: {exc}")
            fb_text = f"Your previous reply was not a valid plan ({exc}). The task is not complete yet."
            continue
        lines = []
        for k, a in enumerate(plan):
            obs, _, done, info = env.step(a)
            ok = "ok" if info["valid"] else "INVALID"
            lines.append(f"action {a} ({names[a]}) -> {ok}: {info['feedback'].split(': ', 1)[-1]}")
            if not info["valid"]:
                res.reasons.append(f"round {rnd}: invalid action {a}: {info['feedback']}")
                if k + 1 < len(plan):
                    lines.append(f"The remaining {len(plan) - k - 1} actions of the plan were not executed.")
                break
            if done:
                break
        if env.succeeded:
            res.success_round = rnd
            break
        if env.done:
            break
        lines.append("The task is not complete yet.")
        fb_text = "\n".join(lines)
    res.success = env.succeeded
    res.steps = env.steps
    res.invalid_actions = env.invalid_actions
    if not res.success and not res.reasons:
        res.reasons.append("plan(s) ran without error but the task was not completed")
    return res


def make_agent(kind: str, client=None, max_tokens: int = 256):
    """``scripted`` (open loop), ``scripted_feedback``, ``scripted_replan`` (rounds from observations
    only), ``expert``, ``random`` (the language agents' floor), ``random_valid`` (the learned step policies'
    floor: one uniformly random valid action per plan), ``llm`` (needs an OpenAI-compatible ``client``) or ``smollm2`` (needs a local
    chat client that takes a forced prefix: ``PrefixLLMAgent``)."""
    if kind == "scripted":
        return ScriptedPlanner()
    if kind == "scripted_replan":
        return ObservationReplanner()
    if kind == "scripted_feedback":
        return FeedbackReplanner()
    if kind == "expert":
        return ExpertAgent()
    if kind == "random":
        return RandomPlanner()
    if kind == "random_valid":
        return MaskedRandomAgent()
    if kind == "llm":
        if client is None:
            raise ValueError("the llm agent needs an OpenAI-compatible client")
        return LLMAgent(client, max_tokens)
    if kind == "smollm2":
        if client is None:
            raise ValueError("the smollm2 agent needs a local chat client (systems.llm_serving.chat.SmolLM2Chat)")
        return PrefixLLMAgent(client, max_tokens)
    raise ValueError(f"agent: unknown agent kind {kind!r}")
