"""Llama (arXiv 2102.01887): latency-targeted, per-invocation configuration of video pipelines on
serverless CPU and GPU workers, vs all-CPU, all-GPU and the cheapest static plan reaching Llama's own
predicted attainment on separate calibration videos (all deployable), with
the cheapest static plan reaching Llama's measured attainment on repeat 0's videos beside them (hindsight,
an oracle). Each repeat runs every variant on its own videos (seed + repeat)."""
from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator, model_validator

from mlsys_flows.systems.common.params import SystemParams
from mlsys_flows.systems.common.spec import Claim, Constraint, Mechanism, Regime, SystemSpec

VARIANTS = ("all_cpu", "all_gpu", "best_static", "static_oracle", "llama", "llama_once")


class Params(SystemParams):
    SYSTEM: ClassVar[str] = "llama"
    PRESETS: ClassVar[dict] = {
        "smoke": dict(videos=1, frames=16, batch_sizes=[2, 8], max_instances=1, prewarm=0, profile_reps=1,
                      cold_probes=1, calibration_videos=1, regime_videos=1, regime_duration_scale=[1.0, 16.0],
                      oracle_tries=2, slo_sweep=[1.0]),
        # eight repeats, each on its own videos and arrivals (seed + repeat): six decide a verdict against one
        # rival at 95% (contract v4), but a loss against the strongest of the three deployable plans is judged at
        # 1 - 0.05 / 3 and needs at least seven pairs on one side (2 / 2^7 < 0.05 / 3); eight leave one pair to
        # fall out of the equal-attainment check. 64 calibration videos, so that one video moves a plan's
        # calibration attainment by less than attainment_tolerance (best_static reaches Llama's itself, none
        # subtracted). slo_cold_starts=0: the SLO is warm latency
        # (instances are provisioned, prewarm), between the all-GPU and all-CPU plans' slowest calibration
        # videos, so it binds for the cheapest plan on its busiest videos; with one cold start of allowance
        # (the default) every plan met every deadline in earlier runs and no policy could be cheaper than all-CPU
        "quick": dict(videos=32, frames=12, batch_sizes=[2, 8, 32], max_instances=2, profile_reps=5, cold_probes=2,
                      calibration_videos=64, regime_videos=8, repeats=8, slo_cold_starts=0.0),
        "full": dict(videos=60, frames=96, batch_sizes=[1, 2, 4, 8, 16, 32], max_instances=8, profile_reps=5,
                     cold_probes=3, calibration_videos=120, regime_videos=16, oracle_tries=24, repeats=8,
                     slo_cold_starts=0.0),
    }

    # workload: synthetic videos
    videos: int = Field(32, ge=1, le=500, description="Evaluated videos per repeat: SLO attainment moves in steps of "
                        "1 / videos, so a comparison at equal attainment needs many (>= 30 at quick); every video runs "
                        "once per variant and repeat, so more of them lengthen the run. Repeat r draws its own videos "
                        "and arrivals from seed + r, the same for every variant of that repeat.")
    calibration_videos: int = Field(64, ge=1, le=1000, description="Separate videos (another seed) on which the SLO "
                                    "is derived and the deployable static plans are chosen; never evaluated. Scoring "
                                    "plans on them is modelled (no processes); with more than 1 / attainment_tolerance "
                                    "of them one video does not decide which plan reaches Llama's attainment.")
    attainment_tolerance: float = Field(0.05, ge=0.0, le=0.5, description="Two SLO attainments (shares of videos) "
                                        "count as equal when they differ by at most this much (best_static must "
                                        "reach Llama's predicted calibration attainment itself, none "
                                        "subtracted): a repeat's "
                                        "cost ratio counts at equal attainment only where the two sides' evaluated "
                                        "attainments are this close (or where the baseline met more videos and costs less). "
                                        "0.05: one evaluated video of 32 at quick, not two.")
    regime_duration_scale: list[float] = Field([1.0, 4.0, 16.0, 64.0], min_length=2, max_length=12,
                                               description="Operator duration / cold start regime: factors on every "
                                               "operation's profiled latency (cold starts unchanged); at each, the SLO "
                                               "and static plans are re-derived on calibration videos and every "
                                               "variant is predicted with the scaled profile (modelled).")
    slo_sweep: list[float] = Field([0.25, 1.0, 2.0], max_length=8, description="SLO tightness sweep (modelled, in "
                                   "the notes): slo_fractions at which, with the headline's profile (duration factor "
                                   "1), the SLO is re-derived, the static plans re-chosen and every variant predicted "
                                   "as at a regime point; the run's own slo_fraction is the regime's factor-1 point. "
                                   "Below 1 the SLO binds for the all-CPU plan's slowest warm videos, above 1 it does not.")
    regime_videos: int = Field(8, ge=1, le=200, description="Videos of each set (calibration, evaluated) a regime "
                               "point predicts (the first ones).")
    prewarm: int = Field(2, ge=0, le=64, description="Instances per tier started (cold, measured) before the first "
                         "video: provisioned concurrency, the same for every variant; idle ones are stopped after keep_alive_s.")
    frames: int = Field(12, ge=4, le=2000, description="Frames per video.")
    frame_size: int = Field(128, ge=64, le=512, description="Frame side in pixels (a multiple of 32).")
    sample_rate: int = Field(2, ge=1, le=16, description="The sample op keeps every sample_rate-th frame (a pipeline "
                                                          "setting, equal for every variant, so every variant computes the same answer).")
    motion_share: float = Field(0.5, ge=0.0, le=1.0, description="Expected share of 8-frame segments in which objects move.")
    object_rate: float = Field(0.5, ge=0.05, le=1.0, description="Probability that an object slot is occupied.")
    motion_threshold: float = Field(0.01, ge=0.0, le=1.0, description="Share of changed pixels above which a frame "
                                                                       "has motion and goes on to detection.")
    video_gap_s: float = Field(0.8, ge=0.0, le=3600.0, description="Mean seconds between video arrivals (Poisson "
                                                                    "arrivals on the pipeline clock).")
    # SLO
    slo_s: float | None = Field(None, gt=0.0, le=3600.0, description="End-to-end latency target per video, seconds; "
                                "None: derived with slo_fraction from the profiled predictions.")
    slo_fraction: float = Field(0.5, ge=0.0, le=10.0, description="Where the derived SLO lies between the slowest video's "
                                "predicted latency under the fastest all-GPU plan (0) and under the cheapest all-CPU plan (1).")
    slo_cold_starts: float = Field(1.0, ge=0.0, le=100.0, description="Cold starts (of the slower tier, as profiled) "
                                   "added to the derived SLO, so that a video meeting one cold start can still make it. "
                                   "0 at quick and full: the SLO is warm latency (instances are provisioned), so it "
                                   "binds for the cheapest plan on its busiest videos; with one cold start of "
                                   "allowance millisecond operators leave every plan far inside the SLO.")
    oracle_tries: int = Field(8, ge=1, le=64, description="Static plans run for real on the evaluated videos, cheapest "
                              "predicted first, in the hindsight search for static_oracle (the cheapest static plan "
                              "reaching Llama's measured attainment there).")
    # knobs and serverless platform
    batch_sizes: list[int] = Field([2, 8, 32], min_length=1, max_length=8, description="Batch sizes (items per "
                                   "invocation) every operation may use, ascending.")
    max_instances: int = Field(2, ge=1, le=64, description="Concurrency limit: worker processes per tier at once.")
    keep_alive_s: float = Field(3.0, ge=0.0, le=3600.0, description="Seconds an idle worker stays warm before it is "
                                                                     "stopped (on the pipeline clock).")
    gpu_speedup_decode: float = Field(1.5, ge=1.0, le=1000.0, description="Modelled GPU speed factor on decode compute.")
    gpu_speedup_sample: float = Field(2.0, ge=1.0, le=1000.0, description="Modelled GPU speed factor on sample compute.")
    gpu_speedup_motion: float = Field(3.0, ge=1.0, le=1000.0, description="Modelled GPU speed factor on motion compute.")
    gpu_speedup_detect: float = Field(4.0, ge=1.0, le=1000.0, description="Modelled GPU speed factor on detect compute.")
    gpu_speedup_classify: float = Field(10.0, ge=1.0, le=1000.0, description="Modelled GPU speed factor on classify compute.")
    cpu_price_per_s: float = Field(3.33e-5, gt=0.0, le=1.0, description="CPU worker price, USD per busy second (AWS "
                                                                        "Lambda x86 at 2 GB: 2 x $0.0000166667/GB-s).")
    gpu_price_per_s: float = Field(1.64e-4, gt=0.0, le=1.0, description="GPU worker price, USD per busy second (a "
                                                                        "T4-class serverless GPU at ~$0.59/h).")
    # profiling
    profile_reps: int = Field(3, ge=1, le=50, description="Timed calls per (op, tier, batch size) in the profile (median).")
    cold_probes: int = Field(2, ge=1, le=10, description="Cold starts timed per tier in the profile.")

    @field_validator("batch_sizes")
    @classmethod
    def _batches(cls, v: list[int]) -> list[int]:
        if any(b < 1 or b > 256 for b in v) or sorted(set(v)) != list(v):
            raise ValueError("batch sizes must be distinct, ascending, between 1 and 256")
        return v

    @field_validator("slo_sweep")
    @classmethod
    def _slo_sweep(cls, v: list[float]) -> list[float]:
        if any(not 0 <= x <= 10 for x in v) or len(set(v)) != len(v):
            raise ValueError("slo_sweep fractions must be distinct, each in [0, 10]")
        return sorted(v)

    @field_validator("regime_duration_scale")
    @classmethod
    def _scales(cls, v: list[float]) -> list[float]:
        if any(not 0 < x <= 1000 for x in v) or len(set(v)) != len(v):
            raise ValueError("duration scales must be distinct, each in (0, 1000]")
        return sorted(v)

    @model_validator(mode="after")
    def _consistent(self):
        if self.frame_size % 32:
            raise ValueError(f"frame_size ({self.frame_size}) must be a multiple of 32")
        if self.prewarm > self.max_instances:
            raise ValueError(f"prewarm ({self.prewarm}) must not exceed max_instances ({self.max_instances})")
        if self.frames < 2 * self.sample_rate:
            raise ValueError("frames must hold at least two sampled frames (frames >= 2 x sample_rate)")
        return self

    def gpu_speedup(self) -> dict[str, float]:
        return {"decode": self.gpu_speedup_decode, "sample": self.gpu_speedup_sample, "motion": self.gpu_speedup_motion,
                "detect": self.gpu_speedup_detect, "classify": self.gpu_speedup_classify, "aggregate": 1.0}

    def prices(self) -> dict[str, float]:
        return {"cpu": self.cpu_price_per_s, "gpu": self.gpu_price_per_s}

    def op_args(self) -> dict:
        return {"size": self.frame_size, "sample_rate": self.sample_rate, "motion_threshold": self.motion_threshold}


