"""Repeats that adapt (contract v4, issue 43 item 1; pure): a measured comparison keeps repeating, its
variants interleaved, until its verdict decides, a maximum of repeats is reached or a time budget is
spent, and says which.

Looking at the interval after every repeat and stopping when it excludes 1 would decide far more
often than 5% with no true difference (optional stopping). So the looks are planned before the first
repeat (``schedule``: the first at the minimum of repeats, at least ``MIN_PAIRS``, then growing by half
up to the maximum), and every look's interval is taken at ``1 - 0.05 / looks`` (Bonferroni over the
planned looks, whether or not they all happen): the final verdict is judged the same way, so its
level holds however early the repeats stopped.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Literal, Sequence

from .spec import Better
from .verdict import CONFIDENCE, MIN_PAIRS, against_strongest, judge

Stopped = Literal["fixed", "decided", "maximum", "budget"]


def schedule(minimum: int, maximum: int) -> list[int]:
    """The planned look sizes between ``minimum`` and ``maximum`` repeats: the first at the fewest
    pairs that can decide at the looks' level (at least ``MIN_PAIRS`` and ``minimum``), then each about
    1.5 times the last, the maximum always one."""
    if maximum <= minimum:
        return [minimum]
    first = max(minimum, MIN_PAIRS)
    while True:
        looks, n = [], first
        while n < maximum:
            looks.append(n)
            n = max(n + 1, math.ceil(n * 1.5))
        looks.append(maximum)
        # the sign test decides n pairs at level a only when all n fall on one side: 2 / 2**n <= a
        decidable = math.ceil(math.log2(2 * len(looks) / (1 - CONFIDENCE)))
        if first >= min(decidable, maximum):
            return looks
        first = min(decidable, maximum)


@dataclass
class AdaptiveRepeats:
    """Iterate repeat indices; after each repeat, ``record`` the headline's samples so far.

        reps = AdaptiveRepeats(p.repeats, p.max_repeats, p.repeat_budget_s)
        for rep in reps:
            ... run every variant once (interleaved) ...
            reps.record(samples["baseline"], samples["technique"], "higher")

    With ``maximum <= minimum`` it is the fixed count of repeats. ``summary()`` goes into the
    SystemResult (``repeats``) so that the report judges the comparison at the planned looks' level."""

    minimum: int
    maximum: int | None = None
    budget_s: float = 0.0            # 0: no time budget, only the maximum
    clock: Callable[[], float] = time.perf_counter
    done: int = 0
    stopped: Stopped | None = None
    _decided: bool = False
    _looks: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.minimum < 1:
            raise ValueError(f"repeats must be at least 1 (got {self.minimum})")
        self.maximum = max(self.minimum, self.maximum or self.minimum)
        self._looks = schedule(self.minimum, self.maximum)

    @property
    def looks(self) -> int:
        """Planned looks (1 for a fixed count): the Bonferroni divisor of every interval."""
        return len(self._looks) if self.adaptive else 1

    @property
    def adaptive(self) -> bool:
        return self.maximum > self.minimum

    def record(self, baseline: Sequence[float], technique: Sequence[float], better: Better) -> None:
        """The samples of the comparison that decides when to stop, after the repeat just run."""
        n = min(len(baseline), len(technique))
        if self.adaptive and n in self._looks:
            v = judge(list(baseline[:n]), list(technique[:n]), better, deterministic=False, looks=self.looks)
            self._decided = v.outcome != "ties"

    def record_headline(self, spec, samples: dict[str, list[float]]) -> None:
        """``record`` the spec's headline technique against its strongest deployable baseline so far
        (the best median among the deployable baselines in ``samples``: variant -> the headline
        metric's samples), the comparison the report shows first."""
        head = spec.headline
        rivals = [b for b in spec.baselines if b in samples and samples[b]
                  and ("deployable" in spec.role(b) if spec.roles else "oracle" not in spec.role(b))]
        if head.technique not in samples or not rivals:
            return
        sign = 1 if head.better == "higher" else -1
        best = max(rivals, key=lambda b: sign * statistics.median(samples[b]))
        n = min(len(samples[b]) for b in (*rivals, head.technique))
        if self.adaptive and n in self._looks:  # the report's own rule (verdict.against_strongest)
            v = against_strongest({b: samples[b][:n] for b in rivals}, best, samples[head.technique][:n], head.better,
                                  deterministic=False, looks=self.looks)
            self._decided = v.outcome != "ties"

    def __iter__(self) -> Iterator[int]:
        start = self.clock()
        while True:
            if self.done >= self.minimum:
                if not self.adaptive:
                    self.stopped = "fixed"
                elif self._decided:
                    self.stopped = "decided"
                elif self.done >= self.maximum:
                    self.stopped = "maximum"
                elif self.budget_s and self.done in self._looks and self.clock() - start >= self.budget_s:
                    self.stopped = "budget"  # only at a planned look: the verdict is judged where it was planned
                if self.stopped:
                    return
            yield self.done
            self.done += 1

    def summary(self) -> dict:
        return {"repeats": self.done, "minimum": self.minimum, "maximum": self.maximum, "looks": self.looks,
                "planned": list(self._looks) if self.adaptive else [self.minimum], "stopped": self.stopped,
                "budget_s": self.budget_s}


def repeats_note(summary: dict, what: str) -> str:
    """A report note on how adaptive repeats ran (``AdaptiveRepeats.summary()``)."""
    why = {"decided": "the verdict decided", "maximum": f"the maximum of {summary['maximum']} was reached undecided",
           "budget": f"the budget of {summary['budget_s']:g} s was spent undecided"}.get(summary["stopped"], "fixed")
    return (f"Adaptive repeats: {what} ran {summary['repeats']} times (at least {summary['minimum']}, looks planned at "
            f"{', '.join(map(str, summary['planned']))}); they stopped because {why}. Every interval of the report is "
            f"taken at {1 - 0.05 / summary['looks']:.1%} ({summary['looks']} planned looks), so stopping early "
            "does not make a decision likelier.")
