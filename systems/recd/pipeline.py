"""RecD's reader and trainer, with the KJT baseline beside them.

Preprocessing (the reader): parquet record batches -> dense log1p transform, sigrid-hashed ids
-> a :class:`Batch`. Without dedup every user list of every sample is hashed and shipped as a
KJT; with dedup (RecD) the repeats of each user list are found first (on session-clustered
data they are adjacent: one comparison pass), only the distinct lists are hashed, and they
ship as an IKJT. Item features vary per sample and stay KJTs in both.

Training: identical DLRMs (same init, same Adagrad, the optimizer of production DLRMs), one per
variant, take turns of ``chunk_steps`` steps so that machine noise hits all alike, in an order that
changes every turn (none always goes first). The flow trains three on the same multiset of samples:
KJT batches in arrival order (the paper's baseline), KJT batches clustered by session, and the IKJT
batches of the clustered samples. The last two are the same math on the same batches, so their loss
curves agree to float rounding; the first shows what the clustered order costs in model quality.
"""
from __future__ import annotations

import copy
import hashlib
import io
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn

from mlsys_flows.systems.common.dlrm import DLRM, Jagged, KeyedJaggedTensor, feature_salt, mix64, sigrid_hash
from mlsys_flows.systems.common.timing import Stopwatch, interleaved

from . import Params
from .ikjt import InverseKeyedJaggedTensor, dedup_consecutive, dedup_jagged
from .workload import Schema, check_dataset

Sparse = KeyedJaggedTensor | InverseKeyedJaggedTensor


@dataclass
class Batch:
    dense: torch.Tensor    # float32 [B, dense_features]
    sparse: list[Sparse]   # item KJT, user KJT or IKJT
    labels: torch.Tensor   # float32 [B]

    @property
    def size(self) -> int:
        return self.labels.numel()

    def to(self, device) -> "Batch":
        return Batch(self.dense.to(device), [s.to(device) for s in self.sparse], self.labels.to(device))


def _lists(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    return col.flatten().to_numpy(), np.diff(col.offsets.to_numpy())


def preprocess(rb: pa.RecordBatch, schema: Schema, table_rows: int, dedup: bool, adjacent: bool = True) -> Batch:
    """Decode one record batch into tensors (the reader's transform step). With ``dedup`` the user
    lists become an IKJT: ``adjacent`` finds the repeats of session-clustered data in one comparison
    pass (:func:`dedup_consecutive`); otherwise every repeat in the batch, in any order, is found by
    hashing (:func:`dedup_jagged`: the IKJT of data that was not clustered)."""
    find = dedup_consecutive if adjacent else dedup_jagged
    dense = np.stack([rb.column(c).to_numpy() for c in schema.dense], axis=1)
    dense = np.log1p(np.maximum(dense, 0.0, dtype=np.float32))
    items = {}
    for c in schema.item:
        values, lengths = _lists(rb.column(c))
        items[c] = Jagged.from_numpy(sigrid_hash(values, feature_salt(c), table_rows), lengths)
    users: Sparse
    if dedup:
        unique, inverse = {}, {}
        for c in schema.user:
            values, lengths, inv = find(*_lists(rb.column(c)))
            unique[c] = Jagged.from_numpy(sigrid_hash(values, feature_salt(c), table_rows), lengths)
            inverse[c] = torch.from_numpy(inv)
        users = InverseKeyedJaggedTensor(unique, inverse)
    else:
        users = KeyedJaggedTensor({c: Jagged.from_numpy(sigrid_hash(v, feature_salt(c), table_rows), l)
                                   for c in schema.user for v, l in [_lists(rb.column(c))]})
    return Batch(torch.from_numpy(dense), [KeyedJaggedTensor(items), users],
                 torch.from_numpy(rb.column(schema.label).to_numpy().astype(np.float32)))


def table_batches(table: pa.Table, p: Params, dedup: bool, adjacent: bool = True) -> list[Batch]:
    """An in-memory table -> preprocessed batches of ``p.batch_size``, in row order (no parquet)."""
    schema = Schema.of(p)
    check_dataset(table.column_names, table.num_rows, schema, "table")
    return [preprocess(rb, schema, p.table_rows, dedup, adjacent)
            for rb in table.combine_chunks().to_batches(max_chunksize=p.batch_size)]


def open_dataset(data: bytes, schema: Schema, where: str) -> pq.ParquetFile:
    pf = pq.ParquetFile(pa.BufferReader(data))
    check_dataset(pf.schema_arrow.names, pf.metadata.num_rows, schema, where)
    return pf


def read_batches(data: bytes, p: Params, dedup: bool, where: str = "dataset", limit: int | None = None,
                 adjacent: bool = True) -> Iterator[Batch]:
    """Parquet bytes -> preprocessed batches, in file order (``adjacent``: see :func:`preprocess`)."""
    schema = Schema.of(p)
    pf = open_dataset(data, schema, where)
    cols = [schema.label, *schema.dense, *schema.sparse]
    for i, rb in enumerate(pf.iter_batches(batch_size=p.batch_size, columns=cols, use_threads=False)):
        if limit is not None and i >= limit:
            return
        yield preprocess(rb, schema, p.table_rows, dedup, adjacent)


def preprocess_throughput(sources: dict[str, tuple[bytes, bool]], p: Params,
                          limit: int | None = None) -> dict[str, list[float]]:
    """Batches/s of the reader per variant ``name -> (parquet bytes, dedup)``: ``p.repeats``
    samples each, measured interleaved."""
    def measure(data: bytes, dedup: bool):
        def run() -> float:
            t0 = time.perf_counter()
            n = sum(1 for _ in read_batches(data, p, dedup, limit=limit))
            return n / (time.perf_counter() - t0)
        return run

    return interleaved({name: measure(*src) for name, src in sources.items()}, p.repeats)


def build_model(p: Params) -> DLRM:
    schema = Schema.of(p)
    torch.manual_seed(p.seed)
    return DLRM(p.dense_features, {k: p.table_rows for k in schema.sparse}, p.embedding_dim, pooling="mean")


def _step(model: DLRM, opt: torch.optim.Optimizer, loss_fn: nn.Module, b: Batch) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(b.dense, b.sparse), b.labels)
    loss.backward()
    opt.step()
    return loss.detach()


