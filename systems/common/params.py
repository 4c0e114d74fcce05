"""Typed, validated parameters shared by every system.

Each system subclasses :class:`SystemParams`, declares its own fields with limits and
descriptions, and fills ``PRESETS`` with the values of each scale. ``for_scale`` merges a
preset with user overrides and validates the result before any work starts; a bad value
raises :class:`ParamsError` naming the field.
"""
from __future__ import annotations

from typing import Any, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator
from pydantic.fields import FieldInfo

from mlsys_flows.errors import MlsysError
from mlsys_flows.systems.common.verdict import MIN_PAIRS

Scale = Literal["smoke", "quick", "full"]
SCALES: tuple[str, ...] = get_args(Scale)
# Every system's values at a scale, under its own PRESETS: smoke runs are for tests, one sample. The
# timeouts are far above what a scale takes on 2 loaded cores (a smoke run: seconds to minutes): past
# them a task or a run is stuck (a hung call, a lost device), not slow.
_SCALE_DEFAULTS: dict[str, dict[str, Any]] = {
    "smoke": {"repeats": 1, "task_timeout_s": 900, "flow_timeout_s": 1800},
    "quick": {"task_timeout_s": 3600, "flow_timeout_s": 7200},
    "full": {"task_timeout_s": 86400, "flow_timeout_s": 3 * 86400},
}


class ParamsError(MlsysError, ValueError):
    """A parameter set was rejected; ``field`` names the offending parameter."""

    def __init__(self, system: str, field: str, problem: str):
        self.system, self.field, self.problem = system, field, problem
        super().__init__(f"{system}: parameter '{field}': {problem}")


class FieldValueError(MlsysError, ValueError):
    """Raised by a cross-field (model) validator to name the parameter at fault, so the
    ParamsError names it too rather than the whole parameter set."""

    def __init__(self, field: str, problem: str):
        self.field = field
        super().__init__(problem)


