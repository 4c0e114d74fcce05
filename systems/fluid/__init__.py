"""FLuID (NeurIPS 2023): Invariant Dropout for stragglers in federated learning, vs FedAvg waiting
for every client, FedAvg dropping its slowest clients (drop fraction tuned on calibration seeds),
random dropout and ordered dropout, on non-IID load_digits clients whose speeds change between rounds;
stragglers are re-detected from the previous round's observations. The straggler-slowdown regime re-runs
the federation at each slowdown."""
from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from pydantic import Field, field_validator, model_validator

from mlsys_flows.systems.common.lazy import lazy_exports
from mlsys_flows.systems.common.params import SystemParams
from mlsys_flows.systems.common.spec import Claim, Mechanism, Regime, SystemSpec

if TYPE_CHECKING:
    from .federation import Config, Plan, Workload

# the federation and its dropout (numpy) load on first use, not with the spec
lazy_exports(__name__, {
    ".dropout": ("UpdateError",),
    ".federation": ("POLICIES", "Config", "History", "Plan", "Workload", "drop_count", "fastest_valid",
                    "final_accuracy", "full_model_estimate", "make_workload", "observed_s", "plan_from_estimates", "plan_stragglers", "redetects",
                    "rescale_stragglers", "round_times", "run_federation", "SMOOTH", "crossed", "smoothed", "slow_stragglers", "speed_trajectory",
                    "time_to_target", "tune_drop_fraction", "with_trajectory"),
})

CALIBRATION_SEED_OFFSET = 1000  # calibration seeds: seed + 1000 + i, never one of the evaluated seeds seed + i
# the policies at every regime point: FLuID and its deployable baselines. All but fedavg_wait are re-run at
# each slowdown other than the headline's; fedavg_wait's training does not depend on the speeds (every client
# trains the full model, nothing is chosen from them), so its headline run is re-timed there: exactly the
# run it would repeat (tests/unit/test_fluid_drop.py checks that)
REGIME_POLICIES = ("fedavg_wait", "fedavg_drop", "random_dropout", "ordered_dropout", "fluid")
REGIME_RERUN = tuple(pol for pol in REGIME_POLICIES if pol != "fedavg_wait")