@torch.no_grad()
def heldout_logloss(model: DLRM, batches: list[Batch]) -> float:
    """The model's mean binary logloss over every sample of the held-out ``batches`` (the same batches
    and the same code for every trainer; no gradient, no optimizer step)."""
    total, n = 0.0, 0
    for b in batches:
        total += float(nn.functional.binary_cross_entropy_with_logits(model(b.dense, b.sparse), b.labels,
                                                                      reduction="sum"))
        n += b.size
    return total / max(1, n)


def turn_order(names: list[str], turn: int) -> list[str]:
    """The order in which the trainers run in ``turn``: a Williams design, so that over each cycle
    (``n`` turns, ``2n`` for an odd count ``n``) every trainer is in every position, and right after
    every other trainer, equally often. Two trainers simply alternate; three cycle through all six
    orders."""
    n = len(names)
    base, lo, hi = [0], 1, n - 1
    while len(base) < n:  # 0, 1, n-1, 2, n-2, ...
        base.append(lo if len(base) % 2 else hi)
        lo, hi = (lo + 1, hi) if len(base) % 2 == 0 else (lo, hi - 1)
    rows = [[names[(b + k) % n] for b in base] for k in range(n)]
    if n % 2 == 1 and n > 1:
        rows += [r[::-1] for r in rows]
    return list(rows[turn % len(rows)])


