"""Low-level grid environment (navigation + manipulation with atomic moves): a GRID x GRID room with
obstacles, coloured objects of several shapes and coloured target pads. The agent sees obstacles
only in the cells next to the places it has been (the rest of the map is hidden state), and sees
every object and pad."""
from __future__ import annotations

import copy
from collections import deque

import numpy as np

from .core import Env, EnvError

GRID = 7
ACTION_NAMES = ["move up", "move down", "move left", "move right", "pick up", "put down"]
N_ACTIONS = len(ACTION_NAMES)
MOVES = {0: (-1, 0), 1: (1, 0), 2: (0, -1), 3: (0, 1)}
COLOURS = ("red", "blue", "green", "yellow")
SHAPES = ("cube", "ball", "ring", "cone")
# common-sense references (used by the common_sense subset)
SHAPE_CS = {"cube": "the thing shaped like a dice", "ball": "the thing that rolls",
            "ring": "the thing with a hole in the middle", "cone": "the thing shaped like an ice-cream cone"}
COLOUR_CS = {"red": "a ripe tomato", "blue": "a clear sky", "green": "fresh grass", "yellow": "a banana"}
CHANNELS = 2 + 2 * len(COLOURS) + len(SHAPES)   # obstacle, agent, object colour, object shape, pad colour
OBS_DIM_STATE = GRID * GRID * CHANNELS + len(COLOURS) + len(SHAPES) + 1
MAX_STEPS = {"long_horizon": 110}
DEFAULT_MAX_STEPS = 40


def bfs_path(start, goal, blocked: set) -> list[int] | None:
    """Shortest list of move actions from start to goal avoiding ``blocked`` cells (None: no path)."""
    if start == goal:
        return []
    prev = {start: None}
    q = deque([start])
    while q:
        cur = q.popleft()
        for a, (dr, dc) in MOVES.items():
            nxt = (cur[0] + dr, cur[1] + dc)
            if nxt in prev or nxt in blocked or not (0 <= nxt[0] < GRID and 0 <= nxt[1] < GRID):
                continue
            prev[nxt] = (cur, a)
            if nxt == goal:
                path = []
                while prev[nxt] is not None:
                    nxt, a = prev[nxt]
                    path.append(a)
                return path[::-1]
            q.append(nxt)
    return None


class _World:
    def __init__(self):
        self.obstacles: set = set()
        self.seen: set = set()
        self.objects: list[dict] = []     # colour, shape, pos (None while held)
        self.pads: list[dict] = []        # colour, pos
        self.agent = (0, 0)
        self.holding: int | None = None
        self.placements: list[tuple[int, int]] = []

    def reveal(self):
        r, c = self.agent
        for dr in (-1, 0, 1):
            for dc in (-1, 0, 1):
                if (r + dr, c + dc) in self.obstacles:
                    self.seen.add((r + dr, c + dc))

    def object_at(self, pos) -> int | None:
        for i, o in enumerate(self.objects):
            if o["pos"] == pos:
                return i
        return None

    def desc(self, i: int) -> str:
        return f"{self.objects[i]['colour']} {self.objects[i]['shape']}"


def _connected(free: set) -> bool:
    start = next(iter(free))
    seen, q = {start}, deque([start])
    while q:
        r, c = q.popleft()
        for dr, dc in MOVES.values():
            n = (r + dr, c + dc)
            if n in free and n not in seen:
                seen.add(n)
                q.append(n)
    return len(seen) == len(free)


