"""ObjectStorage is a Prefect WritableFileSystem: a flow's result storage. A task whose result is
persisted there is not run again with the same inputs in the same flow run (a lost worker's
finished work is read back, not recomputed)."""
from __future__ import annotations

from prefect import flow, task

CALLS: list[int] = []


@task(persist_result=True)
def square(x: int) -> int:
    CALLS.append(x)
    return x * x


def test_object_storage_holds_a_flows_task_results_and_serves_them_again(local_storage):
    import uuid

    local_storage.save(f"results-{uuid.uuid4().hex[:8]}")  # Prefect keeps result storage server-side

    @flow(result_storage=local_storage, persist_result=True)
    def twice() -> tuple:
        first = square(7, return_state=True)
        again = square(7, return_state=True)
        return first.name, again.name, again.result()

    CALLS.clear()
    names = twice()
    assert names == ("Completed", "Cached", 49) and CALLS == [7]
    stored = [k for k in local_storage.list("") if not k.startswith("reports/")]
    assert stored, "no result was written to the storage block"
    assert all(local_storage.read_bytes(k) for k in stored)
