"""ERA (Embodied Reasoning Agent): embodied prior learning, then online RL with turn-level PPO and
shaped rewards, on the EmbodiedBench-style environments of systems/embodied.

The torch code lives in ``run``, ``prior``, ``ppo``, ``policy`` and ``episodes`` and is imported lazily
(``run_cell`` below), so listing the catalogue does not import torch.
"""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from mlsys_flows.systems.common.params import FieldValueError, SystemParams
from mlsys_flows.systems.common.spec import Claim, Component, Mechanism, Regime, SystemSpec

VARIANTS = ("rl_scratch", "prior_only", "prior_rl")
LEVEL_NAMES = ("high", "low")


class Params(SystemParams):
    SYSTEM: ClassVar[str] = "era"
    PRESETS: ClassVar[dict] = {
        "smoke": dict(seeds=1, train_per_subset=2, test_per_subset=1, prior_epochs=4, rl_env_steps=128,
                      rollout_steps=64, minibatch=64, n_envs=8, hidden=32, critic_warmup_updates=1,
                      regime_rl_share=[0.0, 1.0], lr_grid_scratch=[1e-3, 3e-3], lr_grid_prior_rl=[1e-4, 3e-4]),
        "quick": dict(seeds=6, train_per_subset=50, test_per_subset=5, prior_epochs=15, rl_env_steps=16_384,
                      rollout_steps=1024, minibatch=256, n_envs=32, hidden=64,
                      regime_rl_share=[0.0, 0.125, 0.25, 0.5, 1.0]),
        "full": dict(seeds=8, train_per_subset=400, test_per_subset=25, prior_epochs=30, rl_env_steps=100_000,
                     rollout_steps=2048, minibatch=256, n_envs=64, hidden=128, calibration_seeds=2,
                     regime_rl_share=[0.0, 0.0625, 0.125, 0.25, 0.5, 1.0]),
    }

    # workload
    seeds: int = Field(6, ge=1, le=20, description="Training seeds per level (network init and RL sampling); "
                                                   "the test set is the same for every seed.")
    train_per_subset: int = Field(50, ge=1, le=1000, description="Training tasks per capability subset and level: "
                                  "scripted-expert demonstrations for the prior and the RL stage's episodes.")
    test_per_subset: int = Field(5, ge=1, le=1000, description="Held-out test tasks per capability subset and level "
                                 "(the fixed seeded test set; disjoint from the training tasks).")
    # policy
    architecture: Literal["structured", "mlp"] = Field("structured", description="Policy network: structured "
                                                       "(slot tokens with attention at the high level, an egocentric "
                                                       "grid CNN at the low level) or mlp (flat observation vector).")
    hidden: int = Field(64, ge=8, le=2048, description="Width of the policy's two hidden layers.")
    # stage 1: embodied prior learning
    prior_epochs: int = Field(15, ge=1, le=1000, description="Epochs of behaviour cloning + grounding over the "
                              "expert trajectories.")
    prior_lr: float = Field(3e-3, gt=0.0, le=1.0, description="Adam learning rate of prior learning.")
    prior_batch: int = Field(128, ge=8, le=65_536, description="Minibatch of prior learning (transitions).")
    grounding_weight: float = Field(0.5, ge=0.0, le=100.0, description="Weight of the auxiliary grounding loss "
                                    "(next-observation change given the action, remaining steps to the goal); "
                                    "0 is plain behaviour cloning.")
    # stage 2: online RL (PPO)
    rl_env_steps: int = Field(4096, ge=16, le=10_000_000, description="Environment steps of the RL stage, the same "
                              "for rl_scratch and prior_rl (the prior stage's demonstration steps are counted apart).")
    n_envs: int = Field(16, ge=1, le=1024, description="Environments stepped side by side in RL rollouts.")
    rollout_steps: int = Field(512, ge=8, le=1_000_000, description="Environment steps (turns) per PPO update.")
    ppo_epochs: int = Field(4, ge=1, le=100, description="PPO epochs over each rollout.")
    minibatch: int = Field(128, ge=8, le=1_000_000, description="PPO minibatch (turns).")
    clip: float = Field(0.2, gt=0.0, le=1.0, description="PPO clip range of the importance ratio.")
    gamma: float = Field(0.97, gt=0.0, le=1.0, description="Discount per turn.")
    gae_lambda: float = Field(0.95, ge=0.0, le=1.0, description="GAE lambda over turns.")
    entropy_scratch: float = Field(0.01, ge=0.0, le=1.0, description="Entropy bonus weight of PPO from scratch.")
    entropy_prior_rl: float = Field(0.001, ge=0.0, le=1.0, description="Entropy bonus weight of PPO from the prior.")
    critic_warmup_updates: int = Field(2, ge=0, le=10_000, description="PPO from the prior: first updates that train "
                                       "only the value head (their environment steps count in the budget).")
    value_coef: float = Field(0.5, ge=0.0, le=10.0, description="Value loss weight.")
    lr_scratch: float = Field(1e-3, gt=0.0, le=1.0, description="Adam learning rate of PPO from scratch when "
                              "lr_grid_scratch is empty (else the calibration chooses it per level).")
    lr_prior_rl: float = Field(1e-4, gt=0.0, le=1.0, description="Adam learning rate of PPO from the prior when "
                               "lr_grid_prior_rl is empty (else the calibration chooses it per level).")
    # the learning-rate calibration (on tasks of another generator seed, never the evaluated test set)
    lr_grid_scratch: list[float] = Field([3e-4, 1e-3, 3e-3], max_length=8, description="Learning rates of PPO "
                                         "from scratch tried on the calibration tasks; the one with the best "
                                         "held-out calibration success is used, per level (empty: lr_scratch).")
    lr_grid_prior_rl: list[float] = Field([3e-5, 1e-4, 3e-4, 1e-3], max_length=8, description="Learning rates of PPO "
                                          "from the prior tried on the calibration tasks, chosen the same way "
                                          "(empty: lr_prior_rl).")
    calibration_seeds: int = Field(1, ge=1, le=10, description="Training seeds per learning rate and level in "
                                   "the calibration.")
    calibration_offset: int = Field(1000, ge=1, le=1_000_000, description="The calibration's task generator seed "
                                    "is seed + calibration_offset: its training and held-out tasks are not the "
                                    "evaluated run's (overlaps with the evaluated test set are counted).")
    # reward shaping
    success_reward: float = Field(1.0, gt=0.0, le=100.0, description="Reward on the turn that completes the task.")
    subgoal_coef: float = Field(0.5, ge=0.0, le=100.0, description="Reward per unit change of the share of goal "
                                "conditions met (subgoal reward).")
    distance_coef: float = Field(0.05, ge=0.0, le=10.0, description="Reward per step the scripted expert's remaining "
                                 "plan shrinks (dense progress toward the goal); 0 turns it off.")
    invalid_penalty: float = Field(0.05, ge=0.0, le=10.0, description="Penalty for an action the environment rejects.")
    # the regime
    regime_rl_share: list[float] = Field([0.0, 0.25, 0.5, 0.75, 1.0], min_length=2, max_length=16,
                                         description="RL budgets of the regime sweep as shares of rl_env_steps (each "
                                                     "rounded down to whole rollouts; 1 is rl_env_steps): the RL runs' "
                                                     "policies evaluated on the test tasks after the update that reaches "
                                                     "each budget (no extra training).")

    @model_validator(mode="after")
    def _consistent(self):
        if self.minibatch > self.rollout_steps:
            raise ValueError(f"minibatch ({self.minibatch}) must not exceed rollout_steps ({self.rollout_steps})")
        if self.n_envs > self.rollout_steps:
            raise ValueError(f"n_envs ({self.n_envs}) must not exceed rollout_steps ({self.rollout_steps})")
        for name in ("lr_grid_scratch", "lr_grid_prior_rl"):
            grid = getattr(self, name)
            if any(not 0.0 < x <= 1.0 for x in grid):
                raise FieldValueError(name, f"learning rates must lie in (0, 1] (got {grid})")
            if len(set(grid)) != len(grid):
                raise FieldValueError(name, f"learning rates must be distinct (got {grid})")
        if any(not 0.0 <= x <= 1.0 for x in self.regime_rl_share):
            raise FieldValueError("regime_rl_share", "shares of the RL budget must lie in [0, 1]")
        if len(self.regime_rl_steps) < 2:
            raise FieldValueError("regime_rl_share", f"needs at least 2 distinct budgets once rounded down to whole "
                                  f"rollouts of {self.rollout_steps} steps (got {self.regime_rl_steps})")
        return self

    @property
    def regime_rl_steps(self) -> list[int]:
        """The regime's RL budgets in environment steps: each share of rl_env_steps rounded down to whole
        rollouts (the budget itself for a share of 1), distinct, ascending."""
        return sorted({self.rl_env_steps if x >= 1.0 else int(x * self.rl_env_steps) // self.rollout_steps * self.rollout_steps
                       for x in self.regime_rl_share})