class Params(SystemParams):
    SYSTEM: ClassVar[str] = "fluid"
    PRESETS: ClassVar[dict] = {
        "smoke": dict(clients=8, hidden=64, rounds=6, local_epochs=1, faulty_clients=3,
                      regime_straggler_slowdown=[1.5, 3.0], busy_prob=0.25, busy_slowdown=3.0, busy_rounds=3,
                      calibration_seeds=1, drop_fractions=[0.25]),  # one re-run point, one fraction: seconds
        # 6 pairs can decide; the regime re-runs the federation at 1 and 3 (1.5: the headline's runs)
        "quick": dict(clients=16, hidden=256, rounds=25, local_epochs=2, repeats=6,
                      regime_straggler_slowdown=[1.0, 1.5, 3.0]),
        "full": dict(clients=20, hidden=512, rounds=100, local_epochs=2, repeats=6),
    }

    # workload
    clients: int = Field(16, ge=3, le=100, description="Federated clients (each round, each trains locally as one Dask task).")
    dirichlet_alpha: float = Field(0.5, ge=0.01, le=100.0, description="Dirichlet concentration of each label over the clients (smaller: more non-IID).")
    test_fraction: float = Field(0.25, ge=0.05, le=0.5, description="Share of load_digits held out as the global test set (stratified).")
    speed_min: float = Field(1.0, ge=1.0, le=20.0, description="Slowest-to-fastest speed factor range: each client's factor is uniform in [speed_min, speed_max] (1 = reference device).")
    speed_max: float = Field(2.5, ge=1.0, le=20.0, description="Upper end of the client speed factors (a factor of 2.5 trains 2.5x slower).")
    straggler_slowdown: float = Field(1.5, ge=1.0, le=20.0, description="The slowest straggler_fraction of the clients (by profiled compute) are made this many times slower on top of their speed factor: the gap that sub-models must close (it sizes their r: about 0.55-0.75 at 1.5).")
    busy_prob: float = Field(0.05, ge=0.0, le=1.0, description="Changing speeds: per round, the chance that a client that is not busy becomes busy (a device running something else); 0 keeps every speed factor fixed for the whole run.")
    busy_slowdown: float = Field(2.0, ge=1.0, le=20.0, description="Changing speeds: a busy client trains this many times slower than its own speed factor (2: its processor shared with one other app).")
    busy_rounds: int = Field(4, ge=1, le=1000, description="Changing speeds: how many rounds a busy spell lasts (the round it starts in included).")
    redetect_every: int = Field(1, ge=1, le=1000, description="FLuID's dynamic adaptation: the stragglers and their sub-model sizes are re-detected from the server's latest observation of every client (its last round's training time) before round 1 and then every this many rounds (1: every round). Every policy but fluid_static (fixed once from the initial profile) re-detects.")
    regime_straggler_slowdown: list[float] = Field([1.0, 1.25, 1.5, 2.0, 3.0, 4.0], min_length=2, max_length=16,
                                                   description="Regime: straggler slowdowns at which the federation is re-run (FLuID and every deployable baseline, the same seeds, splits and busy spells, the slowed clients this many times slower; stragglers re-detected and sub-models re-sized every round at that slowdown; each run stops at the round where its running mean accuracy over 3 rounds reaches the seed's target; FedAvg-wait, whose training does not depend on the speeds, is its headline run re-timed). At straggler_slowdown the headline's runs are used.")
    # model and local training
    hidden: int = Field(256, ge=8, le=2048, description="Neurons of each of the MLP's two hidden layers.")
    rounds: int = Field(20, ge=2, le=1000, description="Federated rounds per policy.")
    local_epochs: int = Field(2, ge=1, le=50, description="Local epochs of SGD per client per round.")
    batch_size: int = Field(16, ge=1, le=1024, description="Local minibatch size.")
    lr: float = Field(0.05, gt=0.0, le=10.0, description="Local SGD learning rate.")
    # FLuID
    straggler_fraction: float = Field(0.2, ge=0.0, le=0.5, description="Share of clients, slowest first by estimated full-model round compute (the initial profile, then re-detected every redetect_every rounds), treated as stragglers.")
    min_submodel: float = Field(0.5, ge=0.1, le=1.0, description="Smallest sub-model size r a straggler may train (share of each hidden layer kept).")
    theta_init: float = Field(1e-4, gt=0.0, le=10.0, description="Invariant Dropout: first threshold on a neuron's relative update magnitude; raised until enough neurons are invariant.")
    theta_growth: float = Field(1.25, gt=1.0, le=10.0, description="Invariant Dropout: factor by which the threshold is raised per search step.")
    # simulated clock
    ref_gflops: float = Field(10.0, gt=0.0, le=1e6, description="Reference device FLOP rate (GFLOP/s) of the modelled clock (counted FLOPs x speed factor / this): the straggler profile and re-detection (it orders the clients and sizes the sub-models; the order does not depend on it) and fedavg_drop's arrival order within a round (modelled compute + communication, so the order can move with it). The evaluation clock (round_s: measured CPU x speed factor + communication) and fedavg_drop's calibration do not use it.")
    comm_latency_s: float = Field(0.005, ge=0.0, le=60.0, description="Simulated clock: per-round network latency of a client (download + upload).")
    bandwidth_mb_s: float = Field(100.0, gt=0.0, le=1e5, description="Simulated clock: client link bandwidth in MB/s (model down, update up).")
    target_fraction: float = Field(0.98, ge=0.5, le=1.0, description="Target test accuracy = this share of FedAvg-wait's final accuracy (mean of the last 3 rounds); a policy's time to it is read from its running mean accuracy over 3 rounds (the same window), interpolated in time within the crossing round.")
    # FedAvg that drops its stragglers
    drop_fractions: list[float] = Field([0.1, 0.2, 0.3], min_length=1, max_length=8, description="fedavg_drop: the drop fractions tried on the calibration seeds (share of the clients, slowest first by that round's finish time, whose updates a round does not wait for); the one with the lowest median time to the target there (on the evaluation clock round_s, the smoothed crossing rule of time_to_accuracy_s) is run on the evaluated seeds.")
    calibration_seeds: int = Field(3, ge=1, le=10, description="fedavg_drop: calibration seeds (seed + 1000 + i: their own split, speeds and init, never an evaluated seed) on which its drop fraction is tuned.")
    # fault injection
    faulty_clients: int = Field(0, ge=0, le=99, description="Clients 0..k-1 misbehave in round 1 (in turn: NaN update, raised error, wrong shapes) and must be excluded from it.")
    compare_workers: bool = Field(True, description="Also time FedAvg rounds with the clients fanned out on 1 worker vs every worker (measured).")

    @field_validator("regime_straggler_slowdown")
    @classmethod
    def _slowdowns(cls, v):
        if any(not 1.0 <= x <= 20.0 for x in v) or len(set(v)) != len(v):
            raise ValueError("slowdowns must be distinct, each from 1 to 20")
        return sorted(v)

    @field_validator("drop_fractions")
    @classmethod
    def _fractions(cls, v):
        if any(not 0.0 < x <= 0.5 for x in v) or len(set(v)) != len(v):
            raise ValueError("drop fractions must be distinct, each above 0 and at most 0.5")
        return sorted(v)

    @model_validator(mode="after")
    def _consistent(self):
        if self.speed_min > self.speed_max:
            raise ValueError(f"speed_min ({self.speed_min}) exceeds speed_max ({self.speed_max})")
        if self.faulty_clients >= self.clients:
            raise ValueError(f"faulty_clients ({self.faulty_clients}) must leave at least one healthy client of {self.clients}")
        return self

    def config(self, seed: int, drop_fraction: float | None = None) -> Config:
        """The federation's config; ``drop_fraction``: fedavg_drop's (tuned; the grid's first if None)."""
        from .federation import Config

        return Config(drop_fraction=self.drop_fractions[0] if drop_fraction is None else drop_fraction,hidden=self.hidden, rounds=self.rounds, epochs=self.local_epochs, batch=self.batch_size,
                      lr=self.lr, theta_init=self.theta_init, theta_growth=self.theta_growth,
                      comm_latency_s=self.comm_latency_s, bandwidth_mb_s=self.bandwidth_mb_s,
                      faulty_clients=self.faulty_clients, seed=seed, straggler_fraction=self.straggler_fraction,
                      min_r=self.min_submodel, ref_gflops=self.ref_gflops, redetect_every=self.redetect_every)

    def workload(self, seed: int) -> Workload:
        from .federation import make_workload, slow_stragglers, speed_trajectory, with_trajectory

        w = make_workload(self.clients, self.dirichlet_alpha, self.test_fraction, self.speed_min, self.speed_max, seed)
        w = slow_stragglers(w, self.hidden, self.local_epochs, self.straggler_fraction, self.straggler_slowdown,
                            self.ref_gflops)
        return with_trajectory(w, speed_trajectory(w.speed, self.rounds, self.busy_prob, self.busy_slowdown,
                                                   self.busy_rounds, seed))

    def calibration_seed_list(self) -> list[int]:
        """The seeds fedavg_drop's drop fraction is tuned on: disjoint from the evaluated seed + i."""
        return [self.seed + CALIBRATION_SEED_OFFSET + i for i in range(self.calibration_seeds)]

    def at_slowdown(self, slowdown: float) -> "Params":
        """These parameters with the stragglers ``slowdown`` times slower: a regime point's federation."""
        return self.model_copy(update={"straggler_slowdown": float(slowdown)})

    def plan(self, w: Workload) -> Plan:
        from .federation import plan_stragglers

        return plan_stragglers(w, self.hidden, self.local_epochs, self.straggler_fraction, self.min_submodel,
                               self.ref_gflops)


