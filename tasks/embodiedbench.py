"""Prefect tasks of the EmbodiedBench flow: run every variant (agent x feedback protocol) on a chunk of
one level's fixed test set; the full episode records (with failure reasons) go to the storage block."""
from __future__ import annotations

import json
import time

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.embodiedbench import Params, run_chunk
from mlsys_flows.tasks.common import llm_client


@task(name="embodiedbench-episodes")
def run_episodes(p: Params, storage: ObjectStorage, level: str, seed: int, start: int, stop: int, key: str) -> dict:
    """Episodes of tasks[start:stop] of ``level`` in the test set of ``seed`` for every variant; writes them
    to ``key`` (JSON) and returns them without the free-text reasons' details trimmed (they are short)."""
    log = get_run_logger()
    started = time.perf_counter()
    llm = None
    if p.agent == "llm":
        with llm_client(p.llm_base_url, p.llm_model, p.api_key_secret, timeout_s=p.llm_timeout_s) as client:
            out = run_chunk(p, level, start, stop, client, seed=seed)
            llm = {"requests": client.calls}
    else:
        out = run_chunk(p, level, start, stop, seed=seed)
    storage.write_bytes(key, json.dumps(out).encode())
    log.info("%s seed %d tasks %d-%d in %.1f s: success %s%s", level, seed, start, stop, time.perf_counter() - started,
             ", ".join(f"{v} {sum(e['success'] for e in eps)}/{len(eps)}" for v, eps in out.items()),
             f"; {llm['requests']} LLM requests" if llm else "")
    return {"episodes": out, "llm": llm}