def train_interleaved(batches: dict[str, list[Batch]], p: Params, device: str = "cpu",
                      state: dict[str, Any] | None = None,
                      checkpoint: Callable[[int, dict[str, Any]], None] | None = None,
                      checkpoint_every: int = 1, heldout: list[Batch] | None = None) -> dict[str, dict]:
    """Train one DLRM per variant (same init, same number of batches), taking turns of
    ``chunk_steps`` steps in the order of :func:`turn_order`.

    Returns per variant: ``samples_per_s`` (the first chunk, a warm-up, is not counted),
    ``losses`` (one per step), ``chunk_rates`` (samples/s of each turn) and ``samples``.
    With ``checkpoint``, ``checkpoint(turn, state)`` runs after every ``checkpoint_every`` turns and
    after the last, outside the timed steps; training given that ``state`` continues after ``turn``
    exactly as if it had never stopped (models, optimizers, losses and timings so far).
    With ``heldout`` batches, every trainer's held-out logloss is evaluated before training and after
    each of its turns, outside the timed steps: ``evals``, a list of (samples trained, logloss).
    """
    names = list(batches)
    steps = len(batches[names[0]])
    if any(len(b) != steps for b in batches.values()):
        raise ValueError("every variant must train on the same number of batches")
    if device == "cpu":
        torch.set_num_threads(p.train_threads)
    base = build_model(p)
    models = {n: copy.deepcopy(base).to(device) for n in names}
    torch.sparse.check_sparse_tensor_invariants.disable()  # Adagrad's sparse path; silences a warning
    opts = {n: torch.optim.Adagrad(models[n].parameters(), lr=p.lr) for n in names}
    loss_fn = nn.BCEWithLogitsLoss()
    staged = {n: [b.to(device) for b in batches[n]] for n in names}
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    watches = {n: Stopwatch() for n in names}
    losses: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    timed_samples = {n: 0 for n in names}
    chunk_rates: dict[str, list[float]] = {n: [] for n in names}
    staged_heldout = [b.to(device) for b in heldout] if heldout else []
    evals: dict[str, list[tuple[int, float]]] = {n: [] for n in names}
    trained = {n: 0 for n in names}
    first_turn = 0
    if state is not None:
        first_turn = state["turn"] + 1
        for n in names:
            models[n].load_state_dict(state["models"][n])
            opts[n].load_state_dict(state["opts"][n])
            losses[n] = list(state["losses"][n].to(device).unbind())
            chunk_rates[n] = list(state["chunk_rates"][n])
            watches[n].seconds, timed_samples[n] = state["seconds"][n], state["timed_samples"][n]
            evals[n] = [tuple(e) for e in state.get("evals", {}).get(n, [])]
            trained[n] = state.get("trained", {}).get(n, 0)
    if staged_heldout and first_turn == 0:
        for n in names:  # the common starting point: the same init, evaluated once per trainer
            evals[n].append((0, heldout_logloss(models[n], staged_heldout)))
    turns = list(enumerate(range(0, steps, p.chunk_steps)))
    for turn, start in turns[first_turn:]:
        for n in turn_order(names, turn):  # no variant always goes first
            chunk = staged[n][start:start + p.chunk_steps]
            sync()
            t0 = time.perf_counter()
            for b in chunk:
                losses[n].append(_step(models[n], opts[n], loss_fn, b))
            sync()
            seconds, samples = time.perf_counter() - t0, sum(b.size for b in chunk)
            chunk_rates[n].append(samples / max(seconds, 1e-9))
            if turn > 0 or steps <= p.chunk_steps:  # the first turn warms up caches and allocators
                watches[n].seconds += seconds
                timed_samples[n] += samples
            trained[n] += samples
            if staged_heldout:  # outside the timed steps, identical for every trainer
                evals[n].append((trained[n], heldout_logloss(models[n], staged_heldout)))
        if checkpoint is not None and ((turn + 1) % checkpoint_every == 0 or turn == len(turns) - 1):
            checkpoint(turn, {"turn": turn, "models": {n: models[n].state_dict() for n in names},
                              "opts": {n: opts[n].state_dict() for n in names},
                              "losses": {n: torch.stack(losses[n]).cpu() for n in names},
                              "chunk_rates": chunk_rates, "seconds": {n: watches[n].seconds for n in names},
                              "timed_samples": timed_samples, "evals": evals, "trained": trained})
    return {n: {"samples_per_s": timed_samples[n] / max(watches[n].seconds, 1e-9),
                "losses": torch.stack(losses[n]).float().cpu().tolist(), "chunk_rates": chunk_rates[n],
                "samples": sum(b.size for b in batches[n]), "evals": [list(e) for e in evals[n]]} for n in names}


def looked_up_ids(batches: list[Batch]) -> int:
    """Sparse ids a trainer looks up over ``batches``: every id of a KJT, the unique lists' ids of an IKJT."""
    return sum(s.num_values() for b in batches for s in b.sparse)


def duplicated_share(kjt_batches: list[Batch], ikjt_batches: list[Batch]) -> float:
    """Counted: the share of a KJT trainer's looked-up ids that the IKJT of the same samples does not
    look up (in-batch duplicates): 0 when nothing repeats, near the user-id share when every batch
    holds few sessions."""
    total = looked_up_ids(kjt_batches)
    return 1.0 - looked_up_ids(ikjt_batches) / max(1, total)


