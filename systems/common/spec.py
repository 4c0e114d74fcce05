"""The declarative spec of a system: what it is and what its paper claims (pure).

Each implemented system publishes ``SPEC`` in ``systems/<name>/__init__.py``; planned systems keep
theirs in the registry until they are built. The flow harness computes every claim's ratio from
the variants a run measured, so a paper's number is written once, here, and never in a flow.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Better = Literal["higher", "lower"]
# measured: wall clock in this run; counted: exact values computed in this run (counts, bytes,
# iterations, losses); modelled: computed from stated constants; simulated: a simulator's clock.
Kind = Literal["measured", "counted", "modelled", "simulated"]
KINDS: tuple[str, ...] = ("measured", "counted", "modelled", "simulated")


def reduction(fraction: float) -> float:
    """A paper's "X% less" (time, bytes, latency) as an oriented ratio: 1 / (1 - X)."""
    if not 0 <= fraction < 1:
        raise ValueError(f"a reduction is a fraction in [0, 1) (got {fraction})")
    return 1.0 / (1.0 - fraction)


@dataclass(frozen=True)
class Claim:
    """One comparison the paper makes, and the run reproduces as a ratio of two variants' metric."""

    metric: str                  # key in each variant's metrics
    baseline: str                # variant name of the baseline
    technique: str               # variant name of the technique
    better: Better               # which direction of the raw metric wins
    paper: float | None = None   # the paper's value, oriented so >1 means the technique wins; None: no number
    statement: str = ""          # the claim in words, with the paper's own numbers
    headline: bool = False       # exactly one claim per system is its headline


@dataclass(frozen=True)
class SystemSpec:
    name: str
    title: str
    paper: str                   # citation: arXiv id or venue
    family: str
    claims: tuple[Claim, ...]
    params: Any = None           # the system's SystemParams subclass; None while planned
    # Every variant a careful user could run instead of the technique on the headline metric (the
    # headline's baseline included); the report names the strongest of them (`vs_strongest`).
    baselines: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        heads = [c for c in self.claims if c.headline]
        if len(heads) != 1:
            raise ValueError(f"{self.name}: exactly one claim must be the headline (got {len(heads)})")
        if heads[0].baseline not in self.baselines:
            object.__setattr__(self, "baselines", (heads[0].baseline, *self.baselines))

    @property
    def headline(self) -> Claim:
        return next(c for c in self.claims if c.headline)

    # --- the platform's view: where its flow lives (found by name, never imported here) ---

    @property
    def entrypoint(self) -> str:
        """Prefect entrypoint, relative to the repository root."""
        return f"flows/{self.name}.py:{self.name}"

    @property
    def status(self) -> str:
        if self.params is None:
            return "planned"
        try:
            found = importlib.util.find_spec(f"mlsys_flows.flows.{self.name}") is not None
        except ModuleNotFoundError:
            found = False
        return "implemented" if found else "planned"

    def load_flow(self):
        """The Prefect flow object (imports prefect)."""
        return getattr(importlib.import_module(f"mlsys_flows.flows.{self.name}"), self.name)

    def params_model(self):
        """The system's pydantic parameter model."""
        if self.params is None:
            raise ImportError(f"{self.name} is planned: it has no parameters yet")
        return self.params

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "paper": self.paper, "family": self.family,
                "status": self.status, "entrypoint": self.entrypoint, "baselines": list(self.baselines),
                "claims": [asdict(c) for c in self.claims]}
