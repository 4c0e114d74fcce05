"""The declarative spec of a system: what it is and what its paper claims (pure).

Each system publishes ``SPEC`` in ``systems/<name>/__init__.py`` (the registry names it). The flow
harness computes every claim's ratio from the variants a run measured, so a paper's number is
written once, in the spec, and never in a flow.
"""
from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Better = Literal["higher", "lower"]
# deployable: what a user could run without seeing the evaluated data (tuned on a calibration split,
# seed or trace that is not the evaluated one); paper: the paper's named baseline, configured as the
# paper did; oracle: chosen in hindsight on the evaluated data, an upper bound and never a denominator.
Role = Literal["deployable", "paper", "oracle"]
ROLES: tuple[str, ...] = ("deployable", "paper", "oracle")
# measured: wall clock in this run; counted: exact values computed in this run (counts, bytes,
# iterations, losses); modelled: computed from stated constants; simulated: a simulator's clock;
# emulated: a cost injected by sleeping or a replayed delay (contract v4), never `measured`.
Kind = Literal["measured", "counted", "modelled", "simulated", "emulated"]
KINDS: tuple[str, ...] = ("measured", "counted", "modelled", "simulated", "emulated")
# A claim whose statement starts with this is a diagnostic: a variant no user could deploy (e.g. the technique
# with a cost it really pays left out), shown beside the headline's verdict so a reader sees what that cost
# decides; it never counts as a baseline nor as the verdict.
DIAGNOSTIC = "diagnostic, not deployable"
# Kinds that rest on stated constants: a metric of these kinds lists them under ``assumptions``. An
# emulated cost is an injected sleep or a replayed delay: what it stands for and where that comes from.
ASSUMED: tuple[str, ...] = ("modelled", "simulated", "emulated")


# How a system's repeated samples pair up, sample i of the technique with sample i of a baseline:
# repeats: the same work rerun, variants interleaved; seeds: independent seeds or workloads, every
# variant on each; turns: consecutive parts of one run (turn groups, epochs, a window of one trace),
# which are not independent, so their pairs count as one and decide nothing.
Pairing = Literal["repeats", "seeds", "turns"]
PAIRINGS: tuple[str, ...] = ("repeats", "seeds", "turns")

# Where a component a verdict rests on comes from (issue 50): learned (trained on data, in this run or
# shipped weights: SmolLM2, MiniLM, a PPO policy), packaged (a library's implementation: HiGHS, BTrees,
# scikit-learn), scripted (written by this project: a workload generator, a planner, a parser). A
# scripted component whose weaknesses decide the result is a threat the report must show.
Provenance = Literal["learned", "packaged", "scripted"]
PROVENANCES: tuple[str, ...] = ("learned", "packaged", "scripted")


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
class Mechanism:
    """The mechanism the paper credits for its gain, and the variant that isolates it: the technique
    with only that mechanism removed (or the baseline with only it added). The report's
    ``headline.mechanism`` is the technique against this variant on the headline metric."""

    name: str                    # the mechanism, in a few words
    ablation: str                # variant name of the ablation
    statement: str = ""          # what the ablation keeps and what it removes


@dataclass(frozen=True)
class Regime:
    """The one workload or hardware parameter that governs the effect. The flow sweeps it
    (``SystemResult.regime``) and the report gives the curve of headline ratios against the strongest
    deployable baseline with its crossover: where the technique stops winning."""

    parameter: str               # the swept parameter (a Params field or a workload property)
    unit: str = ""
    paper_value: float | None = None   # the paper's setting of the parameter, where it states one
    paper_source: str = ""       # where in the paper
    statement: str = ""          # why this parameter governs the effect
    # Contract v4: why the headline is not measured at paper_value (unreachable here), and which
    # reachable point stands in; required when the headline's value differs from paper_value.
    operating_point_reason: str = ""


