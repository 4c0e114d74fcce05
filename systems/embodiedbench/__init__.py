"""EmbodiedBench (arXiv 2502.09560): success of language agents on high-level (household) and
low-level (grid navigation + manipulation) embodied tasks in six capability subsets, with and
without environment feedback. The environments and agents are the shared family package
systems/embodied; this system runs the benchmark protocol over fixed seeded test sets (one per seed)
and counts. Feedback is compared at an equal round budget (the same agent replanning from the new
observation alone), so retries are not credited to feedback; the round budget is the regime."""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from mlsys_flows.systems.common.lazy import lazy_exports
from mlsys_flows.systems.common.params import FieldValueError, SystemParams
from mlsys_flows.systems.common.llm_params import LLMEndpointParams
from mlsys_flows.systems.common.spec import Claim, Mechanism, Regime, SystemSpec

# the protocol, with the family's environments and agents (numpy), loads on first use, not with the spec
lazy_exports(__name__, {
    ".protocol": ("LEVELS", "SUBSETS", "agent_kinds", "eval_seeds", "tasks_for", "run_chunk", "summarize", "per_seed",
                  "sweep_rounds", "reason_counts", "reason_kind", "success_by_round", "success_within"),
})

PROTOCOLS = ("no_feedback", "with_feedback", "replan_no_feedback")
# The variants compared on the headline metric (the expert is an upper bound, not a baseline).
COMPARED = ("with_feedback", "replan_no_feedback", "no_feedback")


class Params(LLMEndpointParams, SystemParams):
    SYSTEM: ClassVar[str] = "embodiedbench"
    PRESETS: ClassVar[dict] = {
        "smoke": dict(per_subset=2, seeds=2, chunks=1, regime_rounds=[2, 10]),
        "quick": dict(per_subset=60, seeds=6, chunks=1),  # 6 test sets: 6 pairs can decide
        "full": dict(per_subset=500, seeds=5, chunks=4),
    }

    per_subset: int = Field(60, ge=1, le=5000, description="Tasks per capability subset per level in each seed's fixed test set (6 subsets x 2 levels).")
    seeds: int = Field(3, ge=1, le=20, description="Test sets, generated from seed, seed+1, ...: each variant's success rate is one sample per test set (the report's value is their median, the range is over them).")
    max_rounds: int = Field(10, ge=1, le=50, description="Plans an agent may make per episode in the closed loop, with feedback (with_feedback) or from observations only (replan_no_feedback); no_feedback plans once.")
    regime_rounds: list[int] = Field([1, 2, 3, 5, 10], min_length=2, max_length=16,
                                     description="Round budgets of the regime sweep (each at most max_rounds): success within r plans, "
                                                 "read off the same episodes (the agents do not know the budget, so an episode at "
                                                 "budget r is the first r plans of the one at max_rounds).")
    chunks: int = Field(1, ge=1, le=64, description="Dask tasks per level and seed; each runs every variant on a contiguous slice of that test set.")
    agent: Literal["scripted", "llm"] = Field("scripted", description="scripted: the offline keyword planner (open loop without feedback, its replanning variant with feedback); llm: the chat model at llm_base_url in both protocols.")
    expert: bool = Field(True, description="Also run the scripted expert that reads the full state (an upper bound showing every task is solvable in its step budget).")
    llm_max_tokens: int = Field(256, ge=16, le=8192, description="Completion tokens per LLM plan.")

    @model_validator(mode="after")
    def _llm_needs_url(self):
        if self.agent == "llm" and not self.llm_base_url:
            raise FieldValueError("llm_base_url", "agent=llm needs llm_base_url (an OpenAI-compatible endpoint)")
        if any(r < 1 or r > self.max_rounds for r in self.regime_rounds) or len(set(self.regime_rounds)) != len(self.regime_rounds):
            raise FieldValueError("regime_rounds", f"round budgets must be distinct, each from 1 to max_rounds ({self.max_rounds})")
        return self

# Every metric is counted on the episodes, whichever agent plays them (the scripted planner or an LLM:
# its replies are what they are, nothing is timed). The six capability subsets are those of
# systems/embodied/core.SUBSETS, written out here so the spec loads without numpy (a test checks them).
SUBSET_METRICS = tuple(f"success_{s}" for s in ("base", "common_sense", "complex_instruction", "spatial",
                                                 "visual_appearance", "long_horizon"))
KINDS = dict.fromkeys(("success_rate", "episodes", "invalid_plans", "invalid_plan_episodes",
                       "invalid_actions_per_episode", "steps_per_episode", "plans_per_episode", *SUBSET_METRICS),
                      "counted")


SPEC = SystemSpec(
    name="embodiedbench", title="EmbodiedBench: embodied agent benchmark", paper="arXiv:2502.09560", family="embodied",
    params=Params, baselines=("replan_no_feedback", "no_feedback"),
    kinds=KINDS,
    roles={"replan_no_feedback": ("deployable",), "no_feedback": ("deployable",)},
    mechanism=Mechanism(
        "environment feedback", "replan_no_feedback",
        "the same planner with the same round budget, replanning from the new observation alone: it keeps the "
        "retries and the re-read world (opened containers, seen obstacles) and loses only the feedback text, so "
        "it cannot tell a plan cut short by an invalid action from a wrong reading of the instruction"),
    regime=Regime(
        "max_rounds", unit="plans per episode", paper_value=None,
        paper_source="the paper caps episodes in environment steps and states no plan budget",
        statement="feedback can only act between plans: with one plan the protocols coincide, and each further "
                  "plan is where feedback tells the agent what went wrong; success within r plans, counted on the "
                  "same episodes"),
    claims=(
        Claim("success_rate", "replan_no_feedback", "with_feedback", "higher", None,
              "best model averages 28.9%; high-level tasks easier than low-level manipulation (the paper's agents "
              "replan from environment feedback; here: with vs without it, at the same budget of plans)", headline=True),
        Claim("success_rate", "no_feedback", "with_feedback", "higher", None,
              "feedback and retries together: the closed loop vs one plan"),
        Claim("success_rate", "replan_no_feedback_high", "with_feedback_high", "higher", None,
              "feedback on the high-level (household) tasks, same plan budget"),
        Claim("success_rate", "replan_no_feedback_low", "with_feedback_low", "higher", None,
              "feedback on the low-level (navigation + manipulation) tasks, same plan budget"),
        Claim("success_rate", "with_feedback_low", "with_feedback_high", "higher", None,
              "high-level tasks are easier than low-level ones (with feedback; ratio > 1: high level ahead)"),
        Claim("success_rate", "no_feedback_low", "no_feedback_high", "higher", None,
              "high-level tasks are easier than low-level ones (without feedback)"),
    ),
)

__all__ = ["Params", "SPEC", "LEVELS", "SUBSETS", "PROTOCOLS", "COMPARED", "agent_kinds", "eval_seeds", "tasks_for",
           "run_chunk", "summarize", "per_seed", "sweep_rounds", "reason_counts", "reason_kind", "success_by_round",
           "success_within"]
