"""The functions and Prefect tasks `benchmarks/overhead.py` runs on Dask workers.

Module level, so Dask workers import them by reference (the repository root is on their path).
Every function does the same work with or without Prefect, so what differs is orchestration.
"""
from __future__ import annotations

import time

import numpy as np
from prefect import task

# Prefect's default settings, as the system tasks use them: the default cache policy (inputs, task source,
# flow run id) keys every result, and the harness persists results under that key. So within one flow
# run every call must get distinct inputs, or Prefect returns the cached result instead of running it.


# ----- one trivial function ------------------------------------------------------------------------
def trivial(i: int) -> int:
    return i + 1


trivial_task = task(trivial, name="trivial")


# ----- a flow's fixed cost: the task stamps its own start and end ------------------------------------
@task(name="stamp")
def stamp() -> tuple[float, float]:
    start = time.time()
    return start, time.time()


# ----- moving an array between tasks -----------------------------------------------------------------
def make_array(mb: float) -> np.ndarray:
    return np.full(int(mb * 1e6) // 8, 1.0, dtype=np.float64)


def use_array(arr: np.ndarray) -> float:
    return float(arr[::4096].sum()) + arr.nbytes


def make_and_use(mb: float) -> float:
    """The work of a producer and a consumer in one place: nothing is moved."""
    return use_array(make_array(mb))


def make_to_storage(mb: float, storage, key: str) -> str:
    import io

    buf = io.BytesIO()
    np.save(buf, make_array(mb), allow_pickle=False)
    storage.write_bytes(key, buf.getvalue())
    return key


def use_from_storage(storage, key: str) -> float:
    import io

    return use_array(np.load(io.BytesIO(storage.read_bytes(key)), allow_pickle=False))


make_array_task = task(make_array, name="make-array")
use_array_task = task(use_array, name="use-array")
make_and_use_task = task(make_and_use, name="make-and-use")
make_to_storage_task = task(make_to_storage, name="make-to-storage")
use_from_storage_task = task(use_from_storage, name="use-from-storage")