def samples_digest(batches: list[Batch]) -> str:
    """An order-free digest of the samples in ``batches``: the sorted hashes of every sample's label,
    dense values and (hashed) id lists of every feature. Equal digests: the same multiset of samples,
    however they are ordered or batched and whether the sparse features come as KJTs or IKJTs."""
    golden = np.uint64(0x9E3779B97F4A7C15)
    hashes = []
    with np.errstate(over="ignore"):
        for b in batches:
            h = mix64(b.labels.numpy().astype(np.float32).view(np.uint32).astype(np.uint64) + golden)
            dense = b.dense.numpy().astype(np.float32).view(np.uint32).astype(np.uint64)
            for i in range(dense.shape[1]):
                h = mix64(h ^ mix64(dense[:, i] + np.uint64(i + 1) * golden))
            features: dict[str, Jagged] = {}
            for s in b.sparse:
                kjt = s.to_kjt() if isinstance(s, InverseKeyedJaggedTensor) else s
                features.update({k: kjt[k] for k in kjt.keys()})
            for i, key in enumerate(sorted(features)):
                values, lengths = features[key].values.numpy(), features[key].lengths.numpy()
                offsets = np.concatenate([[0], np.cumsum(lengths)])
                pos = (np.arange(values.size) - np.repeat(offsets[:-1], lengths)).astype(np.uint64)
                elem = mix64(values.view(np.uint64) ^ mix64(pos + np.uint64(1000 + i) * golden))
                prefix = np.concatenate([[np.uint64(0)], np.cumsum(elem, dtype=np.uint64)])
                rows = mix64((prefix[offsets[1:]] - prefix[offsets[:-1]]) ^ (lengths.astype(np.uint64) * golden))
                h = mix64(h ^ mix64(rows + np.uint64(2000 + i) * golden))
            hashes.append(h)
    all_h = np.sort(np.concatenate(hashes)) if hashes else np.zeros(0, dtype=np.uint64)
    return hashlib.sha256(all_h.tobytes()).hexdigest()


def check_same_samples(batches: dict[str, list[Batch]]) -> str:
    """The one digest every variant's batches share; raises ValueError naming the variants whose
    samples differ (a comparison of trainers on different data would be meaningless)."""
    digests = {n: samples_digest(bs) for n, bs in batches.items()}
    if len(set(digests.values())) != 1:
        raise ValueError("the trainers would see different samples: "
                         + ", ".join(f"{n} {d[:12]}" for n, d in digests.items()))
    return next(iter(digests.values()))


def throughput_samples(chunk_rates: list[float], repeats: int) -> list[float]:
    """Training throughput as ``repeats`` samples: the turns after the warm-up split into
    consecutive groups, each group's samples/s (harmonic mean of its equal-sized turns). The
    variants alternate turn by turn, so their samples are interleaved in time."""
    timed = chunk_rates[1:] or chunk_rates
    groups = [g for g in np.array_split(np.asarray(timed, dtype=float), min(repeats, len(timed))) if len(g)]
    return [float(len(g) / np.sum(1.0 / g)) for g in groups]


def samples_to_target(evals: list, target: float) -> float | None:
    """Samples trained until the held-out curve ``evals`` (raw, or :func:`smoothed_evals`) first reaches
    ``target``, linear between the evaluations (one per turn); None when it never does."""
    for i, (s1, l1) in enumerate(evals):
        if l1 <= target:
            if i == 0:
                return float(s1)
            s0, l0 = evals[i - 1]
            return float(s0 + (s1 - s0) * (l0 - target) / (l0 - l1))
    return None


SMOOTH_EVALS = 3   # the held-out curve a crossing is read from: the running mean of this many evaluations
FINAL_EVALS = 5    # heldout_logloss: the mean of the last this many evaluations (not one noisy point)


def smoothed_evals(evals: list, window: int = SMOOTH_EVALS) -> list[tuple[float, float]]:
    """The held-out curve as the trailing running mean of ``window`` evaluations, each point at the samples of
    its last evaluation (the mean is only known then); the first ``window - 1`` points average what came
    before them. A single noisy evaluation below the target does not make a crossing."""
    out = []
    for i, (s, _) in enumerate(evals):
        tail = [l for _, l in evals[max(0, i - window + 1):i + 1]]
        out.append((float(s), float(np.mean(tail))))
    return out


def final_heldout(evals: list, k: int = FINAL_EVALS) -> float:
    """The held-out logloss at the end of training: the mean of the last ``k`` evaluations."""
    return float(np.mean([l for _, l in evals[-k:]]))


def heldout_target(base_logloss: float, bayes_logloss: float, fraction: float) -> float:
    """The held-out logloss target: ``fraction`` of the way from the base-rate predictor's held-out
    logloss down to the generator's own (its hidden model's probabilities), both properties of the
    held-out set alone, never of a trained variant."""
    return base_logloss - fraction * (base_logloss - bayes_logloss)


def final_loss(losses: list[float]) -> float:
    """Mean loss of the last tenth of training."""
    tail = losses[-max(1, len(losses) // 10):]
    return float(np.mean(tail))


def parquet_bytes(table: pa.Table, row_group_size: int) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", row_group_size=row_group_size)
    return buf.getvalue()
