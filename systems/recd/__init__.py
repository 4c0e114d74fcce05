"""RecD (arXiv 2211.05239): deduplicated recommendation training data.

Session-clustered storage plus the InverseKeyedJaggedTensor (IKJT), against the baseline of
arrival-order storage and KeyedJaggedTensor (KJT) batches, and against KJT batches of the
clustered file (clustering without the IKJT). Pure: no prefect/dask imports.
"""
from __future__ import annotations

import math
from typing import ClassVar

from pydantic import Field, ValidationInfo, field_validator, model_validator

from mlsys_flows.systems.common.params import SystemParams
from mlsys_flows.systems.common.spec import Claim, Constraint, Mechanism, Regime, SystemSpec


MAX_LIST_LEN = 8192     # limit of user_list_len and item_list_len
MAX_SESSIONS = 5_000_000
# the seeds target_fraction is chosen on (systems/recd/calibrate.py, docs/recd.md); never evaluated
CALIBRATION_SEEDS = (1000, 1001, 1002)


def user_len_range(list_len: int) -> tuple[int, int]:
    """Shortest and longest user list the workload draws for ``user_list_len`` (uniform integers)."""
    return max(1, list_len // 2), list_len + list_len // 2


def mean_user_len(list_len: int) -> float:
    lo, hi = user_len_range(list_len)
    return (lo + hi) / 2


def mix_lengths(user_features: int, user_list_len: int, item_features: int, item_list_len: int,
                share: float) -> tuple[int, int]:
    """(user_list_len, item_list_len) that put ``share`` of a sample's ids in user features while
    keeping its ids per sample; integers, so the share is met to within rounding."""
    total = user_features * mean_user_len(user_list_len) + item_features * item_list_len
    item_len = max(1, round((1.0 - share) * total / item_features))
    want = share * total / user_features  # the mean user-list length wanted
    user_len = min(range(max(1, int(want) - 2), int(want) + 3), key=lambda n: abs(mean_user_len(n) - want))
    return user_len, item_len


class Params(SystemParams):
    SYSTEM: ClassVar[str] = "recd"
    PRESETS: ClassVar[dict] = {
        # every scale's headline workload has ~3/4 of its ids in user features (docs/recd.md: why)
        "smoke": dict(sessions=80, heldout_sessions=12, eval_seeds=2, user_list_len=40, item_features=2, item_list_len=13, table_rows=5_000,
                      embedding_dim=16, batch_size=64, batches_per_row_group=4, chunk_steps=2, sweep_steps=4,
                      mix_sweep=(0.05, 0.75)),
        "quick": dict(),
        "full": dict(sessions=200_000, heldout_sessions=10_000, user_list_len=600, user_features=4, item_features=8, item_list_len=100,
                     table_rows=5_000_000, embedding_dim=128, batch_size=2048, chunk_steps=20, sweep_steps=80),
    }

    sessions: int = Field(800, ge=1, le=MAX_SESSIONS, description="User sessions generated per evaluated seed (each "
                          "yields session_min..session_max samples): one epoch of every trainer's run.")
    eval_seeds: int = Field(6, ge=1, le=64, description="Seeds the headline is evaluated on (seed, seed+1, ...): each "
                            "its own dataset, held-out set, target and training run of the four trainers, paired by "
                            "seed (6 or more: the verdict's minimum of independent pairs). Must not include a "
                            "calibration seed (1000-1002).")
    heldout_sessions: int = Field(200, ge=1, le=MAX_SESSIONS, description="Further sessions drawn from the same generator "
                                  "and seed after the training sessions, never trained on: the held-out set every trainer's "
                                  "logloss is evaluated on (after each turn, outside the timed steps).")
    target_fraction: float = Field(0.023, gt=0.0, lt=1.0, description="The held-out target of the headline: the logloss "
                                   "that closes this fraction of the gap between the base-rate predictor's held-out logloss "
                                   "and the generator's own (its hidden model's probabilities). Declared, chosen on the "
                                   "calibration seeds 1000-1002 (calibrate.py, docs/recd.md) at a margin below the share "
                                   "every trainer's final held-out window closed there, never on an evaluated seed; a "
                                   "trainer that does not reach it is reported as a miss.")
    session_min: int = Field(8, ge=1, le=1024, description="Fewest samples of one session.")
    session_max: int = Field(16, ge=1, le=1024, description="Most samples of one session.")
    user_features: int = Field(2, ge=1, le=16, description="Sparse user features: id lists constant within a session.")
    user_list_len: int = Field(150, ge=1, le=MAX_LIST_LEN, description="Mean length of a user-feature id list (uniform in [L/2, 3L/2]).")
    item_features: int = Field(4, ge=1, le=32, description="Sparse item features: id lists that vary per sample.")
    item_list_len: int = Field(25, ge=1, le=MAX_LIST_LEN, description="Mean length of an item-feature id list (uniform in [1, 2L-1]).")
    dense_features: int = Field(13, ge=1, le=512, description="Dense float features (half per session, half per sample).")
    table_rows: int = Field(200_000, ge=16, le=50_000_000, description="Rows of each embedding table (ids are hashed into them).")
    embedding_dim: int = Field(64, ge=2, le=1024, description="Embedding dimension (also the bottom MLP output).")
    batch_size: int = Field(256, ge=8, le=65_536, description="Samples per training and preprocessing batch.")
    batches_per_row_group: int = Field(16, ge=1, le=4096, description="Parquet row-group size in batches.")
    lr: float = Field(0.005, gt=0, le=10, description="Adagrad learning rate (dense and sparse parameters); chosen on "
                      "the calibration seeds at quick: 0.01 made the held-out curves jump (docs/recd.md).")
    chunk_steps: int = Field(2, ge=1, le=10_000, description="Training steps per turn when the trainers take turns; "
                             "every trainer's held-out logloss is evaluated after each of its turns.")
    train_threads: int = Field(1, ge=1, le=256, description="torch CPU threads per trainer (1 is steadier on a shared CPU).")
    mix_sweep: tuple[float, ...] = Field(
        (0.05, 0.25, 0.75, 0.985), max_length=8,
        description="User-feature shares of all looked-up ids, each in (0, 1), at which the three trainers are "
                    "compared again (ids per sample held at the headline's): the regime sweep, reported over each "
                    "point's counted duplicated share; empty: no sweep.")
    sweep_steps: int = Field(20, ge=1, le=100_000, description="Training steps per trainer at each mix_sweep point: a "
                             "warm-up turn and one turn per repeat.")

    @field_validator("session_max")
    @classmethod
    def _session_range(cls, v: int, info: ValidationInfo) -> int:
        low = info.data.get("session_min")
        if low is not None and v < low:
            raise ValueError(f"must be at least session_min ({low})")
        return v

    @field_validator("mix_sweep")
    @classmethod
    def _shares(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        for share in v:
            if not (math.isfinite(share) and 0.0 < share < 1.0):
                raise ValueError(f"every share must lie strictly between 0 and 1 (got {share})")
        if len(set(v)) != len(v):
            raise ValueError(f"shares must not repeat (got {list(v)})")
        return tuple(sorted(v))

    @model_validator(mode="after")
    def _consistent(self) -> "Params":
        if self.sessions * self.session_min < self.batch_size:
            raise ValueError(f"sessions ({self.sessions}) x session_min ({self.session_min}) yields fewer samples "
                             f"than one batch (batch_size {self.batch_size})")
        for share in self.mix_sweep:  # every sweep point must be a valid workload too, checked before any work
            lengths = mix_lengths(self.user_features, self.user_list_len, self.item_features, self.item_list_len, share)
            if max(lengths) > MAX_LIST_LEN:
                raise ValueError(f"mix_sweep share {share} needs lists of ~{max(lengths)} ids (limit {MAX_LIST_LEN}); "
                                 "use fewer ids per sample, more features or another share")
        if self.mix_sweep and -(-self.sweep_steps * self.batch_size // self.session_min) > MAX_SESSIONS:
            raise ValueError(f"sweep_steps ({self.sweep_steps}) x batch_size ({self.batch_size}) needs more than "
                             f"{MAX_SESSIONS} sessions per mix_sweep point")
        return self


SPEC = SystemSpec(
    name="recd", title="RecD: deduplicated recommendation training data (IKJT)", paper="arXiv:2211.05239",
    # kjt: the paper's baseline pipeline (arrival-order file, KJT reader, KJT trainer on arrival-order
    # batches); kjt_clustered: the same samples clustered by session but no IKJT (reader and trainer)
    family="input-data", params=Params, baselines=("kjt", "kjt_clustered"),
    # neither baseline is tuned on anything: both train the evaluated samples as they come
    roles={"kjt": ("paper", "deployable"), "kjt_clustered": ("deployable",)},
    # issue 45: the headline's samples (time to the target, training throughput, held-out logloss) are one per
    # evaluated seed, each its own data and training run: paired by seed, independent. The reader's samples are
    # interleaved passes over one seed's files and the mix sweep's are turn groups of one short run per point:
    # p.repeats (3 at quick) of them, fewer than verdict.MIN_PAIRS, so they decide nothing either way
    pairing="seeds",
    mechanism=Mechanism(
        "session clustering that puts a session's repeated user lists into one batch for the IKJT",
        "ikjt_arrival",
        "ikjt_arrival is RecD's IKJT reader and trainer on the arrival-order batches (the reader finds every "
        "in-batch repeat by hashing): it keeps the IKJT and removes only the clustering by session, which is what "
        "makes a batch hold a session's duplicate lists"),
    regime=Regime(
        "duplicated share", unit="of looked-up ids",
        paper_source="not stated: the paper gives no per-batch share; by Amdahl its 2.48x needs at least 60% of the "
                     "training step to be deduplicable (docs/recd.md)",
        statement="the IKJT saves exactly the looked-up ids that repeat within a batch; the sweep changes the lookup "
                  "mix (the user-feature share of the ids, ids per sample fixed), and with it the share of a KJT "
                  "trainer's looked-up ids the IKJT of the clustered batches leaves out (counted per point). Each "
                  "point times the same samples (seconds per 1000 samples, measured): a short run with no held-out "
                  "evaluation, so the points compare throughput at equal steps, not time to the held-out target"),
    # throughputs timed in this run; losses, bytes and id counts exact
    kinds={**dict.fromkeys(("time_to_target_s", "train_samples_per_s", "preprocess_batches_per_s",
                            "sweep_train_samples_per_s"), "measured"),
           **dict.fromkeys(("final_loss", "heldout_logloss", "best_heldout_logloss", "samples_to_target",
                            "reached_target", "target_logloss", "stored_bytes", "in_batch_dedup",
                            "user_values_per_epoch", "looked_up_ids_per_epoch", "user_id_share",
                            "duplicated_share"), "counted")},
    # issue 45: the headline is at equal held-out quality; a trainer that never reaches the declared target
    # is a miss: never the strongest baseline, and a technique that misses it wins nothing
    constraint=Constraint(
        "reached_target", "higher", bound=1.0,
        statement="every compared trainer reaches the held-out logloss target (target_fraction of the way from the "
                  "base-rate predictor's held-out logloss to the generator's own) within its training run; one that "
                  "does not is a miss, reported and counted, never a win"),
    claims=(
        Claim("time_to_target_s", "kjt", "ikjt", "lower", 2.48,
              "training time to the held-out logloss target (the paper's training throughput, at equal held-out "
              "quality), paired by evaluated seed: samples trained until the smoothed held-out logloss (running mean "
              "of 3 evaluations) first reaches the seed's target, over the trainer's measured samples/s in that run. Paper: up to 2.48x training throughput, 1.79x preprocessing throughput, 3.71x "
              "storage efficiency", headline=True),
        Claim("train_samples_per_s", "kjt", "ikjt", "higher", 2.48,
              "training throughput at equal steps, not at equal quality. Paper: up to 2.48x training throughput"),
        Claim("stored_bytes", "kjt", "ikjt", "lower", 3.71, "3.71x storage efficiency"),
        Claim("preprocess_batches_per_s", "kjt", "ikjt", "higher", 1.79, "1.79x preprocessing throughput"),
        Claim("preprocess_batches_per_s", "kjt_clustered", "ikjt", "higher",
              statement="the reader's dedup alone, both reading the clustered file"),
        Claim("train_samples_per_s", "kjt_clustered", "ikjt", "higher",
              statement="the IKJT trainer alone, both training on the same session-clustered batches"),
        Claim("time_to_target_s", "kjt_clustered", "ikjt", "lower",
              statement="the IKJT trainer alone at equal held-out quality: both train the same session-clustered "
                        "batches (same math), so the samples to the target agree and the ratio is the throughput's"),
        Claim("heldout_logloss", "kjt", "ikjt", "lower",
              statement="what clustering costs in model quality: held-out logloss at the end of equal steps (mean of "
                        "the last 5 evaluations) on session-clustered batches (RecD) vs arrival-order batches (1.0: no "
                        "cost), paired by seed"),
        Claim("samples_to_target", "kjt", "ikjt", "lower",
              statement="samples trained until the smoothed held-out logloss first reaches the target (running mean of "
                        "3 evaluations, linear between them), paired by seed: what the clustered order costs in "
                        "samples (<1) or saves (>1)"),
    ),
)

__all__ = ["CALIBRATION_SEEDS", "Params", "SPEC"]
