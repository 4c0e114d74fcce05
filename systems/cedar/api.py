"""The user-facing pipeline builder (pure).

    pipe = (Pipeline.from_files(paths, meta=labels)
            .map(decode, reads=("data",), writes=("data", "image"))
            .filter(lambda s: s["label"] >= 0, name="labelled", reads=("label",))
            .map(random_crop, random=True, reads=("image",), writes=("image",))
            .batch(32))
    fast = pipe.optimize(epochs=3, cache="/tmp/cedar-cache")
    print(fast.explain())
    for batch in fast: ...
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Iterator, Sequence

from mlsys_flows.systems.cedar.pipeline import (Op, ParquetRowGroups, Plan, Runtime, Source, StorageReader,
                                                execute, read_local_file)


class Pipeline:
    """A source and operators; iterate it to get samples (or batches). Immutable: every builder
    method returns a new pipeline. ``optimize()`` returns one with an optimized plan."""

    def __init__(self, source: Source, ops: Sequence[Op] = (), seed: int = 0, plan: Plan | None = None,
                 remote: Any = None):
        self.source, self.ops, self.seed = source, tuple(ops), seed
        self.plan = plan or Plan.naive(self.ops)
        self.runtime = Runtime(remote)
        self._epoch = 0

    # ----- sources --------------------------------------------------------------------------
    @classmethod
    def from_list(cls, items: Sequence[Any], seed: int = 0) -> "Pipeline":
        """In-memory samples."""
        return cls(Source(tuple(items), f"list of {len(items)}"), seed=seed)

    @classmethod
    def from_files(cls, paths: Sequence[str], meta: Sequence[dict] | None = None, seed: int = 0) -> "Pipeline":
        """Local files: samples ``{"path", "data": bytes, **meta}``; reading is the operator 'read'."""
        refs = [{"path": str(p), **(meta[i] if meta else {})} for i, p in enumerate(paths)]
        src = Source(tuple(refs), f"{len(refs)} local files")
        return cls(src, seed=seed).map(read_local_file, name="read", reads=("path",), writes=("data",))

    @classmethod
    def from_storage(cls, store: Any, keys: Sequence[str], meta: Sequence[dict] | None = None,
                     seed: int = 0) -> "Pipeline":
        """Objects on anything with ``read_bytes(key)`` (an ObjectStorage block): samples
        ``{"key", "data": bytes, **meta}``; reading is the operator 'read'."""
        if not callable(getattr(store, "read_bytes", None)):
            raise TypeError(f"store must have read_bytes(key); got {type(store).__name__}")
        refs = [{"key": k, **(meta[i] if meta else {})} for i, k in enumerate(keys)]
        src = Source(tuple(refs), f"{len(refs)} objects on {getattr(store, 'root_url', type(store).__name__)}")
        return cls(src, seed=seed).map(StorageReader(store), name="read", reads=("key",), writes=("data",))

    @classmethod
    def from_parquet(cls, path: str, store: Any = None, columns: Sequence[str] | None = None,
                     seed: int = 0) -> "Pipeline":
        """Rows (dicts) of a parquet file, local or a key on ``store`` (``open_input(key)``);
        each row group is read by the operator 'read_parquet', so reading parallelizes."""
        import pyarrow.parquet as pq

        reader = ParquetRowGroups(path, store, tuple(columns) if columns else None)
        with reader.open() as fh:
            groups = pq.ParquetFile(fh).metadata.num_row_groups
        src = Source(tuple(range(groups)), f"parquet {path} ({groups} row groups)")
        return cls(src, seed=seed).flat_map(reader, name="read_parquet")

    # ----- operators ------------------------------------------------------------------------
    def _with(self, op: Op) -> "Pipeline":
        if op.name in {o.name for o in self.ops}:
            raise ValueError(f"operator name {op.name!r} is used twice; names identify operators in "
                             f"plans, errors and random seeds")
        return Pipeline(self.source, [*self.ops, op], self.seed, remote=self.runtime.remote)

    @staticmethod
    def _name(fn: Callable, name: str | None) -> str:
        return name or getattr(fn, "__name__", type(fn).__name__)

    def map(self, fn: Callable, name: str | None = None, *, random: bool = False, deterministic: bool | None = None,
            reads: Sequence[str] | None = None, writes: Sequence[str] | None = None,
            order_sensitive: bool = False) -> "Pipeline":
        """``fn(sample)`` (or ``fn(sample, rng)`` with ``random=True``). Declaring ``reads`` and
        ``writes`` (field names of dict samples) lets the optimizer move it past operators it does
        not conflict with. ``deterministic`` defaults to ``not random``."""
        det = (not random) if deterministic is None else deterministic
        if det and random:
            raise ValueError(f"map {self._name(fn, name)!r}: a random operator is not deterministic")
        return self._with(Op("map", self._name(fn, name), fn, det, random, order_sensitive,
                             tuple(reads) if reads is not None else None, tuple(writes) if writes is not None else None))

    def filter(self, pred: Callable, name: str | None = None, *, reads: Sequence[str] | None = None,
               order_sensitive: bool = False) -> "Pipeline":
        """Keep samples where ``pred(sample)`` is true. Declare ``reads`` to let the optimizer hoist it."""
        return self._with(Op("filter", self._name(pred, name), pred, True, False, order_sensitive,
                             tuple(reads) if reads is not None else None, ()))

    def flat_map(self, fn: Callable, name: str | None = None, *, random: bool = False,
                 deterministic: bool | None = None, order_sensitive: bool = False) -> "Pipeline":
        """``fn(sample)`` returns an iterable; each element becomes a sample."""
        det = (not random) if deterministic is None else deterministic
        return self._with(Op("flat_map", self._name(fn, name), fn, det, random, order_sensitive))

    def batch(self, size: int, drop_last: bool = False, collate: Callable | None = None) -> "Pipeline":
        if size < 1:
            raise ValueError(f"batch size must be >= 1 (got {size})")
        n = sum(o.kind == "batch" for o in self.ops)
        return self._with(Op("batch", f"batch{n or ''}", None, True, order_sensitive=True, size=size,
                             drop_last=drop_last, collate=collate))

    def shuffle(self, buffer: int) -> "Pipeline":
        if buffer < 1:
            raise ValueError(f"shuffle buffer must be >= 1 (got {buffer})")
        n = sum(o.kind == "shuffle" for o in self.ops)
        return self._with(Op("shuffle", f"shuffle{n or ''}", None, False, order_sensitive=True, size=buffer))

    # ----- running --------------------------------------------------------------------------
    def iterate(self, epoch: int = 0) -> Iterator[Any]:
        """One pass over the data; ``epoch`` seeds random operators and shuffles."""
        return execute(self.plan, self.source, self.seed, epoch, self.runtime)

    def __iter__(self) -> Iterator[Any]:
        epoch, self._epoch = self._epoch, self._epoch + 1
        return self.iterate(epoch)

    def take(self, n: int, epoch: int = 0) -> list[Any]:
        return list(itertools.islice(self.iterate(epoch), n))

    def close(self) -> None:
        """Stop worker processes (also done when the pipeline is garbage collected)."""
        self.runtime.close()

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.runtime.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ----- optimizing -----------------------------------------------------------------------
    def profile(self, sample: int = 32):
        from mlsys_flows.systems.cedar.optimizer import profile

        return profile(self.source, self.ops, self.seed, sample)

    def optimize(self, **kwargs) -> "Pipeline":
        """A pipeline with the same samples and an optimized plan; see ``optimizer.optimize``."""
        from mlsys_flows.systems.cedar.optimizer import optimize

        return optimize(self, **kwargs)

    def explain(self) -> str:
        from mlsys_flows.systems.cedar.optimizer import explain

        return explain(self)
