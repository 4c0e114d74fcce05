"""The RL learning rate of each variant, chosen on calibration tasks before the evaluated run (issue 50).

A careful user tunes RL from scratch as well as RL from the prior, on tasks other than the test set. For
each RL variant, level and learning rate of the variant's grid, ``calibration_seeds`` cells train at the
run's own RL budget on the tasks of generator seed ``seed + calibration_offset`` (their own training
tasks and their own held-out tasks; none is a test task of the evaluated run unless the generator
repeats one, and such overlaps are counted) and report held-out success on those calibration tasks.

The rule (``choose``): the learning rate with the best mean held-out calibration success over the
calibration seeds. A tie (counted success: exact equality) goes to the better mean success of the
RL run's own training episodes over the last quarter of its updates (what PPO optimises), then to the
better mean shaped return there, then to the middle of the still tied rates (the upper middle of an
even number). No step of the rule
looks at how far a rate moves the prior, and none prefers the smaller rate.

Pure python over ``run.run_cell`` (torch is imported lazily); the flow submits ``run_one`` per entry
of ``runs`` and passes the outputs to ``choose``.
"""
from __future__ import annotations

import math
import statistics

LEVELS = ("high", "low")
RL_VARIANTS = ("rl_scratch", "prior_rl")


def grid(p, variant: str) -> list[float]:
    """The learning rates tried for ``variant`` (its parameter alone when the grid is empty)."""
    g = list(p.lr_grid_scratch if variant == "rl_scratch" else p.lr_grid_prior_rl)
    return g or [p.lr_scratch if variant == "rl_scratch" else p.lr_prior_rl]


def calibration_params(p):
    """The run's parameters with the calibration's task generator seed."""
    return p.model_copy(update={"seed": p.seed + p.calibration_offset})


def runs(p) -> list[tuple[str, float, str, int]]:
    """(variant, learning rate, level, calibration seed index) of every calibration cell; none for a
    variant whose grid has a single rate (nothing to choose)."""
    return [(v, lr, lvl, k) for v in RL_VARIANTS if len(grid(p, v)) > 1 for lr in grid(p, v)
            for lvl in LEVELS for k in range(p.calibration_seeds)]


def _tail_mean(xs: list[float]) -> float:
    tail = [x for x in xs[-max(1, len(xs) // 4):] if not math.isnan(x)]
    return statistics.fmean(tail) if tail else 0.0


def run_one(p, variant: str, lr: float, level: str, seed_index: int) -> dict:
    """One calibration cell: ``variant`` with learning rate ``lr`` trained on the calibration tasks and
    evaluated on the calibration's held-out tasks (no regime evaluations)."""
    from .run import run_cell

    out = run_cell(calibration_params(p), level, seed_index, variants=(variant,), lrs={variant: lr}, regime=False)
    r = out["variants"][variant]
    return {"variant": variant, "lr": lr, "level": level, "seed_index": seed_index,
            "success_rate": r["success_rate"], "train_success_tail": _tail_mean(out["curves"][variant][1]),
            "train_return_tail": _tail_mean(out["returns"][variant]), "cpu_s": round(out["cpu_s"], 2)}


def choose(p, cells: list[dict]) -> dict[str, dict[str, dict]]:
    """variant -> level -> {"lr", "mean_success" (rate -> mean held-out calibration success), "tied",
    "by"} (see the module's rule). A variant without calibration cells keeps its parameter."""
    out: dict[str, dict[str, dict]] = {}
    for v in RL_VARIANTS:
        out[v] = {}
        for lvl in LEVELS:
            mine = [c for c in cells if c["variant"] == v and c["level"] == lvl]
            rates = grid(p, v)
            if not mine or len(rates) == 1:
                out[v][lvl] = {"lr": rates[0], "mean_success": {}, "tied": False, "by": "parameter"}
                continue
            stats = {lr: tuple(statistics.fmean(c[k] for c in mine if c["lr"] == lr)
                               for k in ("success_rate", "train_success_tail", "train_return_tail"))
                     for lr in rates}
            tied, by = list(rates), "held-out calibration success"
            for i, what in enumerate(("held-out calibration success", "training success (last quarter)",
                                      "training return (last quarter)")):
                best = max(stats[lr][i] for lr in tied)
                tied = [lr for lr in tied if stats[lr][i] == best]
                by = what
                if len(tied) == 1:
                    break
            else:
                by = "the middle of the tied rates"
            lr = sorted(tied)[len(tied) // 2]
            out[v][lvl] = {"lr": lr, "mean_success": {str(r): stats[r][0] for r in rates},
                           "tied": sum(stats[r][0] == stats[lr][0] for r in rates) > 1, "by": by}
    return out


def overlap(p) -> dict[str, int]:
    """Per level: held-out calibration tasks that are also test tasks of the evaluated run (by content)."""
    from ..embodied.api import make_tasks
    from .episodes import task_signature

    q = calibration_params(p)
    res = {}
    for lvl in LEVELS:
        test = {task_signature(t) for t in make_tasks(lvl, p.test_per_subset, p.seed)}
        res[lvl] = sum(task_signature(t) in test for t in make_tasks(lvl, q.test_per_subset, q.seed))
    return res
