"""vCache (arXiv 2502.03771): a verified semantic prompt cache with per-entry learned thresholds and
a user error bound delta, vs static similarity thresholds (a reusable semantic cache library)."""
from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from pydantic import Field, field_validator, model_validator

from mlsys_flows.systems.common.lazy import lazy_exports
from mlsys_flows.systems.common.params import SystemParams
from mlsys_flows.systems.common.spec import Claim, Constraint, Mechanism, Regime, SystemSpec, reduction

if TYPE_CHECKING:
    from .workload import Stream

# the cache, its replay and the experiment (numpy, scipy) load on first use, not with the spec
lazy_exports(__name__, {
    ".cache": ("EPS_GRID", "EPS_GRID_REFERENCE", "Entry", "GlobalVerifiedPolicy", "LogisticFit", "SemanticCache",
               "StaticThreshold", "VectorIndex", "VerifiedPolicy", "fit_logistic", "tau_star"),
    ".experiment": ("CALIBRATION_TRAFFIC", "calibrate", "equal_error_static", "run_stream", "evaluate_policies",
                    "calibration", "evaluate_seed", "regime_point"),
    ".evaluate": ("Outcome", "best_static", "replay", "static_at_hit_rate", "static_sweep"),
    ".workload": ("Stream", "corpus_stream", "max_paraphrase_classes", "paraphrase_corpus", "sphere_stream"),
})

DELTAS = ("low", "mid", "high")  # variant suffixes: vcache_low, vcache, vcache_high


