"""High-level household environment (EB-ALFRED-like): receptacles and objects in N_SLOTS numbered
slots; actions are verb x slot (find, pick, put, open, close). Objects inside closed containers are
hidden (their location is unknown until the container is opened)."""
from __future__ import annotations

import copy

import numpy as np

from .core import Env, EnvError

N_SLOTS = 10
VERBS = ("find", "pick", "put", "open", "close")
N_ACTIONS = len(VERBS) * N_SLOTS
ACTION_NAMES = [f"{v} slot {s}" for v in VERBS for s in range(N_SLOTS)]

# receptacle: (openable, preposition, what it is for -- used by the common-sense subset)
RECEPTACLES = {
    "fridge": (True, "in", "keeps food cold"),
    "cabinet": (True, "in", "stores the dishes"),
    "drawer": (True, "in", "holds cutlery and small tools"),
    "microwave": (True, "in", "heats up leftovers"),
    "counter": (False, "on", "is where you prepare food"),
    "table": (False, "on", "is where meals are eaten"),
    "sink": (False, "in", "is where dishes are washed"),
    "shelf": (False, "on", "holds books on the wall"),
}
# object: (what you use it for, its usual closed container -- the scripted planner's prior)
OBJECTS = {
    "mug": ("drink coffee from", "cabinet"),
    "apple": ("eat as a healthy snack", "fridge"),
    "book": ("read before bed", "drawer"),
    "knife": ("cut bread with", "drawer"),
    "plate": ("serve dinner on", "cabinet"),
    "sponge": ("scrub the pans with", "drawer"),
    "bottle": ("keep cold water in", "fridge"),
    "bowl": ("eat soup from", "cabinet"),
    "pen": ("write a letter with", "drawer"),
    "towel": ("dry your hands with", "drawer"),
}
COLOURS = ("red", "blue", "green", "yellow", "white", "black")
SHAPES = ("round", "square", "tall", "flat")
TYPES = tuple(OBJECTS) + tuple(RECEPTACLES)
PER_SLOT = 2 + len(TYPES) + len(COLOURS) + len(SHAPES) + 5 + N_SLOTS + 1
OBS_DIM_STATE = N_SLOTS * PER_SLOT + 1
MAX_STEPS = {"long_horizon": 36}
DEFAULT_MAX_STEPS = 16


