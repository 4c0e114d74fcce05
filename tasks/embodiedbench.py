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


class GreedyPolicy:
    """A trained ERA network as a step policy: the argmax of its logits over the valid actions (ERA's
    own greedy evaluation, systems/era/episodes.evaluate); every action when the mask allows none."""

    def __init__(self, net):
        self.net = net.eval()

    def __call__(self, vector, mask):
        import numpy as np
        import torch

        m = np.asarray(mask, bool).reshape(-1)
        if not m.any():
            m = np.ones_like(m)
        with torch.no_grad():
            logits, _ = self.net(torch.from_numpy(np.asarray(vector, np.float32).reshape(1, -1)),
                                 torch.from_numpy(m)[None])
        return int(logits.argmax(-1))


def train_era(p: Params, level: str) -> tuple[dict, dict]:
    """ERA's two learned policies of ``level`` (systems/era, its ``p.era_scale`` preset): the embodied prior
    (behaviour cloning + grounding on scripted-expert demonstrations) and the prior tuned by turn-level PPO,
    trained on training tasks with every task whose content equals one of this run's test tasks dropped.
    Returns ({"era_prior": policy, "era_prior_rl": policy}, what the training counted)."""
    import copy

    import numpy as np
    import torch

    from mlsys_flows.systems import era
    from mlsys_flows.systems.embodied.api import make_env, make_tasks
    from mlsys_flows.systems.era.episodes import dims, expert_demos, task_signature
    from mlsys_flows.systems.era.policy import Encoder, make_policy
    from mlsys_flows.systems.era.ppo import ppo_train
    from mlsys_flows.systems.era.prior import learn_prior
    from mlsys_flows.systems.era.run import cell_seed, ppo_config, shaping

    ep = era.Params.for_scale(p.era_scale, seed=p.seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seed = cell_seed(ep.seed, level, 0)
        obs_dim, n_actions = dims(level)
        encoder = Encoder(obs_dim)
        test = {task_signature(t) for s in eval_seeds(p) for t in tasks_for(p, level, s)}
        drawn = make_tasks(level, ep.train_per_subset, p.seed + 7919)
        train = [t for t in drawn if task_signature(t) not in test]
        torch.manual_seed(seed)
        net = make_policy(level, obs_dim, n_actions, ep.hidden, ep.architecture)
        started = time.perf_counter()
        demos = expert_demos(train, encoder, n_actions)
        losses = learn_prior(net, demos, epochs=ep.prior_epochs, lr=ep.prior_lr, batch=ep.prior_batch,
                             grounding_weight=ep.grounding_weight, max_steps=make_env(train[0]).max_steps,
                             generator=torch.Generator().manual_seed(seed + 3))
        prior_s = time.perf_counter() - started
        tuned = copy.deepcopy(net)
        started = time.perf_counter()
        log = ppo_train(tuned, train, encoder, n_actions, ppo_config(ep, "prior_rl"), shaping(ep),
                        np.random.default_rng(seed + 1), torch.Generator().manual_seed(seed + 2))
        rl_s = time.perf_counter() - started
    finally:
        torch.set_num_threads(threads)
    info = {"era_scale": p.era_scale, "train_tasks": len(train), "overlaps_dropped": len(drawn) - len(train),
            "demo_steps": int(len(demos["action"])), "rl_env_steps": int(log["env_steps"]),
            "rl_updates": int(log["updates"]), "prior_s": prior_s, "rl_s": rl_s,
            "bc_accuracy": float(losses["bc_accuracy"])}
    return {"era_prior": GreedyPolicy(net), "era_prior_rl": GreedyPolicy(tuned)}, info


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