class Params(SystemParams):
    SYSTEM: ClassVar[str] = "vcache"
    PRESETS: ClassVar[dict] = {
        "smoke": dict(sphere_queries=2_000, sphere_classes=200, minilm_classes=12, minilm_per_class=24,
                      threshold_step=0.02, seeds=3, regime_near_dup=[0.0, 0.2]),
        # 40 queries per class, as many as a stream of 80,000 over 2,000 classes gives (issue 47: at 20 per class
        # entries rarely finish their warm-up and the bound never acts); 6 evaluated streams: 6 pairs can decide
        "quick": dict(sphere_queries=40_000, sphere_classes=1_000, minilm_classes=102, minilm_per_class=120,
                      threshold_step=0.01, seeds=6),
        # the quick stream's 40 queries per class, over 4x the classes; 6 seeds, the fewest that can decide
        "full": dict(sphere_queries=160_000, sphere_classes=4_000, minilm_classes=102, minilm_per_class=120,
                     threshold_step=0.005, seeds=6),
    }

    delta_low: float = Field(0.01, gt=0.0, lt=0.5, description="Smallest error bound delta (variants *_low).")
    delta: float = Field(0.02, gt=0.0, lt=0.5, description="Error bound delta of the headline (variants vcache, static_threshold).")
    delta_high: float = Field(0.05, gt=0.0, lt=0.5, description="Largest error bound delta (variants *_high).")
    min_observations: int = Field(6, ge=1, le=100, description="Observations an entry needs before vCache may serve it.")
    separable_var_scale: float = Field(1.0, gt=0.0, le=10.0, description="Multiplier on Var(t) for an entry whose observations are perfectly separated (the delta method is undefined there): 1 = our simulated calibration A n^-B (docs/vcache.md).")
    anchor_observations: bool = Field(True, description="Start every entry with the authors' two pseudo-observations (wrong at similarity 0, right at 1), counted by min_observations; off: an entry whose labels all agree explores forever.")
    reference_eps_grid: bool = Field(False, description="Minimise tau over the authors' 50 evenly spaced eps values instead of the dense grid (which adds 400 log-spaced values below 0.5).")
    # synthetic sphere stream (scale workload)
    sphere_queries: int = Field(20_000, ge=200, le=1_000_000, description="Queries in the synthetic sphere stream.")
    sphere_classes: int = Field(2_000, ge=10, le=100_000, description="Equivalence classes in the sphere stream.")
    sphere_dim: int = Field(64, ge=8, le=1024, description="Embedding dimensions of the sphere stream.")
    classes_per_topic: int = Field(5, ge=1, le=100, description="Classes sharing one topic direction (close siblings).")
    scale_min: float = Field(0.15, gt=0.0, le=5.0, description="Smallest topic scale (distance of class centres from the topic direction).")
    scale_max: float = Field(1.0, gt=0.0, le=5.0, description="Largest topic scale (log-uniform between the two).")
    within: float = Field(0.6, gt=0.0, le=5.0, description="Spread of a class's prompts around its centre, relative to the topic scale.")
    near_dup_share: float = Field(0.1, ge=0.0, lt=1.0, description="Class confusion: share of the sphere's classes that are near-duplicates (twins) of another class with a different answer.")
    near_dup_offset: float = Field(0.3, gt=0.0, le=5.0, description="Distance of a twin's centre from its partner's, relative to the topic scale (below 'within': the two classes' prompts interleave).")
    zipf_s: float = Field(0.9, ge=0.0, le=3.0, description="Zipf exponent of class popularity (both workloads).")
    # MiniLM paraphrase workload (real embeddings)
    minilm_classes: int = Field(102, ge=2, le=102, description="Paraphrase classes (question family x slot value) embedded with MiniLM.")
    minilm_per_class: int = Field(120, ge=2, le=120, description="Distinct paraphrases of the most popular class (others fewer, by Zipf).")
    embed_base_url: str | None = Field(None, min_length=8, max_length=500, pattern=r"^https?://", description="OpenAI-compatible endpoint (e.g. http://127.0.0.1:8000/v1) whose /embeddings replaces MiniLM for the paraphrase workload; None: the packaged MiniLM, offline.")
    embed_model: str = Field("text-embedding-3-small", min_length=1, max_length=200, description="Embedding model name sent to embed_base_url.")
    api_key_secret: str | None = Field(None, min_length=1, max_length=200, description="Name of the Prefect Secret block holding the endpoint's API key (resolved in the task, never logged).")
    seeds: int = Field(3, ge=1, le=20, description="Evaluated sphere streams (seeds seed, seed+1, ...) of the headline "
                       "(delta mid): vCache, its ablation, the calibrated and the hindsight static thresholds on each.")
    regime_near_dup: list[float] = Field([0.0, 0.05, 0.1, 0.2], min_length=2, max_length=12,
                                         description="Class-confusion levels of the regime sweep: the sphere stream's "
                                                     "near_dup_share (share of classes with a near-duplicate whose "
                                                     "answer differs); each point is a quarter-size stream (queries and "
                                                     "classes / 4) of one seed, its static threshold calibrated on "
                                                     "held-out traffic of the same world.")
    threshold_step: float = Field(0.01, ge=0.001, le=0.1, description="Spacing of the static-threshold sweep (0.3 to 1.0, half this spacing from 0.9) that picks the hindsight thresholds; the deployable one is calibrated on a finer grid (0.001 from 0.95).")

    @field_validator("regime_near_dup")
    @classmethod
    def _confusions(cls, v):
        if any(not 0 <= w < 1 for w in v) or len(set(v)) != len(v):
            raise ValueError("confusion levels (near-duplicate shares) must be distinct, each in [0, 1)")
        return sorted(v)

    @model_validator(mode="after")
    def _ordered(self):
        if not self.delta_low < self.delta < self.delta_high:
            raise ValueError("need delta_low < delta < delta_high")
        if self.scale_min > self.scale_max:
            raise ValueError("scale_min must not exceed scale_max")
        return self

    def deltas(self) -> dict[str, float]:
        return {"low": self.delta_low, "mid": self.delta, "high": self.delta_high}

    def thresholds(self):
        """The static sweep: every threshold_step from 0.3, and every half step from 0.9, where the
        hit rate and error rate of a static cache change fastest (a careful user sweeps finer there)."""
        import numpy as np
        coarse = np.arange(0.3, 1.0 + 1e-9, self.threshold_step)
        fine = np.arange(0.9, 1.0 + 1e-9, self.threshold_step / 2)
        return np.unique(np.round(np.concatenate([coarse, fine]), 6))

    def calibration_thresholds(self):
        """The deployable threshold's calibration grid: every 0.001 from 0.95 to 1, where the thresholds
        meeting delta lie (``calibration`` extends it with ``thresholds()`` below 0.95 when 0.95 is the one
        chosen)."""
        import numpy as np

        return np.round(np.arange(0.95, 1.0 + 1e-9, 0.001), 6)

    def sphere(self, seed: int | None = None, near_dup: float | None = None, shrink: int = 1,
               traffic: int | None = None) -> Stream:
        """The sphere stream at ``seed`` (default: the run's), class confusion ``near_dup`` (the share
        of near-duplicate classes; default: the parameter), with queries and classes divided by ``shrink``;
        ``traffic``: other prompts of the same world (``sphere_stream``), None: the evaluated ones."""
        from .workload import sphere_stream

        return sphere_stream(max(200, self.sphere_queries // shrink), max(10, self.sphere_classes // shrink),
                             self.sphere_dim, self.classes_per_topic, self.scale_min, self.scale_max,
                             self.within, self.zipf_s, self.seed if seed is None else seed,
                             self.near_dup_share if near_dup is None else near_dup, self.near_dup_offset,
                             traffic=traffic)

    def policy_options(self) -> dict:
        """The VerifiedPolicy / GlobalVerifiedPolicy options these parameters set (besides delta)."""
        from .cache import EPS_GRID_REFERENCE

        return dict(min_obs=self.min_observations, separable_var_scale=self.separable_var_scale,
                    anchors=self.anchor_observations, eps_grid=EPS_GRID_REFERENCE if self.reference_eps_grid else None)


def suffix(level: str) -> str:
    return "" if level == "mid" else f"_{level}"


REGIME_SHRINK = 4   # a regime point's stream has a quarter of the headline's queries and classes


def same_hits_static(sweep: dict, hit_rate: float) -> dict[str, float]:
    """The static cache with (at least) vCache's hit rate: the strictest threshold that reaches it."""
    ok = [i for i, h in enumerate(sweep["hit_rate"]) if h >= hit_rate]
    i = max(ok, key=lambda k: sweep["threshold"][k]) if ok else 0
    return {"hit_rate": sweep["hit_rate"][i], "error_rate": sweep["error_rate"][i], "threshold": sweep["threshold"][i]}


_CLAIMS = [Claim("hit_rate", "static_threshold", "vcache", "higher", None,
                 "vCache's claim: the user's error bound delta holds, with more hits than a static threshold at that "
                 "bound (here: per seed, a static threshold calibrated to meet delta on held-out traffic of the same "
                 "world, evaluated on the same sphere stream as vCache; a seed counts only where both met delta)", headline=True),
           Claim("hit_rate", "static_equal_error", "vcache", "higher", 12.0,
                 "VectorQ's claim (the paper's first version): up to 12x hit rate across static thresholds (here: at "
                 "vCache's realized error, the static threshold of the evaluated stream's sweep with the most hits)"),
           Claim("error_rate", "static_same_hits", "vcache", "lower", round(reduction(0.92), 4),
                 "VectorQ's claim: up to 92% fewer errors than a static threshold (here: the static threshold with "
                 "vCache's hit rate)")]
for _lvl in ("low", "high"):
    _CLAIMS.append(Claim("hit_rate", f"static_threshold_{_lvl}", f"vcache_{_lvl}", "higher",
                         statement=f"hit rate at the {_lvl} error bound vs the static threshold calibrated to meet it"))
for _lvl in DELTAS:
    _CLAIMS.append(Claim("hit_rate", f"static_oracle{suffix(_lvl)}_minilm", f"vcache{suffix(_lvl)}_minilm", "higher",
                         statement=f"MiniLM paraphrase workload, {_lvl} error bound: hit rate vs the best static "
                                   "threshold meeting it, chosen in hindsight on the same stream"))

SPEC = SystemSpec(
    name="vcache", title="vCache: verified semantic prompt caching", paper="arXiv:2502.03771", family="llm-serving",
    params=Params, baselines=("static_threshold", "static_oracle"), claims=tuple(_CLAIMS),
    roles={"static_threshold": ("deployable",), "static_oracle": ("oracle",)},
    # hits count at the user's error bound (issue 47): a static threshold serving more hits by breaking delta is
    # not the strongest baseline, and vCache breaking its own bound is no win
    constraint=Constraint("error_rate", "lower", bound_param="delta",
                          statement="the headline's error bound: error rate (wrong cached answers / queries) at most "
                                    "delta for vCache and the static threshold alike: the verdict counts only the "
                                    "seeds where both met it (and vCache's losses where it broke it)"),
    # every metric is counted: the offline model answers with the prompt's class and the judge compares classes
    kinds=dict.fromkeys(("hit_rate", "error_rate", "hit_precision", "model_calls", "cache_entries", "queries", "delta",
                         "delta_met", "error_budget", "warm_share", "logistic_fits", "threshold", "tail_hit_rate",
                         "tail_error_rate"), "counted"),
    mechanism=Mechanism(
        "per-embedding learned thresholds", "vcache_global",
        "vcache_global keeps vCache's whole error-bound machinery (warm-up, logistic fit, delta-method variance, "
        "eps grid, exploration probability tau*) but pools every entry's observations into one fit: one learned "
        "global threshold instead of one per cached embedding."),
    regime=Regime(
        "near_dup_share", "share of classes", None, "",
        "Class confusion: the share of classes that have a near-duplicate (a class whose prompts interleave with "
        "theirs) with a different answer, the confusion the paper's benchmarks have. At 0 every topic's classes are "
        "separable by one threshold, where a calibrated static threshold should come closest; as the share grows, one "
        "global threshold must be strict enough for the twins everywhere, while per-entry thresholds can be strict "
        "at the twins and lax elsewhere. The paper's benchmarks are not parameterized this way (no paper value)."))

__all__ = ["Params", "SPEC", "SemanticCache", "VectorIndex", "Entry", "StaticThreshold", "VerifiedPolicy", "LogisticFit",
           "fit_logistic", "tau_star", "GlobalVerifiedPolicy", "EPS_GRID_REFERENCE", "REGIME_SHRINK", "calibrate", "calibration", "evaluate_seed",
           "regime_point", "run_stream", "equal_error_static", "CALIBRATION_TRAFFIC", "EPS_GRID", "Outcome", "replay", "static_sweep", "best_static",
           "static_at_hit_rate", "Stream", "sphere_stream", "paraphrase_corpus", "corpus_stream",
           "max_paraphrase_classes", "evaluate_policies", "same_hits_static", "suffix", "DELTAS"]
