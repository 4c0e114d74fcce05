"""A closing Dask worker skips the interpreter's final collections over its imports (runtime.QuickExit):
on a loaded machine they ran past the nanny's 4 s and every local run ended with "Worker process still
alive after 4.0 seconds, killing" (issue 52 item 7). Reproduced with plain prefect-dask and four tasks;
py-spy showed the closing worker in gc_collect_main."""
from __future__ import annotations

import gc

from mlsys_flows.runtime import QuickExit


def test_teardown_freezes_what_the_worker_holds():
    before = gc.get_freeze_count()
    try:
        QuickExit().teardown(worker=None)
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()


def test_the_harness_registers_it_on_every_cluster_it_runs_tasks_on():
    import inspect

    from mlsys_flows.flows import common

    assert "quick_exit(runner.client)" in inspect.getsource(common.tasks_on)