def run_cell(p: Params, level: str, seed_index: int, variants: tuple[str, ...] = VARIANTS,
             lrs: dict[str, float] | None = None) -> dict:
    """Train and evaluate the variants on one level with one seed (imports torch); ``lrs``: each RL
    variant's calibrated learning rate on this level (``calibrate.choose``)."""
    from .run import run_cell as run

    return run(p, level, seed_index, variants, lrs=lrs)

# Success on the test tasks and the step budgets are counted; only the training wall clock is timed. The
# six capability subsets are systems/embodied/core.SUBSETS, written out so the spec loads without numpy
# (a test checks them).
SUBSET_METRICS = tuple(f"success_{s}" for s in ("base", "common_sense", "complex_instruction", "spatial",
                                                 "visual_appearance", "long_horizon"))
KINDS = dict.fromkeys(("success_rate", "failure_rate", *(f"success_rate_{lvl}" for lvl in LEVEL_NAMES),
                       "success_rate_seed_mean", "success_rate_seed_min", "success_rate_seed_max", *SUBSET_METRICS,
                       "rl_env_steps", "prior_demo_steps", "test_episodes", "test_invalid_actions"),
                      "counted") | {"train_s": "measured"}


SPEC = SystemSpec(
    name="era", title="ERA: embodied prior learning + online RL", paper="ERA (Chen, Zhao, Yang et al., Oct 2025)", family="embodied",
    params=Params, baselines=("prior_only", "rl_scratch"),
    kinds=KINDS,
    roles={"prior_only": ("deployable",), "rl_scratch": ("deployable",)},
    mechanism=Mechanism(
        "the embodied prior (stage 1)", "rl_scratch",
        "the same turn-level PPO with the same RL environment steps, the same shaped reward and the same starting "
        "weights, without prior learning (its learning rate calibrated for it, per level, on calibration tasks); "
        "undecidable in a run where it solves no more test tasks than its starting weights (then so is every claim "
        "against it)"),
    regime=Regime(
        "rl_env_steps", unit="RL environment steps per level and seed", paper_value=None,
        paper_source="the paper trains a 3B model with its own RL budget, not comparable to this policy's steps",
        statement="what online RL adds to the prior grows with the RL budget: at 0 steps prior + RL is the prior; "
                  "the policies of the same RL runs evaluated after each budget"),
    components=(
        Component("prior_rl policy", "learned", "the technique: a small torch network (slot tokens with attention at "
                  "the high level, an egocentric grid CNN at the low level; systems/era/policy.py) trained by "
                  "behaviour cloning + grounding on the scripted expert's trajectories, then turn-level PPO"),
        Component("prior_only policy", "learned", "baseline: the same network after prior learning alone"),
        Component("rl_scratch policy", "learned", "baseline and the mechanism's ablation: the same network trained "
                  "by the same PPO from its initial weights"),
        Component("scripted expert", "scripted", "systems/embodied expert_plan: full-state planner written by the "
                  "project; its plans are the prior's demonstrations and its remaining plan length is the "
                  "distance term of every RL run's shaped reward"),
        Component("environments and task generator", "scripted", "systems/embodied high/low: EmbodiedBench-style "
                  "stand-ins (household slots, 7x7 grid) and their procedurally generated tasks, written by the "
                  "project"),
        Component("turn-level PPO and reward shaping", "scripted", "systems/era/ppo.py and episodes.Shaping: PPO "
                  "with per-turn GAE (checked against a textbook GAE) and the shaped reward, written by the project"),
        Component("learning-rate calibration", "scripted", "systems/era/calibrate.py: the rule that picks each RL "
                  "variant's learning rate per level on calibration tasks"),
        Component("torch", "packaged", "PyTorch: layers, autograd and the Adam optimiser"),
    ),
    claims=(
        Claim("failure_rate", "prior_only", "prior_rl", "lower", None,
              "a 3B model beats GPT-4o by 8.4 (high level) and 19.4 (low level) points of success; here: what online "
              "RL adds to the embodied prior, prior + RL vs the prior alone, share of held-out test tasks failed "
              "(1 - success), mean of both levels", headline=True),
        Claim("failure_rate", "rl_scratch", "prior_rl", "lower", None,
              "prior + RL vs RL from scratch at equal RL environment steps: test tasks failed, mean of both levels "
              "(finite where RL from scratch solves nothing)"),
        Claim("success_rate", "rl_scratch", "prior_rl", "higher", None,
              "test success, mean of both levels (infinite where RL from scratch solves no test task)"),
        Claim("success_rate", "prior_only", "prior_rl", "higher", None, "test success over the prior alone"),
        Claim("success_rate_high", "rl_scratch", "prior_rl", "higher", None, "high level (household planning)"),
        Claim("success_rate_low", "rl_scratch", "prior_rl", "higher", None, "low level (grid manipulation)"),
        Claim("success_rate_high", "prior_only", "prior_rl", "higher", None, "RL over the prior, high level"),
        Claim("success_rate_low", "prior_only", "prior_rl", "higher", None, "RL over the prior, low level"),
    ),
)

__all__ = ["Params", "SPEC", "VARIANTS", "LEVEL_NAMES", "run_cell"]