SPEC = SystemSpec(
    name="llama", title="Llama: latency-targeted serverless video pipelines", paper="arXiv:2102.01887",
    family="serverless-edge-fl", params=Params, baselines=("best_static", "all_gpu", "all_cpu", "static_oracle"),
    # all three static plans are chosen on the calibration videos only; all_cpu, the simplest cheap plan, stands
    # even where the rule passed it over, so a static plan that does as well as Llama on the evaluated videos is seen
    roles={"best_static": ("deployable",), "all_gpu": ("deployable",), "all_cpu": ("deployable",),
           "static_oracle": ("oracle",)},
    # latency and cost are modelled from measured invocation times (the GPU tier is a tagged CPU process)
    kinds={"cost": "modelled", "mean_latency_s": "modelled", "p95_latency_s": "modelled", "slo_attainment": "modelled",
           "gpu_busy_share": "modelled", "predicted_cost": "modelled", "predicted_slo_attainment": "modelled",
           "slo_s": "modelled", "invocations": "counted", "cold_starts": "counted", "cold_start_s": "measured",
           "execution_wall_s": "measured", "objects_classified": "counted", "frames_with_motion": "counted",
           "answers_match": "counted", "profile_cold_start_s": "measured", "videos_evaluated": "counted"},
    # cost counts at Llama's own attainment (issue 47): a plan cheaper by missing more deadlines than the tolerance
    # (all-CPU on a binding SLO) is not the strongest deployable baseline; the harness judges medians and pairs
    constraint=Constraint(
        "slo_attainment", "higher", tolerance_param="attainment_tolerance",
        statement="SLO attainment (share of the evaluated videos within the SLO): a deployable plan counts as the "
                  "strongest on cost unless its median and most repeats fall short of Llama's less "
                  "attainment_tolerance; "
                  "the verdict counts the repeats where both are within the tolerance of each other (and Llama's "
                  "losses where it fell short); Llama's own attainment at least that plan's less the tolerance"),
    mechanism=Mechanism(
        "dynamic per-invocation configuration", "llama_once",
        "llama_once keeps Llama's profile, latency targets and cost-based choice of tier and batch size, but fixes "
        "each operation's configuration at its first invocation and keeps it (scaling out like a static plan): no "
        "re-planning as invocations finish, no per-invocation change with the queue, the clock or warm instances."),
    regime=Regime(
        "duration_scale", "x profiled operator latency", None, "",
        "Operator duration relative to the cold start: every operation's profiled latency is multiplied by the "
        "factor while cold starts stay as measured (the SLO is re-derived from the scaled warm latencies). With "
        "millisecond operators a cold start dominates the latency of every video that meets one and no "
        "configuration choice can move it; with operators lasting a sizeable share of the SLO, choosing tier and "
        "batch size per invocation against the remaining budget can matter. The paper's DNN operators last far "
        "longer than the ones here; it states no single ratio."),
    claims=(
        Claim("cost", "best_static", "llama", "lower", 17.2,
              "7.9x lower latency and 17.2x lower cost (paper: against cluster and serverless video systems; "
              "here: against the cheapest static plan, all-CPU ones included, predicted to meet the SLO for at "
              "least Llama's own predicted share of separate calibration videos (no tolerance subtracted), so that no "
              "static plan is as cheap and at least as good there, run on the evaluated videos; a repeat's cost ratio "
              "counts only where the baseline reaches Llama's attainment within the tolerance (or met more videos "
              "and costs less): the run's notes judge every pair and give the verdict at equal attainment)",
              headline=True),
        Claim("cost", "all_gpu", "llama", "lower", statement="cost against running every operation on GPU workers "
                                                             "with the fastest uniform batch size (chosen on the "
                                                             "calibration videos); read with the attainment note"),
        Claim("slo_attainment", "best_static", "llama", "higher",
              statement="share of the evaluated videos within the SLO (steps of 1 / videos), against the deployable "
                        "static plan: 1 means the cost ratio is at equal attainment"),
        Claim("slo_attainment", "static_oracle", "llama", "higher",
              statement="share of videos within the SLO, against the cheapest static plan reaching Llama's "
                        "attainment on the evaluated videos (hindsight; at most 1.0 where its repeats reach Llama's)"),
        Claim("mean_latency_s", "all_cpu", "llama", "lower", 7.9,
              "7.9x lower latency (paper: against other systems' user-chosen configurations; here: against the "
              "cheapest all-CPU plan). Latency below the SLO is asked for by no one: Llama plans to meet the "
              "SLO at least cost, so a lower mean latency is bought with the cost in the cost row against all_cpu, "
              "not a second win"),
        Claim("cost", "all_cpu", "llama", "lower",
              statement="cost against the cheapest all-CPU plan (chosen on the calibration videos without regard "
                        "to the SLO; deployable: read with its attainment note)"),
    ),
)

__all__ = ["Params", "SPEC", "VARIANTS"]