def _generate(subset: str, rng: np.random.Generator) -> tuple[_World, str]:
    if subset not in ("base", "common_sense", "complex_instruction", "spatial", "visual_appearance", "long_horizon"):
        raise EnvError(f"subset: unknown subset {subset!r}")
    w = _World()
    cells = [(r, c) for r in range(GRID) for c in range(GRID)]
    n_obst = 9 if subset == "long_horizon" else 6
    while True:
        idx = rng.choice(len(cells), n_obst, replace=False)
        obst = {cells[i] for i in idx}
        if _connected(set(cells) - obst):
            break
    w.obstacles = obst
    free = [c for c in cells if c not in obst]
    n_pads = 3 if subset == "long_horizon" else 2
    pick = rng.choice(len(free), n_pads + 6, replace=False)
    spots = [free[i] for i in pick]
    pad_cols = rng.choice(COLOURS, n_pads, replace=False)
    w.pads = [dict(colour=str(c), pos=spots[i]) for i, c in enumerate(pad_cols)]
    w.agent = spots[n_pads]
    obj_spots = spots[n_pads + 1:]

    def rand_obj(avoid=()):
        while True:
            o = (str(rng.choice(COLOURS)), str(rng.choice(SHAPES)))
            if o not in avoid and o[1] not in {a[1] for a in avoid if a[0] == "*"}:
                return o

    objs: list[tuple[str, str]] = []
    if subset in ("base", "common_sense", "complex_instruction"):
        objs.append(rand_obj())
        targets = [0]
        avoid_shapes = {objs[0][1]}
    elif subset == "spatial":
        a = rand_obj()
        objs += [a, a]
        targets = [int(rng.integers(0, 2))]
        avoid_shapes = {a[1]}
    elif subset == "visual_appearance":
        a = rand_obj()
        c2 = str(rng.choice([c for c in COLOURS if c != a[0]]))
        s2 = str(rng.choice([s for s in SHAPES if s != a[1]]))
        objs += [a, (a[0], s2), (c2, a[1])]
        targets = [0]
        avoid_shapes = set()
    else:
        shapes = rng.choice(SHAPES, n_pads, replace=False)
        objs += [(str(rng.choice(COLOURS)), str(s)) for s in shapes]
        targets = list(range(n_pads))
        avoid_shapes = set(str(s) for s in shapes)
    n_total = 4 if subset != "long_horizon" else n_pads + 1
    while len(objs) < n_total:
        o = rand_obj()
        if o[1] not in avoid_shapes and o not in objs:
            objs.append(o)
    order = rng.permutation(len(objs))           # the text lists objects in this (random) order
    w.objects = [dict(colour=objs[i][0], shape=objs[i][1], pos=obj_spots[k]) for k, i in enumerate(order)]
    pos_of = {int(i): k for k, i in enumerate(order)}
    tgt = [pos_of[t] for t in targets]
    if subset == "spatial":   # the two look-alikes must differ along the axis the instruction names
        a, b = pos_of[0], pos_of[1]
        pa, pb = w.objects[a]["pos"], w.objects[b]["pos"]
        axis = 0 if pa[0] != pb[0] else 1
        t = tgt[0]
        other = b if t == a else a
        smaller = w.objects[t]["pos"][axis] < w.objects[other]["pos"][axis]
        edge = {(0, True): "top", (0, False): "bottom", (1, True): "left", (1, False): "right"}[(axis, smaller)]
    pad_order = rng.permutation(n_pads)
    w.placements = [(t, int(pad_order[k])) for k, t in enumerate(tgt)]
    w.reveal()
    # instruction
    o, p = w.placements[0]
    obj, pad = w.objects[o], w.pads[p]["colour"]
    if subset == "base":
        instr = f"Move the {obj['colour']} {obj['shape']} to the {pad} pad."
    elif subset == "common_sense":
        instr = f"Move {SHAPE_CS[obj['shape']]} to the pad that has the colour of {COLOUR_CS[pad]}."
    elif subset == "complex_instruction":
        d = w.objects[int(rng.choice([i for i in range(len(w.objects)) if i != o]))]
        dpad = w.pads[1 - p if n_pads == 2 else (p + 1) % n_pads]["colour"]
        main = f"move the {obj['colour']} {obj['shape']} to the {pad} pad"
        dist = f"the {d['colour']} {d['shape']}"
        k = int(rng.integers(0, 3))
        instr = (f"I first thought of putting {dist} on the {dpad} pad, but forget that; {main}." if k == 0 else
                 f"Leave {dist} and the {dpad} pad alone, and {main}." if k == 1 else
                 f"Please {main}; {dist} can stay where it is.")
    elif subset == "spatial":
        instr = f"Move the {obj['colour']} {obj['shape']} that is closer to the {edge} edge to the {pad} pad."
    elif subset == "visual_appearance":
        instr = f"Move the {obj['colour']} {obj['shape']} to the {pad} pad."
    else:
        parts = [f"the {w.desc(oo)} to the {w.pads[pp]['colour']} pad" for oo, pp in w.placements]
        instr = "Move " + parts[0] + "".join(f", then {x}" for x in parts[1:-1]) + f", and finally {parts[-1]}."
    return w, instr