@dataclass(frozen=True)
class Constraint:
    """Contract v4 (issue 47): what every side of the headline's comparison must hold for it to count
    (an SLO attainment, an error bound, an accuracy target), on a metric each variant reports. Either an
    absolute bound (``bound``, or the run parameter ``bound_param``): a variant meets it when its value
    is at least the bound (``better`` higher) or at most it (lower), give or take ``tolerance``; or,
    with neither, relative to the technique: a baseline meets it when its value is at least the
    technique's less the tolerance (higher; at most the technique's plus it where lower is better), so
    the comparison is at the technique's own constraint. ``tolerance_param`` reads the tolerance from a
    run parameter. ``report.build_report`` judges each variant by its median and, where the constraint
    metric was sampled per repeat or seed, per pair: a deployable baseline broke it only where its
    median and most of its pairs miss it (then it is never the strongest, ``vs_strongest``); the
    technique met it only where its median and most of its pairs do; and the headline's verdicts count
    only the pairs where both sides met it (and those where the technique broke it and was behind)."""

    metric: str                  # the constraint's metric, a key of each compared variant's metrics
    better: Better               # which direction of that metric is better
    bound: float | None = None   # an absolute bound
    bound_param: str | None = None   # an absolute bound read from this run parameter
    tolerance: float = 0.0
    tolerance_param: str | None = None   # the tolerance read from this run parameter
    statement: str = ""          # the constraint in words

    def __post_init__(self) -> None:
        if self.better not in ("higher", "lower"):
            raise ValueError(f"constraint {self.metric!r}: better must be 'higher' or 'lower' (got {self.better!r})")
        if self.bound is not None and self.bound_param is not None:
            raise ValueError(f"constraint {self.metric!r}: give bound or bound_param, not both")
        if self.tolerance < 0:
            raise ValueError(f"constraint {self.metric!r}: the tolerance must not be negative (got {self.tolerance})")

    @property
    def relative(self) -> bool:
        """Whether the bound is the technique's own value (no absolute bound declared)."""
        return self.bound is None and self.bound_param is None

    def resolve(self, params: dict[str, Any], model: Any = None) -> tuple[float | None, float]:
        """(the absolute bound, None where relative; the tolerance) for a run with ``params``; a parameter
        the run's dict lacks takes its default in the pydantic ``model`` (the spec's parameter model)."""
        fields = getattr(model, "model_fields", {}) or {}

        def read(name: str) -> float:
            value = params.get(name)
            if value is None and name in fields and not fields[name].is_required():
                value = fields[name].default
            if value is None:
                raise ValueError(f"constraint {self.metric!r} reads the run parameter {name!r}, which this run lacks")
            return float(value)
        bound = read(self.bound_param) if self.bound_param else self.bound
        tolerance = read(self.tolerance_param) if self.tolerance_param else self.tolerance
        if tolerance < 0:
            raise ValueError(f"constraint {self.metric!r}: the tolerance must not be negative (got {tolerance})")
        return bound, tolerance

    def meets(self, value: float, reference: float, tolerance: float) -> bool:
        """Whether ``value`` is at least ``reference`` (the bound, or the technique's value) less the
        tolerance in the constraint's direction."""
        slack = tolerance + 1e-9
        return value >= reference - slack if self.better == "higher" else value <= reference + slack


@dataclass(frozen=True)
class Component:
    """A part of the run the verdict rests on (a variant's model, a baseline's engine, the workload's
    generator), and whether it is learned, packaged or scripted by the project."""
    name: str
    provenance: Provenance
    statement: str = ""          # what it is (the package, the model, what the script does)

    def __post_init__(self) -> None:
        if self.provenance not in PROVENANCES:
            raise ValueError(f"component {self.name!r}: provenance must be one of {', '.join(PROVENANCES)} "
                             f"(got {self.provenance!r})")


