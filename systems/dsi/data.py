"""The DSI dataset and the preprocessing both pipelines run.

Dataset: parquet files with many row groups and many feature columns (dense floats with
missing values, sparse id lists), of which a model uses a few. Preprocessing of one row group:
read (full rows for the baseline; projected, coalesced column reads for DPP), then per used
feature the usual DLRM transforms (fill, clip, log, standardize; first-x truncation, sigrid
hash) and cut into batches.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mlsys_flows.errors import MlsysError
from mlsys_flows.systems.common.dlrm import feature_salt, mix64, sigrid_hash
from mlsys_flows.systems.common.params import ParamsError

from . import Params

LABEL = "label"


class DatasetError(MlsysError, ValueError):
    """The dataset cannot be trained on; the message names the field, file or column."""


@dataclass(frozen=True)
class WorkItem:
    """One row group of one file: the unit the master hands to a worker."""

    id: int
    key: str
    row_group: int
    rows: int


@dataclass
class Batch:
    item: int                       # work item it came from (exactly-once accounting)
    index: int                      # position within the item
    dense: np.ndarray               # float32 [n, used dense]
    sparse: dict[str, tuple[np.ndarray, np.ndarray]]  # column -> (hashed ids, lengths)
    labels: np.ndarray              # float32 [n]

    @property
    def rows(self) -> int:
        return int(self.labels.size)


class CountingFile(io.RawIOBase):
    """A read-only file that counts the bytes and calls its reader asks for."""

    def __init__(self, raw):
        self.raw, self.bytes_read, self.calls = raw, 0, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.bytes_read += len(data)
        self.calls += 1
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def close(self) -> None:
        self.raw.close()
        super().close()


# ----- generation ---------------------------------------------------------------------------
def generate_file(p: Params, index: int) -> pa.Table:
    """One file: ``row_groups_per_file * rows_per_group`` rows; labels from a hidden logistic model."""
    rng = np.random.default_rng([p.seed, index])
    n = p.row_groups_per_file * p.rows_per_group
    cols: dict[str, pa.Array] = {}
    dense = rng.lognormal(0.0, 1.5, (n, p.dense_columns)).astype(np.float32)
    missing = rng.random((n, p.dense_columns)) < 0.05
    score = (np.log1p(dense[:, :min(8, p.dense_columns)]) - 1.0).sum(axis=1) * 0.5
    for i in range(p.dense_columns):
        cols[f"dense_{i}"] = pa.array(dense[:, i], mask=missing[:, i])
    for i in range(p.sparse_columns):
        lengths = rng.integers(0, 2 * p.sparse_list_len + 1, n)
        ids = (2 ** 40 * rng.random(int(lengths.sum())) ** 4).astype(np.int64)  # skewed raw ids
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        cols[f"sparse_{i}"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids))
    label = (rng.random(n) < 1.0 / (1.0 + np.exp(-(score - score.mean())))).astype(np.float32)
    return pa.table({LABEL: pa.array(label), **cols})


def dataset_bytes(p: Params) -> int:
    """Bytes the generated dataset takes, from its parameters: the uncompressed column data (label and
    dense float32 with a null bitmap, id lists of int64 with int32 offsets at their mean length). The
    values are random, so zstd saves little: this is a slight over-estimate of the stored files."""
    per_row = 4 + p.dense_columns * (4 + 1 / 8) + p.sparse_columns * (4 + 8 * p.sparse_list_len)
    return int(p.files * p.row_groups_per_file * p.rows_per_group * per_row)


def check_fits(p: Params, free_bytes: int | None, where: str) -> None:
    """Before any work: fail, naming the parameter, when the dataset to generate would not fit in
    ``free_bytes`` at ``where`` (None: unknown, e.g. S3)."""
    if p.dataset or free_bytes is None:
        return
    need = dataset_bytes(p)
    if need > free_bytes:
        raise ParamsError("dsi", "files", f"the generated dataset needs about {need / 1e9:.1f} GB ({p.files} files x "
                                          f"{p.row_groups_per_file} row groups x {p.rows_per_group} rows of "
                                          f"{p.dense_columns} dense and {p.sparse_columns} sparse columns) but "
                                          f"{where} has {free_bytes / 1e9:.1f} GB free: lower files, "
                                          "row_groups_per_file or rows_per_group")


def file_key(prefix: str, index: int) -> str:
    return f"{prefix}/part-{index:05d}.parquet"


def to_parquet(table: pa.Table, rows_per_group: int) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", row_group_size=rows_per_group)
    return buf.getvalue()


# ----- planning (the master's split) --------------------------------------------------------
def plan(keys: list[str], open_file: Callable[[str], object], used: list[str], where: str) -> list[WorkItem]:
    """Split files into row-group work items after checking every file has the used columns.

    Fails before any training: no files, no rows, or a used column missing (named)."""
    if not keys:
        raise DatasetError(f"dataset: no parquet files under {where!r} (empty dataset)")
    items: list[WorkItem] = []
    for key in keys:
        with open_file(key) as fh:
            meta = pq.ParquetFile(fh).metadata
            names = set(meta.schema.to_arrow_schema().names)
        for col in [LABEL, *used]:
            if col not in names:
                raise DatasetError(f"features: column {col!r} is missing from {key} (has {len(names)} columns)")
        items += [WorkItem(0, key, rg, meta.row_group(rg).num_rows) for rg in range(meta.num_row_groups)]
    items = [it for it in items if it.rows > 0]
    if not items:
        raise DatasetError(f"dataset: {where!r} holds no rows (empty dataset)")
    return [WorkItem(i, it.key, it.row_group, it.rows) for i, it in enumerate(items)]


# ----- reading and transforming ----------------------------------------------------------------
def read_row_group(fh, row_group: int, columns: list[str] | None, coalesce: bool) -> pa.Table:
    """Full rows (``columns=None``) or a projection; ``coalesce`` merges nearby column-chunk
    ranges into few large reads (pyarrow pre-buffering) instead of one read per chunk."""
    return pq.ParquetFile(fh, pre_buffer=coalesce).read_row_group(row_group, columns=columns, use_threads=False)


def _dense(col: pa.ChunkedArray) -> np.ndarray:
    x = col.to_numpy(zero_copy_only=False).astype(np.float32)  # nulls become NaN
    x = np.nan_to_num(x, nan=0.0)
    x = np.log1p(np.clip(x, 0.0, 1e6))
    return (x - 1.0) / 1.5


def _sparse(col: pa.ChunkedArray, name: str, max_len: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    arr = col.combine_chunks()
    values, lengths = arr.flatten().to_numpy(), np.diff(arr.offsets.to_numpy())
    keep = np.minimum(lengths, max_len)  # first-x truncation
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    idx = np.arange(int(keep.sum())) + np.repeat(starts - (np.cumsum(keep) - keep), keep)
    return sigrid_hash(values[idx], feature_salt(name), rows), keep.astype(np.int64)


BUCKETS = np.linspace(-3.0, 3.0, 63)  # 64 buckets over the standardized dense values


def derive_features(dense: np.ndarray, sparse: dict[str, tuple[np.ndarray, np.ndarray]], rows: int,
                    rounds: int) -> int:
    """``rounds`` rounds of derived-feature generation, the costly part of production DLRM preprocessing
    (the DSI paper's feature generation: crosses, n-grams, bucketized dense features). Per round, with a
    salt of its own: each sparse column's bigrams of adjacent ids hashed into ``rows`` rows, and every
    dense column bucketized. The derived features are computed and dropped (the model reads the basic
    ones only): real CPU work that sets the preprocessing cost per sample. Returns a checksum, so no
    round can be skipped."""
    check = 0
    for r in range(rounds):
        for name, (ids, _) in sparse.items():
            if ids.size > 1:
                with np.errstate(over="ignore"):
                    pair = ids[:-1].astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) ^ ids[1:].astype(np.uint64)
                    check ^= int(sigrid_hash(mix64(pair), feature_salt(name) ^ r, rows).sum())
        if dense.size:
            check ^= int(np.searchsorted(BUCKETS + 1e-3 * r, dense.ravel()).sum())
    return check


def transform(table: pa.Table, used: list[str], p: Params, item: int, rounds: int = 0) -> list[Batch]:
    """Filter to the used features, transform them (plus ``rounds`` rounds of derived features, see
    :func:`derive_features`) and cut batches of ``batch_size`` rows."""
    dense_cols = [c for c in used if not c.startswith("sparse")]
    sparse_cols = [c for c in used if c.startswith("sparse")]
    dense = np.stack([_dense(table.column(c)) for c in dense_cols], axis=1) if dense_cols else \
        np.zeros((table.num_rows, 0), np.float32)
    sparse = {c: _sparse(table.column(c), c, 2 * p.sparse_list_len, p.table_rows) for c in sparse_cols}
    derive_features(dense, sparse, p.table_rows, rounds)
    labels = table.column(LABEL).to_numpy().astype(np.float32)
    out = []
    for i, start in enumerate(range(0, table.num_rows, p.batch_size)):
        stop = min(start + p.batch_size, table.num_rows)
        cut = {}
        for c, (values, lengths) in sparse.items():
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            cut[c] = (values[offsets[start]:offsets[stop]], lengths[start:stop])
        out.append(Batch(item, i, dense[start:stop], cut, labels[start:stop]))
    return out


def process_item(item: WorkItem, open_file: Callable[[str], object], used: list[str], p: Params,
                 projected: bool, rounds: int = 0) -> tuple[list[Batch], dict[str, float]]:
    """Read and preprocess one work item (``rounds`` rounds of derived features included); returns its
    batches and I/O counters."""
    with open_file(item.key) as raw:
        fh = CountingFile(raw)
        table = read_row_group(fh, item.row_group, [LABEL, *used] if projected else None, coalesce=projected)
        stats = {"bytes_read": fh.bytes_read, "read_calls": fh.calls}
    if not projected:
        table = table.select([LABEL, *used])  # the inline trainer filters after reading full rows
    return transform(table, used, p, item.id, rounds), stats


def derive_ms_per_batch(item: WorkItem, open_file: Callable[[str], object], used: list[str], p: Params,
                        repeats: int = 3) -> float:
    """CPU ms that one round of derived features costs per batch of ``item`` (median of ``repeats``);
    the flow calibrates on the trainer's core how many rounds make a chosen preprocessing cost."""
    import time

    with open_file(item.key) as fh:
        table = read_row_group(fh, item.row_group, [LABEL, *used], coalesce=True)
    dense_cols = [c for c in used if not c.startswith("sparse")]
    dense = np.stack([_dense(table.column(c)) for c in dense_cols], axis=1)
    sparse = {c: _sparse(table.column(c), c, 2 * p.sparse_list_len, p.table_rows) for c in used if c.startswith("sparse")}
    rounds = 8
    derive_features(dense, sparse, p.table_rows, rounds)  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        derive_features(dense, sparse, p.table_rows, rounds)
        times.append((time.perf_counter() - t0) / rounds)
    batches = -(-table.num_rows // p.batch_size)
    return 1e3 * sorted(times)[len(times) // 2] / batches


def rounds_for(extra: float, step_cpu_ms: float, round_ms_per_batch: float) -> int:
    """Rounds of derived features that cost ``extra`` trainer steps of CPU per batch (0: none)."""
    if extra < 0 or round_ms_per_batch <= 0:
        raise ValueError("extra preprocessing must be >= 0 and a round must cost some time")
    return max(1, round(extra * step_cpu_ms / round_ms_per_batch)) if extra > 0 else 0