SIMULATED = ("time_to_accuracy_s", "mean_round_s", "time_to_accuracy_raw_s")   # on the round model's clock
COUNTED = ("final_accuracy", "accuracy_gap_pts", "rounds_to_target", "reached_target", "excluded_updates",
           "straggler_kept_fraction", "straggler_changes", "rounds_off_profile", "dropped_updates")

SPEC = SystemSpec(
    name="fluid", title="FLuID: invariant-dropout straggler mitigation in FL", paper="FLuID (NeurIPS 2023)",
    family="serverless-edge-fl", params=Params,
    baselines=("fedavg_wait", "fedavg_drop", "random_dropout", "ordered_dropout"),
    # fedavg_drop: FedAvg that does not wait for its slowest clients (a deadline, or over-selection and the
    # first updates to arrive), as practitioners deploy it; its drop fraction is tuned on calibration seeds
    roles={"fedavg_wait": ("paper", "deployable"), "fedavg_drop": ("deployable",),
           "random_dropout": ("paper", "deployable"), "ordered_dropout": ("paper", "deployable")},
    # client_cpu_s: the clients' local training CPU time; round_wall_s: the Dask fan-out's wall clock
    kinds=dict.fromkeys(SIMULATED, "simulated") | dict.fromkeys(COUNTED, "counted")
    | {"client_cpu_s": "measured", "round_wall_s": "measured"},
    # fluid_static (FLuID with the stragglers and sizes fixed once from the initial profile) is the
    # re-detection's ablation, reported by its own claims; not a baseline (nobody would pick it over FLuID)
    mechanism=Mechanism(
        "invariant neuron selection (stragglers drop the neurons whose updates stay below theta on the non-stragglers)",
        "random_dropout",
        "random dropout is FLuID with only the choice of neurons replaced by chance: the same stragglers, the same "
        "sub-model sizes r (re-detected every round from the same observations), the same re-expansion and "
        "aggregation; ordered dropout (FjORD) is a second such ablation"),
    regime=Regime(
        "straggler_slowdown", "x (stragglers' extra slowdown)", None, "",
        "how much slower the stragglers are than the rest: the round time that a sub-model can save, against "
        "the accuracy a sub-model costs; near 1 there is nothing to save and dropping neurons only costs accuracy. "
        "Each point re-runs the federation at that slowdown, so the stragglers are re-detected and their "
        "sub-models re-sized to it every round"),
    claims=(
        Claim("time_to_accuracy_s", "fedavg_wait", "fluid", "lower", None,
              "lower round time at baseline accuracy vs FedAvg-wait, random and ordered dropout", headline=True),
        Claim("time_to_accuracy_s", "fedavg_drop", "fluid", "lower",
              statement="time to the target accuracy against FedAvg that drops its slowest clients' updates each "
                        "round (drop fraction tuned on calibration seeds)"),
        Claim("time_to_accuracy_s", "random_dropout", "fluid", "lower",
              statement="time to the target accuracy against random (federated) dropout of the stragglers"),
        Claim("time_to_accuracy_s", "ordered_dropout", "fluid", "lower",
              statement="time to the target accuracy against ordered dropout (FjORD) of the stragglers"),
        Claim("mean_round_s", "fedavg_wait", "fluid", "lower",
              statement="mean round time: the stragglers' sub-models shorten the wait for the slowest client"),
        Claim("final_accuracy", "fedavg_wait", "fluid", "higher",
              statement="Invariant Dropout keeps the baseline's model quality (ratio near 1)"),
        Claim("final_accuracy", "fedavg_drop", "fluid", "higher",
              statement="final accuracy against FedAvg that drops its slowest clients (their data is left out of "
                        "the rounds they are dropped from)"),
        Claim("final_accuracy", "random_dropout", "fluid", "higher",
              statement="final accuracy against random dropout"),
        Claim("final_accuracy", "ordered_dropout", "fluid", "higher",
              statement="final accuracy against ordered dropout"),
        Claim("time_to_accuracy_s", "fluid_static", "fluid", "lower",
              statement="re-detection vs fixed stragglers: time to the target accuracy against FLuID with its "
                        "stragglers and sub-model sizes fixed once from the initial profile, as client speeds change"),
        Claim("mean_round_s", "fluid_static", "fluid", "lower",
              statement="re-detection vs fixed stragglers: mean round time (a client that became slow is given a "
                        "sub-model from the next round on)"),
        Claim("final_accuracy", "fluid_static", "fluid", "higher",
              statement="re-detection vs fixed stragglers: final accuracy (re-detection moves sub-models between "
                        "clients)"),
    ),
)

__all__ = ["Params", "SPEC", "POLICIES", "REGIME_POLICIES", "REGIME_RERUN", "CALIBRATION_SEED_OFFSET", "Config", "History", "Plan",
           "Workload", "UpdateError", "drop_count", "fastest_valid", "tune_drop_fraction", "final_accuracy",
           "full_model_estimate", "make_workload", "observed_s", "plan_from_estimates", "plan_stragglers", "redetects",
           "rescale_stragglers", "round_times", "run_federation", "SMOOTH", "crossed", "smoothed", "slow_stragglers", "speed_trajectory",
           "time_to_target", "with_trajectory"]