class SystemParams(BaseModel):
    """Parameters every system has. Subclasses add their own fields and ``PRESETS``."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    SYSTEM: ClassVar[str] = "system"
    # scale -> field values; fields absent from a preset keep their declared default.
    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {}

    scale: Scale = Field("quick", description="Workload size: smoke (seconds), quick (~2 min on 2 cores), full (GPU or cluster).")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of every random generator in the run.")
    repeats: int = Field(3, ge=1, le=50, description="Repeats of every timed (measured) metric, variants interleaved; "
                                                      "the report keeps each sample and uses the median (1 at smoke).")
    task_timeout_s: float = Field(3600, gt=0, le=7 * 86400, description="Longest one task may run before it fails "
                                  "as timed out (900 s at smoke, 3600 at quick, 86400 at full).")
    flow_timeout_s: float = Field(7200, gt=0, le=30 * 86400, description="Longest the run's work (its tasks, from the "
                                  "cluster's start to the last result) may take before it fails as timed out (1800 s at smoke, 7200 at quick, 3 days at full).")

    def kills_workers(self) -> bool:
        """Whether the run SIGKILLs workers of its cluster on purpose (a failure it measures). Such a run
        takes a cluster of its own when none is named, never the server's warm one that other runs share."""
        return False

    def own_cluster(self) -> bool:
        """Whether the run takes a cluster of its own when none is named, never the server's warm one that
        other runs share: it kills workers on purpose (:meth:`kills_workers`), or the system changes its
        cluster's processes (pins or grows them)."""
        return self.kills_workers()

    def embedded_workers(self) -> int | None:
        """Workers the run's embedded cluster starts with, when the run starts one (no cluster named); None:
        the ``DaskCluster`` default. Starting them together is quicker than growing the cluster later."""
        return None

    @classmethod
    def preset(cls, scale: str) -> dict[str, Any]:
        """The values ``scale`` sets: every system's (``_SCALE_DEFAULTS``), then this system's ``PRESETS``."""
        return {**_SCALE_DEFAULTS.get(scale, {}), **cls.PRESETS.get(scale, {})}

    @classmethod
    def for_scale(cls, scale: str | None = None, /, **overrides: Any):
        """Preset of ``scale`` with ``overrides`` on top, validated; raises ParamsError."""
        if scale is None:
            scale = overrides.pop("scale", "quick")
        elif "scale" in overrides:  # e.g. --param scale=...: the scale is chosen once, by its own option
            raise ParamsError(cls.SYSTEM, "scale", "is chosen by the scale argument (--scale), not as a parameter override")
        if scale not in SCALES:
            raise ParamsError(cls.SYSTEM, "scale", f"must be one of {', '.join(SCALES)} (got {scale!r})")
        known = set(cls.model_fields)
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ParamsError(cls.SYSTEM, unknown[0], f"unknown parameter; known: {', '.join(sorted(known - {'scale'}))}")
        values = {**cls.preset(scale), **overrides, "scale": scale}
        try:
            return cls(**values)
        except ValidationError as exc:
            err = exc.errors()[0]
            cause = (err.get("ctx") or {}).get("error")
            if isinstance(cause, FieldValueError):
                raise ParamsError(cls.SYSTEM, cause.field, f"{cause} (got {values.get(cause.field)!r})") from None
            field = ".".join(str(p) for p in err.get("loc", ())) or "parameters"
            raise ParamsError(cls.SYSTEM, field, f"{err['msg']} (got {err.get('input')!r})") from None

    @classmethod
    def describe(cls) -> dict[str, str]:
        """Field name -> description, for CLI help and docs."""
        return {name: (f.description or "") for name, f in cls.model_fields.items()}

    @classmethod
    def overrides_model(cls) -> type[BaseModel]:
        """The flow's ``overrides`` parameter as a model: every field of this system (but ``scale``,
        chosen by its own parameter) optional, with its description, limits and each scale's preset.
        Prefect turns it into the deployment's parameter schema, so the UI's run form shows a typed
        field per parameter; an unset field keeps the scale's preset."""
        fields: dict[str, Any] = {}
        for name, info in cls.model_fields.items():
            if name == "scale":
                continue
            default = info.get_default(call_default_factory=True)
            presets = {s: cls.preset(s).get(name, default) for s in SCALES}
            shown = ", ".join(f"{s} {v!r}" for s, v in presets.items())
            optional = FieldInfo.merge_field_infos(info, default=None, default_factory=None, validate_default=False,
                                                   description=f"{info.description or name} Preset: {shown}.")
            fields[name] = (info.annotation | None, optional)
        return create_model(f"{cls.SYSTEM.capitalize()}Overrides", __config__=ConfigDict(extra="forbid"), **fields)



class AdaptiveRepeatParams(SystemParams):
    """Parameters of a system whose measured headline may keep repeating until its verdict decides
    (contract v4; ``systems/common/repeats.py``)."""

    max_repeats: int = Field(0, ge=0, le=200, description="Most repeats of the timed headline when they adapt: "
                             "after `repeats`, more run (interleaved) until the verdict against the strongest "
                             "deployable baseline decides, this many ran or `repeat_budget_s` is spent; 0: exactly "
                             "`repeats`.")
    repeat_budget_s: float = Field(0.0, ge=0, le=7 * 86400, description="Seconds the adaptive repeats may take "
                                   "before they stop undecided (0: no limit but max_repeats).")

    @model_validator(mode="after")
    def _at_least_repeats(self):
        if self.max_repeats and self.max_repeats < max(self.repeats, MIN_PAIRS):
            raise FieldValueError("max_repeats", f"must be 0 or at least repeats = {self.repeats} and {MIN_PAIRS} "
                                                 "(fewer pairs never decide)")
        return self

    def adaptive_repeats(self):
        from .repeats import AdaptiveRepeats

        return AdaptiveRepeats(self.repeats, self.max_repeats or self.repeats, self.repeat_budget_s)