def verb_slot(action: int) -> tuple[str, int]:
    return VERBS[action // N_SLOTS], action % N_SLOTS


def action_id(verb: str, slot: int) -> int:
    return VERBS.index(verb) * N_SLOTS + slot


class _World:
    """Mutable state: entities per slot, contents per receptacle (left to right), agent, goal."""

    def __init__(self):
        self.ent: list[dict | None] = [None] * N_SLOTS
        self.contents: dict[int, list[int]] = {}
        self.at: int | None = None
        self.holding: int | None = None
        self.placements: list[tuple[int, int]] = []
        self.closed_goal: list[int] = []

    def loc(self, o: int) -> int | None:
        for r, objs in self.contents.items():
            if o in objs:
                return r
        return None

    def visible(self, o: int) -> bool:
        r = self.loc(o)
        return r is not None and (not self.ent[r]["openable"] or self.ent[r]["open"])

    def desc(self, s: int) -> str:
        e = self.ent[s]
        return e["type"] if e["kind"] == "rec" else f"{e['colour']} {e['shape']} {e['type']}"


def _generate(subset: str, rng: np.random.Generator) -> tuple[_World, str]:
    w = _World()
    opn = [r for r in RECEPTACLES if RECEPTACLES[r][0]]
    flat = [r for r in RECEPTACLES if not RECEPTACLES[r][0]]
    recs = list(rng.choice(opn, 2, replace=False)) + list(rng.choice(flat, 2, replace=False))
    objs: list[dict] = []

    def new_obj(t=None, c=None, s=None, avoid_types=()):
        t = t or str(rng.choice([x for x in OBJECTS if x not in avoid_types]))
        return dict(kind="obj", type=t, colour=c or str(rng.choice(COLOURS)), shape=s or str(rng.choice(SHAPES)))

    placement_spec: dict[int, str] = {}  # object index -> "visible" | "hidden" | receptacle name
    targets: list[int] = []
    if subset in ("base", "common_sense", "complex_instruction"):
        objs.append(new_obj())
        targets = [0]
        placement_spec[0] = "visible" if subset == "base" or rng.random() < 0.7 else "hidden"
    elif subset == "spatial":
        a = new_obj()
        ref = new_obj(avoid_types=(a["type"],))
        objs += [a, ref, dict(a)]
        host = str(rng.choice(recs[2:]))
        for i in range(3):
            placement_spec[i] = host
        targets = [0] if rng.random() < 0.5 else [2]
    elif subset == "visual_appearance":
        a = new_obj()
        c2 = str(rng.choice([c for c in COLOURS if c != a["colour"]]))
        s2 = str(rng.choice([s for s in SHAPES if s != a["shape"]]))
        objs += [a, new_obj(a["type"], a["colour"], s2), new_obj(a["type"], c2, a["shape"])]
        order = rng.permutation(3)
        objs = [objs[i] for i in order]
        targets = [int(np.where(order == 0)[0][0])]
        for i in range(3):
            placement_spec[i] = "visible" if rng.random() < 0.8 else "hidden"
    elif subset == "long_horizon":
        k = int(rng.integers(2, 4))
        types = rng.choice(list(OBJECTS), k, replace=False)
        for i, t in enumerate(types):
            objs.append(new_obj(str(t)))
            placement_spec[i] = "hidden" if i == 0 or rng.random() < 0.4 else "visible"
        targets = list(range(k))
    else:
        raise EnvError(f"subset: unknown subset {subset!r}")
    # distractors: object types different from every target's type (except where the subset needs them)
    target_types = {o["type"] for o in objs}
    n_total = int(rng.integers(5, 7))
    while len(objs) < n_total:
        objs.append(new_obj(avoid_types=tuple(target_types)))
    # slots: shuffle receptacles and objects together
    ents = [dict(kind="rec", type=r, openable=RECEPTACLES[r][0], open=False) for r in recs] + objs
    slots = rng.permutation(N_SLOTS)[: len(ents)]
    rslot = {r: int(slots[i]) for i, r in enumerate(recs)}
    oslot = [int(slots[len(recs) + i]) for i in range(len(objs))]
    for s, e in zip(slots, ents):
        w.ent[int(s)] = e
    for r in recs:
        w.contents[rslot[r]] = []
    for i in range(len(objs)):
        spec = placement_spec.get(i, "hidden" if rng.random() < 0.3 else "visible")
        if spec == "visible":
            host = str(rng.choice(recs[2:]))
        elif spec == "hidden":
            home = OBJECTS[objs[i]["type"]][1]
            host = home if home in recs[:2] and rng.random() < 0.5 else str(rng.choice(recs[:2]))
        else:
            host = spec
        w.contents[rslot[host]].append(oslot[i])
    if subset == "spatial":  # make the two look-alikes flank the reference object, in order
        host = rslot[placement_spec[0]]
        rest = [o for o in w.contents[host] if o not in oslot[:3]]
        cut = int(rng.integers(0, len(rest) + 1))
        w.contents[host] = rest[:cut] + [oslot[0], oslot[1], oslot[2]] + rest[cut:]
    # destinations: a receptacle other than the object's current one
    dests = []
    for k, i in enumerate(targets):
        cur = w.loc(oslot[i])
        pool = [rslot[r] for r in recs if rslot[r] != cur]
        if subset == "long_horizon" and k == 0:   # one container to fill and close again
            pool = [r for r in pool if w.ent[r]["openable"]]
        elif subset == "long_horizon":            # spread the others over several receptacles
            pool = [r for r in pool if r not in dests] or pool
        dests.append(int(rng.choice(pool)))
    w.placements = [(oslot[i], d) for i, d in zip(targets, dests)]
    w.at = None
    instr = _instruction(subset, w, objs, oslot, targets, rslot, recs, rng)
    return w, instr


def _in(w: _World, r: int) -> str:
    return f"{RECEPTACLES[w.ent[r]['type']][1]} the {w.ent[r]['type']}"


def _instruction(subset, w, objs, oslot, targets, rslot, recs, rng) -> str:
    o, d = w.placements[0]
    e = w.ent[o]
    if subset == "base":
        return f"Put the {e['colour']} {e['type']} {_in(w, d)}."
    if subset == "common_sense":
        dest = (_in(w, d) if rng.random() < 0.5 else
                f"{RECEPTACLES[w.ent[d]['type']][1]} the place that {RECEPTACLES[w.ent[d]['type']][2]}")
        return f"Put the thing you {OBJECTS[e['type']][0]} {dest}."
    if subset == "complex_instruction":
        dist_o = [s for s in oslot if s != o]
        do = w.ent[int(rng.choice(dist_o))]
        dr = int(rng.choice([rslot[r] for r in recs if rslot[r] != d]))
        main = f"put the {e['colour']} {e['type']} {_in(w, d)}"
        dist = f"the {do['colour']} {do['type']}"
        k = int(rng.integers(0, 4))
        if k == 0:
            return f"I was going to ask you to put {dist} {_in(w, dr)}, but forget that; {main}."
        if k == 1:
            return f"If you notice {dist} {_in(w, dr)}, leave it alone, and {main}."
        if k == 2:
            return f"Please {main}; {dist} can stay where it is, and ignore the {w.ent[dr]['type']}."
        return f"Before guests arrive, and without moving {dist} at all, {main}."
    if subset == "spatial":
        ref = w.ent[oslot[1]]
        side = "left" if o == oslot[0] else "right"
        return f"Put the {e['type']} that is to the {side} of the {ref['type']} {_in(w, d)}."
    if subset == "visual_appearance":
        return f"Put the {e['shape']} {e['colour']} {e['type']} {_in(w, d)}."
    # long_horizon
    parts = [f"the {w.ent[oo]['colour']} {w.ent[oo]['type']} {_in(w, dd)}" for oo, dd in w.placements]
    closable = [dd for _, dd in w.placements if w.ent[dd]["openable"]]
    text = "Put " + ", ".join(parts[:-1]) + f" and {parts[-1]}"
    if closable:
        w.closed_goal = [closable[0]]
        text += f", then close the {w.ent[closable[0]]['type']}"
    return text + "."


class HighEnv(Env):
    """Household environment; see the module docstring. Slots hold receptacles or objects."""
    level = "high"
    n_actions = N_ACTIONS
    action_names = ACTION_NAMES

    world_type = _World
    generate = staticmethod(_generate)
    max_steps_by_subset = MAX_STEPS
    default_max_steps = DEFAULT_MAX_STEPS

    # rules ---------------------------------------------------------------------------------
    def _check(self, a: int) -> tuple[bool, str]:
        w = self.w
        verb, s = verb_slot(a)
        e = w.ent[s]
        if e is None:
            return False, f"slot {s} is empty."
        name = w.desc(s)
        if verb == "find":
            if e["kind"] == "rec":
                return True, f"you go to the {name}."
            if w.holding == s:
                return False, f"you are already holding the {name}."
            if not w.visible(s):
                return False, f"you cannot see the {name}; it may be inside a closed container."
            return True, f"you go to the {w.desc(w.loc(s))}, where the {name} is."
        if verb == "pick":
            if e["kind"] != "obj":
                return False, f"the {name} cannot be picked up."
            if w.holding is not None:
                return False, f"your hand is full (holding the {w.desc(w.holding)})."
            if not w.visible(s):
                return False, f"you cannot see the {name}; it may be inside a closed container."
            if w.at != w.loc(s):
                return False, f"the {name} is not within reach; find it first."
            return True, f"you pick up the {name}."
        if e["kind"] != "rec":
            return False, f"the {name} is not a receptacle."
        if verb == "put":
            if w.holding is None:
                return False, "you are not holding anything."
            if w.at != s:
                return False, f"you are not at the {name}; find it first."
            if e["openable"] and not e["open"]:
                return False, f"the {name} is closed."
            return True, f"you put the {w.desc(w.holding)} {_in(w, s)}."
        if not e["openable"]:
            return False, f"the {name} cannot be opened or closed."
        if w.at != s:
            return False, f"you are not at the {name}; find it first."
        if verb == "open":
            if e["open"]:
                return False, f"the {name} is already open."
            inside = ", ".join(f"{w.desc(o)} [slot {o}]" for o in w.contents[s]) or "nothing"
            return True, f"you open the {name}. Inside: {inside}."
        if not e["open"]:
            return False, f"the {name} is already closed."
        return True, f"you close the {name}."

    def _apply(self, a):
        ok, fb = self._check(a)
        if not ok:
            return ok, fb
        w = self.w
        verb, s = verb_slot(a)
        if verb == "find":
            w.at = s if w.ent[s]["kind"] == "rec" else w.loc(s)
        elif verb == "pick":
            w.contents[w.loc(s)].remove(s)
            w.holding = s
        elif verb == "put":
            w.contents[s].append(w.holding)
            w.holding = None
        else:
            w.ent[s]["open"] = verb == "open"
        return ok, fb

    def _progress(self):
        w = self.w
        done = sum(w.loc(o) == r for o, r in w.placements)
        done += sum(not w.ent[r]["open"] for r in w.closed_goal) if done == len(w.placements) else 0
        return done / (len(w.placements) + len(w.closed_goal))

    def _valid_mask(self):
        return np.array([self._check(a)[0] for a in range(N_ACTIONS)], bool)

    def scene_actions(self):
        """The verbs each slot's thing takes, named after it: find anything; pick up an object; put the
        held object in or on a receptacle; open and close an openable one."""
        w, out = self.w, []
        for s, e in enumerate(w.ent):
            if e is None:
                continue
            name = f"the {w.desc(s)} [slot {s}]"
            out.append((action_id("find", s), f"find {name}"))
            if e["kind"] == "obj":
                out.append((action_id("pick", s), f"pick up {name}"))
                continue
            out.append((action_id("put", s), f"put the held object {RECEPTACLES[e['type']][1]} {name}"))
            if e["openable"]:
                out += [(action_id("open", s), f"open {name}"), (action_id("close", s), f"close {name}")]
        return sorted(out)

    # observations ----------------------------------------------------------------------------
    def _text(self):
        w = self.w
        lines = [f"You are {'at the ' + w.desc(w.at) if w.at is not None else 'in the middle of the room'}. "
                 f"You are holding {'the ' + w.desc(w.holding) + f' [slot {w.holding}]' if w.holding is not None else 'nothing'}."]
        lines.append("Receptacles:")
        hidden = []
        for r in sorted(w.contents):
            e = w.ent[r]
            if e["openable"] and not e["open"]:
                lines.append(f"- {e['type']} [slot {r}]: closed")
                hidden += w.contents[r]
                continue
            items = ", ".join(f"{w.desc(o)} [slot {o}]" for o in w.contents[r]) or "nothing"
            state = "open, " if e["openable"] else ""
            lines.append(f"- {e['type']} [slot {r}]: {state}holds (left to right) {items}")
        if hidden:
            lines.append("Not in view (inside a closed container, location unknown): "
                         + ", ".join(f"{w.desc(o)} [slot {o}]" for o in sorted(hidden)))
        empty = [s for s in range(N_SLOTS) if w.ent[s] is None]
        lines.append(f"Empty slots: {', '.join(map(str, empty)) or 'none'}.")
        lines.append("Actions: id = verb_index * 10 + slot, verbs "
                     + ", ".join(f"{i}={v}" for i, v in enumerate(VERBS)) + ".")
        return "\n".join(lines)

    def _state_vector(self):
        w = self.w
        v = np.zeros((N_SLOTS, PER_SLOT), np.float32)
        for s, e in enumerate(w.ent):
            if e is None:
                continue
            row = v[s]
            row[0 if e["kind"] == "obj" else 1] = 1
            row[2 + TYPES.index(e["type"])] = 1
            j = 2 + len(TYPES)
            if e["kind"] == "obj":
                row[j + COLOURS.index(e["colour"])] = 1
                row[j + len(COLOURS) + SHAPES.index(e["shape"])] = 1
            j += len(COLOURS) + len(SHAPES)
            if e["kind"] == "rec":
                row[j] = e["openable"]
                row[j + 1] = e["open"]
                row[j + 4] = w.at == s
            else:
                vis = w.visible(s)
                row[j + 2] = vis
                row[j + 3] = w.holding == s
                if vis:
                    r = w.loc(s)
                    row[j + 5 + r] = 1
                    row[-1] = (w.contents[r].index(s) + 1) / 8.0
        return np.concatenate([v.ravel(), [float(w.holding is not None)]])

    # scripted expert -------------------------------------------------------------------------
    def expert_plan(self) -> list[int]:
        """Actions that complete the task from the current state, using the full (hidden) state."""
        sim = copy.deepcopy(self)
        sim.done = False
        plan: list[int] = []

        def do(verb, s):
            a = action_id(verb, s)
            ok, fb = sim._apply(a)
            if not ok:
                raise AssertionError(f"expert produced an invalid action: {fb}")
            plan.append(a)

        w = sim.w

        def go_open(r):
            if w.at != r:
                do("find", r)
            if w.ent[r]["openable"] and not w.ent[r]["open"]:
                do("open", r)

        goals = dict(w.placements)
        if w.holding is not None and w.holding not in goals:  # put a stray object back down
            r = w.at if w.at is not None else min(w.contents)
            go_open(r)
            do("put", r)
        for o, r in w.placements:
            if w.loc(o) == r:
                continue
            if w.holding is not None and w.holding != o:
                go_open(goals[w.holding])
                do("put", goals[w.holding])
            if w.holding != o:
                go_open(w.loc(o))
                do("pick", o)
            go_open(r)
            do("put", r)
        for r in w.closed_goal:
            if w.ent[r]["open"]:
                if w.at != r:
                    do("find", r)
                do("close", r)
        return plan