@dataclass(frozen=True)
class SystemSpec:
    name: str
    title: str
    paper: str                   # citation: arXiv id or venue
    family: str
    claims: tuple[Claim, ...]
    params: Any = None           # the system's SystemParams subclass
    # Every variant a careful user could run instead of the technique on the headline metric (the
    # headline's baseline included); the report names the strongest of them (`vs_strongest`).
    baselines: tuple[str, ...] = field(default=())
    # Contract v3. Each baseline variant's roles (see Role); a baseline not listed has no declared
    # role yet. The headline's baseline must not be an oracle.
    roles: dict[str, tuple[Role, ...]] = field(default_factory=dict)
    mechanism: Mechanism | None = None
    regime: Regime | None = None
    # Hardware the paper's effect needs that a CPU machine lacks (e.g. "HBM", "NVLink", "FPGA"):
    # the run then gives a modelled ``projection`` beside the headline.
    hardware: tuple[str, ...] = field(default=())
    # Contract v4: how the i-th samples of the technique and of a baseline pair up (see Pairing).
    pairing: "Pairing" = "repeats"
    # Contract v4: what every metric is (metric -> Kind), declared here and never in a flow. A
    # system's result may override a metric whose kind depends on a parameter (a replayed model is
    # ``emulated``, the real one ``measured``); the override is made by its pure package.
    kinds: dict[str, "Kind"] = field(default_factory=dict)
    # Contract v4 (issue 47): the constraint the headline's comparison holds at (see Constraint): a
    # deployable baseline that broke it is not the strongest; None: no declared constraint.
    constraint: Constraint | None = None
    # Issue 50: the components the verdict rests on, each learned, packaged or scripted (see Component).
    components: tuple[Component, ...] = field(default=())

    def __post_init__(self) -> None:
        heads = [c for c in self.claims if c.headline]
        if len(heads) != 1:
            raise ValueError(f"{self.name}: exactly one claim must be the headline (got {len(heads)})")
        if heads[0].baseline not in self.baselines:
            object.__setattr__(self, "baselines", (heads[0].baseline, *self.baselines))
        for variant, roles in self.roles.items():
            unknown = set(roles) - set(ROLES)
            if unknown or not roles:
                raise ValueError(f"{self.name}: roles[{variant!r}] must be one or more of {', '.join(ROLES)} "
                                 f"(got {roles!r})")
            if "oracle" in roles and len(roles) > 1:
                raise ValueError(f"{self.name}: {variant!r} cannot be an oracle and {roles!r} at once")
        if "oracle" in self.roles.get(heads[0].baseline, ()):
            raise ValueError(f"{self.name}: the headline's baseline {heads[0].baseline!r} is an oracle (chosen in "
                             "hindsight): it may stand beside the headline (vs_oracle), never as its denominator")
        bad = {m: k for m, k in self.kinds.items() if k not in KINDS}
        if bad:
            raise ValueError(f"{self.name}: unknown kinds {bad}; use one of {', '.join(KINDS)}")
        if self.pairing not in PAIRINGS:
            raise ValueError(f"{self.name}: pairing must be one of {', '.join(PAIRINGS)} (got {self.pairing!r})")
        if self.mechanism is not None and self.mechanism.ablation == heads[0].technique:
            raise ValueError(f"{self.name}: the mechanism's ablation must be another variant than the technique")

    def role(self, variant: str) -> tuple[str, ...]:
        return tuple(self.roles.get(variant, ()))

    @property
    def contract_v3(self) -> bool:
        """Whether the spec declares everything contract v3 asks: every baseline's role, the mechanism
        and its ablation, and the regime."""
        return self.mechanism is not None and self.regime is not None and all(b in self.roles for b in self.baselines)

    @property
    def headline(self) -> Claim:
        return next(c for c in self.claims if c.headline)

    # --- the platform's view: where its flow lives (found by name, never imported here) ---

    @property
    def entrypoint(self) -> str:
        """Prefect entrypoint, relative to the repository root."""
        return f"flows/{self.name}.py:{self.name}"

    def load_flow(self):
        """The Prefect flow object (imports prefect)."""
        return getattr(importlib.import_module(f"mlsys_flows.flows.{self.name}"), self.name)

    def params_model(self):
        """The system's pydantic parameter model."""
        if self.params is None:
            raise TypeError(f"{self.name}: the spec declares no parameter model")
        return self.params

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "paper": self.paper, "family": self.family,
                "entrypoint": self.entrypoint, "baselines": list(self.baselines),
                "roles": {b: list(r) for b, r in self.roles.items()},
                "mechanism": asdict(self.mechanism) if self.mechanism else None,
                "regime": asdict(self.regime) if self.regime else None, "hardware": list(self.hardware),
                "pairing": self.pairing, "constraint": asdict(self.constraint) if self.constraint else None,
                "components": [asdict(c) for c in self.components],
                "claims": [asdict(c) for c in self.claims]}