class LowEnv(Env):
    """Grid environment; see the module docstring. Walking over objects and pads is allowed; one
    object per cell; a move into an obstacle or off the grid is invalid (and reveals the obstacle)."""
    level = "low"
    n_actions = N_ACTIONS
    action_names = ACTION_NAMES

    world_type = _World
    generate = staticmethod(_generate)
    max_steps_by_subset = MAX_STEPS
    default_max_steps = DEFAULT_MAX_STEPS

    def _check(self, a):
        w = self.w
        if a in MOVES:
            dr, dc = MOVES[a]
            n = (w.agent[0] + dr, w.agent[1] + dc)
            if not (0 <= n[0] < GRID and 0 <= n[1] < GRID):
                return False, f"blocked: {n} is outside the room."
            if n in w.obstacles:
                return False, f"blocked by an obstacle at {n}."
            return True, f"you move to {n}."
        here = w.object_at(w.agent)
        if a == 4:
            if w.holding is not None:
                return False, f"your hand is full (holding the {w.desc(w.holding)})."
            if here is None:
                return False, f"there is no object at {w.agent}."
            return True, f"you pick up the {w.desc(here)}."
        if w.holding is None:
            return False, "you are not holding anything."
        if here is not None:
            return False, f"the cell {w.agent} already holds the {w.desc(here)}."
        pad = [p["colour"] for p in w.pads if p["pos"] == w.agent]
        return True, f"you put the {w.desc(w.holding)} down at {w.agent}" + (f" on the {pad[0]} pad." if pad else ".")

    def _apply(self, a):
        ok, fb = self._check(a)
        w = self.w
        if a in MOVES:
            dr, dc = MOVES[a]
            n = (w.agent[0] + dr, w.agent[1] + dc)
            if ok:
                w.agent = n
                w.reveal()
            elif n in w.obstacles:
                w.seen.add(n)
            return ok, fb
        if ok and a == 4:
            w.holding = w.object_at(w.agent)
            w.objects[w.holding]["pos"] = None
        elif ok:
            w.objects[w.holding]["pos"] = w.agent
            w.holding = None
        return ok, fb

    def _progress(self):
        w = self.w
        return sum(w.objects[o]["pos"] == w.pads[p]["pos"] for o, p in w.placements) / len(w.placements)

    def _valid_mask(self):
        return np.array([self._check(a)[0] for a in range(N_ACTIONS)], bool)

    def _text(self):
        w = self.w
        held = f"the {w.desc(w.holding)}" if w.holding is not None else "nothing"
        objs = "; ".join(f"{w.desc(i)} at {o['pos']}" for i, o in enumerate(w.objects) if o["pos"] is not None)
        pads = "; ".join(f"{p['colour']} pad at {p['pos']}" for p in w.pads)
        seen = ", ".join(map(str, sorted(w.seen))) or "none yet"
        return (f"A {GRID}x{GRID} room; cells are (row, column), row 0 is the top edge, column 0 the left edge.\n"
                f"You are at {w.agent}, holding {held}.\nObjects: {objs or 'none on the floor'}.\nPads: {pads}.\n"
                f"Known obstacles: {seen}. Obstacles are only seen from a neighbouring cell.\n"
                "Actions: " + ", ".join(f"{i}={n}" for i, n in enumerate(ACTION_NAMES)) + ".")

    def _state_vector(self):
        w = self.w
        g = np.zeros((GRID, GRID, CHANNELS), np.float32)
        for r, c in w.seen:
            g[r, c, 0] = 1
        g[w.agent[0], w.agent[1], 1] = 1
        nc = len(COLOURS)
        for o in w.objects:
            if o["pos"] is not None:
                g[o["pos"][0], o["pos"][1], 2 + COLOURS.index(o["colour"])] = 1
                g[o["pos"][0], o["pos"][1], 2 + nc + SHAPES.index(o["shape"])] = 1
        for p in w.pads:
            g[p["pos"][0], p["pos"][1], 2 + nc + len(SHAPES) + COLOURS.index(p["colour"])] = 1
        held = np.zeros(nc + len(SHAPES) + 1, np.float32)
        if w.holding is not None:
            o = w.objects[w.holding]
            held[COLOURS.index(o["colour"])] = 1
            held[nc + SHAPES.index(o["shape"])] = 1
            held[-1] = 1
        return np.concatenate([g.ravel(), held])

    def expert_plan(self) -> list[int]:
        """Shortest-path actions that complete the task from the current state (full map known)."""
        sim = copy.deepcopy(self)
        w = sim.w
        plan: list[int] = []

        def do(a):
            ok, fb = sim._apply(a)
            if not ok:
                raise AssertionError(f"expert produced an invalid action: {fb}")
            plan.append(a)

        def go(cell):
            for a in bfs_path(w.agent, cell, w.obstacles):
                do(a)

        def free_cell_near():
            pads = {p["pos"] for p in w.pads}
            cands = [(r, c) for r in range(GRID) for c in range(GRID)
                     if (r, c) not in w.obstacles and (r, c) not in pads and w.object_at((r, c)) is None]
            return min(cands, key=lambda x: len(bfs_path(w.agent, x, w.obstacles) or [0] * 99))

        goals = dict(w.placements)
        if w.holding is not None and w.holding not in goals:
            go(free_cell_near())
            do(5)
        for o, p in w.placements:
            pad = w.pads[p]["pos"]
            if w.objects[o]["pos"] == pad:
                continue
            if w.holding is not None and w.holding != o:
                go(free_cell_near())
                do(5)
            if w.holding != o:
                go(w.objects[o]["pos"])
                do(4)
            blocker = w.object_at(pad)
            if blocker is not None:       # clear the pad first (a wrong object was left on it)
                keep = o
                go(free_cell_near())
                do(5)
                go(pad)
                do(4)
                go(free_cell_near())
                do(5)
                go(w.objects[keep]["pos"])
                do(4)
            go(pad)
            do(5)
        return plan
