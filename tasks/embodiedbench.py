"""Prefect tasks of the EmbodiedBench flow: run every language-agent variant (agent x feedback protocol)
on a chunk of one level's fixed test set, and train ERA's learned policies on one level and play them on
every test set; the full episode records (with failure reasons) go to the storage block.

The agents the project did not script come from other packages of the project, which a system never
imports (the import contract): SmolLM2's chat client (systems/llm_serving) and ERA's training functions
(systems/era) are called here and handed to systems/embodiedbench as a client and as policies."""
from __future__ import annotations

import json
import time

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.embodiedbench import Params, eval_seeds, run_chunk, run_policies, tasks_for
from mlsys_flows.tasks.common import llm_client


@task(name="embodiedbench-episodes")
def run_episodes(p: Params, storage: ObjectStorage, level: str, seed: int, start: int, stop: int, key: str) -> dict:
    """Episodes of tasks[start:stop] of ``level`` in the test set of ``seed`` for every language-agent
    variant; writes them to ``key`` (JSON) and returns them with the model's counts (calls, tokens,
    generation seconds: the cost per episode)."""
    log = get_run_logger()
    started = time.perf_counter()
    llm = None
    if p.agent == "llm":
        with llm_client(p.llm_base_url, p.llm_model, p.api_key_secret, timeout_s=p.llm_timeout_s) as client:
            out = run_chunk(p, level, start, stop, client, seed=seed)
            llm = {"requests": client.calls}
    elif p.agent == "smollm2":
        from mlsys_flows.systems.llm_serving.chat import SmolLM2Chat

        client = SmolLM2Chat(threads=1)
        out = run_chunk(p, level, start, stop, client, seed=seed)
        llm = client.stats() | {"load_s": float(getattr(client.model, "load_s", 0.0)),
                                "episodes": sum(len(eps) for v, eps in out.items() if v in
                                                ("no_feedback", "with_feedback", "replan_no_feedback"))}
    else:
        out = run_chunk(p, level, start, stop, seed=seed)
    storage.write_bytes(key, json.dumps(out).encode())
    log.info("%s seed %d tasks %d-%d in %.1f s: success %s%s", level, seed, start, stop, time.perf_counter() - started,
             ", ".join(f"{v} {sum(e['success'] for e in eps)}/{len(eps)}" for v, eps in out.items()),
             f"; {llm['requests']} LLM requests" if llm else "")
    return {"episodes": out, "llm": llm}


def train_era(p: Params, level: str) -> tuple[dict, dict]:
    """ERA's two learned policies of ``level`` (systems/era, its ``p.era_scale`` preset), trained by ERA's
    own function (``era.agent.trained_policies``, the ERA flow's training of seed index 0): the embodied
    prior (behaviour cloning + grounding on scripted-expert demonstrations) and the prior tuned by
    turn-level PPO, with every training task whose content equals one of this run's test tasks dropped
    (``exclude``), as ERA drops its own test tasks. Returns ({"era_prior": policy, "era_prior_rl":
    policy}, what the training counted)."""
    from mlsys_flows.systems import era
    from mlsys_flows.systems.era.agent import trained_policies
    from mlsys_flows.systems.era.episodes import task_signature

    ep = era.Params.for_scale(p.era_scale, seed=p.seed)
    test = {task_signature(t) for s in eval_seeds(p) for t in tasks_for(p, level, s)}
    policies, out = trained_policies(ep, level, 0, ("prior_only", "prior_rl"), exclude=test, evaluate=False)
    prior, tuned = out["prior"], out["variants"]["prior_rl"]
    info = {"era_scale": p.era_scale, "train_tasks": out["train_tasks"], "overlaps_dropped": out["overlaps_dropped"],
            "demo_steps": prior["demo_steps"], "rl_env_steps": int(tuned["rl_env_steps"]),
            "rl_updates": int(tuned["rl_updates"]), "prior_s": prior["prior_s"],
            "rl_s": tuned["train_s"] - prior["prior_s"], "bc_accuracy": float(prior["bc_accuracy"]),
            "lr_prior_rl": float(out["lr"]["prior_rl"])}
    return {"era_prior": policies["prior_only"], "era_prior_rl": policies["prior_rl"]}, info


@task(name="embodiedbench-era-policies")
def era_policies(p: Params, storage: ObjectStorage, level: str, key: str) -> dict:
    """ERA's learned policies of ``level``, trained here and played on every test set of the run."""
    log = get_run_logger()
    started = time.perf_counter()
    import torch

    policies, info = train_era(p, level)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # small networks, one row at a time: more threads only contend
    try:
        out = run_policies(p, level, policies)
    finally:
        torch.set_num_threads(threads)
    storage.write_bytes(key, json.dumps(out).encode())
    log.info("ERA policies %s (%s) in %.1f s: success %s", level, info, time.perf_counter() - started,
             ", ".join(f"{v} {sum(e['success'] for e in eps)}/{len(eps)}" for v, eps in out.items()))
    return {"episodes": out, "llm": None, "era": info | {"level": level}}
