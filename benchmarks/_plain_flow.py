"""What a user would write instead of mlsys-flows (issue 42 item 4's yardstick): a plain Prefect flow
with one task, torch imported, run as a script. Prints the task's start (epoch seconds) on a marked
line, so `benchmarks/overhead.py` can time the command around it.

    python benchmarks/_plain_flow.py     # on PREFECT_API_URL, else Prefect's temporary API
"""
from __future__ import annotations

import json
import time

import torch  # noqa: F401 - a user's ML flow imports it; so do the systems'
from prefect import flow, task


@task
def one() -> float:
    return time.time()


@flow
def plain() -> float:
    return one.submit().result()


if __name__ == "__main__":
    print("PLAIN-FLOW " + json.dumps({"task_start": plain()}), flush=True)
